// KVCache: per-layer key/value storage for a batch of sequences, preallocated once per request,
// with a length per row, cropped in O(1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace specdec {

class KVCache {
 public:
  KVCache() = default;
  // Allocates `num_layers` key and value buffers of shape [batch, kv_heads, capacity, head_dim]
  // (zero-filled: slots a row has not written hold finite values).
  KVCache(int64_t num_layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          at::TensorOptions options);

  int64_t batch() const { return static_cast<int64_t>(lengths_.size()); }  // rows (sequences)
  int64_t length(int64_t row) const;  // positions row `row` holds
  // The length every row has (the single-request case); throws specdec::Error when rows differ.
  int64_t length() const;
  int64_t capacity() const { return capacity_; }  // positions that fit in each row
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }

  // Writes `k`, `v` ([B, H_kv, T, D], B <= batch()) for layer `layer`: row b at positions
  // [length(b), length(b) + T) of cache row b, in place, and returns views [B, H_kv, L, D] of rows
  // [0, B) with L = min(capacity, max_b length(b) + T). Positions past the capacity are dropped:
  // only padding can be there, as Model::forward refuses a pass whose real tokens do not fit.
  // Lengths move only with advance().
  std::pair<at::Tensor, at::Tensor> append(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  // Layer `layer`'s key and value buffers [batch, kv_heads, capacity, head_dim], for kernels that
  // write a pass's keys and values in place as append() would (slots past a row's length are free).
  std::pair<at::Tensor, at::Tensor> buffers(int64_t layer) const;
  // Commits new positions after every layer has appended them: row b grows by counts[b] (rows
  // past counts.size() are unchanged).
  void advance(const std::vector<int64_t>& counts);
  void advance(int64_t t) { advance(std::vector<int64_t>(lengths_.size(), t)); }  // every row by t
  // Forgets every position >= n of every row (of row `row`): O(1), nothing is copied or freed.
  // Throws when n exceeds a row's length.
  void crop(int64_t n);
  void crop(int64_t row, int64_t n);
  // After a pass over a tree (Model::forward): keeps, of row `row`'s positions from `from` on, the
  // slots from + path[j] (increasing) at from + j, and forgets the rest. O(path) copies.
  void keep_path(int64_t row, int64_t from, const std::vector<int64_t>& path);
  void reset();
  // Copies row `from` (its positions, length and cross-attention entries) over row `to`: compacts a
  // batch when a sequence finishes, so that later passes run on rows [0, B - 1).
  void copy_row(int64_t from, int64_t to) { copy_row(*this, from, to); }
  // The same from row `from` of another cache of the same model (its capacity may be smaller):
  // admits a sequence prefilled on its own into a running batch.
  void copy_row(const KVCache& source, int64_t from, int64_t to);

  // Encoder-decoder models: row `row`'s cross-attention keys and values over its own encoder
  // output, one [H, S_row, D] tensor per decoder layer (Model::attach_encoder), kept until the row
  // is set or copied over again (crop() and reset() leave them alone). Rows of different S_row
  // share buffers padded to the longest, so a row may be set while the others decode.
  void set_cross(int64_t row, const std::vector<at::Tensor>& keys,
                 const std::vector<at::Tensor>& values);
  // Layer `layer`'s cross-attention entries of rows [0, rows): keys and values [rows, H, S, D], S
  // the longest of their encoder outputs, and the additive mask [rows, 1, 1, 1, S] (-inf over each
  // row's padding; undefined when no row has any). Throws when a row has none set.
  struct Cross {
    at::Tensor keys, values, mask;
  };
  Cross cross(int64_t layer, int64_t rows) const;

  // --- Hidden states, for feature-fed (EAGLE-style) drafts ---
  // From now on, keep the last decoder layer's output (before the final norm) of every position
  // the cache holds: [batch, capacity, size] of `options`, written by Model::forward for each row's
  // real tokens, cropped and copied with the keys and values. Decoder-only models only.
  void keep_hidden(int64_t size, at::TensorOptions options);
  bool keeps_hidden() const { return hidden_.defined(); }
  // [batch, capacity, size]: row b's positions [0, length(b)) hold values; throws when not kept.
  const at::Tensor& hidden() const;
  // Writes x ([B, T, size], B <= batch()) for row b at positions [length(b), length(b) + counts[b])
  // (before advance(counts) commits them); nothing when hidden states are not kept.
  void store_hidden(const at::Tensor& x, const std::vector<int64_t>& counts);
  // A feature-fed draft's cache reads the target's hidden states from `target` (its rows are this
  // cache's rows; it must outlive the passes that read it). nullptr: none.
  void set_feature_source(const KVCache* target) { feature_source_ = target; }
  const KVCache* feature_source() const { return feature_source_; }

 private:
  void update_cross_mask();  // cross_mask_ from cross_lengths_

  std::vector<at::Tensor> keys_;    // per layer [B, H_kv, capacity, D]
  std::vector<at::Tensor> values_;  // per layer [B, H_kv, capacity, D]
  // Per layer [B, H, S, D] (empty until a row is set), S the longest encoder output set; per row
  // its encoder output's length (0: none), and [B, S] of -inf over each row's padding.
  std::vector<std::pair<at::Tensor, at::Tensor>> cross_;
  std::vector<int64_t> cross_lengths_;
  at::Tensor cross_mask_;
  at::Tensor hidden_;  // [B, capacity, size] or undefined
  const KVCache* feature_source_ = nullptr;
  std::vector<int64_t> lengths_;  // per row
  int64_t capacity_ = 0;
};

}  // namespace specdec
