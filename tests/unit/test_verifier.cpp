// Verifiers on crafted scores.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "specdec/verifier.hpp"

namespace specdec {
namespace {

Candidates cands(std::vector<int64_t> t) {
  Candidates c;
  c.tokens = std::move(t);
  return c;
}

TEST(GreedyVerifier, LongestMatchingPrefixPlusTargetToken) {
  // Row argmaxes: 3, 1, 4.
  const at::Tensor s = at::tensor({0.f, 0.f, 0.f, 9.f, 0.f,
                                   0.f, 9.f, 0.f, 0.f, 0.f,
                                   0.f, 0.f, 0.f, 0.f, 9.f}).view({3, 5});
  Rng rng(0);
  GreedyVerifier v;
  Verdict r = v.verify(s, cands({3, 2}), rng);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_EQ(r.next_token, 1);
  r = v.verify(s, cands({3, 1}), rng);
  EXPECT_EQ(r.accepted, 2);
  EXPECT_EQ(r.next_token, 4);  // bonus token
  r = v.verify(s, cands({0, 1}), rng);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.next_token, 3);
  r = v.verify(s.narrow(0, 0, 1), cands({}), rng);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.next_token, 3);
}

TEST(RejectionSamplingVerifier, EqualDistributionsAlwaysAccept) {
  const at::Tensor scores = at::randn({4, 6}, at::TensorOptions().dtype(at::kFloat));
  Candidates c = cands({1, 4, 2});
  c.q = scores.narrow(0, 0, 3).softmax(-1);
  RejectionSamplingVerifier v;
  Rng rng(7);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(v.verify(scores, c, rng).accepted, 3);
}

TEST(RejectionSamplingVerifier, ZeroTargetProbabilityIsNeverAccepted) {
  // p puts no mass on token 0; the draft proposed 0 with q = 1 (one-hot, undefined q).
  const float ninf = -std::numeric_limits<float>::infinity();
  const at::Tensor scores = at::tensor({ninf, 0.f, 0.f, 0.f, 0.f, 0.f}).view({2, 3});
  RejectionSamplingVerifier v;
  Rng rng(3);
  for (int i = 0; i < 200; ++i) {
    const Verdict r = v.verify(scores, cands({0}), rng);
    EXPECT_EQ(r.accepted, 0);
    EXPECT_NE(r.next_token, 0);
  }
}

TEST(RejectionSamplingVerifier, OneStepOutputFollowsTarget) {
  // p = [0.6, 0.3, 0.1]; q = [0.1, 0.1, 0.8]. Draw from q, verify, look at the first output
  // token: its distribution must be p (exact computation: P = q*min(1,p/q) + residual mass).
  const at::Tensor p = at::tensor({0.6f, 0.3f, 0.1f});
  const at::Tensor q = at::tensor({0.1f, 0.1f, 0.8f});
  const at::Tensor scores = at::stack({p.log(), p.log()});  // [2, 3]
  RejectionSamplingVerifier v;
  Rng rng(11);
  std::vector<int> counts(3, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    Candidates c = cands({sample_index(q, rng.uniform())});
    c.q = q.view({1, 3});
    const Verdict r = v.verify(scores, c, rng);
    ++counts[r.accepted == 1 ? c.tokens[0] : r.next_token];
  }
  const double want[3] = {0.6, 0.3, 0.1};
  for (int t = 0; t < 3; ++t) {
    const double sd = std::sqrt(want[t] * (1 - want[t]) / n);
    EXPECT_NEAR(counts[t] / static_cast<double>(n), want[t], 5 * sd) << "token " << t;
  }
}

}  // namespace
}  // namespace specdec
