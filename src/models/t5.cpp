// T5ForConditionalGeneration (t5, t5-v1_1, flan-t5): an encoder and a decoder of pre-norm blocks
// with T5's RMS LayerNorm, unscaled attention with a relative position bias (bucketed, learnt by
// the first block of each stack and shared by the others), ReLU or gated-GELU feed-forward, and a
// head tied to the shared embedding (then scaled by d_model^-0.5) or separate (lm_head).
//
// The encoder runs once per request (encode); attach_encoder computes every decoder layer's
// cross-attention keys/values from its output once; the decoder's self-attention goes through the
// ordinary, croppable KVCache.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "layers.hpp"
#include "models/registry.hpp"
#include "specdec/error.hpp"

namespace specdec::models {
namespace {

// T5's relative position bias: learnt per (bucket, head) for the bucket of each key's offset from
// the query (layers::relative_position_bucket).
class RelativeBias {
 public:
  RelativeBias() = default;
  RelativeBias(at::Tensor table, bool bidirectional, int64_t buckets, int64_t max_distance)
      : table_(std::move(table)),
        bidirectional_(bidirectional),
        buckets_(buckets),
        max_distance_(max_distance) {}

  // Additive bias [H, 1, T, L] for queries at positions [past, past + T) against keys [0, L).
  at::Tensor operator()(int64_t past, int64_t t, int64_t len) const {
    const auto opts = at::TensorOptions().dtype(at::kLong).device(table_.device());
    return bias(at::arange(len, opts).view({1, len}) -
                at::arange(past, past + t, opts).view({t, 1}));
  }
  // The same for a pass: [H, 1, T, L] when its rows start at the same position, else
  // [B, H, 1, T, L] (each row's queries at its own positions).
  at::Tensor operator()(const layers::Pass& pass) const {
    if (pass.same_start()) return (*this)(pass.past(), pass.tokens(), pass.keys());
    const int64_t len = pass.keys();
    const at::Tensor pos =
        pass.positions(std::numeric_limits<int64_t>::max());  // [B, T] on the device
    return bias(at::arange(len, pos.options()).view({1, 1, len}) - pos.unsqueeze(-1));
  }

  const at::Tensor& table() const { return table_; }

 private:
  // rel [..., T, L] (key - query) -> bias [..., H, 1, T, L].
  at::Tensor bias(const at::Tensor& rel) const {
    const at::Tensor b =
        layers::relative_position_bucket(rel, bidirectional_, buckets_, max_distance_);
    std::vector<int64_t> shape = rel.sizes().vec();
    shape.push_back(-1);
    const int64_t n = rel.dim();
    return table_.index_select(0, b.reshape(-1)).view(shape).movedim(n, n - 2).unsqueeze(-3);
  }

 private:
  at::Tensor table_;  // [buckets, H]
  bool bidirectional_ = true;
  int64_t buckets_ = 32, max_distance_ = 128;
};

// T5 keeps float16 activations finite by clamping them after every sub-layer.
at::Tensor clamp_half(const at::Tensor& x) {
  if (x.scalar_type() != at::kHalf) return x;
  const double max = 65504.0;  // torch.finfo(torch.float16).max
  // Hugging Face's rule, decided on the device (no host sync): max - 1000 once anything overflowed.
  const at::Tensor c =
      at::where(x.isinf().any(), at::Scalar(max - 1000), at::Scalar(max)).to(x.scalar_type());
  return at::maximum(at::minimum(x, c), -c);
}

struct T5Block {
  at::Tensor attn_norm;
  layers::Attention attn;   // self-attention, unscaled
  at::Tensor cross_norm;    // decoder only
  Linear cross_q, cross_o;  // decoder only; keys/values come from attach_encoder
  at::Tensor ff_norm;
  layers::Mlp mlp;         // ReLU (t5): wo(act(wi x))
  layers::GatedMlp gated;  // gated-GELU (t5-v1_1, flan-t5): wo(act(wi_0 x) * wi_1 x)
  bool is_gated = false;
  // The feed-forward block on x, plus `residual`.
  at::Tensor ff(const at::Tensor& x, const at::Tensor& residual) const {
    return is_gated ? gated(x, residual) : mlp(x, residual);
  }
};

class T5Model final : public Model {
 public:
  T5Model(const ModelConfig& c, const WeightSource& w, const LoadOptions& o)
      : Model(c, o.device, o.dtype) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, inner = c.num_attention_heads * c.head_dim,
                  f = c.intermediate_size, v = c.vocab_size;
    const WeightLoader load(w, o);
    embed_ = load.linear(
        w.contains("shared.weight") ? "shared.weight" : "encoder.embed_tokens.weight", {v, h});
    auto block = [&](const std::string& p, bool decoder) {
      T5Block b;
      const std::string sa = p + "layer.0.SelfAttention.";
      b.attn_norm = load.tensor(p + "layer.0.layer_norm.weight", {h});
      b.attn.heads = b.attn.kv_heads = c.num_attention_heads, b.attn.head_dim = c.head_dim;
      b.attn.qkv = Linear::cat({load.linear(sa + "q.weight", {inner, h}),
                                load.linear(sa + "k.weight", {inner, h}),
                                load.linear(sa + "v.weight", {inner, h})});
      b.attn.o = load.linear(sa + "o.weight", {h, inner});
      if (decoder) {
        const std::string ca = p + "layer.1.EncDecAttention.";
        b.cross_norm = load.tensor(p + "layer.1.layer_norm.weight", {h});
        b.cross_q = load.linear(ca + "q.weight", {inner, h});
        b.cross_o = load.linear(ca + "o.weight", {h, inner});
      }
      const std::string ffp = p + "layer." + (decoder ? "2" : "1") + ".DenseReluDense.";
      b.ff_norm = load.tensor(p + "layer." + (decoder ? "2" : "1") + ".layer_norm.weight", {h});
      b.is_gated = c.is_gated_act;
      if (c.is_gated_act) {
        b.gated.gate_up = Linear::cat(
            {load.linear(ffp + "wi_0.weight", {f, h}), load.linear(ffp + "wi_1.weight", {f, h})});
        b.gated.down = load.linear(ffp + "wo.weight", {h, f});
        b.gated.act = c.hidden_act;
      } else {
        b.mlp.up = load.linear(ffp + "wi.weight", {f, h});
        b.mlp.down = load.linear(ffp + "wo.weight", {h, f});
        b.mlp.act = c.hidden_act;
      }
      return b;
    };
    const std::string bias_name = "block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    const std::vector<int64_t> bias_shape = {c.relative_attention_num_buckets,
                                             c.num_attention_heads};
    encoder_bias_ =
        RelativeBias(load.tensor("encoder." + bias_name, bias_shape), true,
                     c.relative_attention_num_buckets, c.relative_attention_max_distance);
    decoder_bias_ =
        RelativeBias(load.tensor("decoder." + bias_name, bias_shape), false,
                     c.relative_attention_num_buckets, c.relative_attention_max_distance);
    for (int64_t i = 0; i < c.num_encoder_layers; ++i)
      encoder_.push_back(block("encoder.block." + std::to_string(i) + ".", false));
    std::vector<Linear> cross_kv;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = "decoder.block." + std::to_string(i) + ".";
      decoder_.push_back(block(p, true));
      cross_kv.push_back(load.linear(p + "layer.1.EncDecAttention.k.weight", {inner, h}));
      cross_kv.push_back(load.linear(p + "layer.1.EncDecAttention.v.weight", {inner, h}));
    }
    cross_kv_ = Linear::cat(cross_kv);  // every layer's keys and values: one matmul per request
    encoder_norm_ = load.tensor("encoder.final_layer_norm.weight", {h});
    decoder_norm_ = load.tensor("decoder.final_layer_norm.weight", {h});
    const bool has_head = w.contains("lm_head.weight");
    SPECDEC_CHECK(
        has_head || c.tie_word_embeddings, w.dir(),
        ": checkpoint has no tensor named 'lm_head.weight' and tie_word_embeddings is false");
    lm_head_ = c.tie_word_embeddings ? embed_ : load.linear("lm_head.weight", {v, h});
  }

  at::Tensor encode(const at::Tensor& input_ids) const override {
    const double eps = config_.rms_norm_eps;
    const int64_t s = input_ids.size(1);
    at::Tensor x = embed_.rows(input_ids, dtype_);   // [B, S, H]
    const at::Tensor bias = encoder_bias_(0, s, s);  // [H, 1, S, S]
    for (const T5Block& b : encoder_) {
      x = clamp_half(b.attn(layers::rms_norm(x, b.attn_norm, eps), bias, 1.0, /*residual=*/x));
      x = clamp_half(b.ff(layers::rms_norm(x, b.ff_norm, eps), /*residual=*/x));
    }
    return layers::rms_norm(x, encoder_norm_, eps);
  }

  void attach_encoder(const at::Tensor& states, KVCache& cache, int64_t row) const override {
    SPECDEC_CHECK(states.dim() == 3 && states.size(0) == 1 && states.size(1) >= 1 &&
                      states.size(2) == config_.hidden_size,
                  "attach_encoder: expected one sequence's encoder states [1, S, ",
                  config_.hidden_size, "], got ", states.sizes());
    const int64_t s = states.size(1);
    // [1, S, layers * 2 * H * D] -> [layers * 2, H, S, D]
    const at::Tensor kv = cross_kv_(states.to(device_, dtype_))
                              .view({s, -1, config_.num_attention_heads, config_.head_dim})
                              .permute({1, 2, 0, 3});
    std::vector<at::Tensor> keys, values;
    for (int64_t i = 0; i < static_cast<int64_t>(decoder_.size()); ++i) {
      keys.push_back(kv[2 * i]);
      values.push_back(kv[2 * i + 1]);
    }
    cache.set_cross(row, keys, values);
  }

  bool same_encoder(const Model& other) const override {
    if (&other == this) return true;
    const auto* o = dynamic_cast<const T5Model*>(&other);
    if (o == nullptr || o->dtype_ != dtype_ || o->device_ != device_) return false;
    const ModelConfig &a = config_, &b = o->config_;
    if (a.hidden_size != b.hidden_size || a.num_encoder_layers != b.num_encoder_layers ||
        a.num_attention_heads != b.num_attention_heads || a.head_dim != b.head_dim ||
        a.intermediate_size != b.intermediate_size || a.hidden_act != b.hidden_act ||
        a.is_gated_act != b.is_gated_act || a.rms_norm_eps != b.rms_norm_eps ||
        a.relative_attention_num_buckets != b.relative_attention_num_buckets ||
        a.relative_attention_max_distance != b.relative_attention_max_distance)
      return false;
    const auto mine = encoder_tensors(), theirs = o->encoder_tensors();
    for (size_t i = 0; i < mine.size(); ++i)
      if (mine[i].sizes() != theirs[i].sizes() ||
          mine[i].scalar_type() != theirs[i].scalar_type() || !at::equal(mine[i], theirs[i]))
        return false;
    return true;
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    // T5's relative position bias is computed between positions, not along a path: chains only.
    SPECDEC_CHECK(trees.empty(), "T5 verifies chains only, not trees of candidates");
    check_pass(input_ids, cache, keep_last);
    const layers::Pass pass(input_ids, cache, row_tokens, device_);
    const double eps = config_.rms_norm_eps;
    const int64_t t = input_ids.size(1);
    at::Tensor x = embed_.rows(input_ids, dtype_);  // [B, T, H]
    at::Tensor bias = decoder_bias_(pass);          // [H, 1, T, L] or [B, H, 1, T, L]
    const at::Tensor causal = pass.causal_mask(dtype_);
    if (causal.defined()) bias = bias + causal;
    const int64_t b = x.size(0), heads = config_.num_attention_heads, d = config_.head_dim;
    for (size_t i = 0; i < decoder_.size(); ++i) {
      const T5Block& l = decoder_[i];
      const auto layer = static_cast<int64_t>(i);
      x = clamp_half(l.attn(layers::rms_norm(x, l.attn_norm, eps), cache, layer, bias, 1.0, {}, {},
                            /*residual=*/x));
      const at::Tensor q = l.cross_q(layers::rms_norm(x, l.cross_norm, eps))
                               .view({b, t, heads, d})
                               .transpose(1, 2);       // [B, H, T, D]
      const KVCache::Cross c = cache.cross(layer, b);  // [B, H, S, D]
      x = clamp_half(l.cross_o(layers::attend(q, c.keys, c.values, c.mask, 1.0),
                               /*residual=*/x));
      x = clamp_half(l.ff(layers::rms_norm(x, l.ff_norm, eps), /*residual=*/x));
    }
    pass.commit(cache, x);
    if (keep_last == kCacheOnly) return {};
    x = layers::rms_norm(pass.last(x, keep_last), decoder_norm_, eps);
    if (config_.tie_word_embeddings)
      x = x * std::pow(static_cast<double>(config_.hidden_size), -0.5);
    return lm_head_(x).to(at::kFloat);
  }

 private:
  // Everything the encoder's output depends on, in a fixed order.
  std::vector<at::Tensor> encoder_tensors() const {
    std::vector<at::Tensor> t = {encoder_bias_.table(), encoder_norm_};
    std::vector<const Linear*> linears = {&embed_};
    for (const T5Block& b : encoder_) {
      t.insert(t.end(), {b.attn_norm, b.ff_norm});
      linears.insert(linears.end(),
                     {&b.attn.qkv, &b.attn.o, b.is_gated ? &b.gated.gate_up : &b.mlp.up,
                      b.is_gated ? &b.gated.down : &b.mlp.down});
    }
    for (const Linear* l : linears) {
      const auto w = l->tensors();
      t.insert(t.end(), w.begin(), w.end());
    }
    return t;
  }

  Linear embed_;  // [V, H] shared by encoder, decoder (and the head when tied)
  RelativeBias encoder_bias_, decoder_bias_;
  std::vector<T5Block> encoder_, decoder_;
  Linear cross_kv_;  // [layers * 2 * H * D, H]: k then v of each decoder layer
  at::Tensor encoder_norm_, decoder_norm_;
  Linear lm_head_;  // [V, H]: embed_ itself when tied
};

}  // namespace

std::shared_ptr<const Model> make_t5(const ModelConfig& config, const WeightSource& weights,
                                     const LoadOptions& options) {
  return std::make_shared<T5Model>(config, weights, options);
}

}  // namespace specdec::models
