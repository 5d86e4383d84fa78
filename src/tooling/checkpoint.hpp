// Reading a checkpoint's weights and writing checkpoint folders: shared by make-fixture, the
// early-exit drafts and make-draft. Private to the library.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "specdec/config.hpp"
#include "specdec/gguf.hpp"
#include "specdec/weights.hpp"

namespace specdec::detail {

// Creates `dir` and any missing parents (mkdir -p).
void make_dir(const std::string& dir);
// Copies the tokenizer files of folder `from` that exist into `to`, each atomically.
void copy_tokenizer_files(const std::string& from, const std::string& to);
// Writes model.safetensors, generation_config.json (the special tokens of `config`) and config.json
// into `dir` (created if missing), each atomically, config.json last.
void write_checkpoint(const std::string& dir, const nlohmann::json& config,
                      const std::map<std::string, at::Tensor>& tensors);

// A checkpoint opened for reading its weights by Hugging Face name.
struct SourceCheckpoint {
  ModelConfig config;
  nlohmann::json config_json;      // config.json (with generation_config.json's special tokens), or
                                   // what Hugging Face would write for a GGUF's metadata
  std::unique_ptr<GgufFile> gguf;  // set for a GGUF checkpoint; `weights` reads from it
  std::unique_ptr<WeightSource> weights;
};
// A checkpoint folder, or a GGUF file or a folder holding one. Throws specdec::Error naming the
// file on any problem.
SourceCheckpoint open_checkpoint(const std::string& path);

}  // namespace specdec::detail
