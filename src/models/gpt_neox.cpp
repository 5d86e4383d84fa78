// GPTNeoXForCausalLM (Pythia): LayerNorms with bias, fused per-head QKV, partial rotary
// embeddings (rotary_pct), parallel or sequential residual, GELU MLP, untied head.
#include <c10/core/InferenceMode.h>

#include "layers.hpp"
#include "models/registry.hpp"

namespace specdec::models {
namespace {

struct NeoXLayer {
  layers::Norm ln1, ln2;
  layers::Attention attn;
  layers::Mlp mlp;
};

class GptNeoXModel final : public Model {
 public:
  GptNeoXModel(const ModelConfig& c, const WeightSource& w, const LoadOptions& o)
      : Model(c, o.device, o.dtype),
        rotary_(static_cast<int64_t>(c.head_dim * c.rotary_pct), c.rope_theta, c.rope_scaling,
                c.max_position_embeddings, o.dtype, o.device),
        scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, d = c.head_dim, n = c.num_attention_heads, v = c.vocab_size;
    const std::string root = w.contains("gpt_neox.embed_in.weight") ? "gpt_neox." : "";
    const WeightLoader load(w, o);
    embed_ = load.linear(root + "embed_in.weight", {v, h});
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = root + "layers." + std::to_string(i) + ".";
      NeoXLayer l;
      l.ln1 = {load.tensor(p + "input_layernorm.weight", {h}),
               load.tensor(p + "input_layernorm.bias", {h})};
      l.ln2 = {load.tensor(p + "post_attention_layernorm.weight", {h}),
               load.tensor(p + "post_attention_layernorm.bias", {h})};
      // Stored per head as [q_h | k_h | v_h]; regroup into [all q | all k | all v].
      const auto regroup = [&](const at::Tensor& t) {
        const at::Tensor x = t.reshape({n, 3, d, -1}).transpose(0, 1).reshape({3 * n * d, -1});
        return t.dim() == 1 ? x.reshape({-1}).contiguous() : x.contiguous();
      };
      l.attn.heads = l.attn.kv_heads = n, l.attn.head_dim = d;
      const std::string qkv = p + "attention.query_key_value.weight";
      l.attn.qkv = load.make(
          qkv, regroup(load.stored(qkv, {3 * h, h})),
          c.attention_bias ? regroup(load.tensor(p + "attention.query_key_value.bias", {3 * h}))
                           : at::Tensor());
      l.attn.o = load.linear(
          p + "attention.dense.weight", {h, h},
          c.attention_bias ? load.tensor(p + "attention.dense.bias", {h}) : at::Tensor());
      l.mlp = {load.linear(p + "mlp.dense_h_to_4h.weight", {c.intermediate_size, h},
                           load.tensor(p + "mlp.dense_h_to_4h.bias", {c.intermediate_size})),
               load.linear(p + "mlp.dense_4h_to_h.weight", {h, c.intermediate_size},
                           load.tensor(p + "mlp.dense_4h_to_h.bias", {h})),
               c.hidden_act};
      layers_.push_back(std::move(l));
    }
    final_ = {load.tensor(root + "final_layer_norm.weight", {h}),
              load.tensor(root + "final_layer_norm.bias", {h})};
    head_ = c.tie_word_embeddings ? embed_ : load.linear("embed_out.weight", {v, h});
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    check_pass(input_ids, cache, keep_last);
    const layers::Pass pass(input_ids, cache, row_tokens, device_, trees);
    const ModelConfig& c = config_;
    at::Tensor x = embed_.rows(input_ids, dtype_);
    auto [cos, sin] = rotary_.tables(pass);
    const at::Tensor mask = pass.causal_mask(dtype_);
    const double eps = c.rms_norm_eps;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const NeoXLayer& l = layers_[i];
      // (x + attention) + the MLP's output, of ln2(x) with the parallel residual, else of
      // ln2(x + attention); each addition made by the output projection before it.
      const at::Tensor a = l.attn(l.ln1(x, eps), cache, static_cast<int64_t>(i), mask, scale_, cos,
                                  sin, /*residual=*/x);
      x = l.mlp(l.ln2(c.use_parallel_residual ? x : a, eps), /*residual=*/a);
    }
    pass.commit(cache, x);
    if (keep_last == kCacheOnly) return {};
    x = pass.last(x, keep_last);
    return head_(final_(x, eps)).to(at::kFloat);
  }

 private:
  layers::Rotary rotary_;
  double scale_;
  Linear embed_, head_;  // head_: embed_ itself when tied
  std::vector<NeoXLayer> layers_;
  layers::Norm final_;
};

}  // namespace

std::shared_ptr<const Model> make_gpt_neox(const ModelConfig& config, const WeightSource& weights,
                                           const LoadOptions& options) {
  return std::make_shared<GptNeoXModel>(config, weights, options);
}

}  // namespace specdec::models
