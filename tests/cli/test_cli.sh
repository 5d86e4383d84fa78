#!/usr/bin/env bash
# End-to-end checks of the specdec program: JSON output, streaming, errors, make-fixture.
# Usage: SPECDEC=path/to/specdec test_cli.sh WORKDIR [TEST_DATA_DIR]
set -u
work=$1
data=${2:-$(dirname "$0")/../data}
rm -rf "$work" && mkdir -p "$work"
fails=0
passes=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; passes=$((passes + 1)); else echo "FAIL $name"; fails=$((fails + 1)); fi
}

"$SPECDEC" make-fixture --out "$work/t" --layers 3 --hidden 64 --heads 4 --kv-heads 2 --vocab 128 \
  --init-std 0.1 --exit-layers 1 --exit-scale 0.2 --seed 3 2>/dev/null
"$SPECDEC" make-fixture --draft-of "$work/t" --out "$work/d" --layers 1 2>/dev/null
check "make-fixture writes an HF folder" test -s "$work/t/model.safetensors" -a -s "$work/t/config.json" -a -s "$work/d/config.json"
check "no temporary files are left" bash -c "! ls '$work/t' | grep -q tmp"

out=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json)
check "generate --json prints one JSON object" python3 -c "
import json,sys; j=json.loads(sys.argv[1]); s=j['stats']
assert len(j['tokens'])==12 and s['new_tokens']==12, j
assert sum(a+1 for d,a in s['trace'])==12 and s['target_passes']==len(s['trace'])
for k in ['draft_passes','drafted_tokens','accepted_tokens','acceptance_rate','tokens_per_target_pass','prefill_seconds','drafting_seconds','verification_seconds','other_seconds','tokens_per_second']: assert k in s, k
" "$out"
plain=$("$SPECDEC" generate --model "$work/t" --prompt-ids 5,6,7 --max-new-tokens 12 --json)
check "assisted tokens equal target-only tokens" python3 -c "
import json,sys; assert json.loads(sys.argv[1])['tokens']==json.loads(sys.argv[2])['tokens']" "$out" "$plain"

# (constant K: goodput, the default, may find the draft not worth its cost on a busy machine and
# stop drafting, and then there is no prediction to check)
cmp=$("$SPECDEC" compare --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json --warmup 0 --schedule constant)
check "compare --json reports identical outputs and a speedup" python3 -c "
import json,sys; j=json.loads(sys.argv[1]); assert j['identical'] is True and 'predicted_speedup' in j
a, t = j['assisted']['stats'], j['target_only']['stats']
ratio = t['total_seconds'] / a['total_seconds']  # the definition: same tokens, target-only time / assisted time
assert abs(j['speedup'] - ratio) <= 1e-9 * ratio, (j['speedup'], ratio)
per_pass = lambda s: s['verification_seconds'] / (s['target_passes'] - 1)  # after the first
r = per_pass(a) / per_pass(t)
assert abs(j['pass_ratio'] - r) <= 1e-9 * r, (j['pass_ratio'], r)
al, g, c = j['alpha'], j['gamma'], j['cost_ratio']
want = (1 - al ** (g + 1)) / ((1 - al) * (g * c + r)) if al < 1 else (g + 1) / (g * c + r)
assert abs(j['predicted_speedup_with_pass_cost'] - want) <= 1e-9 * want, (j, want)" "$cmp"

stream=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 2>/dev/null)
check "streamed ids equal the JSON tokens" python3 -c "
import json,sys; assert [int(x) for x in sys.argv[1].split()]==json.loads(sys.argv[2])['tokens']" "$stream" "$out"

nothing=$("$SPECDEC" generate --model "$work/t" --prompt-ids 5,6,7 --max-new-tokens 1 --prompt-lookup 3 2>&1 >/dev/null)
drafted=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --schedule constant --prompt-ids 5,6,7 --max-new-tokens 12 2>&1 >/dev/null)
check "the stats line says when nothing was drafted, and the acceptance when something was" bash -c \
  '[[ $1 == *"nothing drafted"* && $1 != *acceptance* && $2 =~ acceptance\ [0-9.]+%\ \([0-9]+/[1-9][0-9]*\) ]]' _ "$nothing" "$drafted"

nothing_cmp=$("$SPECDEC" compare --model "$work/t" --prompt-ids 5,6,7 --max-new-tokens 1 --prompt-lookup 3 --warmup 0 --json)
check "compare predicts no speedup when nothing was drafted" python3 -c "
import json,sys; j=json.loads(sys.argv[1]); assert j['predicted_speedup'] is None and j['assisted']['stats']['drafted_tokens']==0, j" "$nothing_cmp"

# Hugging Face's knob names are accepted too (num_assistant_tokens_schedule, ...): the same run either way,
# and not the run without them.
short=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json \
  --schedule dynamic --confidence-threshold 0.9)
long=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json \
  --num-assistant-tokens-schedule dynamic --assistant-confidence-threshold 0.9)
lookup_short=$("$SPECDEC" generate --model "$work/t" --prompt-ids 5,6,7,5,6,7,5,6 --max-new-tokens 12 --json \
  --prompt-lookup 3 --max-matching-ngram 1 --schedule constant)
lookup_long=$("$SPECDEC" generate --model "$work/t" --prompt-ids 5,6,7,5,6,7,5,6 --max-new-tokens 12 --json \
  --prompt-lookup-num-tokens 3 --max-matching-ngram-size 1 --num-assistant-tokens-schedule constant)
check "Hugging Face's option names give the runs of the short ones" python3 -c "
import json,sys; a,b,c,d,e=(json.loads(x) for x in sys.argv[1:6])
assert a['stats']['trace']==b['stats']['trace'] and a['tokens']==b['tokens'], (a, b)
assert a['stats']['trace']!=json.loads(sys.argv[6])['stats']['trace'], 'dynamic with 0.9 drafted as constant K=5'
assert c['stats']['trace']==d['stats']['trace'] and c['stats']['drafted_tokens'] > 0, (c, d)
assert e['stats']['drafted_tokens'] == 0" "$short" "$long" "$lookup_short" "$lookup_long" \
  "$("$SPECDEC" generate --model "$work/t" --prompt-ids 5,6,7,5,6,7,5,6 --max-new-tokens 12 --json)" \
  "$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json --schedule constant)"

# ... and as per-request keys of --prompts-file, where they give the runs of the flags (values chosen
# so that they change the run: threshold 0.05 drafts more than the default 0.4, n-grams of 1 match
# elsewhere than n-grams of 2 in this prompt).
line() { # line draft|- PROMPT_IDS KEYS: the JSON result of a one-line --prompts-file run (with the draft or none)
  local draft=(); [ "$1" = draft ] && draft=(--draft "$work/d"); shift
  printf '{"prompt_ids": [%s], "max_new_tokens": 12, %s}\n' "$1" "$2" |
    "$SPECDEC" generate --model "$work/t" "${draft[@]}" --prompts-file - 2>/dev/null; }
flag_threshold=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json \
  --schedule dynamic --confidence-threshold 0.05)
flag_ngram=$("$SPECDEC" generate --model "$work/t" --prompt-ids 6,5,7,5,8,8,8,8,6,5 --max-new-tokens 12 --json \
  --prompt-lookup 3 --max-matching-ngram 1 --schedule constant)
check "--prompts-file: assistant_confidence_threshold and max_matching_ngram_size give the flags' runs" python3 -c "
import json,sys; a,b,c,d,e,f=(json.loads(x) for x in sys.argv[1:7])
assert a['stats']['trace']==b['stats']['trace'] and a['tokens']==b['tokens'], (a, b)
assert a['stats']['trace']!=c['stats']['trace'], 'threshold 0.05 ran as the default'
assert d['stats']['trace']==e['stats']['trace'] and d['tokens']==e['tokens'], (d, e)
assert d['stats']['trace']!=f['stats']['trace'], 'max_matching_ngram_size 1 ran as 2'" \
  "$flag_threshold" \
  "$(line draft 5,6,7 '"num_assistant_tokens_schedule": "dynamic", "assistant_confidence_threshold": 0.05')" \
  "$(line draft 5,6,7 '"num_assistant_tokens_schedule": "dynamic"')" \
  "$flag_ngram" \
  "$(line - 6,5,7,5,8,8,8,8,6,5 '"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 1, "num_assistant_tokens_schedule": "constant"')" \
  "$(line - 6,5,7,5,8,8,8,8,6,5 '"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 2, "num_assistant_tokens_schedule": "constant"')"

s1=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6 --max-new-tokens 10 --do-sample --seed 7 --json)
s2=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6 --max-new-tokens 10 --do-sample --seed 7 --json)
check "same seed, same sampled tokens" python3 -c "
import json,sys; assert json.loads(sys.argv[1])['tokens']==json.loads(sys.argv[2])['tokens']" "$s1" "$s2"

expect_error() { # expect_error NAME NEEDLE ARGS...
  local name=$1 needle=$2; shift 2
  local err rc
  err=$("$SPECDEC" "$@" 2>&1 >/dev/null); rc=$?
  check "$name" bash -c "[ $rc -ne 0 ] && grep -qF -- \"\$1\" <<<\"\$2\"" _ "$needle" "$err"
}
expect_error "bad prompt ids" "'x' is not an integer" generate --model "$work/t" --prompt-ids 1,x
spaced=$("$SPECDEC" generate --model "$work/t" --prompt-ids "5 6  7" --max-new-tokens 12 --json)
check "--prompt-ids takes ids separated by spaces too (as generate prints them without a tokenizer)" python3 -c "
import json,sys; assert json.loads(sys.argv[1])['tokens']==json.loads(sys.argv[2])['tokens']" "$spaced" "$plain"
expect_error "prompt ids ending with a comma, spaces after it" "ends with a comma" generate --model "$work/t" --prompt-ids '1, 2, '
# Every error is one line in one form, CLI11's own included.
check "a flag's bad value: one 'specdec: error:' line" bash -c \
  "[ \"\$('$SPECDEC' generate --model '$work/t' --draft-tree-width 0 2>&1)\" = 'specdec: error: --draft-tree-width: Value 0 not in range 1 to 16' ]"
check "no subcommand: one 'specdec: error:' line" bash -c \
  "'$SPECDEC' 2>&1 | grep -qx 'specdec: error: a subcommand is required, e.g. generate, chat or serve (specdec --help lists them all)'"
check "a missing required flag: one line that names the subcommand's --help" bash -c \
  "'$SPECDEC' generate --prompt-ids 1 2>&1 | grep -qx 'specdec: error: --model is required (specdec generate --help lists its flags)'"
expect_error "missing model folder" "/nonexistent: no such file or folder" generate --model /nonexistent --prompt-ids 1
expect_error "a device for a model" "/dev/null: not a checkpoint: neither a file nor a folder" generate --model /dev/null --prompt-ids 1
# A value CLI11 cannot convert: the flag, the value and what it takes (not "Could not convert").
expect_error "Hugging Face's no_repeat_ngram_size: not implemented, and what there is" \
  "generate has no flag --no-repeat-ngram-size (not implemented: the samplers are" \
  generate --model "$work/t" --prompt-ids 1 --no_repeat_ngram_size 3
expect_error "an integer flag given a word" '--threads: "abc" is not a value it takes (a whole number within its range is expected)' \
  generate --model "$work/t" --prompt-ids 1 --threads abc
expect_error "... or a number in another notation" '--max-new-tokens: "1e3" is not a value it takes (a whole number within its range is expected)' \
  generate --model "$work/t" --prompt-ids 1 --max-new-tokens 1e3
expect_error "a real flag given a word" '--top-p: "abc" is not a value it takes (a number is expected)' \
  generate --model "$work/t" --prompt-ids 1 --top-p abc
expect_error "a switch given a value" '--chat: "maybe" is not a value it takes (a switch' \
  generate --model "$work/t" --prompt-ids 1 --chat=maybe
expect_error "Hugging Face's do_sample=True written as two words: the switch is named" \
  '--do-sample is a switch: give it alone, or --do-sample=true or --do-sample=false (not "True" after it)' \
  generate --model "$work/t" --prompt-ids 1 --do_sample True
expect_error "serve --api-key '' is refused (not a server without a key)" "--api-key: the value is empty" \
  serve --model "$work/t" --api-key ''
check "... and so is an empty SPECDEC_API_KEY" bash -c \
  "SPECDEC_API_KEY= timeout 60 \"\$0\" serve --model \"\$1\" --port 0 2>&1 | grep -qF 'SPECDEC_API_KEY is set but empty'" "$SPECDEC" "$work/t"
expect_error "serve's beam-search hint names what samples a request" \
  'serve has no flag --num-beams (beam search is not supported: a request is greedy, or sampled when its "temperature" is 1e-5 or more)' \
  serve --model "$work/t" --num_beams 2
expect_error "serve's --do-sample says what samples a request" \
  'serve has no flag --do-sample (a request samples when its temperature is 1e-5 or more; --temperature is the default of a request without one)' \
  serve --model "$work/t" --do-sample
expect_error "... and --seed where a request's seed comes from" \
  'serve has no flag --seed (a request gives its own seed; one without draws a random seed)' \
  serve --model "$work/t" --seed 3
expect_error "compare without anything to compare says so before loading (a missing model is not read)" \
  "compare needs --draft PATH, --prompt-lookup N or --speculate suffix" compare --model /nonexistent --prompt-ids 1
expect_error "make-fixture names the size that is not positive" "make-fixture: --vocab must be positive, got 0" \
  make-fixture --out "$work/never" --vocab 0
expect_error "bad schedule" "--schedule" generate --model "$work/t" --prompt-ids 1 --schedule sometimes
for flag in "--draft-tree-width 2" "--draft-weights q8_0" "--draft-int8-activations"; do
  # shellcheck disable=SC2086  # a flag and its value
  expect_error "$flag without --draft" "${flag%% *} needs --draft" generate --model "$work/t" --prompt-ids 1 $flag
done
expect_error "a ranged flag's value that is no number says so" "--port: Value abc is not an integer" \
  serve --model "$work/t" --port abc
expect_error "... and one out of range says that" "--port: Value 70000 not in range 0 to 65535" \
  serve --model "$work/t" --port 70000
expect_error "... a real number where an integer goes too" "--draft-tree-width: Value 1.5 is not an integer" \
  generate --model "$work/t" --draft "$work/d" --prompt-ids 1 --draft-tree-width 1.5
expect_error "--prompt-lookup past its bound, named by its flag" "--prompt-lookup must be in [0, 256]" generate --model "$work/t" --prompt-ids 1 --prompt-lookup 257
expect_error "... as --max-new-tokens 0 is" "--max-new-tokens must be >= 1, got 0" generate --model "$work/t" --prompt-ids 1 --max-new-tokens 0
printf '{"prompt_ids": [1], "max_new_tokens": 0}\n' > "$work/bad_line.jsonl"
expect_error "... and a --prompts-file line's by its key" "bad_line.jsonl:1: max_new_tokens must be >= 1" \
  generate --model "$work/t" --prompts-file "$work/bad_line.jsonl"
expect_error "a value's error names its flag: --frequency-penalty" "--frequency-penalty must be in [-2, 2], got 3" \
  generate --model "$work/t" --prompt-ids 1 --frequency-penalty 3
expect_error "... --suffix-min-prob" "suffix speculation: --suffix-min-prob must be in [0, 1], got 2" \
  generate --model "$work/t" --prompt-ids 1 --speculate suffix --suffix-min-prob 2
printf '{"prompt_ids": [1]}\n{"promt_ids": [1]}\n' > "$work/typo_key.jsonl"
expect_error "a --prompts-file line's misspelt key is named (not taken for a missing prompt), with the key meant" \
  'typo_key.jsonl:2: unknown key "promt_ids" (did you mean "prompt_ids"?)' generate --model "$work/t" --prompts-file "$work/typo_key.jsonl"
printf '{"prompt_ids": [1], "max_tokens": 3}\n' > "$work/openai_key.jsonl"
expect_error "--prompts-file: OpenAI's max_tokens points to max_new_tokens" \
  'openai_key.jsonl:1: unknown key "max_tokens" (did you mean "max_new_tokens"?)' generate --model "$work/t" --prompts-file "$work/openai_key.jsonl"
printf '{"prompt_ids": [1]}\n{"prompt_ids": [1],}\n' > "$work/bad_json.jsonl"
expect_error "... and its JSON error says the column of the file's line, without the JSON library's tag" \
  'bad_json.jsonl:2: parse error at column 20: syntax error' \
  generate --model "$work/t" --prompts-file "$work/bad_json.jsonl"
expect_error "tokenize: a --tokenizer path that does not exist says so" "nothere.gguf: no such file or folder" \
  tokenize --tokenizer "$work/nothere.gguf" --text hi
expect_error "... and a folder without one names what a tokenizer is" "not_a_tokenizer: no tokenizer (a GGUF file" \
  tokenize --tokenizer "$(mkdir -p "$work/not_a_tokenizer" && echo "$work/not_a_tokenizer")" --text hi
expect_error "a flag given twice says so" "--max-new-tokens is given 2 times: give it once" \
  generate --model "$work/t" --prompt-ids 1 --max-new-tokens 2 --max-new-tokens 3
expect_error "a bare argument is said to be no flag's value" "not expected: my prompt (every input is a flag's value: --help lists the flags)" \
  generate --model "$work/t" "my prompt"
expect_error "the server's --max-tokens points to --max-new-tokens" "generate has no flag --max-tokens (OpenAI's max_tokens is a request's field; the flag is --max-new-tokens)" \
  generate --model "$work/t" --prompt-ids 1 --max-tokens 2
# What a newcomer types: Hugging Face's snake_case names, typos, flags specdec does not have.
check "Hugging Face's snake_case names are the dashed flags" bash -c \
  "\"\$0\" generate --model \"\$1\" --prompt-ids 1 --max_new_tokens=3 --json | grep -q '\"new_tokens\":3'" "$SPECDEC" "$work/t"
expect_error "a flag where a value should be is not taken for the value" \
  "--prompt needs a value, and --chat after it is a flag (a value that begins with -- is written --prompt=VALUE)" \
  generate --model "$work/t" --prompt --chat
expect_error "a flag before the subcommand" "the subcommand comes first, then its flags: specdec generate --threads ..." \
  --threads 1 generate --model "$work/t" --prompt-ids 1
expect_error "an unknown subcommand names the closest" "unknown subcommand 'gen' (did you mean generate?)" gen --model "$work/t"
expect_error "an unknown flag names the closest" "generate has no flag --promt (did you mean --prompt?)" \
  generate --model "$work/t" --promt hi
expect_error "... a switch's too" "generate has no flag --do-sampel (did you mean --do-sample?)" \
  generate --model "$work/t" --prompt-ids 1 --do-sampel
check "--help followed by a word is still the help" bash -c "\"\$0\" generate --help foo | grep -q -- '--max-new-tokens'" "$SPECDEC"
expect_error "llama.cpp's short flags are named, with what to use instead" \
  "generate has no flag -n (the number of new tokens is --max-new-tokens); specdec generate --help lists its flags" \
  generate --model "$work/t" --prompt-ids 1 -n 12
expect_error "... before a missing required flag" "generate has no flag -m (the model is --model)" generate -m "$work/t" -p hi
expect_error "... and llama.cpp's and vLLM's long ones" "serve has no flag --max-num-seqs (the requests decoded together are --max-batch)" \
  serve --model "$work/t" --max-num-seqs 4
expect_error "... the context's too" "serve has no flag -c (the context of each request is --ctx)" serve --model "$work/t" -c 512
neg=$("$SPECDEC" generate --model "$work/t" --prompt-ids 1 --max-new-tokens 2 --temperature -1 2>&1)
check "a negative number after a flag is its value, not a short flag" bash -c '[[ $1 != *"has no flag"* ]]' _ "$neg"
expect_error "... or what to do instead" "generate has no flag --num-beams (beam search is not supported" \
  generate --model "$work/t" --prompt-ids 1 --num-beams 2
expect_error "... transformers' assistant_model is --draft" "generate has no flag --assistant-model (the draft model is --draft)" \
  generate --model "$work/t" --prompt-ids 1 --assistant_model "$work/d"
expect_error "... the config field suffix_speculation is --speculate suffix" \
  "generate has no flag --suffix-speculation (suffix speculation is --speculate suffix)" \
  generate --model "$work/t" --prompt-ids 1 --suffix_speculation
expect_error "... chat's turns come from stdin" "chat has no flag --prompt (chat reads each turn from stdin" \
  chat --model "$work/t" --prompt hi
check "specdec help SUBCOMMAND is its --help" bash -c "\"\$0\" help generate | grep -q -- '--max-new-tokens'" "$SPECDEC"
# Flags that apply only beside another are warned about (Hugging Face warns of sampling knobs
# without do_sample), and the run goes on.
warned() { # warned NEEDLE ARGS...: the run succeeds and stderr holds NEEDLE
  local needle=$1 err; shift
  err=$("$SPECDEC" generate --model "$work/t" --prompt-ids 1 --max-new-tokens 2 "$@" 2>&1 >/dev/null) && grep -qF -- "$needle" <<<"$err"
}
check "sampling flags without --do-sample are warned about" warned "--temperature, --top-p only apply with --do-sample" --temperature 0.7 --top-p 0.9
check "... one of them too" warned "--top-k only applies with --do-sample" --top-k 5
check "... --seed as well" warned "--seed only applies with --do-sample" --seed 3
check "... and with --do-sample at --temperature 0, which is greedy" warned "--top-k does not apply at --temperature 0 (or below 1e-5)" --do-sample --temperature 0 --top-k 5
check "--do-sample below --temperature 1e-5 says it decodes greedily" warned "--do-sample at --temperature below 1e-5 decodes greedily" --do-sample --temperature 1e-38
check "... and so it does (logits divided by it overflow)" bash -c \
  "[ \"\$(\"\$0\" generate --model \"\$1\" --prompt-ids 5,6,7 --max-new-tokens 6 --do-sample --temperature 1e-38 2>/dev/null)\" = \"\$(\"\$0\" generate --model \"\$1\" --prompt-ids 5,6,7 --max-new-tokens 6 2>/dev/null)\" ]" "$SPECDEC" "$work/t"
check "--num-assistant-tokens beside --prompt-lookup is warned about" warned "--num-assistant-tokens does not apply with --prompt-lookup N" --prompt-lookup 4 --num-assistant-tokens 2
check "no warning for --temperature 0 (greedy, as documented)" bash -c "! \"\$0\" generate --model \"\$1\" --prompt-ids 1 --max-new-tokens 2 --temperature 0 2>&1 >/dev/null | grep -q warning" "$SPECDEC" "$work/t"
check "prompt lookup flags without --prompt-lookup are warned about" warned "only apply with --prompt-lookup" --max-matching-ngram 4
check "suffix flags without --speculate suffix are warned about" warned "only apply with --speculate suffix" --suffix-tree
check "--min-new-tokens past --max-new-tokens is warned about" warned "at most 2 are generated" --min-new-tokens 9
check "the confidence-threshold flags beside prompt lookup are warned about" \
  warned "only apply with --draft and --schedule dynamic" --prompt-lookup 3 --confidence-threshold 0.3
# A --prompts-file run warns of the flags that no line uses; a line that uses one silences it.
printf '{"prompt_ids": [1], "max_new_tokens": 2}\n' > "$work/plain_line.jsonl"
printf '{"prompt_ids": [1], "max_new_tokens": 2}\n{"prompt_ids": [1], "max_new_tokens": 2, "speculate": "suffix"}\n' \
  > "$work/suffix_line.jsonl"
file_warnings() { "$SPECDEC" generate --model "$work/t" --prompts-file "$1" "${@:2}" 2>&1 >/dev/null | grep warning; }
check "--prompts-file: a flag that no line uses is warned about" bash -c \
  '[[ $1 == *"--suffix-* flags only apply with --speculate suffix"* ]]' _ "$(file_warnings "$work/plain_line.jsonl" --suffix-tree)"
check "... not when a line uses it" bash -c '[ -z "$1" ]' _ "$(file_warnings "$work/suffix_line.jsonl" --suffix-tree)"
printf '{"prompt_ids": [1.0], "max_new_tokens": 2.0, "temperature": 0.7, "seed": 3.0}\n{"prompt_ids": [1], "max_new_tokens": 2, "temperature": 0.7, "do_sample": true}\n' \
  > "$work/greedy_knobs.jsonl"
check "--prompts-file: sampling keys on greedy lines are warned about once (an integral float is an integer)" bash -c \
  '[ "$1" = "specdec: warning: $2: 1 greedy line sets sampling keys, which apply with \"do_sample\": true (or --do-sample) only (line 1: temperature, seed)" ]' \
  _ "$(file_warnings "$work/greedy_knobs.jsonl")" "$work/greedy_knobs.jsonl"
spaced=$("$SPECDEC" generate --model "$work/t" --prompt-ids '1, 2 ,3' --max-new-tokens 3 --json 2>/dev/null)
check "--prompt-ids takes spaces around the ids" python3 -c "
import json, sys; a, b = (json.loads(x) for x in sys.argv[1:3]); assert a['tokens'] == b['tokens'] and a['stats']['prompt_tokens'] == 3, (a, b)" \
  "$spaced" "$("$SPECDEC" generate --model "$work/t" --prompt-ids 1,2,3 --max-new-tokens 3 --json 2>/dev/null)"
check "--int8-activations beside float weights is warned about" warned "quantized weights only, not float32" \
  --int8-activations --weights float32
check "no warning with --do-sample" bash -c "! \"\$0\" generate --model \"\$1\" --prompt-ids 1 --max-new-tokens 2 --do-sample --temperature 0.7 2>&1 >/dev/null | grep -q warning" "$SPECDEC" "$work/t"
expect_error "a token outside the vocabulary, named by its flag" "--prompt-ids: token id 1000 is outside the vocabulary [0, 128)" generate --model "$work/t" --prompt-ids 1000
expect_error "--prompt-lookup with --draft" "--prompt-lookup and --draft: give one of them" \
  generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --prompt-lookup 3
expect_error "--threads past what the machine can run is refused at once" "--threads: the thread count must be between 1 and" \
  generate --model "$work/t" --prompt-ids 1 --threads 100000
random=$(for i in 1 2 3 4 5; do "$SPECDEC" generate --model "$work/t" --prompt-ids 5,6 --max-new-tokens 12 --do-sample --seed -1 2>/dev/null; echo; done | sort -u | wc -l)
check "--seed -1 draws a random seed (five runs, not all alike)" test "$random" -gt 1
expect_error "... and no other negative seed is taken" "the seed must be an integer from 0 to 2^64 - 1 (or -1 for a random one), got -2" \
  generate --model "$work/t" --prompt-ids 5,6 --do-sample --seed -2
expect_error "--seed past 2^64 - 1 is refused" "the seed must be an integer from 0 to 2^64 - 1" \
  generate --model "$work/t" --prompt-ids 1 --seed 18446744073709551616
expect_error "--temperature inf is refused" "temperature must be finite" \
  generate --model "$work/t" --prompt-ids 1 --do-sample --temperature inf
rc_of() { "$SPECDEC" "$@" > /dev/null 2>&1; echo $?; }
check "a flag that does not parse exits 1, as every other error" bash -c '[ "$*" = "1 1 1 0" ]' _ \
  "$(rc_of generate --model "$work/t" --max-new-tokens x)" "$(rc_of generate --bogus)" \
  "$(rc_of serve --model "$work/t" --port 70000)" "$(rc_of generate --help)"
serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --port 0 --threads 100000 2>&1)
check "serve refuses a bad flag before it listens" bash -c \
  '[[ $1 == *"--threads: the thread count"* && $1 != *listening* ]]' _ "$serve_err"
for bad in "--device tpu" "--chat-template nosuch" "--weights q8_0 --dtype bfloat16"; do
  # shellcheck disable=SC2086  # flags and their values
  serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --port 0 $bad 2>&1)
  check "... $bad too (what the model's loading would refuse whatever the model)" bash -c \
    '[[ $1 == *error* && $1 != *listening* ]]' _ "$serve_err"
done
for flag in --served-model-name --alias; do
  serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --port 0 $flag "" 2>&1)
  check "serve $flag '' is refused" bash -c '[[ $1 == *"the value is empty"* && $1 != *listening* ]]' _ "$serve_err"
done
serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --port 0 --temperature 3 2>&1)
check "serve holds --temperature to a request's range" bash -c \
  '[[ $1 == *"--temperature must be in [0, 2]"* && $1 != *listening* ]]' _ "$serve_err"
serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --port 0 --ctx 512 --max-new-tokens 512 2>&1)
check "serve refuses --max-new-tokens that leaves no room in --ctx" bash -c \
  '[[ $1 == *"--max-new-tokens 512 leaves no room for a prompt in --ctx 512"* && $1 != *listening* ]]' _ "$serve_err"
serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --tokenizer "$data/tiny_bpe" --port 0 --ctx 100000 2>&1)
check "serve names --ctx past the model's positions" bash -c \
  '[[ $1 == *"--ctx 100000 is more than the model'"'"'s 2048 positions"* ]]' _ "$serve_err"
serve_rc=0
serve_err=$(timeout 60 "$SPECDEC" serve --model "$work/t" --port 0 2>&1) || serve_rc=$?
check "serve exits 1 when the model fails to load (it has no tokenizer), and does not hang" bash -c \
  '[[ $1 == 1 && $2 == *"has no tokenizer"* ]]' _ "$serve_rc" "$serve_err"
expect_error "draft of a missing target" "config.json" make-fixture --draft-of /nonexistent --out "$work/x" --layers 1
# A target whose weights do not follow its config is refused as the loader refuses it, and no draft is written.
cp -r "$work/t" "$work/t_bad"
python3 -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p))
c["intermediate_size"] //= 2; json.dump(c, open(p, "w"))' "$work/t_bad"
expect_error "a draft of a target whose tensors do not follow its config.json is refused" \
  "t_bad/model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [256, 64] but" \
  make-fixture --draft-of "$work/t_bad" --out "$work/t_bad_d" --layers 1
check "... and nothing is written" bash -c "! ls -a '$work' | grep -q t_bad_d"
mkdir -p "$work/not_a_checkpoint"
expect_error "a folder that is no checkpoint is named as such, before its tokenizer" \
  "not_a_checkpoint: not a checkpoint: no " generate --model "$work/not_a_checkpoint" --prompt "Hello"
echo "not weights" > "$work/weights.bin"
expect_error "a file that is not GGUF is named as no checkpoint, not as a folder" \
  "weights.bin: not a checkpoint: a file whose name does not end in .gguf" \
  generate --model "$work/weights.bin" --prompt "Hello"
expect_error "unknown subcommand" "" nosuchcommand
if ! nvidia-smi -L >/dev/null 2>&1; then  # on a GPU host these succeed
  expect_error "--device cuda without a GPU" "has no CUDA" generate --model "$work/t" --prompt-ids 1 --device cuda
  expect_error "--device cuda:1 without a GPU" "has no CUDA" generate --model "$work/t" --prompt-ids 1 --device cuda:1
fi
expect_error "unknown device" "expected cpu, cuda or cuda:N" generate --model "$work/t" --prompt-ids 1 --device tpu

# make-draft: a draft distilled from a small target with a tokenizer, end to end.
"$SPECDEC" make-fixture --out "$work/tt0" --layers 3 --hidden 64 --heads 4 --kv-heads 2 --init-std 0.1 \
  --tokenizer "$data/tiny_bpe" --seed 4 2>/dev/null
python3 -c "print(' '.join(['the cat sat on the mat and the dog ran to the big red house'] * 60))" > "$work/train.txt"
"$SPECDEC" make-draft --target "$work/tt0" --out "$work/md" --layers 1 --vocab-subset 20 --data "$work/train.txt" \
  --steps 3 --seq-len 32 --batch 2 2>"$work/md_err"
check "make-draft writes a draft with a reduced head and reports held-out quality" python3 -c "
import json; c=json.load(open('$work/md/config.json')); assert c['num_hidden_layers']==1 and 20<=len(c['head_token_ids'])<=21, c
assert 'held-out, after 3 steps' in open('$work/md_err').read()"
a=$("$SPECDEC" generate --model "$work/tt0" --draft "$work/md" --prompt "the cat" --max-new-tokens 16 --json)
p=$("$SPECDEC" generate --model "$work/tt0" --prompt "the cat" --max-new-tokens 16 --json)
check "make-draft: assisted output with the draft equals target-only" python3 -c "
import json,sys; assert json.loads(sys.argv[1])['tokens']==json.loads(sys.argv[2])['tokens']" "$a" "$p"
help=$("$SPECDEC" make-draft --help)
check "make-draft --help names its options" bash -c 'for f in --layers --layer-ids --vocab-subset --data --prompts --self-prompts --gen-temperature --steps --seq-len --lr --threads --seed --resume --data-from; do grep -qF -- "$f" <<<"$1" || exit 1; done' _ "$help"
expect_error "make-draft: a folder as --data says so" "--data $work is a folder: give the text files in it" \
  make-draft --target "$work/tt0" --out "$work/x" --data "$work"
expect_error "make-draft: --vocab-subset 0" "--vocab-subset must be >= 1" make-draft --target "$work/tt0" --out "$work/x" --data "$work/train.txt" --vocab-subset 0
expect_error "make-draft: more layers than the target" "has 3 layers" make-draft --target "$work/tt0" --out "$work/x" --data "$work/train.txt" --layers 4
"$SPECDEC" make-fixture --arch gpt2 --out "$work/g2" --layers 1 --hidden 32 --heads 2 2>/dev/null
expect_error "make-draft: unsupported architecture" "supports llama, mistral, qwen2, qwen3 and gemma3 targets" make-draft --target "$work/g2" --out "$work/x" --data "$work/train.txt"
expect_error "make-draft: output exists" "already exists" make-draft --target "$work/tt0" --out "$work/md" --data "$work/train.txt"
check "make-draft: failed runs leave no folder" test ! -e "$work/x"
# Ctrl-C: the run stops at the next step, writes a checkpoint and says how to resume.
"$SPECDEC" make-draft --target "$work/tt0" --out "$work/mi" --data "$work/train.txt" --steps 1000000 --seq-len 32 \
  --batch 2 --checkpoint-every 3 2>"$work/mi_err" &
pid=$!
for _ in $(seq 600); do [ -f "$work/mi/training/state.json" ] && break; sleep 0.1; done
kill -INT $pid; wait $pid; rc=$?
check "make-draft: Ctrl-C exits 130 with a checkpoint and a resume hint" bash -c "[ $rc -eq 130 ] && grep -q -- '--resume' '$work/mi_err' && test -f '$work/mi/model.safetensors'"
step=$(python3 -c "import json; print(json.load(open('$work/mi/training/state.json'))['step'])")
"$SPECDEC" make-draft --target "$work/tt0" --out "$work/mi" --resume --steps $((step + 2)) --seq-len 64 --batch 2 2>"$work/mi_err2"
check "make-draft --resume continues to the new total" python3 -c "
import json; s=json.load(open('$work/mi/training/state.json')); assert s['step']==$step+2 and s['seq_len']==32, s"
check "... and says that the --seq-len given is not used" grep -q -- "--seq-len not used with --resume" "$work/mi_err2"
# A run made with --features and --int8-activations resumes as it was made without them repeated.
"$SPECDEC" make-draft --target "$work/tt0" --out "$work/mf" --data "$work/train.txt" --steps 1 --seq-len 32 --batch 2 \
  --features --int8-activations 2>/dev/null
check "make-draft --resume keeps the run's --features and --int8-activations" bash -c \
  '"$@" 2>/dev/null && python3 -c "import json, sys; s = json.load(open(sys.argv[1])); assert s[\"step\"] == 2 and s[\"features\"] and s[\"int8_activations\"], s" "$0/training/state.json"' \
  "$work/mf" "$SPECDEC" make-draft --target "$work/tt0" --out "$work/mf" --resume --steps 2
expect_error "unknown weight format" "--weights" generate --model "$work/t" --prompt-ids 1 --weights q3
expect_error "packed weights need float32 compute" "q8_0 needs float32 compute" generate --model "$work/t" \
  --prompt-ids 1 --weights q8_0 --dtype bfloat16
q=$("$SPECDEC" generate --model "$work/t" --weights q8_0 --int8-activations --draft "$work/d" --draft-weights q4_0 \
  --draft-int8-activations --prompt-ids 5,6,7 --max-new-tokens 12 --json)
qplain=$("$SPECDEC" generate --model "$work/t" --weights q8_0 --int8-activations --prompt-ids 5,6,7 --max-new-tokens 12 --json)
check "quantized target and draft: assisted equals target-only" python3 -c "
import json,sys; a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a['tokens']==b['tokens'] and len(a['tokens'])==12, (a['tokens'], b['tokens'])" "$q" "$qplain"
"$SPECDEC" make-fixture --out "$work/v" --vocab 64 --layers 1 --hidden 64 --heads 4 2>/dev/null
check "a draft without tokenizer files of the target's vocabulary is accepted beside a larger --tokenizer" bash -c \
  '"$0" generate --model "$1" --tokenizer "$2" --draft "$3" --prompt-ids 5,6,7 --max-new-tokens 4 --json > /dev/null 2>&1' \
  "$SPECDEC" "$work/t" "$data/tiny_bpe" "$work/d"
# (The library runs such a draft, exactly: Exactness.DraftVocabularyPaddedOrCutStaysExact.)
expect_error "a draft with a smaller vocabulary is refused" "the draft's vocabulary has 64 tokens, the target writes 128: it was not made for this target" \
  generate --model "$work/t" --draft "$work/v" --prompt-ids 5,6,7 --max-new-tokens 12
for arch in gpt_neox gpt2 opt qwen3 gemma3; do
  "$SPECDEC" make-fixture --out "$work/$arch" --arch $arch --layers 2 --hidden 64 --heads 4 --vocab 128 \
    --init-std 0.1 --exit-layers 1 --exit-scale 0.2 --seed 2 2>/dev/null
  "$SPECDEC" make-fixture --draft-of "$work/$arch" --out "$work/$arch-d" --layers 1 2>/dev/null
  c=$("$SPECDEC" compare --model "$work/$arch" --draft "$work/$arch-d" --prompt-ids 5,6,7 --max-new-tokens 12 --json --warmup 0 \
    --schedule constant)
  check "make-fixture --arch $arch, early-exit draft, identical assisted output" python3 -c "
import json,sys; j=json.loads(sys.argv[1]); assert j['identical'] is True and j['assisted']['stats']['accepted_tokens']>0, j" "$c"
done

# ---- T5 (encoder-decoder): the prompt goes to the encoder; an early-exit draft shares it ----
"$SPECDEC" make-fixture --out "$work/m/t5" --arch t5 --gated --layers 2 --hidden 64 --heads 4 --vocab 128 \
  --init-std 0.1 --exit-layers 1 --exit-scale 0.2 --seed 2 2>/dev/null
"$SPECDEC" make-fixture --draft-of "$work/m/t5" --out "$work/m/t5-d" --layers 1 2>/dev/null
check "make-fixture --arch t5 --gated writes a flan-t5 style config (parent folders created)" python3 -c "
import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); d=json.load(open(sys.argv[2]+'/config.json'))
assert c['feed_forward_proj']=='gated-gelu' and c['is_encoder_decoder'] and c['decoder_start_token_id']==0, c
assert d['num_layers']==2 and d['num_decoder_layers']==1, d" "$work/m/t5" "$work/m/t5-d"
c=$("$SPECDEC" compare --model "$work/m/t5" --draft "$work/m/t5-d" --prompt-ids 5,6,7,8,9 --max-new-tokens 12 --json --warmup 0 \
  --schedule constant)
check "t5: identical assisted output, one shared encoder pass" python3 -c "
import json,sys; j=json.loads(sys.argv[1]); a=j['assisted']['stats']
assert j['identical'] is True and a['accepted_tokens']>0 and a['encoder_passes']==1 and a['prompt_tokens']==5, j" "$c"
expect_error "t5 draft for a decoder-only target" "both be decoder-only or both encoder-decoder" \
  generate --model "$work/t" --draft "$work/m/t5-d" --prompt-ids 1
expect_error "--gated without t5" "--gated is for --arch t5 only" make-fixture --out "$work/x" --gated
expect_error "make-fixture: a scale that is not a number" "exit-scale must be finite" \
  make-fixture --out "$work/x" --exit-scale nan --exit-layers 1
expect_error "make-fixture: a size past memory, before any allocation" "a fixture has at most" \
  make-fixture --out "$work/x" --hidden 1000000 --layers 1000
: > "$work/empty.txt"
expect_error "make-tokenizer: no text to train on" "could not train" make-tokenizer --input "$work/empty.txt" --out "$work/mt"
expect_error "make-tokenizer: a missing input" "no such file" make-tokenizer --input "$work/none.txt" --out "$work/mt"
check "make-tokenizer leaves no folder when it fails" test ! -e "$work/mt"
mkdir -p "$work/mt_there" && echo keep > "$work/mt_there/notes.txt"
expect_error "make-tokenizer into a folder that was there" "could not train" make-tokenizer --input "$work/empty.txt" --out "$work/mt_there"
check "... which keeps its files when training fails" grep -qx keep "$work/mt_there/notes.txt"

# ---- text in, text out (the tiny BPE tokenizer of tests/data) ----
tok="$data/tiny_bpe"
"$SPECDEC" make-fixture --out "$work/tt" --layers 2 --hidden 64 --heads 4 --init-std 0.1 --exit-layers 1 \
  --exit-scale 0.2 --seed 5 --tokenizer "$tok" 2>/dev/null
"$SPECDEC" make-fixture --draft-of "$work/tt" --out "$work/td" --layers 1 2>/dev/null
check "make-fixture --tokenizer copies the tokenizer and sizes the vocabulary" python3 -c "
import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); assert c['vocab_size']==264 and c['eos_token_id']==263, c" "$work/tt"
check "tokenize prints the ids" bash -c "[ \"\$('$SPECDEC' tokenize --tokenizer '$tok' --text 'Hello the')\" = 262,258 ]"
check "tokenize reads stdin, --json" bash -c "[ \"\$(printf 'Hello the' | '$SPECDEC' tokenize --tokenizer '$tok' --json)\" = '{\"ids\":[262,258]}' ]"
check "tokenize --text '' encodes the empty text, as empty stdin does" bash -c "[ \"\$('$SPECDEC' tokenize --tokenizer '$tok' --text '' --json)\" = '{\"ids\":[]}' ] && [ \"\$(printf '' | '$SPECDEC' tokenize --tokenizer '$tok' --json)\" = '{\"ids\":[]}' ]"
check "detokenize prints the text" bash -c "[ \"\$('$SPECDEC' detokenize --tokenizer '$tok' --ids 262,258,263)\" = 'Hello the<|endoftext|>' ]"
check "detokenize --skip-special --json" bash -c "[ \"\$('$SPECDEC' detokenize --tokenizer '$tok' --ids 262,258,263 --skip-special --json)\" = '{\"text\":\"Hello the\"}' ]"
tj=$("$SPECDEC" generate --model "$work/tt" --draft "$work/td" --prompt "Hello the" --max-new-tokens 12 --json)
ids=$("$SPECDEC" generate --model "$work/tt" --prompt-ids 262,258 --max-new-tokens 12 --json)
check "--prompt TEXT is the encoded ids; --json has the text" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
assert a['tokens']==b['tokens'] and isinstance(a['text'], str) and a['text']==b['text'], (a, b)" "$tj" "$ids"
expected=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['text'])" "$tj")
streamed=$("$SPECDEC" generate --model "$work/tt" --draft "$work/td" --prompt "Hello the" --max-new-tokens 12 2>/dev/null)
check "streamed text equals the decoded tokens" test "$streamed" = "$expected"
piped=$(printf 'Hello the\n' | "$SPECDEC" generate --model "$work/tt" --draft "$work/td" --max-new-tokens 12 --no-stream 2>/dev/null)
check "prompt from stdin (its last line break dropped), --no-stream" test "$piped" = "$expected"
mkdir -p "$work/tok2" && cp "$tok"/* "$work/tok2/" && sed -i 's/l l/o l/' "$work/tok2/merges.txt" && rm "$work/tok2/tokenizer.json"
"$SPECDEC" make-fixture --out "$work/td2" --layers 1 --hidden 64 --heads 4 --tokenizer "$work/tok2" 2>/dev/null
expect_error "draft with another tokenizer" "tokenizers differ" generate --model "$work/tt" --draft "$work/td2" --prompt "Hello"
expect_error "text prompt without a tokenizer" "--prompt-ids" generate --model "$work/t" --prompt "Hello"
expect_error "--prompt and --prompt-ids together" "excludes" generate --model "$work/tt" --prompt "Hello" --prompt-ids 1
empty=$("$SPECDEC" detokenize --tokenizer "$tok" --ids "" --json)
check "detokenize of no ids is the empty text" test "$empty" = '{"text":""}'
expect_error "bad ids for detokenize" "not in the tokenizer" detokenize --tokenizer "$tok" --ids 9999
check "--help lists the subcommands" bash -c "'$SPECDEC' --help | grep -q make-fixture && '$SPECDEC' --help | grep -q detokenize && '$SPECDEC' --help | grep -q chat"
expect_error "a model path that does not exist" "no such file or folder" generate --model "$work/nothing.gguf" --prompt "Hi"
expect_error "--system without --chat" "need --chat" generate --model "$work/tt" --prompt "Hello" --system "x"
expect_error "chat without a template" "no chat template" generate --model "$work/tt" --prompt "Hello" --chat

# ---- --prompts-file: JSON Lines in, one JSON line per request out, batched ----
cat > "$work/reqs.jsonl" <<'JSONL'
{"prompt_ids": [5, 6, 7], "max_new_tokens": 12, "id": "first"}

{"prompt": "Hello the", "max_new_tokens": 9}
{"prompt_ids": [9, 3, 4, 8, 1, 2, 40, 41, 42], "max_new_tokens": 7, "do_sample": true, "seed": 7, "temperature": 0.8}
JSONL
for bs in 1 2 3; do
  "$SPECDEC" generate --model "$work/tt" --draft "$work/td" --prompts-file "$work/reqs.jsonl" --batch-size $bs \
    > "$work/out$bs.jsonl" 2>"$work/err$bs"
done
one=$("$SPECDEC" generate --model "$work/tt" --prompt-ids 5,6,7 --max-new-tokens 12 --json)
two=$("$SPECDEC" generate --model "$work/tt" --prompt "Hello the" --max-new-tokens 9 --json)
three=$("$SPECDEC" generate --model "$work/tt" --draft "$work/td" --prompt-ids 9,3,4,8,1,2,40,41,42 --max-new-tokens 7 --do-sample --seed 7 --temperature 0.8 --json)
check "--prompts-file: one line per request, in order, each equal to the request alone, batched (2: the third joins as one finishes) or not" python3 -c "
import json,sys
alone=[json.loads(x) for x in sys.argv[4:7]]
for path in sys.argv[1:4]:
    rows=[json.loads(l) for l in open(path)]
    assert [r['line'] for r in rows]==[1,3,4] and rows[0]['id']=='first' and 'id' not in rows[1], rows
    for r, a in zip(rows, alone): assert r['tokens']==a['tokens'] and r['text']==a['text'], (r, a)
" "$work/out1.jsonl" "$work/out2.jsonl" "$work/out3.jsonl" "$one" "$two" "$three"
check "--prompts-file reports progress on stderr" grep -q "3/3 requests" "$work/err3"
cat > "$work/shared.jsonl" <<'JSONL'
{"prompt_ids": [5, 6, 7, 8, 9, 10], "max_new_tokens": 6}
{"prompt_ids": [5, 6, 7, 8, 9, 11, 12], "max_new_tokens": 6}
{"prompt_ids": [5, 6, 7, 8, 9, 10], "max_new_tokens": 5, "do_sample": true, "seed": 3}
JSONL
"$SPECDEC" generate --model "$work/tt" --draft "$work/td" --prompts-file "$work/shared.jsonl" > "$work/plain.jsonl" 2>/dev/null
"$SPECDEC" generate --model "$work/tt" --draft "$work/td" --prompts-file "$work/shared.jsonl" --prompt-cache \
  > "$work/cached.jsonl" 2>/dev/null
check "--prompt-cache: the same tokens, and each request after the first computes only its prompt after the shared prefix" python3 -c "
import json,sys
plain=[json.loads(l) for l in open(sys.argv[1])]
cached=[json.loads(l) for l in open(sys.argv[2])]
assert [r['tokens'] for r in plain]==[r['tokens'] for r in cached], (plain, cached)
assert [r['stats']['cached_prompt_tokens'] for r in cached]==[0,5,5], [r['stats'] for r in cached]
assert [r['stats']['cached_prompt_tokens'] for r in plain]==[0,0,0]
" "$work/plain.jsonl" "$work/cached.jsonl"
# --speculate suffix: the same request twice; the second is proposed from the first's answer
# (the shared tree), unless --suffix-cache-tokens 0 keeps each request's own text only.
printf '{"prompt_ids": [9, 3, 4, 8, 1, 2], "max_new_tokens": 24}\n%.0s' 1 2 > "$work/twice.jsonl"
"$SPECDEC" generate --model "$work/tt" --prompts-file "$work/twice.jsonl" > "$work/twice_plain.jsonl" 2>/dev/null
for cache in 65536 0; do
  "$SPECDEC" generate --model "$work/tt" --prompts-file "$work/twice.jsonl" --speculate suffix --schedule constant \
    --suffix-cache-tokens $cache > "$work/twice_$cache.jsonl" 2>/dev/null
done
check "--speculate suffix: target-only tokens; a repeated request is proposed from the earlier answer, and not with --suffix-cache-tokens 0" python3 -c "
import json,sys
plain, shared, own = ([json.loads(l) for l in open(p)] for p in sys.argv[1:4])
assert [r['tokens'] for r in plain]==[r['tokens'] for r in shared]==[r['tokens'] for r in own], (plain, shared, own)
s = [r['stats'] for r in shared]; o = [r['stats'] for r in own]
assert s[1]['accepted_tokens'] >= 20 and s[1]['target_passes'] <= 4, s[1]   # 23 of the 24 tokens can be proposed
assert s[0]['accepted_tokens'] < s[1]['accepted_tokens'], s
assert o[1]['accepted_tokens'] == o[0]['accepted_tokens'] == s[0]['accepted_tokens'], (o, s)
" "$work/twice_plain.jsonl" "$work/twice_65536.jsonl" "$work/twice_0.jsonl"
# A line's proposer replaces the flags': suffix speculation under --prompt-lookup 3 (the second of
# two such lines, proposed from the first one's answer, drafts more than 3 tokens in a pass),
# and prompt lookup of 2 under --speculate suffix (at most 2: not suffix speculation, which would
# propose the first answer's 23 tokens); both keys on one line are refused, as by the server.
plain_line='{"prompt_ids": [9, 3, 4, 8, 1, 2], "max_new_tokens": 24'
printf '%s, "speculate": "suffix"}\n%s, "speculate": "suffix"}\n' "$plain_line" "$plain_line" > "$work/choice_suffix.jsonl"
printf '%s}\n%s, "prompt_lookup_num_tokens": 2}\n' "$plain_line" "$plain_line" > "$work/choice_lookup.jsonl"
"$SPECDEC" generate --model "$work/tt" --prompts-file "$work/choice_suffix.jsonl" --prompt-lookup 3 --schedule constant > "$work/choice_suffix.out" 2>/dev/null
"$SPECDEC" generate --model "$work/tt" --prompts-file "$work/choice_lookup.jsonl" --speculate suffix --schedule constant > "$work/choice_lookup.out" 2>/dev/null
check "--prompts-file: a line's speculate or prompt_lookup_num_tokens replaces the flags' proposer" python3 -c "
import json,sys
plain = [json.loads(l)['tokens'] for l in open(sys.argv[1])]
s, l = ([json.loads(x) for x in open(p)] for p in sys.argv[2:4])
assert [r['tokens'] for r in s] == [r['tokens'] for r in l] == plain, (plain, s, l)
assert len(s[1]['stats']['drafted_at_position']) > 3, s[1]['stats']
assert 0 < len(l[1]['stats']['drafted_at_position']) <= 2 and l[1]['stats']['drafted_tokens'] > 0, l[1]['stats']
" "$work/twice_plain.jsonl" "$work/choice_suffix.out" "$work/choice_lookup.out"
printf '%s, "speculate": "suffix", "prompt_lookup_num_tokens": 2}\n' "$plain_line" > "$work/choice_both.jsonl"
expect_error "--prompts-file: speculate suffix and prompt lookup on one line" "give one of them" \
  generate --model "$work/tt" --prompts-file "$work/choice_both.jsonl"
expect_error "--speculate takes suffix or none" "--speculate" generate --model "$work/tt" --prompt-ids 1 --speculate tree
expect_error "--speculate suffix with --prompt-lookup" "prompt" \
  generate --model "$work/tt" --prompt-ids 1 --speculate suffix --prompt-lookup 3
printf '{"prompt": "Hello the", "max_new_tokens": 4}\n{"prompt": "Hello the", "system": "the the", "max_new_tokens": 4}\n' > "$work/sys.jsonl"
# The same turns as "messages": --system goes first where none is given; text parts are joined.
printf '%s\n' '{"messages": [{"role": "user", "content": "Hello the"}], "max_new_tokens": 4}' \
  '{"messages": [{"role": "developer", "content": "the the"}, {"role": "user", "content": [{"type": "text", "text": "Hello the"}]}], "max_new_tokens": 4}' \
  >> "$work/sys.jsonl"
"$SPECDEC" generate --model "$work/tt" --chat --chat-template chatml --system "Hello" --prompts-file "$work/sys.jsonl" \
  > "$work/sys_out.jsonl" 2>/dev/null
sys1=$("$SPECDEC" generate --model "$work/tt" --chat --chat-template chatml --system "Hello" --prompt "Hello the" --max-new-tokens 4 --json)
sys2=$("$SPECDEC" generate --model "$work/tt" --chat --chat-template chatml --system "the the" --prompt "Hello the" --max-new-tokens 4 --json)
check "--prompts-file --chat: --system, or the line's own \"system\" or \"messages\", as with --prompt" python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
alone=[json.loads(x) for x in sys.argv[2:4]] * 2
assert len(rows) == 4, rows
for r, a in zip(rows, alone): assert r['tokens']==a['tokens'] and r['stats']['prompt_tokens']==a['stats']['prompt_tokens'], (r, a)
assert alone[0]['stats']['prompt_tokens']!=alone[1]['stats']['prompt_tokens']
" "$work/sys_out.jsonl" "$sys1" "$sys2"
printf '{"prompt": "Hello", "system": "x"}\n' > "$work/bad_sys.jsonl"
printf '{"messages": [{"role": "user", "content": "Hello"}], "system": "x"}\n' > "$work/bad_msgs.jsonl"
expect_error "--prompts-file: \"messages\" without --chat" 'bad_msgs.jsonl:1: "messages" needs --chat' \
  generate --model "$work/tt" --prompts-file "$work/bad_msgs.jsonl"
expect_error "--prompts-file: \"system\" beside \"messages\"" '"messages" hold their own' \
  generate --model "$work/tt" --chat --chat-template chatml --prompts-file "$work/bad_msgs.jsonl"
expect_error "--prompts-file: \"system\" without --chat" 'bad_sys.jsonl:1: "system" needs --chat' \
  generate --model "$work/tt" --prompts-file "$work/bad_sys.jsonl"
expect_error "--prompt-cache with --batch-size 2" "--prompt-cache runs the requests one after another" \
  generate --model "$work/tt" --prompts-file "$work/shared.jsonl" --prompt-cache --batch-size 2
expect_error "--prompt-cache without --prompts-file" "--prompt-cache requires --prompts-file" \
  generate --model "$work/tt" --prompt "x" --prompt-cache
printf '{"prompt_ids": [5]}\n{"prompt_ids": [5, 4000]}\n' > "$work/bad1.jsonl"
printf '{"prompt_ids": [5]}\n{"prompt_ids": [5]\n' > "$work/bad2.jsonl"
printf '{"prompt_ids": [5], "max_new_token": 3}\n' > "$work/bad3.jsonl"
printf '{"prompt_ids": [5], "temperature": "hot"}\n' > "$work/bad5.jsonl"
expect_error "--prompts-file: id outside the vocabulary names the line" "bad1.jsonl:2: prompt token id 4000 is outside" \
  generate --model "$work/tt" --prompts-file "$work/bad1.jsonl"
expect_error "--prompts-file: malformed JSON names the line" "bad2.jsonl:2: " generate --model "$work/tt" --prompts-file "$work/bad2.jsonl"
expect_error "--prompts-file: unknown knob" 'unknown key "max_new_token"' generate --model "$work/tt" --prompts-file "$work/bad3.jsonl"
printf '{"prompt_ids": [5], "logit_bias": {"5000": 1}}\n' > "$work/bad_bias1.jsonl"
printf '{"prompt_ids": [5], "logit_bias": {"7": 101}}\n' > "$work/bad_bias2.jsonl"
expect_error "--prompts-file: logit_bias id outside the vocabulary" "bad_bias1.jsonl:1: logit_bias token id 5000 is outside" \
  generate --model "$work/tt" --prompts-file "$work/bad_bias1.jsonl"
printf '{"prompt_ids": [5], "draft_tree_width": 3}\n' > "$work/bad_tree.jsonl"
expect_error "--prompts-file: a line's draft_tree_width needs --draft" 'bad_tree.jsonl:1: "draft_tree_width" needs --draft' \
  generate --model "$work/tt" --prompts-file "$work/bad_tree.jsonl"
printf '{"prompt_ids": [5], "max_matching_ngram_size": 18446744073709551615}\n' > "$work/bad_big.jsonl"
expect_error "--prompts-file: an integer past int64 is named, not wrapped" \
  'bad_big.jsonl:1: "max_matching_ngram_size" is out of range, got 18446744073709551615' \
  generate --model "$work/tt" --prompts-file "$work/bad_big.jsonl"
printf '{"prompt_ids": [18446744073709551615]}\n' > "$work/bad_id.jsonl"
expect_error "--prompts-file: a prompt id past int64 is named, not wrapped" \
  'bad_id.jsonl:1: prompt token id 18446744073709551615 is outside the vocabulary' \
  generate --model "$work/tt" --prompts-file "$work/bad_id.jsonl"
printf '{"prompt_ids": [5, 6, 5, 6, 5, 6, 5], "speculate": "none"}\n' > "$work/none.jsonl"
check '--prompts-file: "speculate": "none" turns --prompt-lookup off' python3 -c "
import json,sys; s=json.loads(sys.argv[1].splitlines()[0])['stats']; assert s['drafted_tokens']==0, s" \
  "$("$SPECDEC" generate --model "$work/tt" --prompts-file "$work/none.jsonl" --prompt-lookup 3 --schedule constant --max-new-tokens 6)"
expect_error "--prompts-file: logit_bias out of range" "bad_bias2.jsonl:1: logit_bias: the bias of token 7 must be in [-100, 100]" \
  generate --model "$work/tt" --prompts-file "$work/bad_bias2.jsonl"
printf '{"prompt_ids": [5, 6, 5], "max_new_tokens": 4, "logit_bias": {"9": 100}}\n' > "$work/bias.jsonl"
check "--prompts-file: logit_bias +100 forces its token" python3 -c "
import json,subprocess,sys
out=subprocess.run(sys.argv[1:],capture_output=True,text=True,check=True).stdout
assert json.loads(out)['tokens']==[9]*4, out
" "$SPECDEC" generate --model "$work/tt" --prompts-file "$work/bias.jsonl" --prompt-lookup 2
printf '{"prompt_ids": [5, 6, 5, 6, 5], "max_new_tokens": 6}\n{"prompt_ids": [5, 6, 5, 6, 5], "max_new_tokens": 6, "prompt_lookup_num_tokens": 2, "num_assistant_tokens_schedule": "constant"}\n{"prompt_ids": [7, 8, 7], "max_new_tokens": 5}\n' > "$work/mixed.jsonl"
mixed_alone=$("$SPECDEC" generate --model "$work/tt" --prompt-ids 7,8,7 --max-new-tokens 5 --json)
check "--prompts-file: requests with and without prompt lookup in one file, --batch-size 2" python3 -c "
import json,subprocess,sys
out=subprocess.run(sys.argv[1:4]+['--prompts-file',sys.argv[4],'--batch-size','2'],capture_output=True,text=True,check=True).stdout
rows=[json.loads(l) for l in out.splitlines()]
assert [r['line'] for r in rows]==[1,2,3], rows
assert rows[0]['tokens']==rows[1]['tokens'] and len(rows[0]['tokens'])==6, rows
assert rows[1]['stats']['drafted_tokens']>0 and rows[0]['stats']['drafted_tokens']==0, rows
assert rows[2]['tokens']==json.loads(sys.argv[5])['tokens'], rows
" "$SPECDEC" generate --model="$work/tt" "$work/mixed.jsonl" "$mixed_alone"
expect_error "--prompts-file: a knob of the wrong type" '"temperature" must be a number' \
  generate --model "$work/tt" --prompts-file "$work/bad5.jsonl"
nothing=$("$SPECDEC" generate --model "$work/tt" --prompts-file "$work/bad1.jsonl" 2>/dev/null)
check "--prompts-file: nothing is written when a request fails validation" test -z "$nothing"
expect_error "--prompts-file and --prompt together" "excludes" generate --model "$work/tt" --prompt "x" --prompts-file "$work/reqs.jsonl"
expect_error "--batch-size 0" "--batch-size must be >= 1" generate --model "$work/tt" --prompts-file "$work/reqs.jsonl" --batch-size 0
expect_error "--batch-size without --prompts-file" "--batch-size requires --prompts-file" generate --model "$work/tt" --prompt "x" --batch-size 2

# ---- files written in one call: nothing stale, nothing half-written ----
mkdir -p "$work/full" && echo keep > "$work/full/tokenizer.json"
expect_error "make-fixture refuses a folder with files" "exists and is not empty" make-fixture --out "$work/full"
check "... and leaves them alone" grep -qx keep "$work/full/tokenizer.json"
expect_error "make-fixture --draft-of takes the target's shape" "--arch excludes --draft-of" \
  make-fixture --draft-of "$work/t" --out "$work/x" --arch gpt2
expect_error "--noise needs --draft-of" "--noise requires --draft-of" make-fixture --out "$work/x" --noise 0.1
expect_error "make-fixture --seed -1 is refused (not wrapped around)" "the seed must be an integer" \
  make-fixture --out "$work/x" --seed -1
expect_error "make-draft --layers and --layer-ids together" "excludes" \
  make-draft --target "$work/t" --out "$work/x" --data "$work/train.txt" --layers 1 --layer-ids 0
# Ctrl-C once the weights are being written (into a scratch folder beside the output)
"$SPECDEC" make-fixture --out "$work/int/o" --hidden 1024 --layers 12 --vocab 32000 2>"$work/int_err" &
pid=$!
for _ in $(seq 1200); do
  compgen -G "$work/int/.o.partial-*/*" >/dev/null && break
  sleep 0.05
done
kill -INT $pid
wait $pid
rc=$?
check "Ctrl-C during make-fixture leaves nothing (not even the parent it made), status 130" \
  bash -c "[ $rc = 130 ] && [ ! -e '$work/int' ] && grep -q 'interrupted: nothing was written' '$work/int_err'"
cat "$(dirname "$0")"/../../docs/*.md > "$work/a corpus.txt"
"$SPECDEC" make-tokenizer --input "$work/a corpus.txt" --out "$work/a tok/sub" --vocab-size 500 2>/dev/null
check "make-tokenizer: paths with spaces, parents made" test -s "$work/a tok/sub/tokenizer.model"
cp "$work/a tok/sub/tokenizer.model" "$work/tok_before"
expect_error "make-tokenizer: an existing tokenizer.model is not overwritten" "tokenizer.model: already exists" \
  make-tokenizer --input "$work/a corpus.txt" --out "$work/a tok/sub" --vocab-size 600
check "... and stays as it was" cmp -s "$work/tok_before" "$work/a tok/sub/tokenizer.model"
expect_error "make-fixture: --out \"\" is an empty value" "--out: the value is empty" make-fixture --out ""
"$SPECDEC" make-fixture --out "$work/mode" --layers 1 --hidden 32 --heads 2 --vocab 64 2>/dev/null
check "make-fixture: its folder has mkdir's permissions (umask $(umask)), not 0700" \
  test "$(stat -c %a "$work/mode")" = "$(printf '%o' $((0777 & ~0$(umask))))"
expect_error "make-tokenizer: too small a vocabulary for the text says so in specdec's words" \
  "--vocab-size 260 is too small for this text" make-tokenizer --input "$work/a corpus.txt" --out "$work/x" --vocab-size 260
expect_error "--prompt \"\" with a tokenizer that adds no BOS: nothing to begin from (not a read of stdin)" \
  "the prompt is empty (give --prompt TEXT or --prompt-ids, or the text on stdin); this tokenizer adds no BOS" \
  generate --model "$work/tt" --prompt "" < /dev/null
"$SPECDEC" make-fixture --out "$work/spm" --layers 1 --hidden 32 --heads 2 --tokenizer "$work/a tok/sub" 2>/dev/null
check "--prompt \"\" with a tokenizer that adds BOS begins from BOS alone (Hugging Face's and llama.cpp's generation from nothing)" \
  python3 -c "
import json, subprocess, sys
run = lambda *a: json.loads(subprocess.run([sys.argv[1], 'generate', '--model', sys.argv[2], '--max-new-tokens', '4', '--json', *a], capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout)
bos = subprocess.run([sys.argv[1], 'tokenize', '--tokenizer', sys.argv[2], '--text', ''], capture_output=True, text=True, check=True).stdout.strip()
assert bos and ',' not in bos, bos
a, b = run('--prompt', ''), run('--prompt-ids', bos)
assert a['stats']['prompt_tokens'] == 1 and a['tokens'] == b['tokens'], (a, b)" "$SPECDEC" "$work/spm"
expect_error "--chat with nothing on stdin: the prompt is empty (as without --chat)" "the prompt is empty" \
  generate --model "$work/t" --tokenizer "$data/tiny_bpe" --chat --chat-template chatml < /dev/null
expect_error "--prompt-ids with a trailing comma" "ends with a comma" generate --model "$work/t" --prompt-ids 1,
check "--version" bash -c "'$SPECDEC' --version | grep -q '^specdec [0-9]'"
printf '%s\n' '{"prompt_ids": [1], "max_new_tokens": 4}' '' '{"prompt_ids": [1], "max_new_tokens": 5000}' > "$work/ctx.jsonl"
out=$("$SPECDEC" generate --model "$work/t" --prompts-file "$work/ctx.jsonl" --prompt-cache 2>"$work/ctx_err"); rc=$?
check "--prompts-file: a line past the context names its line, before anything runs" \
  bash -c "[ $rc -ne 0 ] && [ -z '$out' ] && grep -q 'ctx.jsonl:3: the prompt (1 token) plus max_new_tokens (5000)' '$work/ctx_err'"
echo '{"prompt_ids": [262, 258]}' > "$work/chat_ids.jsonl"
expect_error "--prompts-file: prompt_ids with --chat is refused, as --prompt-ids is" "a chat turn is text" \
  generate --model "$work/tt" --chat --chat-template chatml --prompts-file "$work/chat_ids.jsonl"

# Output that cannot be written (a full disk) is an error, never a silent exit 0, with its reason;
# a --prompts-file run ends at the first line it loses.
full() { # full NAME STDIN ARGS...: the command exits 1 saying it cannot write, with stdout on /dev/full
  local name=$1 input=$2; shift 2
  check "a full stdout is an error: $name" bash -c \
    "! printf '%s' \"\$1\" | \"\$0\" \"\${@:2}\" > /dev/full 2> '$work/full.err' && grep -q 'cannot write the output (stdout): No space left on device' '$work/full.err'" \
    "$SPECDEC" "$input" "$@"
}
full "generate" "" generate --model "$work/t" --prompt-ids 1,2 --max-new-tokens 3
full "generate --json" "" generate --model "$work/t" --prompt-ids 1,2 --max-new-tokens 3 --json
full "--prompts-file" $'{"prompt_ids": [1, 2]}\n{"prompt_ids": [3]}\n' generate --model "$work/t" --prompts-file - --max-new-tokens 3
full "--prompts-file --batch-size 2" $'{"prompt_ids": [1, 2]}\n{"prompt_ids": [3]}\n{"prompt_ids": [4]}\n' \
  generate --model "$work/t" --prompts-file - --max-new-tokens 3 --batch-size 2
full "--help" "" --help
full "generate --help" "" generate --help

# The real model, when scripts/get_models.sh has fetched it.
smol=${SPECDEC_MODELS:-$(dirname "$0")/../../models}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$smol" ]; then
  ans=$("$SPECDEC" generate --model "$smol" --chat --prompt "What is the capital of France?" --max-new-tokens 24 2>/dev/null)
  check "SmolLM2 GGUF: a chat answer" test "$ans" = "The capital of France is Paris."
  folder=$("$SPECDEC" generate --model "$(dirname "$smol")" --chat --prompt "What is the capital of France?" --max-new-tokens 24 --prompt-lookup 5 2>/dev/null)
  check "SmolLM2 GGUF: a folder holding it, prompt lookup, same answer" test "$folder" = "$ans"
  conv=$(printf 'Hi, my name is Ada.\n/stats\nWhat is my name?\n/stats\n/reset\nWhat is my name?\n' |
    "$SPECDEC" chat --model "$smol" --max-new-tokens 40 --prompt-lookup 5 2>"$work/chat_err")
  one=$("$SPECDEC" generate --model "$smol" --chat --prompt "Hi, my name is Ada." --max-new-tokens 40 2>/dev/null)
  fresh=$("$SPECDEC" generate --model "$smol" --chat --prompt "What is my name?" --max-new-tokens 40 2>/dev/null)
  check "chat: turn 1 and the turn after /reset are one-shot answers; turn 2 sees the history" python3 -c "
import sys; lines=sys.argv[1].strip().split('\\n'); assert len(lines)==3, lines
assert lines[0]==sys.argv[2] and lines[2]==sys.argv[3] and lines[1]!=sys.argv[3], lines" "$conv" "$one" "$fresh"
  # A conversation's next turn as a --prompts-file line of "messages": the chat's second answer.
  python3 -c "
import json,sys
turn1=sys.argv[1].strip().split('\\n')[0]
print(json.dumps({'messages': [{'role': 'user', 'content': 'Hi, my name is Ada.'}, {'role': 'assistant', 'content': turn1},
                               {'role': 'user', 'content': 'What is my name?'}], 'max_new_tokens': 40}))" "$conv" > "$work/turn2.jsonl"
  check "--prompts-file \"messages\": a conversation's next turn, as chat answers it" python3 -c "
import json,sys
assert json.loads(sys.argv[1])['text'] == sys.argv[2].strip().split('\\n')[1], sys.argv[1:]" \
    "$("$SPECDEC" generate --model "$smol" --chat --prompts-file "$work/turn2.jsonl" 2>/dev/null)" "$conv"
  check "chat: /stats and the reset notice go to stderr" bash -c "grep -q 'target passes' '$work/chat_err' && grep -q 'reset' '$work/chat_err'"
  check "chat: /stats ends with the session's tokens, seconds and rate" \
    grep -Eq '^session: [1-9][0-9]* tokens in [0-9]+\.[0-9]{3} s \([0-9]+\.[0-9]{2} tok/s\)$' "$work/chat_err"
  check "chat: turn 2 continues turn 1's cache (and only turn 2)" \
    test "$(grep -c "prompt tokens came from the conversation's cache" "$work/chat_err")" = 1
  multi=$(printf 'Name three colours.\\\nAnswer in French.\n' | "$SPECDEC" chat --model "$smol" --max-new-tokens 24 2>/dev/null)
  multi_one=$("$SPECDEC" generate --model "$smol" --chat --prompt $'Name three colours.\nAnswer in French.' --max-new-tokens 24 2>/dev/null)
  check "chat: a line ending in a backslash goes on to the next, the line break kept" test "$multi" = "$multi_one"
  slash=$(printf '//etc/hosts is what?\n' | "$SPECDEC" chat --model "$smol" --max-new-tokens 12 2>/dev/null)
  slash_one=$("$SPECDEC" generate --model "$smol" --chat --prompt "/etc/hosts is what?" --max-new-tokens 12 2>/dev/null)
  check "chat: // sends a message that begins with /" test "$slash" = "$slash_one"
  check "chat: an unknown command names the // escape" bash -c "printf '/etc\n' | '$SPECDEC' chat --model '$smol' 2>&1 | grep -q 'begin with //'"
  # Commands as typed: spaces around them and any case (the message after /EXIT is never answered).
  check "chat: ' /Stats ' and '/EXIT' are commands" bash -c \
    "out=\$(printf ' /Stats \n/EXIT\nHi\n' | '$SPECDEC' chat --model '$smol' --max-new-tokens 4 2>&1); [[ \$out == *'(no answer yet)'* && \$out != *'unknown command'* && \$out != *'tokens/pass'* ]]"
  # Ctrl-C while a long message goes in: the answer stops before its first token, once the message
  # is in, and the turn is dropped (it kept a one-token answer); the chat goes on.
  mkfifo "$work/chat_in"
  env --default-signal=INT "$SPECDEC" chat --model "$smol" --max-new-tokens 8 < "$work/chat_in" > "$work/int_out" 2> "$work/int_err" &
  pid=$!
  exec 3> "$work/chat_in"
  for _ in $(seq 600); do grep -q 'specdec chat (' "$work/int_err" && break; sleep 0.05; done
  python3 -c "print(' '.join(['word'] * 3000))" >&3
  sleep 1
  kill -INT $pid
  printf '/stats\n/exit\n' >&3
  exec 3>&-
  wait $pid
  rc=$?
  check "chat: Ctrl-C while the message goes in drops the turn, and the chat goes on" bash -c \
    "[ $rc = 0 ] && grep -q 'stopped before the answer began' '$work/int_err' && grep -q '(no answer yet)' '$work/int_err' && [ ! -s '$work/int_out' ]"
  # make-draft --resume under another thread count (the target's fingerprint once held a float sum
  # of its embedding rows, whose rounding followed the threads).
  python3 -c "import random; random.seed(1); w='the cat sat on a mat and a dog ran to the big red house'.split(); print(' '.join(random.choice(w) for _ in range(400)))" > "$work/md_text.txt"
  "$SPECDEC" make-draft --target "$smol" --out "$work/md_threads" --layers 1 --vocab-subset 1024 --data "$work/md_text.txt" \
    --steps 1 --seq-len 32 --batch 2 --threads 2 > /dev/null 2>&1
  check "make-draft: a run resumes under another --threads" bash -c '"$@" > /dev/null 2>&1' _ \
    "$SPECDEC" make-draft --target "$smol" --out "$work/md_threads" --resume --steps 2 --threads 1
  # tokenize --chat: the prompt generate --chat computes, and its text (SmolLM2's template puts its
  # default system prompt before a conversation without one).
  check "tokenize --chat: generate --chat's prompt, and the text the template renders" python3 -c "
import json, subprocess, sys
spec, smol = sys.argv[1:]
t = json.loads(subprocess.run([spec, 'tokenize', '--tokenizer', smol, '--chat', '--text', 'Hi', '--json'], capture_output=True, text=True, check=True).stdout)
g = json.loads(subprocess.run([spec, 'generate', '--model', smol, '--chat', '--prompt', 'Hi', '--max-new-tokens', '1', '--json'], capture_output=True, text=True, check=True).stdout)
assert len(t['ids']) == g['stats']['prompt_tokens'], (len(t['ids']), g['stats']['prompt_tokens'])
assert t['text'] == '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n', t['text']
plain = subprocess.run([spec, 'tokenize', '--tokenizer', smol, '--no-special', '--text', t['text']], capture_output=True, text=True, check=True).stdout.strip()
assert plain == ','.join(map(str, t['ids'])), plain
" "$SPECDEC" "$smol"
  expect_error "tokenize: --system without --chat" "--system and --chat-template go with --chat" \
    tokenize --tokenizer "$smol" --text Hi --system S
  # An empty --system is an empty system turn (Hugging Face's template renders a system message
  # whatever its content), not the template's default one.
  check "--system '' renders an empty system turn" python3 -c "
import json, subprocess, sys
spec, smol = sys.argv[1:]
t = json.loads(subprocess.run([spec, 'tokenize', '--tokenizer', smol, '--chat', '--system', '', '--text', 'Hi', '--json'], capture_output=True, text=True, check=True).stdout)
assert t['text'] == '<|im_start|>system\\n<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n', t['text']
g = json.loads(subprocess.run([spec, 'generate', '--model', smol, '--chat', '--system', '', '--prompt', 'Hi', '--max-new-tokens', '1', '--json'], capture_output=True, text=True, check=True).stdout)
assert len(t['ids']) == g['stats']['prompt_tokens'], (len(t['ids']), g['stats']['prompt_tokens'])
" "$SPECDEC" "$smol"
  check "tokenize --chat warns about a template of another model" bash -c \
    "'$SPECDEC' tokenize --tokenizer '$smol' --chat --chat-template llama3 --text Hi 2>&1 >/dev/null | grep -q 'end of turn, <|eot_id|>, is no token'"
  # A tokenizer or chat template of another model is used as asked, with a warning; a prompt that
  # holds tokens the model lacks is refused, naming --tokenizer.
  check "a --tokenizer of another model is warned about" bash -c \
    "'$SPECDEC' generate --model '$work/t' --tokenizer '$smol' --prompt a --max-new-tokens 2 2>&1 >/dev/null | grep -q 'tokenizer has 49152 tokens, the model 128'"
  expect_error "... and a prompt with tokens the model lacks is refused, naming --tokenizer" \
    "the prompt holds token 26843 of --tokenizer, which the model's vocabulary [0, 128) lacks" \
    generate --model "$work/t" --tokenizer "$smol" --prompt Hi --max-new-tokens 2
  check "a --chat-template of another model family is warned about" bash -c \
    "'$SPECDEC' generate --model '$smol' --chat --chat-template gemma --prompt Hi --max-new-tokens 2 2>&1 >/dev/null | grep -q 'end of turn, <end_of_turn>, is no token'"
  check "... and the model's own template is not" bash -c \
    "! '$SPECDEC' generate --model '$smol' --chat --prompt Hi --max-new-tokens 2 2>&1 >/dev/null | grep -q warning"
  # Text that is not UTF-8: the error names where it came from, and the byte in it.
  expect_error "--chat: a bad byte in --prompt is named there" "--prompt: text is not valid UTF-8 (byte 3)" \
    generate --model "$smol" --chat --prompt $'caf\xe9'
  expect_error "--chat: a bad byte in --system is named there" "--system: text is not valid UTF-8 (byte 1)" \
    generate --model "$smol" --chat --system $'s\xe9' --prompt "Hi"
  check "chat: a bad byte in a message is named there" bash -c \
    "printf 'caf\\xe9\\n' | '$SPECDEC' chat --model '$smol' 2>&1 | grep -q 'your message: text is not valid UTF-8 (byte 3)'"
  # chat: Ctrl-C (SIGINT) while an answer streams stops that answer; the conversation goes on.
  rm -f "$work/chat_in" && mkfifo "$work/chat_in"
  # (A script's background job ignores SIGINT, and chat leaves it ignored: SIGINT is restored first.)
  python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$SPECDEC" chat --model "$smol" --max-new-tokens 3000 < "$work/chat_in" > "$work/chat_out" 2> "$work/chat_err" &
  chat_pid=$!
  exec 7> "$work/chat_in"
  printf 'Write a very long story about a dragon.\n' >&7
  for _ in $(seq 600); do [ -s "$work/chat_out" ] && break; sleep 0.1; done  # the answer streams
  kill -INT "$chat_pid"
  sleep 0.5
  printf 'Say hi.\n/stats\n/exit\n' >&7
  exec 7>&-
  chat_rc=0; wait "$chat_pid" || chat_rc=$?
  check "chat: Ctrl-C stops the answer, and the next turn is answered (to its end)" bash -c \
    "[ $chat_rc -eq 0 ] && grep -q 'answer stopped' '$work/chat_err' && grep -Eq 'stop: (eos|max_new_tokens)' '$work/chat_err'"
  # generate: Ctrl-C while the answer streams ends its line, prints the stats (stop: cancelled)
  # and exits 130.
  python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$SPECDEC" generate --model "$smol" --chat --prompt "Write a very long story about a dragon." \
    --max-new-tokens 3000 > "$work/gen_out" 2> "$work/gen_err" &
  gen_pid=$!
  for _ in $(seq 600); do [ -s "$work/gen_out" ] && break; sleep 0.1; done
  kill -INT "$gen_pid"
  gen_rc=0; wait "$gen_pid" || gen_rc=$?
  check "generate: Ctrl-C ends the streamed line, says stop: cancelled, exits 130" bash -c \
    "[ $gen_rc -eq 130 ] && [ \"\$(tail -c 1 '$work/gen_out' | od -An -c | tr -d ' ')\" = '\\n' ] && grep -q 'stop: cancelled' '$work/gen_err'"
  # The stats line: the prompt's tokens (counted by tokenize) and the rate after the prefill.
  n_prompt=$("$SPECDEC" tokenize --tokenizer "$smol" --chat --text "What is the capital of France?" | tr ',' '\n' | wc -l)
  "$SPECDEC" generate --model "$smol" --chat --prompt "What is the capital of France?" --max-new-tokens 24 2> "$work/stats_err" > /dev/null
  check "generate: the stats line gives the rate after the prefill and the prompt's tokens and time" \
    grep -Eq "^[0-9]+ new tokens in [0-9.]+ s \([0-9.]+ tok/s, [0-9.]+ after the prefill: $n_prompt prompt tokens in [0-9.]+ s\); " "$work/stats_err"
  # On a terminal, a long prompt's prefill shows a line on stderr, erased before the answer.
  command -v script > /dev/null || { echo "FAIL: script (util-linux's bsdutils) is needed"; fails=$((fails + 1)); }
  long=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog.'] * 150))")
  n_long=$("$SPECDEC" tokenize --tokenizer "$smol" --text "$long" | tr ',' '\n' | wc -l)
  timeout 300 script -qfec "'$SPECDEC' generate --model '$smol' --prompt '$long' --max-new-tokens 2 --threads 1" /dev/null > "$work/tty_out"
  check "generate on a terminal: 'reading the prompt' with its tokens while a long prompt goes in, erased before the answer" \
    python3 -c "
import re, sys
out = open(sys.argv[1], encoding='utf-8', newline='').read()
notes = [m.end() for m in re.finditer(r'\r\x1b\[Kspecdec: reading the prompt \(' + sys.argv[2] + r' tokens\)\.\.\. [1-9][0-9]* s', out)]
assert notes, repr(out[:300])
rest = out[notes[-1]:]
assert rest.startswith('\r\x1b[K') and 'reading' not in rest and 'new tokens in' in rest, repr(rest)" "$work/tty_out" "$n_long"
  timeout 300 script -qfec "'$SPECDEC' generate --model '$smol' --prompt '$long' --max-new-tokens 2 --threads 1 --json" /dev/null > "$work/tty_json"
  check "... and with --json, erased before the JSON" python3 -c "
import json, sys
out = open(sys.argv[1], encoding='utf-8', newline='').read()
assert 'reading the prompt (' + sys.argv[2] + ' tokens)' in out, repr(out[:300])
rest = out[out.rindex('\r\x1b[K') + 4:]
assert json.loads(rest)['stats']['new_tokens'] == 2, repr(rest)" "$work/tty_json" "$n_long"
  "$SPECDEC" generate --model "$smol" --prompt "$long" --max-new-tokens 2 --threads 1 > /dev/null 2> "$work/notty_err"
  check "... and not when stderr is not a terminal" bash -c "! grep -q 'reading the prompt' '$work/notty_err'"
  # On a terminal, the note before reading stdin names the subcommand's own flag.
  tty_note=$( (sleep 1; printf 'hi\n\004') | timeout 60 script -q -c "'$SPECDEC' tokenize --tokenizer '$smol'" /dev/null)
  check "tokenize: reading a terminal, the note names --text" grep -q "or use --text TEXT" <<<"$tty_note"
  full "tokenize" "" tokenize --tokenizer "$smol" --text "Hello"
  full "detokenize" "" detokenize --tokenizer "$smol" --ids 19556,905
  ids=$("$SPECDEC" tokenize --tokenizer "$smol" --text "Hello world 123")
  check "tokenize from GGUF metadata (digits split, no BOS)" test "$ids" = "19556,905,216,33,34,35"
  expect_error "unknown --chat-template" "unknown chat template" generate --model "$smol" --chat --chat-template vicuna --prompt "Hi"
else
  echo "skip SmolLM2 checks: $smol absent (scripts/get_models.sh fetches it)"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
