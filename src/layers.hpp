// Building blocks shared by the architectures: norms, rotary embeddings, cached attention.
// Private header: full ATen available.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <vector>

#include "linear.hpp"
#include "specdec/config.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/model.hpp"

namespace specdec::layers {

// Hugging Face's RMSNorm, x [..., H], w [H]: normalise in float32, cast back, then scale
// (LlamaRMSNorm), or, when w is float32 (Gemma's 1 + w), scale in float32 and cast once
// (Gemma3RMSNorm). The same for float32 x.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

// Where the tokens of one forward pass go (Model::forward): row b of input_ids [B, T] goes to cache
// row b, its first n_b tokens (row_tokens[b], all T when row_tokens is empty) at positions
// [cache.length(b), cache.length(b) + n_b); the rest of the row is padding, computed but never
// attended to by a real token and never kept. When every row starts at the same position (one
// request, or a batch in lockstep) masks and tables are the single-sequence ones. `trees` (one per
// row, or none; an empty one: a chain): a row's real tokens as a TokenTree (Model::forward), each
// at position start + depth, seeing its ancestors and the cached positions only.
class Pass {
 public:
  Pass(const at::Tensor& input_ids, const KVCache& cache, const std::vector<int64_t>& row_tokens,
       c10::Device device, const std::vector<TokenTree>& trees = {});
  int64_t rows() const { return static_cast<int64_t>(starts_.size()); }
  int64_t tokens() const { return t_; }
  bool same_start() const { return same_start_; }
  int64_t past() const { return starts_[0]; }  // same_start(): where every row starts
  int64_t keys() const { return keys_; }       // L: the key positions attention runs over
  int64_t end() const { return end_; }         // 1 + the last real position of any row
  // [B, T] int64 positions on the device, padding clamped below `limit` (tables' sizes); only
  // when !same_start().
  at::Tensor positions(int64_t limit) const;
  // Token j of row `row`'s position (a tree's: start + depth; padding's: start + j).
  int64_t position(int64_t row, int64_t j) const {
    return positions_host_[static_cast<size_t>(row * t_ + j)];
  }
  int64_t start(int64_t row) const {
    return starts_[static_cast<size_t>(row)];
  }  // row's first position
  int64_t count(int64_t row) const {
    return counts_[static_cast<size_t>(row)];
  }  // row's real tokens
  // Additive causal mask over the pass's L keys: [T, L] (undefined when T == 1 and no window
  // applies) when same_start(), else [B, 1, 1, T, L]. `window` > 0: Mistral's sliding window (by
  // position). A tree's token sees the cached keys and its ancestors' (and its own).
  at::Tensor causal_mask(at::ScalarType dtype, int64_t window = 0) const;
  // The hidden states x [B, T, H] of each row's last `keep` real tokens ([B, keep, H]; keep <= 0:
  // all T). A row with fewer real tokens gets copies of its first one in front.
  at::Tensor last(const at::Tensor& x, int64_t keep) const;
  // Advances each row of `cache` by its real tokens, after every layer has appended; `hidden`
  // ([B, T, H]: the last layer's output, before the final norm) is kept when the cache asks for it.
  void commit(KVCache& cache, const at::Tensor& hidden) const {
    cache.store_hidden(hidden, counts_);
    cache.advance(counts_);
  }

 private:
  // The mask of a pass with a tree: built on the host, key by key.
  at::Tensor tree_mask(at::ScalarType dtype, int64_t window) const;

  std::vector<int64_t> starts_, counts_;
  std::vector<TokenTree> trees_;         // empty: every row a chain
  std::vector<int64_t> positions_host_;  // [B * T]
  at::Tensor positions_;                 // [B, T] on the device; only when !same_start_
  int64_t t_ = 0, keys_ = 0, end_ = 0;
  bool same_start_ = true, full_ = true;
  c10::Device device_;
};

// A feature-fed draft's features for the pass: [B, T, F], row b's token at position p getting the
// hidden state of position p - 1 from the target's cache (cache.feature_source()) where the
// target holds it, else from the draft's own cache (its prediction), zeros at p = 0 and for
// padding.
at::Tensor draft_features(const Pass& pass, const KVCache& cache, int64_t feature_size);

// Rotary position embedding over the first `rot_dim` features of each head (rotate-half layout).
class Rotary {
 public:
  Rotary() = default;
  // The inverse frequencies (with the configured scaling) in float32, as Hugging Face computes
  // them. No table of every position is kept (4 MB for SmolLM2's 8192, beside 94 MB of weights):
  // each pass computes the cos and sin of its own positions on the host, one float32 product and
  // one scalar cosf/sinf per (position, frequency), so a position's values never depend on the
  // pass it is in. Positions run below min(max_positions, Limits::max_sequence_length).
  Rotary(int64_t rot_dim, double theta, const RopeScaling& scaling, int64_t max_positions,
         at::ScalarType dtype, c10::Device device);
  // cos, sin tables [T, rot_dim] for positions [start, start + T); throws specdec::Error past the
  // last position.
  std::pair<at::Tensor, at::Tensor> tables(int64_t start, int64_t t) const;
  // The tables of a pass: [T, rot] when every row starts at the same position, else
  // [B, 1, T, rot] (a position per row and token).
  std::pair<at::Tensor, at::Tensor> tables(const Pass& pass) const;
  // x [B, H, T, D]; rotates the first rot_dim features, leaves the rest.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  // [rows, T, rot] cos and sin of positions[r * T + j], in the model's dtype on its device;
  // throws specdec::Error when `end` (1 + the last real position) passes the last position.
  std::pair<at::Tensor, at::Tensor> compute(const std::vector<int64_t>& positions, int64_t rows,
                                            int64_t t, int64_t end) const;

  std::vector<float> inv_;  // [rot_dim / 2] inverse frequencies
  int64_t max_positions_ = 0;
  at::ScalarType dtype_ = at::kFloat;
  c10::Device device_ = c10::kCPU;
};

// Additive causal mask [T, past + T] (0 or -inf) in `dtype`, or an undefined tensor when T == 1.
// With `window` > 0 (Mistral's sliding_window), query i also sees only the last `window` keys up to
// its own position (key j is visible when i - window < j <= i); the mask is then defined for T == 1
// too once the sequence is longer than the window.
at::Tensor causal_mask(int64_t past, int64_t t, at::ScalarType dtype, c10::Device device,
                       int64_t window = 0);

// Grouped-query attention: q [B, Hq, T, D] against keys, values [B, Hkv, L, D]. mask: additive,
// broadcastable to [B, Hkv, Hq / Hkv, T, L] (e.g. [T, L], or [H, 1, T, L] with a per-head bias),
// or undefined. Returns [B, T, Hq * D].
at::Tensor attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& mask, double scale);
// The same against the cache: k, v [B, Hkv, T, D] are appended to `cache` layer `layer` first.
at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            KVCache& cache, int64_t layer, const at::Tensor& mask, double scale);

// LayerNorm with weight and bias (either may be undefined) over the last dimension.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps);

// Hugging Face activations by name (ModelConfig::validate admits only these): relu, gelu (erf),
// gelu_new / gelu_pytorch_tanh / gelu_fast (tanh approximation), silu.
at::Tensor activation(const at::Tensor& x, const std::string& name);
// act(gate) * up of a fused gate|up [..., 2 I] (gate first).
at::Tensor gated_activation(const at::Tensor& gate_up, const std::string& name);

// Self-attention with a fused q|k|v projection (rows: Hq*D queries, Hkv*D keys, Hkv*D values),
// optional rotary embeddings and an output projection; keys/values go through the cache.
struct Attention {
  Linear qkv, o;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  // Qwen3, Gemma 3: RMSNorm weights [head_dim] applied to each head of q and of k before the
  // rotary embedding (undefined: none), with the model's epsilon.
  at::Tensor q_norm, k_norm;
  double norm_eps = 1e-6;
  // x [B, T, H] -> [B, T, H]. cos/sin undefined: no rotary. `residual` defined: residual + that,
  // added by the output projection (Linear::operator()).
  at::Tensor operator()(const at::Tensor& x, KVCache& cache, int64_t layer, const at::Tensor& mask,
                        double scale, const at::Tensor& cos = {}, const at::Tensor& sin = {},
                        const at::Tensor& residual = {}) const;
  // Without a cache: every position of x attends to every position of x under `mask` (encoders).
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& mask, double scale,
                        const at::Tensor& residual = {}) const;

 private:
  // The projection y = qkv(x) [B, T, (Hq + 2 Hkv) D], its q and k heads normalised when q_norm is
  // defined.
  at::Tensor project(const at::Tensor& x) const;
  // q [B, Hq, T, D], k and v [B, Hkv, T, D] of a projection, rotated when cos/sin are defined.
  std::array<at::Tensor, 3> split(const at::Tensor& y, const at::Tensor& cos,
                                  const at::Tensor& sin) const;
};

// Two-layer MLP: down(act(up(x))), plus `residual` when defined (added by down).
struct Mlp {
  Linear up, down;
  std::string act;
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& residual = {}) const {
    return down(activation(up(x), act), residual);
  }
};

// Gated MLP: down(act(gate(x)) * up(x)), gate and up fused into one [2 I, H] matrix (gate rows
// first), plus `residual` when defined (added by down). Llama's SiLU MLP; T5 v1.1's gated GELU.
struct GatedMlp {
  Linear gate_up, down;  // biases: Llama's mlp_bias
  std::string act;
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& residual = {}) const {
    return down(gated_activation(gate_up(x), act), residual);
  }
};

// The language-model head: logits = w(x) in float32 [B, T, V]. w is [V, H] (the embeddings when
// tied), or, for a reduced head (head_token_ids, make-draft --vocab-subset), [V', H] over `ids`,
// every other id getting -inf (probability 0).
struct Head {
  Linear w;
  at::Tensor ids;  // [V'] int64 on the device; undefined: w covers the vocabulary
  int64_t vocab = 0;
  at::Tensor operator()(const at::Tensor& x) const;
};
// The head of a decoder with embeddings `embed`: lm_head.weight, or the embeddings when tied (or
// when the checkpoint has no lm_head.weight and says tie_word_embeddings), or a reduced head.
Head load_head(const ModelConfig& c, const WeightSource& w, const WeightLoader& load,
               const Linear& embed, c10::Device device);

// A LayerNorm's parameters.
struct Norm {
  at::Tensor w, b;
  at::Tensor operator()(const at::Tensor& x, double eps) const { return layer_norm(x, w, b, eps); }
};

// T5's bucket of each relative position (key - query; int64): offsets below half the buckets (per
// direction when bidirectional) get a bucket each, larger ones share logarithmically wider buckets
// up to max_distance, and the rest the last one. Hugging Face's
// T5Attention._relative_position_bucket op for op: its float32 logarithm decides the bucket at the
// boundaries.
at::Tensor relative_position_bucket(const at::Tensor& rel, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance);

// The last `keep` positions of x [B, T, H] (keep <= 0 or >= T: all of them).
at::Tensor last_positions(const at::Tensor& x, int64_t keep);

// Learned absolute positions: rows [offset + past, offset + past + T) of `table`, [T, H]; throws
// when the sequence would run past the table.
at::Tensor learned_positions(const at::Tensor& table, int64_t past, int64_t t, int64_t offset);
// The rows of a pass: [T, H] when every row starts at the same position, else [B, T, H].
at::Tensor learned_positions(const at::Tensor& table, const Pass& pass, int64_t offset);

}  // namespace specdec::layers
