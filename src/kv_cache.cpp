#include "specdec/kv_cache.hpp"

#include <ATen/ATen.h>

#include "specdec/error.hpp"

namespace specdec {

KVCache::KVCache(int64_t num_layers, int64_t batch, int64_t kv_heads, int64_t capacity,
                 int64_t head_dim, at::TensorOptions options)
    : capacity_(capacity) {
  SPECDEC_CHECK(num_layers > 0 && batch > 0 && kv_heads > 0 && capacity > 0 && head_dim > 0,
                "KVCache: every dimension must be positive");
  keys_.reserve(num_layers);
  values_.reserve(num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    keys_.push_back(at::empty({batch, kv_heads, capacity, head_dim}, options));
    values_.push_back(at::empty({batch, kv_heads, capacity, head_dim}, options));
  }
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers(), "KVCache: layer ", layer, " out of range");
  const int64_t t = k.size(2);
  SPECDEC_CHECK(length_ + t <= capacity_, "KVCache: capacity ", capacity_,
                " exceeded (holding ", length_, " positions, appending ", t,
                "); create the cache with a larger max length");
  keys_[layer].narrow(2, length_, t).copy_(k);
  values_[layer].narrow(2, length_, t).copy_(v);
  return {keys_[layer].narrow(2, 0, length_ + t), values_[layer].narrow(2, 0, length_ + t)};
}

void KVCache::advance(int64_t t) {
  SPECDEC_CHECK(t >= 0 && length_ + t <= capacity_, "KVCache: cannot advance by ", t);
  length_ += t;
}

void KVCache::crop(int64_t n) {
  SPECDEC_CHECK(n >= 0 && n <= length_, "KVCache: cannot crop to ", n, " positions (holding ",
                length_, ")");
  length_ = n;
}

void KVCache::set_cross(int64_t layer, at::Tensor k, at::Tensor v) {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers(), "KVCache: layer ", layer, " out of range");
  cross_.resize(keys_.size());
  cross_[layer] = {std::move(k), std::move(v)};
}

const std::pair<at::Tensor, at::Tensor>& KVCache::cross(int64_t layer) const {
  SPECDEC_CHECK(layer >= 0 && layer < static_cast<int64_t>(cross_.size()) && cross_[layer].first.defined(),
                "KVCache: no encoder output attached for layer ", layer,
                " (call Model::attach_encoder before the decoder's forward)");
  return cross_[layer];
}

}  // namespace specdec
