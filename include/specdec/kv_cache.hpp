// KVCache: per-layer key/value storage, preallocated once per request, cropped in O(1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace specdec {

class KVCache {
 public:
  KVCache() = default;
  // Allocates `num_layers` key and value buffers of shape [batch, kv_heads, capacity, head_dim].
  KVCache(int64_t num_layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          at::TensorOptions options);

  int64_t length() const { return length_; }      // positions held (same for every layer)
  int64_t capacity() const { return capacity_; }  // positions that fit
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }

  // Writes `k`, `v` ([B, H_kv, T, D]) for layer `layer` at positions [length, length + T) in place
  // and returns views of the keys and values of positions [0, length + T). Throws specdec::Error
  // when length + T would exceed the capacity. The length moves only with advance().
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  // Commits `t` new positions after every layer has appended them.
  void advance(int64_t t);
  // Forgets every position >= n: O(1), nothing is copied or freed. Throws when n > length.
  void crop(int64_t n);
  void reset() { length_ = 0; }

  // Encoder-decoder models: the cross-attention keys and values of decoder layer `layer` over the
  // encoder output ([B, H, S, D]), set once per request (Model::attach_encoder). crop() and reset()
  // leave them alone; cross() throws when they were never set.
  void set_cross(int64_t layer, at::Tensor k, at::Tensor v);
  const std::pair<at::Tensor, at::Tensor>& cross(int64_t layer) const;

 private:
  std::vector<at::Tensor> keys_;    // per layer [B, H_kv, capacity, D]
  std::vector<at::Tensor> values_;  // per layer [B, H_kv, capacity, D]
  std::vector<std::pair<at::Tensor, at::Tensor>> cross_;  // per layer, empty for decoder-only
  int64_t length_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace specdec
