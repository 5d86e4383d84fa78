#include "specdec/kv_cache.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "specdec/error.hpp"

namespace specdec {

KVCache::KVCache(int64_t num_layers, int64_t batch, int64_t kv_heads, int64_t capacity,
                 int64_t head_dim, at::TensorOptions options)
    : lengths_(batch > 0 ? batch : 0, 0), capacity_(capacity) {
  SPECDEC_CHECK(num_layers > 0 && batch > 0 && kv_heads > 0 && capacity > 0 && head_dim > 0,
                "KVCache: every dimension must be positive");
  keys_.reserve(num_layers);
  values_.reserve(num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    keys_.push_back(at::zeros({batch, kv_heads, capacity, head_dim}, options));
    values_.push_back(at::zeros({batch, kv_heads, capacity, head_dim}, options));
  }
}

int64_t KVCache::length(int64_t row) const {
  SPECDEC_CHECK(row >= 0 && row < batch(), "KVCache: row ", row, " out of range (", batch(),
                " rows)");
  return lengths_[row];
}

int64_t KVCache::length() const {
  if (lengths_.empty()) return 0;
  SPECDEC_CHECK(
      std::all_of(lengths_.begin(), lengths_.end(), [&](int64_t n) { return n == lengths_[0]; }),
      "KVCache: rows hold different lengths; ask for one row's length");
  return lengths_[0];
}

std::pair<at::Tensor, at::Tensor> KVCache::buffers(int64_t layer) const {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers(), "KVCache: layer ", layer, " out of range");
  return {keys_[layer], values_[layer]};
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int64_t layer, const at::Tensor& k,
                                                  const at::Tensor& v) {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers(), "KVCache: layer ", layer, " out of range");
  const int64_t b = k.size(0), t = k.size(2);
  SPECDEC_CHECK(b <= batch(), "KVCache: a pass of ", b, " rows on a cache of ", batch());
  const auto first = lengths_.begin(), last = lengths_.begin() + b;
  const int64_t longest = *std::max_element(first, last);
  if (std::all_of(first, last, [&](int64_t n) { return n == longest; })) {
    const int64_t n = std::min(t, capacity_ - longest);
    keys_[layer].narrow(0, 0, b).narrow(2, longest, n).copy_(k.narrow(2, 0, n));
    values_[layer].narrow(0, 0, b).narrow(2, longest, n).copy_(v.narrow(2, 0, n));
  } else {
    for (int64_t r = 0; r < b; ++r) {
      const int64_t n = std::min(t, capacity_ - lengths_[r]);
      keys_[layer][r].narrow(1, lengths_[r], n).copy_(k[r].narrow(1, 0, n));
      values_[layer][r].narrow(1, lengths_[r], n).copy_(v[r].narrow(1, 0, n));
    }
  }
  const int64_t len = std::min(capacity_, longest + t);
  return {keys_[layer].narrow(0, 0, b).narrow(2, 0, len),
          values_[layer].narrow(0, 0, b).narrow(2, 0, len)};
}

void KVCache::advance(const std::vector<int64_t>& counts) {
  SPECDEC_CHECK(static_cast<int64_t>(counts.size()) <= batch(), "KVCache: advancing ",
                counts.size(), " rows of ", batch());
  for (size_t r = 0; r < counts.size(); ++r)
    SPECDEC_CHECK(counts[r] >= 0 && lengths_[r] + counts[r] <= capacity_,
                  "KVCache: cannot advance row ", r, " by ", counts[r]);
  for (size_t r = 0; r < counts.size(); ++r) lengths_[r] += counts[r];
}

void KVCache::crop(int64_t n) {
  for (int64_t r = 0; r < batch(); ++r) crop(r, n);
}

void KVCache::crop(int64_t row, int64_t n) {
  SPECDEC_CHECK(n >= 0 && n <= length(row), "KVCache: cannot crop row ", row, " to ", n,
                " positions (holding ", lengths_[row], ")");
  lengths_[row] = n;
}

void KVCache::keep_path(int64_t row, int64_t from, const std::vector<int64_t>& path) {
  const auto n = static_cast<int64_t>(path.size());
  SPECDEC_CHECK(row >= 0 && row < batch() && from >= 0 && from + n <= length(row),
                "KVCache: keep_path of ", n, " slots from ", from, " on row ", row,
                " out of range");
  for (int64_t j = 0; j < n; ++j) {
    const int64_t slot = path[static_cast<size_t>(j)];
    SPECDEC_CHECK(slot >= j && from + slot < length(row) && (j == 0 || slot > path[j - 1]),
                  "KVCache: keep_path needs increasing slots, got ", slot, " at ", j);
    if (slot == j) continue;
    // Slots move down in increasing order, so a slot is read before anything is written over it.
    for (int64_t l = 0; l < num_layers(); ++l) {
      keys_[l][row].select(1, from + j).copy_(keys_[l][row].select(1, from + slot));
      values_[l][row].select(1, from + j).copy_(values_[l][row].select(1, from + slot));
    }
    if (hidden_.defined()) hidden_[row][from + j].copy_(hidden_[row][from + slot]);
  }
  lengths_[row] = from + n;
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KVCache::copy_row(const KVCache& source, int64_t from, int64_t to) {
  SPECDEC_CHECK(from >= 0 && from < source.batch() && to >= 0 && to < batch(), "KVCache: copy_row(",
                from, ", ", to, ") out of range (", source.batch(), " and ", batch(), " rows)");
  SPECDEC_CHECK(source.num_layers() == num_layers() && source.lengths_[from] <= capacity_,
                "KVCache: copy_row from a cache of another shape");
  if (&source == this && from == to) return;
  const int64_t n = source.lengths_[from];
  for (int64_t l = 0; l < num_layers(); ++l) {
    if (n > 0) {
      keys_[l][to].narrow(1, 0, n).copy_(source.keys_[l][from].narrow(1, 0, n));
      values_[l][to].narrow(1, 0, n).copy_(source.values_[l][from].narrow(1, 0, n));
    }
  }
  const int64_t s = source.cross_.empty() ? 0 : source.cross_lengths_[from];
  if (s > 0) {
    std::vector<at::Tensor> keys, values;
    for (const auto& [k, v] : source.cross_) {
      keys.push_back(k[from].narrow(1, 0, s));
      values.push_back(v[from].narrow(1, 0, s));
    }
    set_cross(to, keys, values);
  } else if (!cross_.empty() && cross_lengths_[to] > 0) {
    cross_lengths_[to] = 0;
    update_cross_mask();
  }
  if (hidden_.defined() && n > 0) {
    SPECDEC_CHECK(source.hidden_.defined() && source.hidden_.size(2) == hidden_.size(2),
                  "KVCache: copy_row from a cache that keeps no hidden states of this size");
    hidden_[to].narrow(0, 0, n).copy_(source.hidden_[from].narrow(0, 0, n));
  }
  lengths_[to] = n;
}

void KVCache::keep_hidden(int64_t size, at::TensorOptions options) {
  SPECDEC_CHECK(size > 0 && batch() > 0,
                "KVCache: keep_hidden needs a positive size and an allocated cache");
  hidden_ = at::zeros({batch(), capacity_, size}, options);
}

const at::Tensor& KVCache::hidden() const {
  SPECDEC_CHECK(hidden_.defined(), "KVCache: this cache keeps no hidden states (keep_hidden)");
  return hidden_;
}

void KVCache::store_hidden(const at::Tensor& x, const std::vector<int64_t>& counts) {
  if (!hidden_.defined()) return;
  SPECDEC_CHECK(x.dim() == 3 && x.size(0) <= batch() && x.size(2) == hidden_.size(2) &&
                    static_cast<int64_t>(counts.size()) <= x.size(0),
                "KVCache: hidden states of shape ", x.sizes(), " for a cache keeping ",
                hidden_.sizes());
  for (size_t r = 0; r < counts.size(); ++r) {
    const int64_t n = std::min(counts[r], capacity_ - lengths_[r]);
    if (n > 0) hidden_[r].narrow(0, lengths_[r], n).copy_(x[r].narrow(0, 0, n));
  }
}

void KVCache::set_cross(int64_t row, const std::vector<at::Tensor>& keys,
                        const std::vector<at::Tensor>& values) {
  SPECDEC_CHECK(row >= 0 && row < batch(), "KVCache: row ", row, " out of range (", batch(),
                " rows)");
  SPECDEC_CHECK(static_cast<int64_t>(keys.size()) == num_layers() && values.size() == keys.size(),
                "KVCache: cross-attention entries for ", keys.size(), " layers, the cache has ",
                num_layers());
  const int64_t s = keys[0].dim() == 3 ? keys[0].size(1) : 0;
  for (size_t l = 0; l < keys.size(); ++l)
    SPECDEC_CHECK(keys[l].dim() == 3 && keys[l].sizes() == values[l].sizes() &&
                      keys[l].sizes() == keys[0].sizes() && s > 0,
                  "KVCache: cross-attention keys and values must be [H, S, D] alike for every "
                  "layer, got ",
                  keys[l].sizes(), " and ", values[l].sizes());
  const int64_t padded = cross_.empty() ? 0 : cross_[0].first.size(2);
  if (cross_.empty()) {
    cross_lengths_.assign(lengths_.size(), 0);
    for (const at::Tensor& k : keys) {
      const std::vector<int64_t> shape{batch(), k.size(0), s, k.size(2)};
      cross_.emplace_back(at::zeros(shape, k.options()), at::zeros(shape, k.options()));
    }
  } else if (s > padded) {
    for (auto& [k, v] : cross_) {
      k = at::constant_pad_nd(k, {0, 0, 0, s - padded});
      v = at::constant_pad_nd(v, {0, 0, 0, s - padded});
    }
  }
  const int64_t width = std::max(s, padded);
  for (size_t l = 0; l < keys.size(); ++l) {
    for (auto [into, from] :
         {std::pair{cross_[l].first[row], keys[l]}, std::pair{cross_[l].second[row], values[l]}}) {
      into.narrow(1, 0, s).copy_(from);
      into.narrow(1, s, width - s).zero_();
    }
  }
  cross_lengths_[row] = s;
  update_cross_mask();
}

void KVCache::update_cross_mask() {
  const int64_t s = cross_[0].first.size(2);
  at::Tensor mask = at::zeros({batch(), s}, at::kFloat);
  for (int64_t r = 0; r < batch(); ++r)
    if (cross_lengths_[r] > 0 && cross_lengths_[r] < s)
      mask[r]
          .narrow(0, cross_lengths_[r], s - cross_lengths_[r])
          .fill_(-std::numeric_limits<float>::infinity());
  cross_mask_ = mask.to(cross_[0].first.options());
}

KVCache::Cross KVCache::cross(int64_t layer, int64_t rows) const {
  SPECDEC_CHECK(layer >= 0 && layer < num_layers() && rows >= 1 && rows <= batch(),
                "KVCache: cross(", layer, ", ", rows, ") out of range");
  int64_t s = 0;
  bool padded = false;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = cross_.empty() ? 0 : cross_lengths_[r];
    SPECDEC_CHECK(n > 0, "KVCache: no encoder output attached for row ", r,
                  " (call Model::attach_encoder before the decoder's forward)");
    padded = padded || (r > 0 && n != s);
    s = std::max(s, n);
  }
  const auto& [k, v] = cross_[layer];
  Cross c{k.narrow(0, 0, rows).narrow(2, 0, s), v.narrow(0, 0, rows).narrow(2, 0, s), {}};
  if (padded) c.mask = cross_mask_.narrow(0, 0, rows).narrow(1, 0, s).view({rows, 1, 1, 1, s});
  return c;
}

}  // namespace specdec
