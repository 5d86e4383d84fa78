// A linear layer that owns its weight format, and the loader that builds every model's layers in
// the format LoadOptions::weights asks for. Private header: full ATen available.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "specdec/gguf.hpp"
#include "specdec/model.hpp"
#include "specdec/weights.hpp"

namespace specdec {

// Memory for one model's weight matrices in transparent huge pages (Linux THP in "madvise" or
// "always" mode; elsewhere ordinary pages). A decode pass streams every matrix once per token; on 4
// KiB pages the hardware prefetcher stops at every page boundary and each page costs a TLB miss (a
// one-row F16 stream ran at 19 GB/s on 4 KiB pages and 25-28 GB/s on 2 MiB ones, Zen 4). Matrices
// are copied in one after another, 64-byte aligned, into chunks of address space of at least
// 256 MiB that are only touched where written; a chunk is unmapped with its last tensor. The loader
// owns one arena; its destructor hands back the untouched end of the last huge page.
class WeightArena {
 public:
  struct Chunk;
  WeightArena() = default;
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;
  ~WeightArena();
  // A copy of the contiguous CPU tensor `t` in the arena and the chunk holding it (its tensors
  // keep it alive); {t, nullptr} when no memory could be mapped. `release_source`: the caller
  // gives `t` up, and its memory is handed back (reads as zeros) while the copy goes on.
  std::pair<at::Tensor, std::shared_ptr<Chunk>> copy(const at::Tensor& t, bool release_source);

 private:
  std::shared_ptr<Chunk> current_;
};

// y = x @ W^T + b with W [N, K] held as float32, bfloat16, float16 or ggml blocks (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). The kernel is chosen once, when the layer is built: the
// packed CPU kernels for float32 activations on the CPU, libtorch's at::linear for dense weights
// on other devices or compute dtypes. Copies share the weights.
class Linear {
 public:
  Linear() = default;
  // Dense weights [N, K] (float32, bfloat16 or float16, any device), kept as they are.
  explicit Linear(at::Tensor w, at::Tensor b = {});
  // Block-quantized weights: `bytes` [N, row_bytes] (CPU uint8) of `type`, K columns per row. With
  // `int8_activations`, Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K run the 8-bit-activation kernel
  // (kernels::LinearKernel), which reorders the rows (kernels::prepare_weights): in place when
  // `bytes` is the only reference to its storage (pass it with std::move), else in a copy.
  Linear(GgmlType type, at::Tensor bytes, int64_t k, at::Tensor b = {},
         bool int8_activations = false);
  // One layer whose output is the concatenation of the parts' outputs (fused q|k|v, gate|up): the
  // rows are concatenated into one matrix when the parts share a format (one pass over x), else
  // the parts run one after the other (GGUF files that mix formats, e.g. Q4_K_M). Parts in a
  // WeightArena are never copied: adjacent ones in one chunk (as the loader places the matrices of
  // a fused layer) become one view of them, others run one after the other (a concatenated copy
  // would leave their arena memory resident and unused).
  static Linear cat(const std::vector<Linear>& parts);
  // Moves the weights into `arena` when they are on the CPU and this layer holds the only
  // reference to them.
  void move_to(WeightArena& arena);

  bool defined() const { return w_.defined() || !parts_.empty(); }
  int64_t out_features() const { return n_; }
  int64_t in_features() const { return k_; }
  GgmlType type() const { return type_; }
  // Bytes held by the weights (and bias).
  int64_t bytes() const;
  // The tensors holding the weights and bias, in a fixed order (to compare two layers).
  std::vector<at::Tensor> tensors() const;

  // x [..., K] -> [..., N]; with `residual` (the output's shape), residual + that: the packed
  // kernels add it where they write the output, saving a pass over it and a libtorch operation.
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& residual = {}) const;
  // Rows `ids` ([B, T] int64, any device) of W as [B, T, K] in `dtype` on the weights' device:
  // the token-embedding lookup of a matrix shared with the output head. Throws specdec::Error for
  // ids outside [0, N).
  at::Tensor rows(const at::Tensor& ids, at::ScalarType dtype) const;

 private:
  at::Tensor w_;  // dense [N, K], or uint8 [N, row_bytes] for block formats
  at::Tensor b_;  // [N] or undefined
  GgmlType type_ = GgmlType::kF32;
  int64_t n_ = 0, k_ = 0, row_bytes_ = 0;
  kernels::LinearKernel kernel_;  // the packed CPU kernel, or none (dense at::linear only)
  std::vector<Linear> parts_;     // set instead of w_ when fused parts differ in format
  std::shared_ptr<WeightArena::Chunk> chunk_;  // the arena chunk holding w_, or null
};

// Whether a load multiplies with specdec's packed kernels (float32 compute on the CPU), where every
// weight format applies; elsewhere a checkpoint stays as stored or takes the compute dtype.
inline bool packed_compute(const LoadOptions& options) {
  return options.device.is_cpu() && options.dtype == at::kFloat;
}

// Builds a model's parameters from a WeightSource under LoadOptions: dense tensors in the compute
// dtype on the device (norms, biases, position tables), and Linear layers in the weight format.
class WeightLoader {
 public:
  // Throws specdec::Error when the weight format cannot serve the device and compute dtype.
  WeightLoader(const WeightSource& source, const LoadOptions& options);

  // A tensor in the compute dtype on the device.
  at::Tensor tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  // Matrix `name` [N, K] as a Linear in the weight format (block-quantized tensors stay as stored
  // under WeightFormat::kAsStored).
  Linear linear(const std::string& name, const std::vector<int64_t>& shape,
                at::Tensor bias = {}) const;
  // Matrix `name` in its stored float dtype on the CPU (in the compute dtype on the device when
  // packed formats do not apply), for models that reorder or transpose it before make().
  at::Tensor stored(const std::string& name, const std::vector<int64_t>& shape) const;
  // A Linear in the weight format from a matrix [N, K] that stored() gave (`name` for messages).
  Linear make(const std::string& name, const at::Tensor& w, at::Tensor bias = {}) const;

 private:
  Linear convert(const std::string& name, const at::Tensor& w,
                 at::Tensor bias) const;  // make() before move_to

  const WeightSource& source_;
  LoadOptions options_;
  bool packed_ = false;  // float32 compute on the CPU: every weight format applies
  std::shared_ptr<WeightArena> arena_ = std::make_shared<WeightArena>();  // for the const methods
};

}  // namespace specdec
