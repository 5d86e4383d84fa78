#!/usr/bin/env python3
"""Hugging Face's outputs for the real Gemma 3 270M (the base pretrained model, Q4_K_M GGUF), as small
test data.

Run with the transformers 5 virtual environment (scripts/setup_hf.sh makes it):
    nice -n 19 .venv-hf/bin/python scripts/hf_reference_gemma3.py models/gemma3/gemma-3-270m-q4_k_m.gguf \
        tests/data/gemma3/reference.json

transformers 5 loads the GGUF and dequantizes it to float32 (Gemma3ForCausalLM, model_type gemma3_text,
tied head, eager attention). The layout follows tests/data/smollm2/reference.json where it applies:
  source:    file, transformers / torch versions, dtype, and the config transformers built;
  tokenizer: the shared tokenizer test strings (../shared/fixtures/tokenizers/, the first folder's
             reference.json, as scripts/hf_reference_smollm2.py takes them, plus three digit strings):
             ids without special tokens, ids as the tokenizer adds them by default (`ids_default`:
             <bos> first), and the decoded text of the ids without special tokens;
  logits:    for 3 prompts (BOS added, as the tokenizer does; the third is longer than the 512-token
             sliding window), the top-20 logits (ids and values, rounded to 6 significant digits) at
             every position of one forward pass;
  greedy:    12 plain-text continuation prompts (BOS added; prose, code, a list, numbers, French,
             German, Japanese, JSON, a dialogue, one longer than the sliding window): the prompt ids
             and 64 greedy tokens (argmax of transformers' forward with its KV cache, one token at a time;
             generation does not stop at EOS: cut at the first <eos> (1) yourself), with the decoded text
             and, per step, the gap between the two largest logits (`top2_gap`, 4 significant digits:
             where it is tiny, a float32 reimplementation may rightly pick the other token).
`eos_token_id` is 1 (<eos>); <end_of_turn> (106) ends the turns of the instruction-tuned model, not this one.

What transformers 5.24's GGUF loader does with this file (it is the legacy loader: gemma3 is not among
the architectures of its new in-block path, integrations/gguf GGUF_ARCHS, so
modeling_gguf_pytorch_utils.load_gguf_checkpoint dequantizes every tensor with gguf-py to float32):
  - config: context_length -> max_position_embeddings (32768), embedding_length, block_count,
    feed_forward_length, attention.head_count / head_count_kv (4 / 1), attention.key_length -> head_dim
    (256), attention.layer_norm_rms_epsilon (1e-6 as float32: 9.99999997e-07), rope.freq_base ->
    rope_theta (1e6, the full-attention layers), attention.sliding_window (512); vocab_size from the
    token list (262144; no gemma3.vocab_size key). Everything else is Gemma3TextConfig's default, which
    is right for this model: query_pre_attn_scalar 256 (scale 1/16), rope_local_base_freq 10000 for
    the sliding layers, layer pattern 6 (layers 5, 11, 17 full attention, the rest sliding; llama.cpp
    hard-codes the same), no rope scaling, no soft-capping, gelu_pytorch_tanh. (It never reads
    rope.scaling.* for gemma3: a 4B+ GGUF with linear factor 8 would load without it.)
  - tensors (Gemma2TensorProcessor): every tensor whose name contains "norm.weight" (attn_norm,
    post_attention_norm, ffn_norm, post_ffw_norm, attn_q_norm, attn_k_norm, output_norm) gets 1
    subtracted: llama.cpp's converter stores Gemma norms as 1 + w (it multiplies by the stored value),
    transformers' RMSNorm multiplies by 1 + w. So GGUF value == effective multiplier.
    No q/k row permutation (that is the llama processor only; Gemma's rope is the rotate-half / NEOX
    form in both llama.cpp and transformers). token_embd (Q8_0 here) is the tied LM head (no
    output.weight in the file -> tie_word_embeddings true).
  - the embedding scale sqrt(640) is not in the file: the model multiplies the embedding rows by
    float32(sqrt(hidden_size)) (in bfloat16 it would be rounded to bfloat16 first).
  - tokenizer (integrations/gguf/gguf_tokenizer_mapping.py gemma_tokenizer): tokenizer.ggml.model is
    "llama" (SentencePiece) and the file has no merges; transformers builds GemmaTokenizer, a
    `tokenizers` BPE (byte_fallback, fuse_unk) whose merges are derived from the vocabulary with the
    tokens' order in the file as priority (not their scores), after renaming tokens made only of
    spaces ("  ") to "\u2581\u2581". Normalizer: " " -> "\u2581"; no prefix space (add_space_prefix
    false); decoder: "\u2581" -> " ", byte fallback, fuse. Control tokens (token_type 3) become special
    added tokens (<bos>, <eos>, <start_of_turn>, ...), user-defined ones (type 4) plain added tokens.
    add_bos_token true (from the file): encode() puts <bos> (2) first; no EOS. No chat template in this
    GGUF. clean_up_tokenization_spaces is off.
"""
import glob
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

LONG = (
    "The harbour town of Kestrel Bay was founded in the late sixteenth century by a handful of fishing "
    "families who had been driven from the northern coast by a series of hard winters. For the first fifty "
    "years the settlement was little more than a row of stone cottages along the shingle, a chapel with a "
    "slate roof, and a wooden jetty that had to be rebuilt after almost every autumn storm. The families "
    "caught herring and mackerel in the summer, mended their nets through the winter, and traded salted "
    "fish with the farmers of the valley for grain, wool and cider.\n\n"
    "Everything changed in 1712, when a merchant from the capital noticed that the bay was deep enough for "
    "ships of a much larger size than the fishing boats that used it. Within a decade a proper harbour wall "
    "had been built from granite quarried in the hills behind the town, and warehouses began to appear "
    "along the waterfront. The population grew from a few hundred people to nearly four thousand. Rope "
    "makers, sail makers, coopers and carpenters arrived from all over the country, and the town acquired "
    "its first school, its first inn with rooms for travellers, and a customs house whose clock still "
    "keeps time today.\n\n"
    "The nineteenth century brought the railway, which reached Kestrel Bay in 1863 after years of argument "
    "about the route. The line made it possible to send fresh fish to the cities overnight, and for a while "
    "the town prospered as never before. Photographs from that period show the harbour so crowded with boats "
    "that a person could walk from one side to the other across their decks. Yet the same railway also "
    "brought visitors, and by the end of the century the fishing fleet was shrinking while the number of "
    "hotels, tea rooms and bathing machines on the beach kept rising.\n\n"
    "In the twentieth century the town had to reinvent itself more than once. During both wars the harbour "
    "served as a base for minesweepers, and several of the old warehouses were turned into workshops. After "
    "the second war the last large fishing company closed, and for some years many young people left to "
    "find work elsewhere. The revival came slowly: a marine research station opened in the former customs "
    "house in 1971, a festival of music and boats started in 1984, and the old railway line, closed in the "
    "sixties, became a path for walkers and cyclists. Today Kestrel Bay is known for its lifeboat station, "
    "its small but busy fish market, and the long summer evenings when the whole town gathers on the harbour "
    "wall to watch the sun go down behind the lighthouse. Historians who study the town often say that its "
    "story is the story of the whole coast in miniature, and that"
)

GREEDY_PROMPTS = [
    "The old lighthouse keeper climbed the stairs every evening, and",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Shopping list:\n1. Milk\n2. Eggs\n3.",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889. Elle",
    "Der Rhein ist einer der längsten Flüsse Europas. Er",
    "日本の首都は東京です。東京は",
    "{\"name\": \"Alice\", \"age\": 30, \"city\":",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Photosynthesis is the process by which plants",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    LONG,
]
LOGIT_PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    LONG,
]
NEW_TOKENS = 64
TOP = 20


def sig6(x):
    return float(f"{x:.6g}")


def greedy(model, ids, n):
    out, gaps, cache, nxt = [], [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            r = model(nxt, cache=cache, use_cache=True)
            cache = r.cache
            row = r.logits[0, -1]
            top = row.topk(2).values
            gaps.append(float(f"{float(top[0] - top[1]):.4g}"))
            tok = int(row.argmax())
            out.append(tok)
            nxt = torch.tensor([[tok]])
    return out, gaps


def main():
    gguf_path, out_path = sys.argv[1], sys.argv[2]
    shared = os.environ.get("SPECDEC_SHARED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    d, f = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.config
    assert type(model).__name__ == "Gemma3ForCausalLM" and cfg.final_logit_softcapping is None
    # the legacy GGUF path dequantized everything (config.quantization_config says dequantize false regardless)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert all(p.dtype == torch.float32 for p in model.parameters())
    print(type(tok).__name__, cfg.layer_types, cfg.rope_parameters, flush=True)

    strings = []
    refs = sorted(glob.glob(os.path.join(shared, "fixtures", "tokenizers", "*", "reference.json")))
    if refs:
        strings = [c["text"] for c in json.load(open(refs[0]))["cases"]]
    strings += ["Numbers: 3.14159, 2024-11-22, x1y22z333 and 1,000,000.", " 42 ", "a1 b2"]
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        cases.append({"text": s, "ids": ids, "ids_default": tok.encode(s),
                      "decoded": tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)})

    logit_cases = []
    with torch.no_grad():
        for p in LOGIT_PROMPTS:
            ids = tok.encode(p)
            logits = model(torch.tensor([ids]), use_cache=False).logits[0]  # [T, V]
            top = logits.topk(TOP, dim=-1)
            logit_cases.append({"text": p, "ids": ids, "top_ids": top.indices.tolist(),
                                "top_values": [[sig6(v) for v in row] for row in top.values.tolist()]})
            print(f"logits: {len(ids)} tokens", flush=True)

    greedy_cases = []
    for i, p in enumerate(GREEDY_PROMPTS):
        ids = tok.encode(p)
        new, gaps = greedy(model, ids, NEW_TOKENS)
        greedy_cases.append({"text": p, "prompt_ids": ids, "greedy": new, "top2_gap": gaps,
                             "greedy_text": tok.decode(new, skip_special_tokens=False,
                                                       clean_up_tokenization_spaces=False)})
        print(f"[{i + 1}/{len(GREEDY_PROMPTS)}] {len(ids)} tokens: {tok.decode(new)!r}", flush=True)

    out = {
        "source": {"file": f, "transformers": transformers.__version__, "torch": torch.__version__,
                   "dtype": "float32", "attn_implementation": "eager", "model_class": type(model).__name__,
                   "tokenizer_class": type(tok).__name__,
                   "config": {k: v for k, v in cfg.to_dict().items()
                              if not k.startswith("_") and k not in ("quantization_config", "id2label", "label2id")}},
        "eos_token_id": 1,
        "bos_token_id": 2,
        "tokenizer": cases,
        "logits": logit_cases,
        "greedy": greedy_cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh, ensure_ascii=False, indent=None, separators=(",", ":"))
    os.replace(tmp, out_path)
    print("wrote", out_path, os.path.getsize(out_path) // 1024, "KB")


if __name__ == "__main__":
    main()
