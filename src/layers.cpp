#include "layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "device.hpp"
#include "kernels/kernels.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"

namespace specdec::layers {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (at::Tensor y = kernels::rms_norm_f32(x, w, eps); y.defined()) return y;
  const at::Tensor xf = x.to(at::kFloat);                       // [..., H]
  const at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);  // [..., 1]
  const at::Tensor normed = xf * at::rsqrt(var + eps);          // [..., H] float32
  if (w.scalar_type() == at::kFloat) return (normed * w).to(x.scalar_type());
  return w * normed.to(x.scalar_type());
}

Pass::Pass(const at::Tensor& input_ids, const KVCache& cache,
           const std::vector<int64_t>& row_tokens, c10::Device device,
           const std::vector<TokenTree>& trees)
    : device_(device) {
  SPECDEC_CHECK(input_ids.dim() == 2 && input_ids.size(0) >= 1 && input_ids.size(1) >= 1,
                "forward: expected input ids [B, T] with B, T >= 1, got ", input_ids.sizes());
  const int64_t b = input_ids.size(0);
  t_ = input_ids.size(1);
  SPECDEC_CHECK(b <= cache.batch(), "forward: a pass of ", b, " rows on a cache of ", cache.batch(),
                " rows");
  SPECDEC_CHECK(row_tokens.empty() || static_cast<int64_t>(row_tokens.size()) == b,
                "forward: ", row_tokens.size(), " row token counts for ", b, " rows");
  SPECDEC_CHECK(trees.empty() || static_cast<int64_t>(trees.size()) == b, "forward: ", trees.size(),
                " trees for ", b, " rows");
  positions_host_.resize(static_cast<size_t>(b * t_));
  bool chains = true;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t n = row_tokens.empty() ? t_ : row_tokens[r];
    SPECDEC_CHECK(n >= 0 && n <= t_, "forward: row ", r, " has ", n, " tokens in a pass of ", t_);
    const int64_t start = cache.length(r);
    SPECDEC_CHECK(start + n <= cache.capacity(), "KVCache: capacity ", cache.capacity(),
                  " exceeded (row ", r, " holds ", start, " positions, appending ", n,
                  "); create the cache with a larger max length");
    starts_.push_back(start);
    counts_.push_back(n);
    same_start_ = same_start_ && start == starts_[0];
    full_ = full_ && n == t_;
    end_ = std::max(end_, start + n);
    int64_t* pos = positions_host_.data() + r * t_;
    for (int64_t j = 0; j < t_; ++j) pos[j] = start + j;
    const TokenTree* tree = trees.empty() ? nullptr : &trees[static_cast<size_t>(r)];
    if (!tree || tree->empty()) continue;
    SPECDEC_CHECK(static_cast<int64_t>(tree->size()) == n, "forward: row ", r, "'s tree has ",
                  tree->size(), " nodes for ", n, " tokens");
    for (int64_t j = 0; j < n; ++j) {
      const int64_t parent = (*tree)[static_cast<size_t>(j)];
      SPECDEC_CHECK(parent >= -1 && parent < j, "forward: row ", r, " token ", j, "'s parent is ",
                    parent, " (a tree lists parents before children)");
      pos[j] = parent < 0 ? start : pos[parent] + 1;
      chains = chains && parent == j - 1;
    }
  }
  keys_ = std::min(cache.capacity(), *std::max_element(starts_.begin(), starts_.end()) + t_);
  if (!chains) {
    trees_ = trees;
    same_start_ = false;  // positions and masks row by row
  }
  if (!same_start_)  // built and copied to the device once per pass, used by every table and mask
    positions_ = detail::to_device(at::tensor(positions_host_, at::kLong).view({b, t_}), device_);
}

at::Tensor Pass::positions(int64_t limit) const {
  SPECDEC_CHECK(positions_.defined(), "Pass::positions: every row starts at ", past(),
                ": use past()");
  return positions_.clamp_max(limit - 1);
}

at::Tensor Pass::causal_mask(at::ScalarType dtype, int64_t window) const {
  if (same_start_) return layers::causal_mask(past(), t_, dtype, device_, window);
  if (!trees_.empty()) return tree_mask(dtype, window);
  const at::Tensor pos = positions(keys_).unsqueeze(-1);  // [B, T, 1]
  const at::Tensor key = at::arange(keys_, at::TensorOptions().dtype(at::kLong).device(device_));
  at::Tensor hidden = key.view({1, 1, keys_}) > pos;  // [B, T, L]
  if (window > 0) hidden = hidden.logical_or(key.view({1, 1, keys_}) <= pos - window);
  return at::zeros(hidden.sizes(), at::TensorOptions().dtype(dtype).device(device_))
      .masked_fill_(hidden, -std::numeric_limits<float>::infinity())
      .view({rows(), 1, 1, t_, keys_});
}

// Row r's query j (at position P) sees cached key k < start when the window allows (k > P -
// window), and the pass's key start + i when token i is j or one of j's ancestors (padding
// queries: the keys up to their own slot, as in a chain).
at::Tensor Pass::tree_mask(at::ScalarType dtype, int64_t window) const {
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor mask = at::full({rows(), t_, keys_}, -inf, at::kFloat);
  float* m = mask.data_ptr<float>();
  std::vector<char> sees(static_cast<size_t>(t_));
  for (int64_t r = 0; r < rows(); ++r) {
    const int64_t start = starts_[static_cast<size_t>(r)], n = counts_[static_cast<size_t>(r)];
    const TokenTree& tree = trees_[static_cast<size_t>(r)];
    for (int64_t j = 0; j < t_; ++j) {
      float* row = m + (r * t_ + j) * keys_;
      const int64_t p = position(r, j);
      std::fill(sees.begin(), sees.end(), 0);
      if (j >= n || tree.empty()) {
        for (int64_t i = 0; i <= j; ++i) sees[static_cast<size_t>(i)] = 1;
      } else {
        for (int64_t i = j; i >= 0; i = tree[static_cast<size_t>(i)])
          sees[static_cast<size_t>(i)] = 1;
      }
      const auto visible = [&](int64_t key_position) {
        return window <= 0 || key_position > p - window;
      };
      for (int64_t k = 0; k < std::min(start, keys_); ++k)
        if (visible(k)) row[k] = 0;
      for (int64_t i = 0; i < t_ && start + i < keys_; ++i)
        if (sees[static_cast<size_t>(i)] && visible(position(r, i))) row[start + i] = 0;
    }
  }
  return detail::to_device(mask, device_).to(dtype).view({rows(), 1, 1, t_, keys_});
}

at::Tensor Pass::last(const at::Tensor& x, int64_t keep) const {
  if (full_ || keep <= 0) return last_positions(x, keep);
  keep = std::min(keep, t_);
  std::vector<int64_t> idx;
  for (const int64_t n : counts_)
    for (int64_t j = 0; j < keep; ++j) idx.push_back(std::max<int64_t>(0, n - keep + j));
  const at::Tensor index =
      detail::to_device(at::tensor(idx, at::kLong), x.device()).view({rows(), keep, 1});
  return x.gather(1, index.expand({rows(), keep, x.size(2)}));
}

at::Tensor draft_features(const Pass& pass, const KVCache& cache, int64_t feature_size) {
  const KVCache* target = cache.feature_source();
  SPECDEC_CHECK(
      target != nullptr,
      "forward: a feature-fed draft (specdec_feature_size) runs beside its target: ",
      "its cache needs the target's cache as feature source (KVCache::set_feature_source)");
  const at::Tensor& theirs = target->hidden();  // [B', capacity', F]
  const at::Tensor& own = cache.hidden();       // [B, capacity, F]
  SPECDEC_CHECK(theirs.size(2) == feature_size, "forward: the target's hidden states have ",
                theirs.size(2), " features, the draft expects ", feature_size);
  at::Tensor out =
      at::zeros({pass.rows(), pass.tokens(), feature_size}, own.options());  // [B, T, F]
  for (int64_t b = 0; b < pass.rows(); ++b) {
    const int64_t first = pass.start(b) - 1,
                  end = first + pass.count(b);  // feature positions [first, end)
    const int64_t verified = b < target->batch() ? target->length(b) : 0;
    const int64_t from = std::max<int64_t>(first, 0), split = std::clamp(verified, from, end);
    if (split > from)
      out[b].narrow(0, from - first, split - from).copy_(theirs[b].narrow(0, from, split - from));
    if (end > split) {
      SPECDEC_CHECK(end <= cache.length(b), "forward: feature-fed draft row ", b,
                    " has no hidden state for position ", end - 1, " (the target holds ", verified,
                    " positions, the draft ", cache.length(b), ")");
      out[b].narrow(0, split - first, end - split).copy_(own[b].narrow(0, split, end - split));
    }
  }
  return out;
}

Rotary::Rotary(int64_t rot_dim, double theta, const RopeScaling& scaling, int64_t max_positions,
               at::ScalarType dtype, c10::Device device) {
  at::Tensor exponent =
      at::arange(0, rot_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(rot_dim);
  at::Tensor inv = 1.0 / at::pow(at::scalar_tensor(theta, at::kFloat), exponent);  // [rot_dim/2]
  if (scaling.type == "linear") {
    inv = inv / scaling.factor;
  } else if (scaling.type == "llama3") {
    const double old_len = static_cast<double>(scaling.original_max_position_embeddings);
    const double low_wavelen = old_len / scaling.low_freq_factor;
    const double high_wavelen = old_len / scaling.high_freq_factor;
    const at::Tensor wavelen = 2 * M_PI / inv;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv / scaling.factor, inv);
    const at::Tensor smooth = (old_len / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
    const at::Tensor smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv = at::where(medium, smoothed, scaled);
  }
  // A request never runs past Limits::max_sequence_length, whatever the configuration claims.
  max_positions_ = std::min(max_positions, limits().max_sequence_length);
  const at::Tensor f = inv.contiguous();
  inv_.assign(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  dtype_ = dtype;
  device_ = device;
}

std::pair<at::Tensor, at::Tensor> Rotary::compute(const std::vector<int64_t>& positions,
                                                  int64_t rows, int64_t t, int64_t end) const {
  SPECDEC_CHECK(end <= max_positions_, "positions up to ", end, " exceed max_position_embeddings (",
                max_positions_, ")");
  const auto half = static_cast<int64_t>(inv_.size()), rot = 2 * half;
  at::Tensor cos = at::empty({rows, t, rot}, at::kFloat),
             sin = at::empty({rows, t, rot}, at::kFloat);
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < t; ++j, c += rot, s += rot) {
      const auto pos = static_cast<float>(positions[static_cast<size_t>(r * t + j)]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_[static_cast<size_t>(i)];  // at::outer's float32 product
        c[i] = c[i + half] = std::cos(angle);
        s[i] = s[i + half] = std::sin(angle);
      }
    }
  if (device_.is_cpu() && dtype_ == at::kFloat) return {cos, sin};
  return {detail::to_device(cos, device_).to(dtype_), detail::to_device(sin, device_).to(dtype_)};
}

std::pair<at::Tensor, at::Tensor> Rotary::tables(int64_t start, int64_t t) const {
  std::vector<int64_t> positions(static_cast<size_t>(t));
  for (int64_t j = 0; j < t; ++j) positions[static_cast<size_t>(j)] = start + j;
  auto [cos, sin] = compute(positions, 1, t, start + t);
  return {cos[0], sin[0]};
}

std::pair<at::Tensor, at::Tensor> Rotary::tables(const Pass& pass) const {
  if (pass.same_start()) return tables(pass.past(), pass.tokens());
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < pass.rows(); ++r)
    for (int64_t j = 0; j < pass.tokens(); ++j) positions.push_back(pass.position(r, j));
  // padding tokens get positions past a row's end (not checked: their values are never used)
  auto [cos, sin] = compute(positions, pass.rows(), pass.tokens(), pass.end());
  return {cos.unsqueeze(1), sin.unsqueeze(1)};  // [B, 1, T, rot]
}

at::Tensor Rotary::apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (at::Tensor y = kernels::rotary_f32(x, cos, sin); y.defined()) return y;
  const int64_t rot = cos.size(-1);
  const int64_t d = x.size(-1);
  const at::Tensor xr = rot == d ? x : x.narrow(-1, 0, rot);  // [B, H, T, rot]
  const int64_t half = rot / 2;
  const at::Tensor rotated = at::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
  const at::Tensor out = xr * cos + rotated * sin;
  return rot == d ? out : at::cat({out, x.narrow(-1, rot, d - rot)}, -1);
}

at::Tensor causal_mask(int64_t past, int64_t t, at::ScalarType dtype, c10::Device device,
                       int64_t window) {
  const bool windowed = window > 0 && past + t > window;
  if (t == 1 && !windowed) return {};
  at::Tensor m = at::full({t, past + t}, -std::numeric_limits<float>::infinity(),
                          at::TensorOptions().dtype(dtype).device(device));
  at::Tensor mask = at::triu(m, past + 1);  // query i (position past+i) sees keys 0..past+i
  if (windowed)
    mask = mask + at::tril(m, past - window);  // ... and none at or before past+i-window
  return mask;
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& mask, double scale) {
  if (at::Tensor y = kernels::attention_f32(q, keys, values, mask, scale); y.defined()) return y;
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), groups = hq / hkv, len = keys.size(2);
  // Fold the query heads that share a KV head into the row dimension: no copy of the cache.
  const at::Tensor qg = q.reshape({b, hkv, groups * t, d});    // [B, Hkv, g*T, D]
  at::Tensor scores = at::matmul(qg, keys.transpose(-1, -2));  // [B, Hkv, g*T, L]
  if (scale != 1.0) scores = scores * scale;
  if (mask.defined())
    scores = (scores.view({b, hkv, groups, t, len}) + mask).view({b, hkv, groups * t, len});
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  const at::Tensor out = at::matmul(probs, values);  // [B, Hkv, g*T, D]
  return out.view({b, hq, t, d}).transpose(1, 2).reshape({b, t, hq * d});
}

at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            KVCache& cache, int64_t layer, const at::Tensor& mask, double scale) {
  auto [keys, values] = cache.append(layer, k, v);  // [B, Hkv, L, D] views
  return attend(q, keys, values, mask, scale);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  if (at::Tensor y = kernels::layer_norm_f32(x, w, b, eps); y.defined()) return y;
  return at::layer_norm(x, {x.size(-1)}, w, b, eps);
}

namespace {
// The name activation_f32 knows `name` by.
std::string kernel_activation(const std::string& name) {
  const bool tanh = name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast";
  return tanh ? "gelu_tanh" : name;
}
}  // namespace

at::Tensor gated_activation(const at::Tensor& gate_up, const std::string& name) {
  if (at::Tensor y = kernels::activation_f32(gate_up, kernel_activation(name), true); y.defined())
    return y;
  const auto gu = gate_up.chunk(2, -1);
  return activation(gu[0], name) * gu[1];
}

at::Tensor activation(const at::Tensor& x, const std::string& name) {
  if (at::Tensor y = kernels::activation_f32(x, kernel_activation(name)); y.defined()) return y;
  if (name == "relu") return at::relu(x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
    return at::gelu(x, "tanh");
  if (name == "silu") return at::silu(x);
  throw Error("unsupported activation '" + name + "'");
}

std::array<at::Tensor, 3> Attention::split(const at::Tensor& y, const at::Tensor& cos,
                                           const at::Tensor& sin) const {
  const int64_t b = y.size(0), t = y.size(1), d = head_dim;
  const auto parts = y.split({heads * d, kv_heads * d, kv_heads * d}, -1);
  at::Tensor q = parts[0].view({b, t, heads, d}).transpose(1, 2);  // [B, Hq, T, D]
  at::Tensor k = parts[1].view({b, t, kv_heads, d}).transpose(1, 2);
  at::Tensor v = parts[2].view({b, t, kv_heads, d}).transpose(1, 2);
  if (cos.defined()) {
    q = Rotary::apply(q, cos, sin);
    k = Rotary::apply(k, cos, sin);
  }
  return {q, k, v};
}

at::Tensor Attention::project(const at::Tensor& x) const {
  const at::Tensor y = qkv(x);  // [B, T, (Hq + 2 Hkv) D]
  if (!q_norm.defined()) return y;
  const int64_t b = y.size(0), t = y.size(1), d = head_dim;
  const auto parts = y.split({heads * d, kv_heads * d, kv_heads * d}, -1);
  const at::Tensor q = rms_norm(parts[0].reshape({b, t, heads, d}), q_norm, norm_eps);
  const at::Tensor k = rms_norm(parts[1].reshape({b, t, kv_heads, d}), k_norm, norm_eps);
  return at::cat({q.view({b, t, heads * d}), k.view({b, t, kv_heads * d}), parts[2]}, -1);
}

at::Tensor Attention::operator()(const at::Tensor& x, KVCache& cache, int64_t layer,
                                 const at::Tensor& mask, double scale, const at::Tensor& cos,
                                 const at::Tensor& sin, const at::Tensor& residual) const {
  const at::Tensor y = project(x);  // [B, T, (Hq + 2 Hkv) D]
  std::vector<int64_t> past(static_cast<size_t>(y.size(0)));
  for (size_t r = 0; r < past.size(); ++r) past[r] = cache.length(static_cast<int64_t>(r));
  const auto [keys, values] = cache.buffers(layer);
  if (at::Tensor a = kernels::cached_attention_f32(y, heads, kv_heads, head_dim, cos, sin, keys,
                                                   values, past, mask, scale);
      a.defined())
    return o(a, residual);
  const auto [q, k, v] = split(y, cos, sin);
  return o(cached_attention(q, k, v, cache, layer, mask, scale), residual);
}

at::Tensor Attention::operator()(const at::Tensor& x, const at::Tensor& mask, double scale,
                                 const at::Tensor& residual) const {
  const auto [q, k, v] = split(project(x), {}, {});
  return o(attend(q, k, v, mask, scale), residual);
}

at::Tensor Head::operator()(const at::Tensor& x) const {
  at::Tensor logits = w(x).to(at::kFloat);  // [B, T, V or V']
  if (!ids.defined()) return logits;
  at::Tensor full =
      at::full({logits.size(0), logits.size(1), vocab}, -std::numeric_limits<float>::infinity(),
               logits.options());  // [B, T, V]
  return full.index_copy_(2, ids, logits);
}

Head load_head(const ModelConfig& c, const WeightSource& w, const WeightLoader& load,
               const Linear& embed, c10::Device device) {
  Head head;
  head.vocab = c.vocab_size;
  if (!c.head_token_ids.empty()) {  // a reduced head: its own rows, never tied
    const auto n = static_cast<int64_t>(c.head_token_ids.size());
    head.w = load.linear("lm_head.weight", {n, c.hidden_size});
    head.ids = at::tensor(c.head_token_ids, at::kLong).to(device);
    return head;
  }
  const bool has_head = w.contains("lm_head.weight");
  SPECDEC_CHECK(
      has_head || c.tie_word_embeddings, w.dir(),
      ": checkpoint has no tensor named 'lm_head.weight' and tie_word_embeddings is false");
  head.w = (c.tie_word_embeddings || !has_head)
               ? embed
               : load.linear("lm_head.weight", {c.vocab_size, c.hidden_size});
  return head;
}

at::Tensor relative_position_bucket(const at::Tensor& rel, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance) {
  int64_t n = num_buckets;
  at::Tensor out = at::zeros_like(rel);
  at::Tensor dist;
  if (bidirectional) {
    n /= 2;
    out = out + (rel > 0).to(at::kLong) * n;
    dist = rel.abs();
  } else {
    dist = -at::minimum(rel, at::zeros_like(rel));
  }
  const int64_t max_exact = n / 2;
  at::Tensor large =
      max_exact + (at::log(dist.to(at::kFloat) / max_exact) /
                   std::log(static_cast<double>(max_distance) / max_exact) * (n - max_exact))
                      .to(at::kLong);
  large = at::minimum(large, at::full_like(large, n - 1));
  return out + at::where(dist < max_exact, dist, large);
}

at::Tensor last_positions(const at::Tensor& x, int64_t keep) {
  const int64_t t = x.size(1);
  return keep > 0 && keep < t ? x.narrow(1, t - keep, keep) : x;
}

at::Tensor learned_positions(const at::Tensor& table, int64_t past, int64_t t, int64_t offset) {
  SPECDEC_CHECK(offset + past + t <= table.size(0), "sequence of ", past + t,
                " tokens is longer than the model's learned positions (", table.size(0) - offset,
                ")");
  return table.narrow(0, offset + past, t);
}

at::Tensor learned_positions(const at::Tensor& table, const Pass& pass, int64_t offset) {
  if (pass.same_start()) return learned_positions(table, pass.past(), pass.tokens(), offset);
  SPECDEC_CHECK(offset + pass.end() <= table.size(0), "sequence of ", pass.end(),
                " tokens is longer than the model's learned positions (", table.size(0) - offset,
                ")");
  const at::Tensor idx = pass.positions(table.size(0) - offset).reshape(-1) + offset;
  return table.index_select(0, idx).view({pass.rows(), pass.tokens(), table.size(1)});
}

}  // namespace specdec::layers
