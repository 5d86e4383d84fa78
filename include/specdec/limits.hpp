// Upper bounds on what a file or a request may ask for. Every parser checks them before it
// allocates, so a corrupt or hostile file (or request) costs at most these amounts and gets a
// specdec::Error naming the file and the limit. The defaults admit every real checkpoint we know
// of; raise them with set_limits() before loading when yours needs more.
#pragma once

#include <cstdint>

namespace specdec {

struct Limits {
  // safetensors: the JSON header (the format's own limit is 100 MB). GGUF: one string value.
  int64_t max_header_bytes = int64_t{100} << 20;
  // GGUF: metadata values in one file, array elements included (a real vocabulary, its scores,
  // types and merges: under a million).
  int64_t max_metadata_values = int64_t{1} << 23;
  // Tensors in one checkpoint file.
  int64_t max_tensors = int64_t{1} << 20;
  // Dimensions of one tensor (GGUF's format allows 4).
  int64_t max_rank = 8;
  // Elements of one tensor (and so of its in-memory copy): 2^36 = 64 Gi.
  int64_t max_tensor_elements = int64_t{1} << 36;
  // A configuration's vocab_size, and every token id a tokenizer file names (the largest real
  // vocabularies hold about 256 K tokens).
  int64_t max_vocab_size = int64_t{1} << 22;
  // Positions of one request (prompt plus max_new_tokens), whatever the model's own limit.
  // 1 M (Qwen2.5-1M's context).
  int64_t max_sequence_length = int64_t{1} << 20;
  // A configuration's decoder layers and attention head size (real models: under 200 layers,
  // heads of at most 512), checked before anything is built per layer or per head dimension.
  int64_t max_layers = 4096;
  int64_t max_head_dim = 4096;
  // T5Tokenizer's sentinel count (extra_ids: 100 in T5, 125 in ByT5).
  int64_t max_extra_ids = 4096;
};

// The limits in force (process-wide; the defaults above until set_limits is called).
Limits limits();
// Replaces them; throws specdec::Error when a value is not positive. Call it before loading:
// files already loaded were checked against the old limits.
void set_limits(const Limits& limits);

}  // namespace specdec
