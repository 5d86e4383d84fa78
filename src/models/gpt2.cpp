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
  Gpt2Model(const ModelConfig& c, const WeightSource& w, const LoadOptions& o) : Model(c, o.device, o.dtype) {
    c10::InferenceMode guard;
    const int64_t h = c.hidden_size, in = c.intermediate_size, v = c.vocab_size;
    const std::string root = w.contains("transformer.wte.weight") ? "transformer." : "";
    auto load = [&](const std::string& name, std::vector<int64_t> shape) {
      return w.load(name, dtype_, device_, shape);
    };
    // Conv1D keeps weights as [in, out]; linear wants [out, in].
    auto conv = [&](const std::string& name, int64_t rows, int64_t cols) {
      return load(name, {rows, cols}).t().contiguous();
    };
    wte_ = load(root + "wte.weight", {v, h});
    wpe_ = load(root + "wpe.weight", {c.max_position_embeddings, h});
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = root + "h." + std::to_string(i) + ".";
      Gpt2Layer l;
      l.ln1 = {load(p + "ln_1.weight", {h}), load(p + "ln_1.bias", {h})};
      l.ln2 = {load(p + "ln_2.weight", {h}), load(p + "ln_2.bias", {h})};
      l.attn.heads = l.attn.kv_heads = c.num_attention_heads, l.attn.head_dim = c.head_dim;
      l.attn.qkv_w = conv(p + "attn.c_attn.weight", h, 3 * h);
      l.attn.qkv_b = load(p + "attn.c_attn.bias", {3 * h});
      l.attn.o_w = conv(p + "attn.c_proj.weight", h, h);
      l.attn.o_b = load(p + "attn.c_proj.bias", {h});
      l.mlp = {conv(p + "mlp.c_fc.weight", h, in), load(p + "mlp.c_fc.bias", {in}),
               conv(p + "mlp.c_proj.weight", in, h), load(p + "mlp.c_proj.bias", {h}), c.hidden_act};
      l.scale = c.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(c.head_dim)) : 1.0;
      if (c.scale_attn_by_inverse_layer_idx) l.scale /= static_cast<double>(i + 1);
      layers_.push_back(std::move(l));
    }
    ln_f_ = {load(root + "ln_f.weight", {h}), load(root + "ln_f.bias", {h})};
    head_ = (c.tie_word_embeddings || !w.contains("lm_head.weight")) ? wte_ : load("lm_head.weight", {v, h});
  }

  at::Tensor forward(const at::Tensor& input_ids, KVCache& cache, int64_t keep_last) const override {
    const double eps = config_.rms_norm_eps;
    const int64_t t = input_ids.size(1), past = cache.length();
    at::Tensor x = layers::embed(wte_, input_ids) +
                   layers::learned_positions(wpe_, past, t, 0);
    const at::Tensor mask = layers::causal_mask(past, t, dtype_, device_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Gpt2Layer& l = layers_[i];
      x = x + l.attn(l.ln1(x, eps), cache, static_cast<int64_t>(i), mask, l.scale);
      x = x + l.mlp(l.ln2(x, eps));
    }
    cache.advance(t);
    x = layers::last_positions(x, keep_last);
    return layers::linear(ln_f_(x, eps), head_).to(at::kFloat);
  }

 private:
  at::Tensor wte_, wpe_, head_;
  std::vector<Gpt2Layer> layers_;
  layers::Norm ln_f_;
};

}  // namespace

std::shared_ptr<const Model> make_gpt2(const ModelConfig& config, const WeightSource& weights,
                                       const LoadOptions& options) {
  return std::make_shared<Gpt2Model>(config, weights, options);
}

}  // namespace specdec::models
