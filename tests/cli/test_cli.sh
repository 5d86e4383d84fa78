#!/usr/bin/env bash
# End-to-end checks of the specdec program: JSON output, streaming, errors, make-fixture.
# Usage: SPECDEC=path/to/specdec test_cli.sh WORKDIR
set -u
work=$1
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

cmp=$("$SPECDEC" compare --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 --json --warmup 0)
check "compare --json reports identical outputs and a speedup" python3 -c "
import json,sys; j=json.loads(sys.argv[1]); assert j['identical'] is True and j['speedup']>0 and 'predicted_speedup' in j" "$cmp"

stream=$("$SPECDEC" generate --model "$work/t" --draft "$work/d" --prompt-ids 5,6,7 --max-new-tokens 12 2>/dev/null)
check "streamed ids equal the JSON tokens" python3 -c "
import json,sys; assert [int(x) for x in sys.argv[1].split()]==json.loads(sys.argv[2])['tokens']" "$stream" "$out"

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
expect_error "missing model folder" "/nonexistent/config.json" generate --model /nonexistent --prompt-ids 1
expect_error "bad schedule" "--schedule" generate --model "$work/t" --prompt-ids 1 --schedule sometimes
expect_error "token outside the vocabulary" "outside the vocabulary" generate --model "$work/t" --prompt-ids 1000
expect_error "zero max-new-tokens" "max_new_tokens must be >= 1" generate --model "$work/t" --prompt-ids 1 --max-new-tokens 0
expect_error "draft of a missing target" "config.json" make-fixture --draft-of /nonexistent --out "$work/x" --layers 1
expect_error "unknown subcommand" "" nosuchcommand
"$SPECDEC" make-fixture --out "$work/v" --vocab 64 --layers 1 --hidden 64 --heads 4 2>/dev/null
expect_error "draft with another vocabulary" "different vocab sizes" generate --model "$work/t" --draft "$work/v" --prompt-ids 1
check "--help lists the subcommands" bash -c "'$SPECDEC' --help | grep -q make-fixture"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
