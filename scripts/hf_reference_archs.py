#!/usr/bin/env python3
"""Tiny random-weight Gemma 3 (text) and Qwen 3 checkpoints, made and run by Hugging Face
transformers 5 itself, in the layout of the shared fixtures (../shared/fixtures/README.md): each
folder holds config.json, generation_config.json, model.safetensors (float32), logits.f32 and
reference.json {meta, logits, greedy[, assisted]}.

Run with the transformers 5 virtual environment (scripts/setup_hf.sh makes it):
    nice -n 19 .venv-hf/bin/python scripts/hf_reference_archs.py tests/data/hf

Writes OUT_ROOT/{qwen3,gemma3}/{draft,target}. The target is the draft plus small Gaussian noise on
every weight, so the draft is partly accepted; `assisted` is transformers' own
generate(assistant_model=draft, num_assistant_tokens=5, num_assistant_tokens_schedule="constant",
assistant_confidence_threshold=0, do_sample=False), its trace [candidates drafted, accepted] per target
pass recorded by wrapping AssistedCandidateGenerator.get_candidates / update_candidate_strategy (the
accepted count is the n_matches transformers hands to update_candidate_strategy, after its EOS and
length cuts). `greedy` is generate(do_sample=False) of the model alone; both stop at EOS. Every
greedy run is also checked against a token-by-token loop with the KV cache and against full
recomputation without a cache, and the smallest top-1/top-2 logit gap of all recorded steps is in
meta (the seeds were picked so that no step is a near tie).

Weights: everything redrawn normal(0, 0.2) (input-dependent outputs), norm weights included: Gemma's
as w ~ N(0, 0.2) (its RMSNorm multiplies by 1 + w), Qwen 3's as 1 + N(0, 0.2) (it multiplies by w).
float32 throughout, eager attention, one thread.

gemma3 (Gemma3ForCausalLM, model_type gemma3_text): hidden 32, 4 heads, 2 KV heads, head_dim 16
  (not hidden / heads = 8), query_pre_attn_scalar 24 (attention scale 24**-0.5, not head_dim**-0.5),
  4 layers, layer_types [sliding, full, sliding, full], sliding_window 8, rope_parameters
  {sliding_attention: default, theta 1e4; full_attention: linear, factor 2, theta 1e6},
  gelu_pytorch_tanh, tie_word_embeddings true, no soft-capping (as every Gemma 3), vocab 64,
  prompts up to 44 tokens (beyond the window). gemma3/target also gets config_v4.json, the same
  model in the transformers 4.5x dialect:
      rope_theta 1e6 (global layers), rope_local_base_freq 1e4 (sliding layers),
      sliding_window_pattern 2 (layer i slides iff (i + 1) % 2 != 0),
      rope_scaling {"rope_type": "linear", "factor": 2.0} (global layers only), no layer_types and no
      rope_parameters.
  transformers 5 reads that dialect (Gemma3TextConfig.convert_rope_params_to_dict and
  __post_init__); the script loads a folder with config_v4.json as its config.json and asserts
  bitwise-equal logits. meta.config_dialects records both.
qwen3 (Qwen3ForCausalLM): hidden 32, 4 heads, 2 KV heads (GQA), head_dim 16 (not hidden / heads),
  3 layers, q_norm/k_norm (RMSNorm over head_dim, before RoPE), rope_theta 1e6, vocab 96;
  the draft ties the LM head to the embeddings, the target does not (its lm_head is the draft's
  embedding plus noise).
"""
import copy
import json
import os
import shutil
import struct
import sys
import tempfile

import torch
import transformers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen3Config, Qwen3ForCausalLM
from transformers.generation import candidate_generator as cg

NUM_ASSISTANT_TOKENS = 5
SCHEDULE = "constant"
THRESHOLD = 0.0
INIT_STD = 0.2
NORM_STD = 0.2
PROMPT_LENS = [1, 5, 12, 44]
TARGET_NEW = [1, 2, 5, 6, 24]
DRAFT_NEW = [1, 8, 24]
LOGITS_LEN = 44
PROMPT_SEED = 1234

GEMMA3 = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}},
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=256, rms_norm_eps=1e-6,
    tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
    pad_token_id=0, eos_token_id=1, bos_token_id=2)
# The same model as transformers 4.5x wrote Gemma 3 configs.
GEMMA3_V4 = dict(rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window_pattern=2,
                 rope_scaling={"rope_type": "linear", "factor": 2.0})
QWEN3 = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, hidden_act="silu", max_position_embeddings=256, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, attention_bias=False,
    use_sliding_window=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# name -> (class, config kwargs, draft seed, target seed, noise, draft overrides, target overrides)
ARCHS = {
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, GEMMA3, 21, 22, 0.015, {}, {}),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, QWEN3, 31, 32, 0.01,
              {"tie_word_embeddings": True}, {"tie_word_embeddings": False}),
}


def f32_list(t):
    """float32 values as the shortest decimals that read back to the same float32."""
    return [float(str(v)) for v in t.detach().to(torch.float32).reshape(-1).numpy()]


def safetensors_table(path):
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return dict(sorted(header.items()))


def prompts(vocab):
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def randomize(model, is_gemma, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, NORM_STD)
                if not is_gemma:
                    p.add_(1.0)
            else:
                p.normal_(0.0, INIT_STD)


def load(d):
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def manual_greedy(model, ids, n, eos, use_cache):
    out, cache, nxt, gaps = [], None, torch.tensor([ids]), []
    with torch.no_grad():
        for _ in range(n):
            if use_cache:
                r = model(nxt, cache=cache, use_cache=True)
                cache = r.cache
            else:
                r = model(torch.tensor([ids + out]), use_cache=False)
            row = r.logits[0, -1]
            top = row.topk(2).values
            gaps.append(float(top[0] - top[1]))
            tok = int(row.argmax())
            out.append(tok)
            nxt = torch.tensor([[tok]])
            if tok == eos:
                break
    return out, min(gaps)


class Tracer:
    """Records [candidates drafted, accepted] for every target pass of assisted generation."""

    def __init__(self):
        self.trace = []
        cls = cg.AssistedCandidateGenerator
        self.orig = cls.get_candidates, cls.update_candidate_strategy
        tracer = self

        def get_candidates(self, input_ids, **kw):
            out, logits = tracer.orig[0](self, input_ids, **kw)
            tracer.trace.append([out.shape[1] - input_ids.shape[1], 0])
            return out, logits

        def update(self, input_ids, scores, num_matches):
            tracer.trace[-1][1] = int(num_matches)
            return tracer.orig[1](self, input_ids, scores, num_matches)

        cls.get_candidates, cls.update_candidate_strategy = get_candidates, update


def run_folder(out_root, arch, role, model, args, draft=None):
    d = os.path.join(out_root, arch, role)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    model = load(d)  # everything below comes from the saved files
    cfg = model.config
    eos = cfg.eos_token_id
    ps = prompts(cfg.vocab_size)
    logit_ids = ps[PROMPT_LENS.index(LOGITS_LEN)]
    with torch.no_grad():
        logits = model(torch.tensor([logit_ids]), use_cache=False).logits
    logits.detach().numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))

    min_gap, greedy = float("inf"), []
    for pi, ids in enumerate(ps):
        for n in (TARGET_NEW if draft is not None else DRAFT_NEW):
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False)[0].tolist()
            new = out[len(ids):]
            cached, gap = manual_greedy(model, ids, n, eos, True)
            full, _ = manual_greedy(model, ids, n, eos, False)
            assert new == cached == full, (arch, role, ids, new, cached, full)
            min_gap = min(min_gap, gap)
            greedy.append({"prompt_index": pi, "input_ids": ids, "max_new_tokens": n, "output_ids": out,
                           "new_tokens": new})

    ref = {"meta": {
        "transformers": transformers.__version__, "torch": torch.__version__, "arch": arch,
        "model_class": type(model).__name__, "model_type": cfg.model_type, "seed": args["seed"],
        "save_dtype": "float32", "compute_dtype": "float32", "args": args, "attn_implementation": "eager",
        "min_top2_gap": min_gap, "tensors": safetensors_table(os.path.join(d, "model.safetensors")),
        "generation_config": model.generation_config.to_dict()},
        "logits": {"input_ids": logit_ids, "shape": list(logits.shape), "dtype": "float32",
                   "data": f32_list(logits)},
        "greedy": greedy}

    if draft is not None:
        dmodel = load(os.path.join(out_root, draft))
        dmodel.generation_config.num_assistant_tokens = NUM_ASSISTANT_TOKENS
        dmodel.generation_config.num_assistant_tokens_schedule = SCHEDULE
        dmodel.generation_config.assistant_confidence_threshold = THRESHOLD
        tracer = Tracer()
        runs, accepted, drafted = [], 0, 0
        for g in greedy:
            tracer.trace = []
            ids = g["input_ids"]
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 assistant_model=dmodel, max_new_tokens=g["max_new_tokens"], do_sample=False,
                                 num_assistant_tokens=NUM_ASSISTANT_TOKENS,
                                 num_assistant_tokens_schedule=SCHEDULE,
                                 assistant_confidence_threshold=THRESHOLD)[0].tolist()
            runs.append({"prompt_index": g["prompt_index"], "input_ids": ids, "max_new_tokens": g["max_new_tokens"],
                         "output_ids": out, "equals_greedy": out == g["output_ids"],
                         "trace": [list(t) for t in tracer.trace]})
            drafted += sum(t[0] for t in tracer.trace)
            accepted += sum(t[1] for t in tracer.trace)
        cls = cg.AssistedCandidateGenerator
        cls.get_candidates, cls.update_candidate_strategy = tracer.orig
        ref["assisted"] = {"draft": draft, "draft_model_class": type(dmodel).__name__,
                           "settings": {"num_assistant_tokens": NUM_ASSISTANT_TOKENS,
                                        "num_assistant_tokens_schedule": SCHEDULE,
                                        "assistant_confidence_threshold": THRESHOLD},
                           "all_equal_greedy": all(r["equals_greedy"] for r in runs), "runs": runs}
        print(f"  {arch}/{role}: {accepted}/{drafted} drafted tokens accepted, all equal greedy: "
              f"{ref['assisted']['all_equal_greedy']}", flush=True)

    if arch == "gemma3" and role == "target":
        ref["meta"]["config_dialects"] = gemma3_v4(d, model, logit_ids, logits)
    with open(os.path.join(d, "reference.json"), "w") as fh:
        json.dump(ref, fh, separators=(",", ":"))
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"wrote {d} ({size // 1024} KB, smallest top-2 gap {min_gap:.4g})", flush=True)
    return model


def gemma3_v4(d, model, logit_ids, logits):
    """config_v4.json: the same model in transformers 4.5x's keys; checks transformers 5 reads it alike."""
    with open(os.path.join(d, "config.json")) as fh:
        v5 = json.load(fh)
    # 4.50 had neither `_sliding_window_pattern` (a stale 6 that transformers 5 writes beside layer_types
    # and never reads) nor use_bidirectional_attention; it did write cache_implementation "hybrid".
    drop = ("layer_types", "rope_parameters", "dtype", "_sliding_window_pattern", "use_bidirectional_attention")
    v4 = {k: v for k, v in v5.items() if k not in drop}
    v4.update(GEMMA3_V4, cache_implementation="hybrid")
    v4["torch_dtype"] = "float32"
    v4["transformers_version"] = "4.50.0"
    v4 = dict(sorted(v4.items()))
    with open(os.path.join(d, "config_v4.json"), "w") as fh:
        json.dump(v4, fh, indent=2)
        fh.write("\n")
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(d, "config_v4.json"), os.path.join(tmp, "config.json"))
        shutil.copy(os.path.join(d, "model.safetensors"), tmp)
        old = load(tmp)
        with torch.no_grad():
            again = old(torch.tensor([logit_ids]), use_cache=False).logits
        same_layers = old.config.layer_types == model.config.layer_types
        same_rope = old.config.rope_parameters == model.config.rope_parameters
        equal = bool(torch.equal(again, logits))
        assert same_layers and same_rope and equal, (old.config.layer_types, old.config.rope_parameters)
    finally:
        shutil.rmtree(tmp)
    return {
        "config.json": "transformers 5: layer_types (per layer 'sliding_attention' | 'full_attention') and "
                       "rope_parameters keyed by layer type ({rope_type, rope_theta[, factor]})",
        "config_v4.json": "transformers 4.5x: rope_theta (full_attention layers), rope_local_base_freq "
                          "(sliding_attention layers, rope_type default), sliding_window_pattern P (layer i "
                          "slides iff (i + 1) % P != 0), rope_scaling (full_attention layers only)",
        "v4_keys": GEMMA3_V4,
        "v5_layer_types": model.config.layer_types,
        "v5_rope_parameters": model.config.rope_parameters,
        "v4_read_by_transformers5_as": {"layer_types": old.config.layer_types,
                                        "rope_parameters": old.config.rope_parameters},
        "v4_logits_bitwise_equal": equal,
    }


def main():
    out_root = sys.argv[1]
    torch.set_num_threads(1)
    for arch, (cls, cfg_cls, base, dseed, tseed, noise, dover, tover) in ARCHS.items():
        shutil.rmtree(os.path.join(out_root, arch), ignore_errors=True)
        is_gemma = arch == "gemma3"
        common = dict(hidden=base["hidden_size"], layers=base["num_hidden_layers"],
                      heads=base["num_attention_heads"], kv_heads=base["num_key_value_heads"],
                      head_dim=base["head_dim"], intermediate=base["intermediate_size"], vocab=base["vocab_size"],
                      init_std=INIT_STD, norm_init=("N(0, %g) (used as 1 + w)" if is_gemma else "1 + N(0, %g)")
                      % NORM_STD, save_dtype="float32", compute_dtype="float32", prompt_lens=PROMPT_LENS,
                      logits_len=LOGITS_LEN, prompt_seed=PROMPT_SEED, num_assistant_tokens=NUM_ASSISTANT_TOKENS,
                      assistant_schedule=SCHEDULE, assistant_confidence_threshold=THRESHOLD, threads=1)

        def make(over):
            c = cfg_cls(**copy.deepcopy(base), **over)
            c._attn_implementation = "eager"
            return c

        draft = cls(make(dover)).eval()
        randomize(draft, is_gemma, dseed)
        run_folder(out_root, arch, "draft", draft,
                   dict(common, arch=arch, out=f"{arch}/draft", seed=dseed, max_new_tokens=DRAFT_NEW, draft=None,
                        init_from=None, noise=0.0, **dover))

        target = cls(make(tover)).eval()
        sd = draft.state_dict()
        if not draft.config.tie_word_embeddings and "lm_head.weight" not in sd:
            raise RuntimeError("untied draft without lm_head")
        sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
        sd["lm_head.weight"] = sd["lm_head.weight"].clone()
        missing, unexpected = target.load_state_dict(sd, strict=False)
        assert not [k for k in missing if "lm_head" not in k] and not unexpected, (missing, unexpected)
        torch.manual_seed(tseed)
        with torch.no_grad():
            for p in target.parameters():
                p.add_(torch.randn_like(p) * noise)
        run_folder(out_root, arch, "target", target,
                   dict(common, arch=arch, out=f"{arch}/target", seed=tseed, max_new_tokens=TARGET_NEW,
                        draft=f"{arch}/draft", init_from=f"{arch}/draft", noise=noise, **tover),
                   draft=f"{arch}/draft")


if __name__ == "__main__":
    main()
