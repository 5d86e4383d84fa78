#include "specdec/verifier.hpp"

#include <ATen/ATen.h>

#include "specdec/error.hpp"

namespace specdec {

namespace {
void check_shapes(const at::Tensor& scores, const Candidates& c) {
  SPECDEC_CHECK(scores.dim() == 2 && scores.size(0) == static_cast<int64_t>(c.size()) + 1,
                "verifier: expected scores of shape [K+1, V] for K = ", c.size(), " candidates");
}
}  // namespace

Verdict GreedyVerifier::verify(const at::Tensor& scores, const Candidates& c, Rng&) const {
  check_shapes(scores, c);
  const at::Tensor best = scores.argmax(-1).to(at::kCPU);  // [K+1]: the one sync of the iteration
  const int64_t* b = best.data_ptr<int64_t>();
  Verdict v;
  const auto k = static_cast<int64_t>(c.size());
  while (v.accepted < k && b[v.accepted] == c.tokens[v.accepted]) ++v.accepted;
  v.next_token = b[v.accepted];
  return v;
}

Verdict RejectionSamplingVerifier::verify(const at::Tensor& scores, const Candidates& c,
                                          Rng& rng) const {
  check_shapes(scores, c);
  const auto k = static_cast<int64_t>(c.size());
  const at::Tensor p = scores.softmax(-1);  // [K+1, V] float32
  Verdict v;
  if (k > 0) {
    const at::Tensor idx = at::tensor(c.tokens, at::kLong).to(p.device()).view({k, 1});  // [K, 1]
    const at::Tensor p_tok = p.narrow(0, 0, k).gather(1, idx).view({k});                 // [K]
    const at::Tensor q_tok = c.q.defined() ? c.q.to(p.device()).gather(1, idx).view({k})
                                           : at::ones({k}, p.options());
    const at::Tensor pq = at::stack({p_tok, q_tok}).to(at::kCPU, at::kDouble);  // [2, K]: one sync
    const double* pp = pq.data_ptr<double>();
    const double* qq = pp + k;
    while (v.accepted < k) {
      const double pi = pp[v.accepted], qi = qq[v.accepted];
      const double u = rng.uniform();
      // Accept with probability min(1, p/q). q == 0 cannot be drafted; treat it as a rejection.
      if (!(qi > 0.0) || u * qi >= pi) break;
      ++v.accepted;
    }
    if (v.accepted < k) {
      const int64_t i = v.accepted;
      const at::Tensor qi = c.q.defined()
                                ? c.q[i].to(p.device())
                                : at::zeros_like(p[i]).index_fill_(0, idx[i], 1.0);  // one-hot
      at::Tensor residual = (p[i] - qi).clamp_min(0);  // [V]
      // p == q up to rounding leaves no mass: any rejection then came from rounding, draw from p.
      if (!(residual.sum().item<double>() > 0)) residual = p[i];
      v.next_token = sample_index(residual, rng.uniform());
      return v;
    }
  }
  v.next_token = sample_index(p[k], rng.uniform());
  return v;
}

}  // namespace specdec
