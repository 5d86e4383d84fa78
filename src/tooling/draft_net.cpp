#include "draft_net.hpp"

#include <cmath>
#include <limits>
#include <tuple>

#include "layers.hpp"
#include "specdec/error.hpp"

namespace specdec::detail {

const std::array<const char*, 20> DraftNet::kLayerTensors = {"input_layernorm.weight",
                                                             "self_attn.q_proj.weight",
                                                             "self_attn.k_proj.weight",
                                                             "self_attn.v_proj.weight",
                                                             "self_attn.q_proj.bias",
                                                             "self_attn.k_proj.bias",
                                                             "self_attn.v_proj.bias",
                                                             "self_attn.o_proj.weight",
                                                             "self_attn.o_proj.bias",
                                                             "post_attention_layernorm.weight",
                                                             "mlp.gate_proj.weight",
                                                             "mlp.up_proj.weight",
                                                             "mlp.down_proj.weight",
                                                             "mlp.gate_proj.bias",
                                                             "mlp.up_proj.bias",
                                                             "mlp.down_proj.bias",
                                                             "self_attn.q_norm.weight",
                                                             "self_attn.k_norm.weight",
                                                             "pre_feedforward_layernorm.weight",
                                                             "post_feedforward_layernorm.weight"};

std::vector<at::Tensor> DraftNet::trainable() const {
  std::vector<at::Tensor> p;
  for (const Layer& l : layers)
    for (const at::Tensor* t : l.all())
      if (t->defined()) p.push_back(*t);
  p.push_back(norm);
  p.push_back(head);
  if (fc.defined()) p.push_back(fc_norm), p.push_back(fc);
  return p;
}

std::map<std::string, at::Tensor> DraftNet::named() const {
  std::map<std::string, at::Tensor> t{
      {"model.embed_tokens.weight", embed}, {"model.norm.weight", norm}, {"lm_head.weight", head}};
  if (fc.defined()) t["fc.weight"] = fc, t["fc_norm.weight"] = fc_norm;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto all = layers[i].all();
    for (size_t j = 0; j < all.size(); ++j)
      if (all[j]->defined())
        t["model.layers." + std::to_string(i) + "." + kLayerTensors[j]] = *all[j];
  }
  for (auto& [name, x] : t) x = x.detach().contiguous();
  return t;
}

at::Tensor DraftNet::rms(const at::Tensor& x, const at::Tensor& w) const {
  return (gemma() ? w + 1.0 : w) * (x * at::rsqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps));
}

at::Tensor DraftNet::forward(const at::Tensor& ids, const at::Tensor& features,
                             at::Tensor* last) const {
  const int64_t n = ids.size(0), s = ids.size(1), d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads;
  const bool g = gemma();
  // Gemma 3's sliding layers rotate with their own base; every other layer with the global one.
  auto tables = [&](double theta, const RopeScaling& scaling) {
    return layers::Rotary(d, theta, scaling, std::max<int64_t>(s, 1), at::kFloat,
                          c10::Device(c10::kCPU))
        .tables(0, s);  // [S, D] each
  };
  const auto global = tables(c.rope_theta, c.rope_scaling);
  const auto local = g ? tables(c.rope_local_theta, c.rope_local_scaling) : global;
  auto rotate = [d](const at::Tensor& x, const std::pair<at::Tensor, at::Tensor>& cs) {
    const int64_t half = d / 2;  // x [N, heads, S, D]
    return x * cs.first +
           at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * cs.second;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor causal = at::triu(at::full({s, s}, -inf), 1);  // [S, S]
  const at::Tensor window =
      c.sliding_window > 0 ? causal + at::tril(at::full({s, s}, -inf), -c.sliding_window) : causal;
  // Gemma 3 windows only its sliding layers; Mistral-style configs window every layer.
  const at::Tensor& full = g ? causal : window;
  const double scale = 1.0 / std::sqrt(g && c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar
                                                                        : static_cast<double>(d));
  at::Tensor x = embed.index_select(0, ids.reshape(-1)).view({n, s, -1});  // [N, S, H]
  // Gemma3TextScaledWordEmbedding: sqrt(hidden) rounded to float32.
  if (g) x = x * at::scalar_tensor(std::sqrt(static_cast<double>(c.hidden_size)), at::kFloat);
  if (fc.defined()) {
    const at::Tensor before =
        at::constant_pad_nd(features.narrow(1, 0, s - 1).to(at::kFloat), {0, 0, 1, 0});  // h_{p-1}
    x = at::linear(at::cat({x, rms(before, fc_norm)}, -1), fc);
  }
  auto heads = [&](const at::Tensor& y, int64_t count, const at::Tensor& norm) {
    at::Tensor t = y.view({n, s, count, d});
    if (norm.defined()) t = rms(t, norm);  // per head, before the rotation
    return t.transpose(1, 2);              // [N, count, S, D]
  };
  for (const Layer& l : layers) {
    const auto& rope = l.sliding ? local : global;
    const at::Tensor h = rms(x, l.in_norm);
    const at::Tensor q = rotate(heads(at::linear(h, l.q, l.qb), hq, l.q_norm), rope);
    at::Tensor k = rotate(heads(at::linear(h, l.k, l.kb), hkv, l.k_norm), rope);
    at::Tensor v = heads(at::linear(h, l.v, l.vb), hkv, at::Tensor());
    if (hq != hkv) k = k.repeat_interleave(hq / hkv, 1), v = v.repeat_interleave(hq / hkv, 1);
    const at::Tensor probs =
        at::softmax(at::matmul(q, k.transpose(-1, -2)) * scale + (l.sliding ? window : full), -1);
    const at::Tensor a =
        at::matmul(probs, v).transpose(1, 2).reshape({n, s, hq * d});  // [N, S, Hq*D]
    if (g) {  // sandwich norms: each branch's output normalised before its residual add
      x = x + rms(at::linear(a, l.o), l.post_norm);
      const at::Tensor m = rms(x, l.pre_ff);
      x = x + rms(at::linear(at::gelu(at::linear(m, l.gate), "tanh") * at::linear(m, l.up), l.down),
                  l.post_ff);
    } else {
      x = x + at::linear(a, l.o, l.ob);
      const at::Tensor m = rms(x, l.post_norm);
      x = x + at::linear(at::silu(at::linear(m, l.gate, l.gb)) * at::linear(m, l.up, l.ub), l.down,
                         l.db);
    }
  }
  if (last) *last = x;
  return at::linear(rms(x, norm), head);
}

DraftNet load_draft_net(const SourceCheckpoint& src, const std::vector<int64_t>& ids,
                        const std::vector<int64_t>& head_ids) {
  const ModelConfig& c = src.config;
  const WeightSource& w = *src.weights;
  auto get = [&](const std::string& name) {
    return w.contains(name) ? w.load(name, at::kFloat, c10::Device(c10::kCPU)).clone()
                            : at::Tensor();
  };
  DraftNet net;
  net.c = c;
  net.embed = get("model.embed_tokens.weight");
  SPECDEC_CHECK(net.embed.defined(), w.dir(), ": no tensor 'model.embed_tokens.weight'");
  for (int64_t i : ids) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    DraftNet::Layer l;
    const auto all = l.all();
    for (size_t j = 0; j < all.size(); ++j) *all[j] = get(p + DraftNet::kLayerTensors[j]);
    std::vector<const at::Tensor*> needed = {&l.in_norm,   &l.q,    &l.k,  &l.v,   &l.o,
                                             &l.post_norm, &l.gate, &l.up, &l.down};
    if (c.qk_norm) needed.insert(needed.end(), {&l.q_norm, &l.k_norm});
    if (net.gemma()) {
      needed.insert(needed.end(), {&l.pre_ff, &l.post_ff});
      l.sliding = c.layer_types.at(static_cast<size_t>(i)) == "sliding_attention";
    }
    for (const at::Tensor* t : needed)
      SPECDEC_CHECK(t->defined(), w.dir(), ": layer ", i, " is missing a tensor");
    net.layers.push_back(std::move(l));
  }
  net.norm = get("model.norm.weight");
  at::Tensor head = get("lm_head.weight");
  if (!head.defined() || c.tie_word_embeddings) head = net.embed;
  net.head =
      head_ids.empty() ? head.clone() : head.index_select(0, at::tensor(head_ids, at::kLong));
  return net;
}

}  // namespace specdec::detail
