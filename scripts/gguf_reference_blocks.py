#!/usr/bin/env python3
"""The `gguf` Python package's own dequantization, as test data for specdec's dequantizers.

    .venv/bin/python scripts/gguf_reference_blocks.py models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        tests/data/gguf_reference.json

  blocks:  for every type specdec reads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K),
           4 blocks of random bytes (seeded; scale fields set to finite float16 values) and the floats
           gguf.quants.dequantize makes of them;
  quantized: for Q8_0, Q4_0 and Q4_1, 8 blocks of seeded random floats (scales varied, one block all
           zeros, one constant) and the bytes gguf.quants.quantize makes of them;
  tensors: for every tensor of the real file, its type and shape, the float64 sum and sum of squares of
           gguf's dequantization, and its first 8 and last 8 values.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

# Byte offsets of float16 scale fields inside one block, per type.
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
              T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]


def main():
    gguf_path, out_path = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(1234)
    blocks = []
    for t in TYPES:
        elems, size = gguf.GGML_QUANT_SIZES[t]
        n_blocks = 4 if elems > 1 else 64
        raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        if t == T.F32:
            raw = rng.normal(size=n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, size)
        elif t == T.F16:
            raw = rng.normal(size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, size)
        elif t == T.BF16:
            f = rng.normal(size=n_blocks).astype(np.float32).view(np.uint32) >> 16
            raw = f.astype(np.uint16).view(np.uint8).reshape(n_blocks, size)
        for off in F16_FIELDS.get(t, []):
            scale = rng.uniform(0.001, 0.1, size=n_blocks).astype(np.float16)
            raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        values = dequantize(raw.reshape(-1), t).reshape(-1).astype(np.float32)
        blocks.append({"type": t.name, "type_id": int(t), "bytes": raw.tobytes().hex(),
                       "values": [float(v) for v in values]})
    quantized = []
    for t in [T.Q8_0, T.Q4_0, T.Q4_1]:
        x = rng.normal(size=(8, 32)) * rng.uniform(0.01, 10.0, size=(8, 1))
        x[6] = 0.0
        x[7] = 0.37
        x = x.astype(np.float32)
        quantized.append({"type": t.name, "type_id": int(t), "values": [float(v) for v in x.reshape(-1)],
                          "bytes": quantize(x, t).tobytes().hex()})
    tensors = []
    reader = gguf.GGUFReader(gguf_path)
    for t in reader.tensors:
        v = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
        tensors.append({"name": t.name, "type": t.tensor_type.name,
                        "shape": [int(x) for x in reversed(t.shape.tolist())],
                        "sum": float(v.sum()), "sum_sq": float((v * v).sum()),
                        "head": [float(x) for x in v[:8]], "tail": [float(x) for x in v[-8:]]})
    out = {"gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19", "file": os.path.basename(gguf_path),
           "blocks": blocks, "quantized": quantized, "tensors": tensors}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))
    os.replace(tmp, out_path)
    print("wrote", out_path, len(blocks), "block sets,", len(tensors), "tensors")


if __name__ == "__main__":
    main()
