// Reading safetensors checkpoints: single files or sharded (model.safetensors.index.json).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "specdec/gguf.hpp"

namespace specdec {

// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string dtype;  // "F32", "F16", "BF16" (others are rejected when read)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// A memory-mapped .safetensors file with a validated header. Construction throws specdec::Error
// naming the file for: missing/unreadable file, file shorter than 8 bytes, header length past the
// end, invalid header JSON, unknown dtype, byte count not matching the shape, offsets out of range
// or overlapping.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // A copy of the tensor converted to `dtype` on `device` (the mapping is not referenced after).
  at::Tensor load(const std::string& name, at::ScalarType dtype, c10::Device device) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;  // start of the data section inside the mapping
  int fd_ = -1;                    // open while the mapping lives: load() reads tensors through it
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Where a model's weights come from: named tensors under Hugging Face's parameter names
// ("model.layers.0.self_attn.q_proj.weight"), whatever the file format. A safetensors folder hands
// them out as stored; a GGUF file through a name map per architecture (and with llama.cpp's own
// layouts undone), so each architecture's model code exists once.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  // Loads `name`, checking its shape when `expected_shape` is non-empty; throws specdec::Error
  // naming the tensor, the file and the expected/actual shapes.
  virtual at::Tensor load(const std::string& name, at::ScalarType dtype, c10::Device device,
                          const std::vector<int64_t>& expected_shape = {}) const = 0;
  virtual std::vector<std::string> names() const = 0;
  // A block-quantized matrix as stored (GGUF Q8_0, Q4_1, Q4_K, ...), for weight formats that keep
  // it so: its bytes as a CPU uint8 tensor [rows, row_bytes] and its format in `type`, after the
  // same checks and row reordering as load(). False for tensors stored as floats (the default),
  // which load() hands out in their stored_dtype without loss.
  virtual bool load_blocks(const std::string& name, const std::vector<int64_t>& expected_shape,
                           at::Tensor* bytes, GgmlType* type) const {
    (void)name, (void)expected_shape, (void)bytes, (void)type;
    return false;
  }
  // The stored dtype of `name` when it is float32/bfloat16/float16, float32 for quantized formats.
  virtual at::ScalarType stored_dtype(const std::string& name) const = 0;
  // The file or folder the weights come from (for messages).
  virtual const std::string& dir() const = 0;
};

// All tensors of a checkpoint folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json`.
class WeightStore final : public WeightSource {
 public:
  explicit WeightStore(const std::string& dir);
  bool contains(const std::string& name) const override { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  at::Tensor load(const std::string& name, at::ScalarType dtype, c10::Device device,
                  const std::vector<int64_t>& expected_shape = {}) const override;
  std::vector<std::string> names() const override;
  at::ScalarType stored_dtype(const std::string& name) const override;
  const std::string& dir() const override { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes tensors (any of float32/float16/bfloat16, CPU or not) as a .safetensors file, atomically
// (temporary file + rename). Tensors are written in name order.
void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Throws specdec::Error naming the tensor and `source` when `actual` differs from a non-empty
// `expected` shape (`implied_by` names where the expectation comes from).
void check_shape(const std::string& source, const std::string& name,
                 const std::vector<int64_t>& actual, const std::vector<int64_t>& expected,
                 const std::string& implied_by);

// "float32" | "bfloat16" | "float16" -> ScalarType; throws specdec::Error for anything else.
at::ScalarType parse_dtype(const std::string& name);
std::string dtype_name(at::ScalarType dtype);

}  // namespace specdec
