// OPTForCausalLM: learned positions with an offset of 2, LayerNorms before (or, opt-350m style,
// after) each block, separate q/k/v projections fused here, ReLU MLP, optional project_in /
// project_out around the decoder when word_embed_proj_dim differs from hidden_size, tied head.
#include <c10/core/InferenceMode.h>

#include "layers.hpp"
#include "models/registry.hpp"

namespace specdec::models {
namespace {

struct OptLayer {
  layers::Norm attn_ln, mlp_ln;
  layers::Attention attn;
  layers::Mlp mlp;
};

constexpr int64_t kPositionOffset = 2;  // OPTLearnedPositionalEmbedding

class OptModel final : public Model {
 public:
  OptModel(const ModelConfig& c, const WeightSource& w, const LoadOptions& o)
      : Model(c, o.device, o.dtype), scale_(1.0 / std::sqrt(static_cast<double>(c.head_dim))) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, f = c.intermediate_size, v = c.vocab_size;
    const int64_t e = c.word_embed_proj_dim > 0 ? c.word_embed_proj_dim : h;
    const std::string root =
        w.contains("model.decoder.embed_tokens.weight") ? "model.decoder." : "decoder.";
    const WeightLoader load(w, o);
    auto bias = [&](const std::string& name, int64_t n) {
      return c.enable_bias ? load.tensor(name, {n}) : at::Tensor();
    };
    auto norm = [&](const std::string& p) {
      return layers::Norm{load.tensor(p + ".weight", {h}), load.tensor(p + ".bias", {h})};
    };
    embed_ = load.linear(root + "embed_tokens.weight", {v, e});
    positions_ = load.tensor(root + "embed_positions.weight",
                             {c.max_position_embeddings + kPositionOffset, h});
    if (e != h) {
      project_in_ = load.linear(root + "project_in.weight", {h, e});
      project_out_ = load.linear(root + "project_out.weight", {e, h});
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = root + "layers." + std::to_string(i) + ".";
      OptLayer l;
      l.attn_ln = norm(p + "self_attn_layer_norm");
      l.mlp_ln = norm(p + "final_layer_norm");
      l.attn.heads = l.attn.kv_heads = c.num_attention_heads, l.attn.head_dim = c.head_dim;
      const std::string a = p + "self_attn.";
      l.attn.qkv =
          Linear::cat({load.linear(a + "q_proj.weight", {h, h}, bias(a + "q_proj.bias", h)),
                       load.linear(a + "k_proj.weight", {h, h}, bias(a + "k_proj.bias", h)),
                       load.linear(a + "v_proj.weight", {h, h}, bias(a + "v_proj.bias", h))});
      l.attn.o = load.linear(a + "out_proj.weight", {h, h}, bias(a + "out_proj.bias", h));
      l.mlp = {load.linear(p + "fc1.weight", {f, h}, bias(p + "fc1.bias", f)),
               load.linear(p + "fc2.weight", {h, f}, bias(p + "fc2.bias", h)), c.hidden_act};
      layers_.push_back(std::move(l));
    }
    if (c.do_layer_norm_before && !c.remove_final_layer_norm)
      final_ = norm(root + "final_layer_norm");
    head_ = (c.tie_word_embeddings || !w.contains("lm_head.weight"))
                ? embed_
                : load.linear("lm_head.weight", {v, e});
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    check_pass(input_ids, cache, keep_last);
    const layers::Pass pass(input_ids, cache, row_tokens, device_, trees);
    const ModelConfig& c = config_;
    const double eps = c.rms_norm_eps;
    at::Tensor x = embed_.rows(input_ids, dtype_);
    if (project_in_.defined()) x = project_in_(x);
    x = x + layers::learned_positions(positions_, pass, kPositionOffset);
    const at::Tensor mask = pass.causal_mask(dtype_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const OptLayer& l = layers_[i];
      const bool pre = c.do_layer_norm_before;
      x = l.attn(pre ? l.attn_ln(x, eps) : x, cache, static_cast<int64_t>(i), mask, scale_, {}, {},
                 /*residual=*/x);
      if (!pre) x = l.attn_ln(x, eps);
      x = l.mlp(pre ? l.mlp_ln(x, eps) : x, /*residual=*/x);
      if (!pre) x = l.mlp_ln(x, eps);
    }
    pass.commit(cache, x);
    if (keep_last == kCacheOnly) return {};
    x = pass.last(x, keep_last);
    if (final_.w.defined()) x = final_(x, eps);
    if (project_out_.defined()) x = project_out_(x);
    return head_(x).to(at::kFloat);
  }

 private:
  double scale_;
  Linear embed_, project_in_, project_out_, head_;  // head_: embed_ itself when tied
  at::Tensor positions_;
  std::vector<OptLayer> layers_;
  layers::Norm final_;
};

}  // namespace

std::shared_ptr<const Model> make_opt(const ModelConfig& config, const WeightSource& weights,
                                      const LoadOptions& options) {
  return std::make_shared<OptModel>(config, weights, options);
}

}  // namespace specdec::models
