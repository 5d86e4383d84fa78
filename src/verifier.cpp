#include "specdec/verifier.hpp"

#include <ATen/ATen.h>

#include "device.hpp"
#include "kernels/kernels.hpp"
#include "specdec/error.hpp"
#include "specdec/sampling.hpp"

namespace specdec {

namespace {
void check_shapes(const at::Tensor& scores, const Candidates& c) {
  SPECDEC_CHECK(scores.dim() == 2 && scores.size(0) == static_cast<int64_t>(c.size()) + 1,
                "verifier: expected scores of shape [K+1, V] for K = ", c.size(), " candidates");
  if (!c.tree()) return;
  SPECDEC_CHECK(c.parents.size() == c.size() && !c.q.defined(),
                "verifier: a tree of candidates needs a parent per candidate and no q");
  for (size_t i = 0; i < c.size(); ++i)
    SPECDEC_CHECK(c.parents[i] >= -1 && c.parents[i] < static_cast<int64_t>(i),
                  "verifier: candidate ", i, "'s parent ", c.parents[i], " is not an earlier one");
}

// The child (an index into `children`) holding `token`, or -1.
int64_t child_holding(const Candidates& c, const std::vector<int64_t>& children, int64_t token) {
  for (size_t i = 0; i < children.size(); ++i)
    if (c.tokens[static_cast<size_t>(children[i])] == token) return static_cast<int64_t>(i);
  return -1;
}

// A tree's verdict, decided on the host one level at a time: `pick(row, children)` returns the
// child (an index into `children`, the candidates under the node whose scores are row `row`) the
// target keeps, or -1 with the target's own token in `next`.
template <class Pick>
at::Tensor walk_tree(const Candidates& c, Pick pick) {
  const auto k = static_cast<int64_t>(c.size());
  std::vector<int64_t> out(static_cast<size_t>(2 + k), -1);
  int64_t node = -1, accepted = 0, next = 0;
  std::vector<int64_t> children;
  for (;;) {
    children.clear();
    for (int64_t i = node + 1; i < k; ++i)
      if (c.parents[static_cast<size_t>(i)] == node) children.push_back(i);
    const int64_t chosen = pick(node + 1, children, next);
    if (chosen < 0) break;
    node = children[static_cast<size_t>(chosen)];
    out[static_cast<size_t>(2 + accepted++)] = node;
  }
  out[0] = accepted, out[1] = next;
  return at::tensor(out, at::kLong);
}
}  // namespace

void Verifier::settle(const Verdict&, const Candidates&, Rng&) const {}

Verdict verdict_of(const int64_t* values, const Candidates& c, int64_t vocab) {
  Verdict v;
  v.accepted = values[0];
  v.next_token = values[1];
  const auto k = static_cast<int64_t>(c.tokens.size());
  SPECDEC_CHECK(v.accepted >= 0 && v.accepted <= k, "verifier: decide() keeps ", v.accepted, " of ",
                k, " candidates");
  if (c.tree()) {
    v.path.assign(values + 2, values + 2 + v.accepted);
    for (size_t i = 0; i < v.path.size(); ++i) {  // from the root, each node a child of the last
      const int64_t n = v.path[i];
      SPECDEC_CHECK(
          n >= 0 && n < k && c.parents[static_cast<size_t>(n)] == (i == 0 ? -1 : v.path[i - 1]),
          "verifier: decide()'s path ", i, " is candidate ", n,
          ", which does not follow the path before it");
    }
  } else {
    v.path.resize(static_cast<size_t>(v.accepted));
    for (int64_t i = 0; i < v.accepted; ++i) v.path[static_cast<size_t>(i)] = i;
  }
  SPECDEC_CHECK(v.next_token >= 0 && v.next_token < vocab, "verifier: decide()'s next token ",
                v.next_token, " is no token of the vocabulary (", vocab, ")");
  return v;
}

void detail::check_decision(const at::Tensor& d, const Candidates& c) {
  const auto k = static_cast<int64_t>(c.size());
  const int64_t want = c.tree() ? 2 + k : 2;
  SPECDEC_CHECK(d.scalar_type() == at::kLong && d.dim() == 1 && d.size(0) == want,
                "verifier: decide() returned ", d.scalar_type(), " ", d.sizes(), " for ", k,
                c.tree() ? " candidates in a tree" : " candidates", " (int64 [", want,
                "] expected)");
}

Verdict Verifier::verify(const at::Tensor& scores, const Candidates& c, Rng& rng) const {
  const at::Tensor decision = decide(scores, c, rng);
  detail::check_decision(decision, c);
  // the one sync of the iteration
  const at::Tensor host = decision.to(at::kCPU).contiguous();
  const Verdict v = verdict_of(host.data_ptr<int64_t>(), c, scores.size(-1));
  settle(v, c, rng);
  return v;
}

at::Tensor GreedyVerifier::decide(const at::Tensor& scores, const Candidates& c, Rng&) const {
  check_shapes(scores, c);
  if (c.tree() || scores.device().is_cpu()) {
    const at::Tensor best = kernels::argmax(scores).to(at::kCPU).contiguous();  // [K+1]
    const int64_t* b = best.data_ptr<int64_t>();
    if (c.tree())
      return walk_tree(c, [&](int64_t row, const std::vector<int64_t>& children, int64_t& next) {
        next = b[row];
        return child_holding(c, children, next);
      });
    // The matching prefix and the target's token after it, on the host.
    int64_t accepted = 0;
    while (accepted < static_cast<int64_t>(c.size()) && b[accepted] == c.tokens[accepted])
      ++accepted;
    return at::tensor({accepted, b[accepted]}, at::kLong);
  }
  // On a device: without waiting for it.
  const auto k = static_cast<int64_t>(c.size());
  const at::Tensor best = scores.argmax(-1);  // [K+1]
  at::Tensor accepted = at::zeros({1}, best.options());
  if (k > 0) {
    const at::Tensor tokens =
        detail::to_device(at::tensor(c.tokens, at::kLong), best.device());  // [K]
    accepted = best.narrow(0, 0, k).eq(tokens).to(at::kLong).cumprod(0).sum().view(
        {1});  // matching prefix
  }
  return at::cat({accepted, best.index_select(0, accepted)});
}

at::Tensor RejectionSamplingVerifier::decide(const at::Tensor& scores, const Candidates& c,
                                             Rng& rng) const {
  check_shapes(scores, c);
  if (!c.q.defined()) {
    // Deterministic candidates (a chain or a tree, or none): at each position the walk reaches,
    // the target's token is drawn from p with one uniform, as target-only sampling draws it, and
    // the candidate holding that token, if one does, is kept.
    const at::Tensor p = scores.softmax(-1);  // [K+1, V]
    if (c.tree())  // on the host, each uniform drawn from `rng` as it is needed
      return walk_tree(c, [&](int64_t row, const std::vector<int64_t>& children, int64_t& next) {
        next = sample_index(p[row], rng.uniform());
        return child_holding(c, children, next);
      });
    // A chain: from a copy of the stream (settle() advances past the uniforms used).
    Rng ahead = rng;
    return detail::draw_along_chain(p, c.tokens, ahead);
  }
  const auto k = static_cast<int64_t>(c.size());
  const c10::Device device = scores.device();
  const at::Tensor p = scores.softmax(-1);  // [K+1, V] float32
  // The decision runs on the device. Its uniforms are drawn ahead from a copy of the request's
  // stream, in the order a one-by-one decision draws them: candidate i's test takes u[i]; the final
  // draw (from the residual after a rejection at a, or the bonus draw after K acceptances) takes
  // u[min(a + 1, K)]. settle() then advances the stream past the ones used.
  Rng ahead = rng;
  std::vector<double> draws(static_cast<size_t>(k) + 1);
  for (double& x : draws) x = ahead.uniform();
  const at::Tensor u = detail::to_device(at::tensor(draws, at::kDouble), device);  // [K+1]
  at::Tensor accepted = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor dist = p[0];  // [V]: what the next token is drawn from
  if (k > 0) {
    const at::Tensor idx = detail::to_device(at::tensor(c.tokens, at::kLong), device).view({k, 1});
    const at::Tensor q = c.q.to(device);  // [K, V]
    const at::Tensor p_tok = p.narrow(0, 0, k).gather(1, idx).view({k}).to(at::kDouble);
    const at::Tensor q_tok = q.gather(1, idx).view({k}).to(at::kDouble);
    // Accept with probability min(1, p/q). q == 0 cannot be drafted; treat it as a rejection.
    const at::Tensor reject =
        (q_tok > 0).logical_not().logical_or(u.narrow(0, 0, k) * q_tok >= p_tok);
    accepted =
        reject.logical_not().to(at::kLong).cumprod(0).sum().view({1});  // leading acceptances
    const at::Tensor p_a = p.index_select(0, accepted).view({-1});      // [V]
    const at::Tensor row = accepted.clamp_max(k - 1);                   // the rejected candidate
    at::Tensor residual = (p_a - q.index_select(0, row).view({-1})).clamp_min(0);
    // p == q up to rounding leaves no mass: any rejection then came from rounding, draw from p.
    residual = at::where(residual.sum() > 0, residual, p_a);
    dist = at::where(accepted == k, p_a, residual);
  }
  const at::Tensor token =
      sample_index_tensor(dist, u.index_select(0, (accepted + 1).clamp_max(k)));
  return at::cat({accepted, token.view({1})});
}

void RejectionSamplingVerifier::settle(const Verdict& v, const Candidates& c, Rng& rng) const {
  if (c.tree()) return;  // decide() drew from rng itself
  const auto k = static_cast<int64_t>(c.size());
  // One uniform per token of a deterministic chain; a drafted one's tests and its final draw.
  const int64_t used = c.q.defined() ? std::min(v.accepted + 2, k + 1) : v.accepted + 1;
  for (int64_t i = used; i > 0; --i) (void)rng.uniform();
}

namespace detail {

at::Tensor draw_along_chain(const at::Tensor& p, const std::vector<int64_t>& tokens, Rng& rng) {
  const auto k = static_cast<int64_t>(tokens.size());
  if (p.device().is_cpu()) {  // one position at a time, up to the first mismatch
    int64_t accepted = 0, next = sample_index(p[0], rng.uniform());
    while (accepted < k && tokens[static_cast<size_t>(accepted)] == next)
      next = sample_index(p[++accepted], rng.uniform());
    return at::tensor(std::vector<int64_t>{accepted, next}, at::kLong);
  }
  // On a device: every position's draw at once (the same inverse-CDF draws, row by row), so
  // the pass's verdicts still reach the host in one copy.
  std::vector<double> draws(static_cast<size_t>(k) + 1);
  for (double& x : draws) x = rng.uniform();
  const at::Tensor drawn =
      sample_rows_tensor(p, detail::to_device(at::tensor(draws, at::kDouble), p.device()));
  at::Tensor accepted = at::zeros({1}, drawn.options());
  if (k > 0)
    accepted = drawn.narrow(0, 0, k)
                   .eq(detail::to_device(at::tensor(tokens, at::kLong), p.device()))
                   .to(at::kLong)
                   .cumprod(0)
                   .sum()
                   .view({1});
  return at::cat({accepted, drawn.index_select(0, accepted)});
}

}  // namespace detail

}  // namespace specdec
