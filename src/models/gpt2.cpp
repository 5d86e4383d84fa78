// GPT2LMHeadModel: learned positions, pre-norm LayerNorms with bias, Conv1D weights (stored
// [in, out], transposed here once), fused c_attn, tanh-GELU MLP, head tied to the embeddings.
#include <c10/core/InferenceMode.h>

#include "layers.hpp"
#include "models/registry.hpp"
#include "specdec/error.hpp"

namespace specdec::models {
namespace {

struct Gpt2Layer {
  layers::Norm ln1, ln2;
  layers::Attention attn;
  layers::Mlp mlp;
  double scale = 1.0;
};

class Gpt2Model final : public Model {
 public:
  Gpt2Model(const ModelConfig& c, const WeightSource& w, const LoadOptions& o)
      : Model(c, o.device, o.dtype) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, in = c.intermediate_size, v = c.vocab_size;
    const std::string root = w.contains("transformer.wte.weight") ? "transformer." : "";
    const WeightLoader load(w, o);
    // Conv1D keeps weights as [in, out]; linear wants [out, in].
    auto conv = [&](const std::string& name, int64_t rows, int64_t cols, const std::string& bias) {
      return load.make(name, load.stored(name, {rows, cols}).t().contiguous(),
                       load.tensor(bias, {cols}));
    };
    wte_ = load.linear(root + "wte.weight", {v, h});
    wpe_ = load.tensor(root + "wpe.weight", {c.max_position_embeddings, h});
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = root + "h." + std::to_string(i) + ".";
      Gpt2Layer l;
      l.ln1 = {load.tensor(p + "ln_1.weight", {h}), load.tensor(p + "ln_1.bias", {h})};
      l.ln2 = {load.tensor(p + "ln_2.weight", {h}), load.tensor(p + "ln_2.bias", {h})};
      l.attn.heads = l.attn.kv_heads = c.num_attention_heads, l.attn.head_dim = c.head_dim;
      l.attn.qkv = conv(p + "attn.c_attn.weight", h, 3 * h, p + "attn.c_attn.bias");
      l.attn.o = conv(p + "attn.c_proj.weight", h, h, p + "attn.c_proj.bias");
      l.mlp = {conv(p + "mlp.c_fc.weight", h, in, p + "mlp.c_fc.bias"),
               conv(p + "mlp.c_proj.weight", in, h, p + "mlp.c_proj.bias"), c.hidden_act};
      l.scale = c.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(c.head_dim)) : 1.0;
      if (c.scale_attn_by_inverse_layer_idx) l.scale /= static_cast<double>(i + 1);
      layers_.push_back(std::move(l));
    }
    ln_f_ = {load.tensor(root + "ln_f.weight", {h}), load.tensor(root + "ln_f.bias", {h})};
    head_ = (c.tie_word_embeddings || !w.contains("lm_head.weight"))
                ? wte_
                : load.linear("lm_head.weight", {v, h});
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last,
                     const std::vector<int64_t>& row_tokens,
                     const std::vector<TokenTree>& trees) const override {
    check_pass(input_ids, cache, keep_last);
    const layers::Pass pass(input_ids, cache, row_tokens, device_, trees);
    const double eps = config_.rms_norm_eps;
    at::Tensor x = wte_.rows(input_ids, dtype_) + layers::learned_positions(wpe_, pass, 0);
    const at::Tensor mask = pass.causal_mask(dtype_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Gpt2Layer& l = layers_[i];
      x = l.attn(l.ln1(x, eps), cache, static_cast<int64_t>(i), mask, l.scale, {}, {},
                 /*residual=*/x);
      x = l.mlp(l.ln2(x, eps), /*residual=*/x);
    }
    pass.commit(cache, x);
    if (keep_last == kCacheOnly) return {};
    x = pass.last(x, keep_last);
    return head_(ln_f_(x, eps)).to(at::kFloat);
  }

 private:
  Linear wte_, head_;  // head_: wte_ itself when tied
  at::Tensor wpe_;
  std::vector<Gpt2Layer> layers_;
  layers::Norm ln_f_;
};

}  // namespace

std::shared_ptr<const Model> make_gpt2(const ModelConfig& config, const WeightSource& weights,
                                       const LoadOptions& options) {
  return std::make_shared<Gpt2Model>(config, weights, options);
}

}  // namespace specdec::models
