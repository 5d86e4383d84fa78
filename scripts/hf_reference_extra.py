#!/usr/bin/env python3
"""Small random-weight checkpoints made and run by Hugging Face transformers 4.47 itself, for
options the shared fixtures do not cover: Mistral with a short `sliding_window`, Llama with
`mlp_bias`. Writes tests/data/hf_extra/<name>/ (config.json, model.safetensors, reference.json
with the logits of a 40-token prompt and 24 greedy tokens computed token by token with the KV cache).

    .venv/bin/python scripts/hf_reference_extra.py tests/data/hf_extra
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
MODELS = {
    "mistral_sliding_window": (MistralForCausalLM, MistralConfig(sliding_window=8, **COMMON)),
    "llama_mlp_bias": (LlamaForCausalLM, LlamaConfig(mlp_bias=True, **COMMON)),
}


def main():
    out_root = sys.argv[1]
    for name, (cls, cfg) in MODELS.items():
        torch.manual_seed(7)
        cfg._attn_implementation = "eager"
        model = cls(cfg).eval()
        with torch.no_grad():  # larger weights than the default init: input-dependent outputs
            for p in model.parameters():
                p.normal_(0.0, 0.2)
        d = os.path.join(out_root, name)
        model.save_pretrained(d, safe_serialization=True)
        prompt = [(i * 7 + 3) % 60 + 3 for i in range(40)]
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0]
            past, nxt, greedy = None, torch.tensor([prompt]), []
            for _ in range(24):
                r = model(nxt, past_key_values=past, use_cache=True)
                past = r.past_key_values
                tok = int(r.logits[0, -1].argmax())
                greedy.append(tok)
                nxt = torch.tensor([[tok]])
        with open(os.path.join(d, "reference.json"), "w") as fh:
            json.dump({"prompt": prompt, "logits": logits.tolist(), "greedy": greedy,
                       "transformers": __import__("transformers").__version__}, fh)
        print("wrote", d)


if __name__ == "__main__":
    main()
