"""The MB (10^6 bytes, rounded) a one-token pass of a GGUF model reads: every tensor but the token
embedding, of which a pass reads one row, unless the file has no output matrix (the embedding is
then the output matrix too, read whole). The KV cache is left out (a few KB per position here).
Usage: pass_bytes.py FILE.gguf   (gguf from PyPI)"""
import sys

from gguf import GGUFReader

sizes = {t.name: int(t.n_bytes) for t in GGUFReader(sys.argv[1]).tensors}
if "output.weight" in sizes:
    sizes.pop("token_embd.weight", None)
print(round(sum(sizes.values()) / 1e6))
