#include "draft_net.hpp"

#include <cmath>
#include <limits>
#include <tuple>

#include "layers.hpp"
#include "specdec/error.hpp"

namespace specdec::detail {

const std::array<const char*, 15> DraftNet::kLayerTensors = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.q_proj.bias",   "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",   "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
    "mlp.gate_proj.bias",      "mlp.up_proj.bias",        "mlp.down_proj.bias"};

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
  return w * (x * at::rsqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps));
}

at::Tensor DraftNet::forward(const at::Tensor& ids, const at::Tensor& features,
                             at::Tensor* last) const {
  const int64_t n = ids.size(0), s = ids.size(1), d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads;
  const layers::Rotary rotary(d, c.rope_theta, c.rope_scaling, std::max<int64_t>(s, 1), at::kFloat,
                              c10::Device(c10::kCPU));
  at::Tensor cos, sin;  // [S, D] (not a structured binding: lambdas cannot capture one in C++17)
  std::tie(cos, sin) = rotary.tables(0, s);
  auto rotate = [&](const at::Tensor& x) {  // [N, heads, S, D]
    const int64_t half = d / 2;
    return x * cos + at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
  };
  at::Tensor mask =
      at::triu(at::full({s, s}, -std::numeric_limits<float>::infinity()), 1);  // [S, S]
  if (c.sliding_window > 0)
    mask = mask +
           at::tril(at::full({s, s}, -std::numeric_limits<float>::infinity()), -c.sliding_window);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor x = embed.index_select(0, ids.reshape(-1)).view({n, s, -1});  // [N, S, H]
  if (fc.defined()) {
    const at::Tensor before =
        at::constant_pad_nd(features.narrow(1, 0, s - 1).to(at::kFloat), {0, 0, 1, 0});  // h_{p-1}
    x = at::linear(at::cat({x, rms(before, fc_norm)}, -1), fc);
  }
  for (const Layer& l : layers) {
    const at::Tensor h = rms(x, l.in_norm);
    const at::Tensor q =
        rotate(at::linear(h, l.q, l.qb).view({n, s, hq, d}).transpose(1, 2));  // [N, Hq, S, D]
    at::Tensor k =
        rotate(at::linear(h, l.k, l.kb).view({n, s, hkv, d}).transpose(1, 2));  // [N, Hkv, S, D]
    at::Tensor v = at::linear(h, l.v, l.vb).view({n, s, hkv, d}).transpose(1, 2);
    if (hq != hkv) k = k.repeat_interleave(hq / hkv, 1), v = v.repeat_interleave(hq / hkv, 1);
    const at::Tensor probs = at::softmax(at::matmul(q, k.transpose(-1, -2)) * scale + mask, -1);
    const at::Tensor a =
        at::matmul(probs, v).transpose(1, 2).reshape({n, s, hq * d});  // [N, S, Hq*D]
    x = x + at::linear(a, l.o);
    const at::Tensor m = rms(x, l.post_norm);
    x = x +
        at::linear(at::silu(at::linear(m, l.gate, l.gb)) * at::linear(m, l.up, l.ub), l.down, l.db);
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
    for (const at::Tensor* t :
         {&l.in_norm, &l.q, &l.k, &l.v, &l.o, &l.post_norm, &l.gate, &l.up, &l.down})
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
