#!/usr/bin/env python3
"""Hugging Face's outputs for the real SmolLM2-135M-Instruct GGUF, as small test data.

Run with the project's virtual environment (scripts/setup_python.sh makes it):
    .venv/bin/python scripts/hf_reference_smollm2.py models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        tests/data/smollm2/reference.json [--tokenizer-only]

--tokenizer-only recomputes the tokenizer cases alone and keeps the file's other sections.

transformers 4.47 loads the GGUF and dequantizes it to float32 (LlamaForCausalLM, tied head). What is
recorded:
  logits:  for a few prompts, the top-20 logits (ids and values) at every position of one forward pass;
  greedy:  for 12 chat prompts (the GGUF's chat template, applied by transformers' Jinja renderer),
           the prompt ids and 64 greedy tokens (argmax of transformers' own forward with its KV cache;
           generation does not stop at EOS here: the tests cut at the first EOS themselves);
  tokenizer: ids of the shared tokenizer test strings (no special tokens) and their decoded text;
  prompt_lookup: for the 8 input-grounded prompts of benchmarks/prompts/grounded.txt (chat-formatted),
           transformers' own assisted generation with prompt_lookup_num_tokens=10 (64 new tokens,
           greedy, EOS <|im_end|>): the tokens and the per-pass trace [candidates, accepted], recorded
           by wrapping PromptLookupCandidateGenerator.

Tokenizer notes (transformers 4.47's GGUF converter, integrations/ggml.py GGUFLlamaConverter):
  - it ignores `tokenizer.ggml.add_bos_token` (false in this file) and adds <|im_start|> as BOS, and it
    swaps the bos/eos names; so only ids without special tokens are recorded (llama.cpp and the original
    SmolLM2 tokenizer add nothing);
  - it ignores `tokenizer.ggml.pre` ("smollm": digits split one by one, then GPT-2's byte-level regex);
    the converted tokenizer is patched here to that pre-tokenizer, the one of SmolLM2's own
    tokenizer.json. (SmolLM2's merges never join digits, so the two agree on every recorded string;
    the script checks that and says so);
  - it turns clean_up_tokenization_spaces on (its Llama 3 setting); SmolLM2's tokenizer_config.json has it
    off and llama.cpp does no clean-up, so text is decoded without it.
"""
import glob
import json
import os
import sys

import torch
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for learning to play the guitar.",
    "Rewrite this sentence in the passive voice: The cat chased the mouse across the garden.",
    "Translate to French: Good morning, how are you today?",
    "What is 12 times 7?",
    "Write a Python function that returns the square of a number.",
    "List the planets of the solar system in order from the sun.",
    "Summarise this: The meeting was moved from Monday to Wednesday because the manager was travelling, "
    "and the budget review will now happen on Friday.",
    "Who wrote Romeo and Juliet?",
    "Extract the email address from this text: Please contact jane.doe@example.com for the tickets.",
]
LOGIT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
]
SYSTEM_CHATS = [
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Say hello."}],
    [
        {"role": "user", "content": "Hi, my name is Ada."},
        {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
        {"role": "user", "content": "What is my name?"},
    ],
]
NEW_TOKENS = 64
TOP = 20


def greedy(model, ids, n):
    out, past, nxt = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            r = model(nxt, past_key_values=past, use_cache=True)
            past = r.past_key_values
            tok = int(r.logits[0, -1].argmax())
            out.append(tok)
            nxt = torch.tensor([[tok]])
    return out


def prompt_lookup_traces(model, tok, prompts):
    from transformers.generation import candidate_generator as cg
    cls = cg.PromptLookupCandidateGenerator
    trace = []
    orig_get, orig_update = cls.get_candidates, cls.update_candidate_strategy

    def get_candidates(self, input_ids):
        out, logits = orig_get(self, input_ids)
        trace.append([out.shape[1] - input_ids.shape[1], 0])
        return out, logits

    def update(self, input_ids, scores, num_matches):
        trace[-1][1] = int(num_matches)
        return orig_update(self, input_ids, scores, num_matches)

    cls.get_candidates, cls.update_candidate_strategy = get_candidates, update
    cases = []
    for p in prompts:
        text = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        trace.clear()
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             prompt_lookup_num_tokens=10, eos_token_id=2, pad_token_id=2,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long), synced_gpus=False)
        cases.append({"prompt": p, "prompt_ids": ids, "tokens": out[0, len(ids):].tolist(), "trace": [list(t) for t in trace]})
        print("prompt lookup:", trace, flush=True)
    cls.get_candidates, cls.update_candidate_strategy = orig_get, orig_update
    return cases


def main():
    args = [a for a in sys.argv[1:] if a != "--tokenizer-only"]
    tokenizer_only = len(args) < len(sys.argv) - 1
    gguf_path, out_path = args[0], args[1]
    shared = os.environ.get("SPECDEC_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    d, f = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)

    as_converted = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])

    strings = []
    refs = sorted(glob.glob(os.path.join(shared, "fixtures", "tokenizers", "*", "reference.json")))
    if refs:
        strings = [c["text"] for c in json.load(open(refs[0]))["cases"]]
    strings += ["Numbers: 3.14159, 2024-11-22, x1y22z333 and 1,000,000.", " 42 ", "a1 b2"]
    # Bytes the vocabulary lacks (0x04 0x06 0x13 0x14 0x16 0x1D, lead bytes 0xF1 0xF2): unk_token, a
    # run of them one.
    strings += ["a\x04b", "\x1c\x1d\x1e sep", "\x13\x14\x16", "x\U00050000y", "tab\x06\x06 end\x1d"]
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        if ids != as_converted.encode(s, add_special_tokens=False):
            print("note: the converted tokenizer (GPT-2 regex) differs on", repr(s))
        cases.append({"text": s, "ids": ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)})

    if tokenizer_only:  # the other sections as they are
        out = json.load(open(out_path))
        out["tokenizer"] = cases
        write(out, out_path)
        return
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    chats = [[{"role": "user", "content": p}] for p in CHAT_PROMPTS] + SYSTEM_CHATS
    greedy_cases = []
    for i, msgs in enumerate(chats):
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        new = greedy(model, ids, NEW_TOKENS)
        greedy_cases.append({"messages": msgs, "text": text, "prompt_ids": ids, "greedy": new,
                             "greedy_text": tok.decode(new, clean_up_tokenization_spaces=False)})
        print(f"[{i + 1}/{len(chats)}] {tok.decode(new)!r}", flush=True)

    logit_cases = []
    with torch.no_grad():
        for p in LOGIT_PROMPTS:
            ids = tok.encode(p, add_special_tokens=False)
            logits = model(torch.tensor([ids])).logits[0]  # [T, V]
            top = logits.topk(TOP, dim=-1)
            logit_cases.append({"text": p, "ids": ids, "top_ids": top.indices.tolist(),
                                "top_values": top.values.tolist()})

    grounded = open(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "prompts", "grounded.txt")).read()
    lookup_cases = prompt_lookup_traces(model, tok, [line for line in grounded.splitlines() if line.strip()])

    out = {
        "source": {"file": f, "transformers": __import__("transformers").__version__,
                   "torch": torch.__version__, "dtype": "float32"},
        "eos_token_id": 2,
        "tokenizer": cases,
        "logits": logit_cases,
        "chat": greedy_cases,
        "prompt_lookup": lookup_cases,
    }
    write(out, out_path)


def write(out, out_path):
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh, ensure_ascii=False, indent=None, separators=(",", ":"))
    os.replace(tmp, out_path)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
