// Building blocks shared by the architectures: norms, rotary embeddings, cached attention.
// Private header: full ATen available.
#pragma once

#include <ATen/ATen.h>

#include <array>

#include "specdec/config.hpp"
#include "specdec/kv_cache.hpp"
#include "linear.hpp"

namespace specdec::layers {

// Hugging Face's RMSNorm: normalise in float32, cast back, then scale. x [..., H], w [H].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

// Rotary position embedding over the first `rot_dim` features of each head (rotate-half layout).
class Rotary {
 public:
  Rotary() = default;
  // Precomputes the cos and sin tables of positions [0, max_positions) once, in float32, cast to
  // `dtype` on `device` (as Hugging Face computes them): a position's values never depend on the
  // pass it is in.
  Rotary(int64_t rot_dim, double theta, const RopeScaling& scaling, int64_t max_positions,
         at::ScalarType dtype, c10::Device device);
  // cos, sin tables [T, rot_dim] for positions [start, start + T) (views of the precomputed ones);
  // throws specdec::Error past max_positions.
  std::pair<at::Tensor, at::Tensor> tables(int64_t start, int64_t t) const;
  // x [B, H, T, D]; rotates the first rot_dim features, leaves the rest.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  at::Tensor cos_, sin_;  // [max_positions, rot_dim] in the model's dtype, on its device
};

// Additive causal mask [T, past + T] (0 or -inf) in `dtype`, or an undefined tensor when T == 1.
// With `window` > 0 (Mistral's sliding_window), query i also sees only the last `window` keys up to
// its own position (key j is visible when i - window < j <= i); the mask is then defined for T == 1
// too once the sequence is longer than the window.
at::Tensor causal_mask(int64_t past, int64_t t, at::ScalarType dtype, c10::Device device, int64_t window = 0);

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

// Self-attention with a fused q|k|v projection (rows: Hq*D queries, Hkv*D keys, Hkv*D values),
// optional rotary embeddings and an output projection; keys/values go through the cache.
struct Attention {
  Linear qkv, o;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  // x [B, T, H] -> [B, T, H]. cos/sin undefined: no rotary.
  at::Tensor operator()(const at::Tensor& x, KVCache& cache, int64_t layer, const at::Tensor& mask,
                        double scale, const at::Tensor& cos = {}, const at::Tensor& sin = {}) const;
  // Without a cache: every position of x attends to every position of x under `mask` (encoders).
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& mask, double scale) const;

 private:
  // q [B, Hq, T, D], k and v [B, Hkv, T, D], rotated when cos/sin are defined.
  std::array<at::Tensor, 3> project(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
};

// Two-layer MLP: down(act(up(x))).
struct Mlp {
  Linear up, down;
  std::string act;
  at::Tensor operator()(const at::Tensor& x) const { return down(activation(up(x), act)); }
};

// Gated MLP: down(act(gate(x)) * up(x)), gate and up fused into one [2 I, H] matrix (gate rows
// first). Llama's SiLU MLP; T5 v1.1's gated GELU.
struct GatedMlp {
  Linear gate_up, down;  // biases: Llama's mlp_bias
  std::string act;
  at::Tensor operator()(const at::Tensor& x) const {
    const auto gu = gate_up(x).chunk(2, -1);  // 2 x [B, T, I]
    return down(activation(gu[0], act) * gu[1]);
  }
};

// A LayerNorm's parameters.
struct Norm {
  at::Tensor w, b;
  at::Tensor operator()(const at::Tensor& x, double eps) const { return layer_norm(x, w, b, eps); }
};

// T5's bucket of each relative position (key - query; int64): offsets below half the buckets (per
// direction when bidirectional) get a bucket each, larger ones share logarithmically wider buckets
// up to max_distance, and the rest the last one. Hugging Face's T5Attention._relative_position_bucket
// op for op: its float32 logarithm decides the bucket at the boundaries.
at::Tensor relative_position_bucket(const at::Tensor& rel, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance);

// The last `keep` positions of x [B, T, H] (keep <= 0 or >= T: all of them).
at::Tensor last_positions(const at::Tensor& x, int64_t keep);

// Learned absolute positions: rows [offset + past, offset + past + T) of `table`, [T, H]; throws
// when the sequence would run past the table.
at::Tensor learned_positions(const at::Tensor& table, int64_t past, int64_t t, int64_t offset);

}  // namespace specdec::layers
