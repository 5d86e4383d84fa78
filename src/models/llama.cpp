// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM: pre-norm decoder with
// RMSNorm, rotary embeddings, grouped-query attention (Qwen3: with an RMSNorm over each q and k
// head) and a SiLU-gated MLP.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "layers.hpp"
#include "models/registry.hpp"
#include "specdec/error.hpp"

namespace specdec::models {
namespace {

struct LlamaLayer {
  at::Tensor input_norm;   // [H]
  layers::Attention attn;  // q, k, v fused into one matmul; biases for Qwen2
  at::Tensor post_norm;    // [H]
  layers::GatedMlp mlp;    // SiLU-gated
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& c, const WeightSource& w, const LoadOptions& o)
      : Model(c, o.device, o.dtype),
        rotary_(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings, o.dtype,
                o.device),
        scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                  hkv = c.num_key_value_heads, inter = c.intermediate_size, v = c.vocab_size;
    const WeightLoader load(w, o);
    embed_ = load.linear("model.embed_tokens.weight", {v, h});
    if (c.feature_size > 0) {
      fc_norm_ = load.tensor("fc_norm.weight", {c.feature_size});
      fc_ = load.linear("fc.weight", {h, h + c.feature_size});
    }
    layers_.reserve(c.num_hidden_layers);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      auto bias = [&](const std::string& name, int64_t n, bool present) {
        return present ? load.tensor(name, {n}) : at::Tensor();
      };
      LlamaLayer l;
      l.input_norm = load.tensor(p + "input_layernorm.weight", {h});
      l.attn.heads = hq, l.attn.kv_heads = hkv, l.attn.head_dim = d;
      const std::string a = p + "self_attn.";
      l.attn.qkv = Linear::cat({load.linear(a + "q_proj.weight", {hq * d, h},
                                            bias(a + "q_proj.bias", hq * d, c.attention_bias)),
                                load.linear(a + "k_proj.weight", {hkv * d, h},
                                            bias(a + "k_proj.bias", hkv * d, c.attention_bias)),
                                load.linear(a + "v_proj.weight", {hkv * d, h},
                                            bias(a + "v_proj.bias", hkv * d, c.attention_bias))});
      // LlamaAttention and Qwen3Attention give o_proj a bias with attention_bias too (Qwen2's and
      // Mistral's never have one): loaded when the checkpoint has it.
      l.attn.o = load.linear(
          a + "o_proj.weight", {h, hq * d},
          bias(a + "o_proj.bias", h, c.attention_bias && w.contains(a + "o_proj.bias")));
      if (c.qk_norm) {
        l.attn.q_norm = load.tensor(a + "q_norm.weight", {d});
        l.attn.k_norm = load.tensor(a + "k_norm.weight", {d});
        l.attn.norm_eps = c.rms_norm_eps;
      }
      l.post_norm = load.tensor(p + "post_attention_layernorm.weight", {h});
      const std::string m = p + "mlp.";
      l.mlp.gate_up = Linear::cat({load.linear(m + "gate_proj.weight", {inter, h},
                                               bias(m + "gate_proj.bias", inter, c.mlp_bias)),
                                   load.linear(m + "up_proj.weight", {inter, h},
                                               bias(m + "up_proj.bias", inter, c.mlp_bias))});
      l.mlp.down = load.linear(m + "down_proj.weight", {h, inter},
                               bias(m + "down_proj.bias", h, c.mlp_bias));
      l.mlp.act = "silu";
      layers_.push_back(std::move(l));
    }
    norm_ = load.tensor("model.norm.weight", {h});
    head_ = layers::load_head(c, w, load, embed_, o.device);
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    check_pass(input_ids, cache, keep_last);
    const layers::Pass pass(input_ids, cache, row_tokens, device_, trees);
    const ModelConfig& c = config_;
    at::Tensor x = embed_.rows(input_ids, dtype_);  // [B, T, H]
    if (c.feature_size > 0)
      x = fc_(at::cat({x, layers::rms_norm(layers::draft_features(pass, cache, c.feature_size),
                                           fc_norm_, c.rms_norm_eps)},
                      2));
    auto [cos, sin] = rotary_.tables(pass);                              // [T, D]
    const at::Tensor mask = pass.causal_mask(dtype_, c.sliding_window);  // [T, past+T]
    for (size_t i = 0; i < layers_.size(); ++i) {
      const LlamaLayer& l = layers_[i];
      const at::Tensor hidden = layers::rms_norm(x, l.input_norm, c.rms_norm_eps);  // [B, T, H]
      x = l.attn(hidden, cache, static_cast<int64_t>(i), mask, scale_, cos, sin, /*residual=*/x);
      x = l.mlp(layers::rms_norm(x, l.post_norm, c.rms_norm_eps), /*residual=*/x);
    }
    pass.commit(cache, x);
    if (keep_last == kCacheOnly) return {};
    return head_(layers::rms_norm(pass.last(x, keep_last), norm_, c.rms_norm_eps));  // [B, T', V]
  }

 private:
  layers::Rotary rotary_;
  double scale_;
  Linear embed_;        // [V, H]
  at::Tensor fc_norm_;  // [F]: feature-fed drafts only: the features' RMS norm before fc
  Linear fc_;           // [H, H + F]: feature-fed drafts only
  std::vector<LlamaLayer> layers_;
  at::Tensor norm_;  // [H]
  layers::Head head_;
};

}  // namespace

std::shared_ptr<const Model> make_llama(const ModelConfig& config, const WeightSource& weights,
                                        const LoadOptions& options) {
  return std::make_shared<LlamaModel>(config, weights, options);
}

}  // namespace specdec::models
