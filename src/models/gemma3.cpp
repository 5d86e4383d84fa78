// Gemma3ForCausalLM (model_type gemma3_text): a pre-norm decoder with "sandwich" norms (the
// attention and MLP outputs are normalised again before their residual add), RMSNorm with Gemma's
// (1 + weight) scale, an RMSNorm over each q and k head, embeddings scaled by sqrt(hidden), a
// GeGLU MLP (tanh GELU), and interleaved sliding-window and global attention layers, each kind
// with its own rotary base. The KV cache of a sliding layer keeps every position (the window is
// applied by the mask), as the global layers' does: correct first; a ring buffer would save memory.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>

#include "layers.hpp"
#include "models/registry.hpp"
#include "specdec/error.hpp"

namespace specdec::models {
namespace {

struct Gemma3Layer {
  at::Tensor input_norm;      // [H] float32; each norm weight here is the checkpoint's 1 + w
  layers::Attention attn;     // q, k, v fused; q/k heads normalised
  at::Tensor post_attn_norm;  // [H]: the attention output's, before the residual add
  at::Tensor pre_ff_norm;     // [H]
  layers::GatedMlp mlp;       // gelu_pytorch_tanh-gated
  at::Tensor post_ff_norm;    // [H]: the MLP output's, before the residual add
  bool sliding = false;       // a sliding-window layer (local rotary base) or a global one
};

class Gemma3Model final : public Model {
 public:
  Gemma3Model(const ModelConfig& c, const WeightSource& w, const LoadOptions& o)
      : Model(c, o.device, o.dtype),
        global_(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings, o.dtype,
                o.device),
        local_(c.head_dim, c.rope_local_theta, c.rope_local_scaling, c.max_position_embeddings,
               o.dtype, o.device),
        scale_(1.0 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar
                                                           : static_cast<double>(c.head_dim))),
        // Gemma3TextScaledWordEmbedding: sqrt(hidden) as a float32 tensor, cast to the dtype.
        embed_scale_(at::scalar_tensor(std::sqrt(static_cast<double>(c.hidden_size)), at::kFloat)
                         .to(o.dtype)
                         .to(o.device)) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                  hkv = c.num_key_value_heads, inter = c.intermediate_size, v = c.vocab_size;
    const WeightLoader load(w, o);
    // Gemma3RMSNorm: x / rms(x) * (1 + w) in float32, w in the compute dtype as Hugging Face
    // loads it; (1 + w) is formed once here and kept in float32 (layers::rms_norm then scales in
    // float32 and rounds once).
    auto norm = [&](const std::string& name, int64_t n) {
      return load.tensor(name, {n}).to(at::kFloat) + 1.0;
    };
    embed_ = load.linear("model.embed_tokens.weight", {v, h});
    if (c.feature_size > 0) {  // a feature-fed draft (make-draft --features)
      fc_norm_ = norm("fc_norm.weight", c.feature_size);
      fc_ = load.linear("fc.weight", {h, h + c.feature_size});
    }
    layers_.reserve(c.num_hidden_layers);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const std::string a = p + "self_attn.", m = p + "mlp.";
      Gemma3Layer l;
      l.sliding = c.layer_types.at(static_cast<size_t>(i)) == "sliding_attention";
      l.input_norm = norm(p + "input_layernorm.weight", h);
      l.attn.heads = hq, l.attn.kv_heads = hkv, l.attn.head_dim = d;
      l.attn.qkv = Linear::cat({load.linear(a + "q_proj.weight", {hq * d, h}),
                                load.linear(a + "k_proj.weight", {hkv * d, h}),
                                load.linear(a + "v_proj.weight", {hkv * d, h})});
      l.attn.o = load.linear(a + "o_proj.weight", {h, hq * d});
      l.attn.q_norm = norm(a + "q_norm.weight", d);
      l.attn.k_norm = norm(a + "k_norm.weight", d);
      l.attn.norm_eps = c.rms_norm_eps;
      l.post_attn_norm = norm(p + "post_attention_layernorm.weight", h);
      l.pre_ff_norm = norm(p + "pre_feedforward_layernorm.weight", h);
      l.mlp.gate_up = Linear::cat({load.linear(m + "gate_proj.weight", {inter, h}),
                                   load.linear(m + "up_proj.weight", {inter, h})});
      l.mlp.down = load.linear(m + "down_proj.weight", {h, inter});
      l.mlp.act = c.hidden_act;
      l.post_ff_norm = norm(p + "post_feedforward_layernorm.weight", h);
      layers_.push_back(std::move(l));
    }
    norm_ = norm("model.norm.weight", h);
    head_ = layers::load_head(c, w, load, embed_, o.device);
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    check_pass(input_ids, cache, keep_last);
    const layers::Pass pass(input_ids, cache, row_tokens, device_, trees);
    const ModelConfig& c = config_;
    at::Tensor x = embed_.rows(input_ids, dtype_) * embed_scale_;  // [B, T, H]
    if (c.feature_size > 0)
      x = fc_(at::cat({x, layers::rms_norm(layers::draft_features(pass, cache, c.feature_size),
                                           fc_norm_, c.rms_norm_eps)},
                      2));
    const auto [cos_g, sin_g] = global_.tables(pass);  // [T, D]
    const auto [cos_l, sin_l] = local_.tables(pass);
    const at::Tensor full = pass.causal_mask(dtype_);                      // [T, past+T]
    const at::Tensor window = pass.causal_mask(dtype_, c.sliding_window);  // [T, past+T]
    const double eps = c.rms_norm_eps;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Gemma3Layer& l = layers_[i];
      const at::Tensor a =
          l.attn(layers::rms_norm(x, l.input_norm, eps), cache, static_cast<int64_t>(i),
                 l.sliding ? window : full, scale_, l.sliding ? cos_l : cos_g,
                 l.sliding ? sin_l : sin_g);  // [B, T, H]
      x = x + layers::rms_norm(a, l.post_attn_norm, eps);
      x = x + layers::rms_norm(l.mlp(layers::rms_norm(x, l.pre_ff_norm, eps)), l.post_ff_norm, eps);
    }
    pass.commit(cache, x);
    if (keep_last == kCacheOnly) return {};
    return head_(layers::rms_norm(pass.last(x, keep_last), norm_, eps));  // [B, T', V]
  }

 private:
  layers::Rotary global_, local_;  // full-attention and sliding layers' rotary embeddings
  double scale_;
  at::Tensor embed_scale_;  // [] in the dtype
  Linear embed_;            // [V, H]
  at::Tensor fc_norm_;      // [F] float32, (1 + w): feature-fed drafts only
  Linear fc_;               // [H, H + F]: feature-fed drafts only
  std::vector<Gemma3Layer> layers_;
  at::Tensor norm_;  // [H] float32, (1 + w)
  layers::Head head_;
};

}  // namespace

std::shared_ptr<const Model> make_gemma3(const ModelConfig& config, const WeightSource& weights,
                                         const LoadOptions& options) {
  return std::make_shared<Gemma3Model>(config, weights, options);
}

}  // namespace specdec::models
