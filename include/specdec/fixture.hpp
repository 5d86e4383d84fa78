// Synthesising Hugging Face checkpoints with deterministic random weights (tests, demos, benches).
#pragma once

#include <cstdint>
#include <string>

namespace specdec {

struct FixtureOptions {
  // llama | mistral | qwen2 | qwen3 | gemma3 | gpt_neox | gpt2 | opt | t5 (gemma3: model_type
  // gemma3_text, always tied)
  std::string arch = "llama";
  int64_t layers = 2;  // t5: encoder layers and decoder layers each
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 0;      // 0 = heads
  int64_t intermediate = 0;  // 0 = 4 * hidden
  int64_t vocab = 512;
  int64_t max_pos = 2048;
  uint64_t seed = 0;
  std::string dtype = "float32";  // dtype the weights are saved in: float32 | bfloat16 | float16
  double init_std = 0.02;         // weights ~ N(0, init_std^2); norms are 1
  // Synthetic early-exit pair: o_proj and down_proj of layers >= exit_layers are multiplied by
  // exit_scale, so the first exit_layers layers alone predict what the full model does.
  // exit_layers 0 with exit_scale 0 gives a bigram model at full cost: every layer runs, none
  // changes the residual stream, so the next token depends on the current one only.
  int64_t exit_layers = -1;  // -1 = off
  double exit_scale = 1.0;
  bool tie_word_embeddings = false;
  // Llama family: a feature-fed draft (ModelConfig::feature_size = hidden, "fc.weight" [hidden,
  // 2 * hidden]), to run beside a target of the same hidden size.
  bool feature_fed = false;
  bool gated_act = false;  // t5: feed_forward_proj "gated-gelu" (t5-v1_1, flan-t5), else "relu"
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 0;  // t5: also the decoder_start_token_id
  // Copy the tokenizer files of this folder into the checkpoint (empty = none). The vocabulary
  // becomes the tokenizer's size and bos/eos its tokens, so generated ids always decode.
  std::string tokenizer_dir;
  void validate() const;
};

// Writes config.json, generation_config.json and model.safetensors into `out_dir` (created if
// missing). Each file is written atomically; config.json last, so a folder that has it is whole.
void make_fixture(const std::string& out_dir, const FixtureOptions& options);

// Derives an early-exit draft from the checkpoint `target` (a folder, or a GGUF file or a folder
// holding one): its embeddings, first `layers` layers, final norm and head, plus optional Gaussian
// noise of standard deviation `noise`, written as a safetensors folder (from GGUF: dequantized to
// float32, with a config.json made from the metadata). The target's tokenizer files are copied too
// (a GGUF's tokenizer stays in the GGUF). T5: the whole encoder is kept (with noise 0 the pair
// then shares one encoder pass) and `layers` counts decoder layers.
void make_draft_of(const std::string& target, const std::string& out_dir, int64_t layers,
                   double noise = 0.0, uint64_t seed = 0);

}  // namespace specdec
