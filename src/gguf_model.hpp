// GGUF checkpoints as a WeightSource: llama.cpp's tensor names mapped to Hugging Face's, and the
// rotary row order of llama.cpp's converter undone. Private to the library.
#pragma once

#include <map>
#include <string>

#include "specdec/config.hpp"
#include "specdec/gguf.hpp"
#include "specdec/weights.hpp"

namespace specdec {

// True when `path` is a GGUF checkpoint: a `.gguf` file, or a folder without config.json holding
// one (`file` receives it). A Hugging Face folder (config.json) is not, even beside a `.gguf`.
bool gguf_checkpoint(const std::string& path, std::string* file);

// GGUF architectures whose tensors this build can map ("llama", "qwen2", "qwen3", "gemma3").
const std::vector<std::string>& supported_gguf_architectures();

class GgufWeights final : public WeightSource {
 public:
  // `file` must outlive this object; `config` comes from ModelConfig::from_gguf(file).
  GgufWeights(const GgufFile& file, const ModelConfig& config);
  bool contains(const std::string& name) const override {
    auto it = to_gguf_.find(name);
    return it != to_gguf_.end() && file_.tensors().count(it->second) != 0;
  }
  at::Tensor load(const std::string& name, at::ScalarType dtype, c10::Device device,
                  const std::vector<int64_t>& expected_shape = {}) const override;
  bool load_blocks(const std::string& name, const std::vector<int64_t>& expected_shape,
                   at::Tensor* bytes, GgmlType* type) const override;
  std::vector<std::string> names() const override;
  at::ScalarType stored_dtype(const std::string& name) const override;
  const std::string& dir() const override { return file_.path(); }
  // The GGUF tensor behind a Hugging Face name.
  const GgufTensorInfo& info(const std::string& name) const;

 private:
  // llama.cpp's converter stores each head's rotary halves of q/k rows interleaved (row 2i + h
  // holds Hugging Face's row h * d/2 + i): puts rows of x [rows, ...] of tensor `t` back.
  at::Tensor unpermute(const GgufTensorInfo& t, at::Tensor x) const;
  // info(name) with its shape checked against a non-empty `expected_shape`.
  const GgufTensorInfo& checked(const std::string& name,
                                const std::vector<int64_t>& expected_shape) const;

  const GgufFile& file_;
  int64_t heads_ = 0, kv_heads_ = 0;
  bool unpermute_qk_ = false;  // llama: the converter reordered q/k rows
  bool norm_shift_ = false;    // gemma3: the converter stored each norm weight as 1 + w
  std::map<std::string, std::string> to_gguf_;  // Hugging Face name -> GGUF name (present or not)
};

}  // namespace specdec
