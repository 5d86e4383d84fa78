// Verifiers on crafted scores.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "specdec/error.hpp"

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
  const at::Tensor s =
      at::tensor({0.f, 0.f, 0.f, 9.f, 0.f, 0.f, 9.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 9.f})
          .view({3, 5});
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

// The verifier decides from uniforms drawn ahead (on a device, in one pass); the textbook
// algorithm decides on the host, one draw at a time. Same draws, same decision, same stream after.
// Deterministic proposals (no q): the target's token is drawn from p at each position, one
// uniform each, and kept as a candidate while it equals it.
TEST(RejectionSamplingVerifier, DecidesAsTheOneDrawAtATimeAlgorithm) {
  const int64_t vocab = 7;
  at::manual_seed(5);
  RejectionSamplingVerifier v;
  Rng pick(99);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t k = trial % 6;
    const at::Tensor scores = at::randn({k + 1, vocab}) * 2;
    Candidates c;
    const bool deterministic = trial % 3 == 0;
    at::Tensor q = at::randn({k, vocab}).mul(2).softmax(-1);
    for (int64_t i = 0; i < k; ++i) c.tokens.push_back(sample_index(q[i], pick.uniform()));
    if (!deterministic) c.q = q;
    Rng rng(trial), oracle_rng(trial);
    const Verdict got = v.verify(scores, c, rng);
    // The oracle.
    const at::Tensor p = scores.softmax(-1);
    Verdict want;
    bool rejected = false;
    for (int64_t i = 0; i < k && !rejected; ++i) {
      const int64_t t = c.tokens[i];
      if (deterministic) {
        const int64_t drawn = sample_index(p[i], oracle_rng.uniform());
        if (drawn == t) {
          ++want.accepted;
        } else {
          rejected = true;
          want.next_token = drawn;
        }
        continue;
      }
      const double pi = p[i][t].item<double>(), qi = q[i][t].item<double>();
      if (!(qi > 0.0) || oracle_rng.uniform() * qi >= pi) {
        rejected = true;
        at::Tensor residual = (p[i] - q[i]).clamp_min(0);
        if (!(residual.sum().item<double>() > 0)) residual = p[i];
        want.next_token = sample_index(residual, oracle_rng.uniform());
      } else {
        ++want.accepted;
      }
    }
    if (!rejected) want.next_token = sample_index(p[k], oracle_rng.uniform());
    ASSERT_EQ(got.accepted, want.accepted) << "trial " << trial;
    ASSERT_EQ(got.next_token, want.next_token) << "trial " << trial;
    ASSERT_EQ(rng.uniform(), oracle_rng.uniform()) << "trial " << trial << ": the streams part";
  }
}

// A device's chain verdict draws every position at once (sample_rows_tensor): each row's index is
// the one sample_index draws from it with the same uniform.
TEST(Sampling, RowsAtOnceDrawAsOneRowAtATime) {
  at::manual_seed(4);
  Rng rng(6);
  for (int trial = 0; trial < 50; ++trial) {
    const at::Tensor p = (at::randn({5, 11}) * 3).softmax(-1);
    std::vector<double> u(5);
    for (double& x : u) x = rng.uniform();
    const at::Tensor rows = sample_rows_tensor(p, at::tensor(u, at::kDouble));
    for (int64_t r = 0; r < 5; ++r)
      ASSERT_EQ(rows[r].item<int64_t>(), sample_index(p[r], u[static_cast<size_t>(r)])) << trial;
  }
}

// A deterministic proposal changes which positions one pass verifies, never which tokens a seed
// gives: the tokens of passes with any proposals equal those of target-only passes (no candidates)
// from the same stream, one uniform per token either way.
TEST(RejectionSamplingVerifier, DeterministicProposalsGiveTheTargetOnlyTokensOfASeed) {
  const int64_t vocab = 5, n = 40;
  at::manual_seed(8);
  const at::Tensor logits = at::randn({n + 1, vocab});  // the target's scores at each position
  RejectionSamplingVerifier v;
  std::vector<int64_t> alone;
  Rng rng(3);
  for (int64_t i = 0; i < n; ++i)
    alone.push_back(v.verify(logits[i].view({1, vocab}), {}, rng).next_token);
  for (int trial = 0; trial < 20; ++trial) {
    Rng proposals(trial), stream(3);
    std::vector<int64_t> out;
    while (static_cast<int64_t>(out.size()) < n - 2) {
      const auto at = static_cast<int64_t>(out.size());
      const int64_t k = std::min<int64_t>(proposals.uniform() * 4, n - at - 3);
      // Candidates that are right half the time (the target-only token), else a random one.
      const auto guess = [&](int64_t i) {
        return proposals.uniform() < 0.5 ? alone[at + i]
                                         : static_cast<int64_t>(proposals.uniform() * vocab);
      };
      Candidates c;
      at::Tensor scores;
      if (trial % 2 == 0 || k < 2) {  // a chain
        for (int64_t i = 0; i < k; ++i) c.tokens.push_back(guess(i));
        scores = logits.narrow(0, at, k + 1);
      } else {  // a tree: two children under the root, one under each; a row per node's depth
        c.tokens = {guess(0), guess(0), guess(1), guess(1)};
        c.parents = {-1, -1, 0, 1};
        scores =
            at::stack({logits[at], logits[at + 1], logits[at + 1], logits[at + 2], logits[at + 2]});
      }
      const Verdict r = v.verify(scores, c, stream);
      for (const int64_t node : r.path) out.push_back(c.tokens[node]);
      out.push_back(r.next_token);
    }
    out.resize(std::min(out.size(), alone.size()));
    EXPECT_EQ(out, std::vector<int64_t>(alone.begin(), alone.begin() + out.size()))
        << "trial " << trial;
  }
}

}  // namespace

Candidates tree(std::vector<int64_t> t, std::vector<int64_t> parents) {
  Candidates c = cands(std::move(t));
  c.parents = std::move(parents);
  return c;
}

// A tree of 5 candidates: 2 and 3 under the verified tokens, 4 and 1 under the 2, 0 under the 1.
// Scores row 0 (the root), then 1 + i after candidate i; argmaxes set per case.
TEST(GreedyVerifier, TreeFollowsTheChildHoldingTheArgmax) {
  const Candidates c = tree({2, 3, 4, 1, 0}, {-1, -1, 0, 0, 3});
  const auto scores = [](std::vector<int64_t> argmax) {
    at::Tensor s = at::zeros({6, 5});
    for (int64_t r = 0; r < 6; ++r) s[r][argmax[r]] = 9.f;
    return s;
  };
  Rng rng(0);
  GreedyVerifier v;
  // root -> 2 (candidate 0) -> 1 (candidate 3) -> 0 (candidate 4) -> bonus 3.
  Verdict r = v.verify(scores({2, 1, 0, 0, 0, 3}), c, rng);
  EXPECT_EQ(r.accepted, 3);
  EXPECT_EQ(r.path, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(r.next_token, 3);
  // root -> 3 (candidate 1, a leaf) -> the target's 4.
  r = v.verify(scores({3, 0, 4, 0, 0, 0}), c, rng);
  EXPECT_EQ(r.path, (std::vector<int64_t>{1}));
  EXPECT_EQ(r.next_token, 4);
  // root -> 2 -> 0, which no child of candidate 0 holds.
  r = v.verify(scores({2, 0, 0, 0, 0, 0}), c, rng);
  EXPECT_EQ(r.path, (std::vector<int64_t>{0}));
  EXPECT_EQ(r.next_token, 0);
  r = v.verify(scores({4, 0, 0, 0, 0, 0}), c, rng);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_TRUE(r.path.empty());
  EXPECT_EQ(r.next_token, 4);
  Candidates bad = tree({2, 3}, {-1, 1});  // a parent after its child
  EXPECT_THROW(v.verify(at::zeros({3, 5}), bad, rng), Error);
}

// A verifier of one's own whose values name what does not exist: verify() (as the engine) throws
// before settle() sees the verdict.
TEST(Verifier, ValuesNamingNoCandidateOrTokenAreAnError) {
  struct Fixed final : Verifier {
    std::vector<int64_t> values;
    mutable bool settled = false;
    at::Tensor decide(const at::Tensor&, const Candidates&, Rng&) const override {
      return at::tensor(values, at::kLong);
    }
    void settle(const Verdict&, const Candidates&, Rng&) const override { settled = true; }
  };
  const Candidates c = tree({2, 3, 4}, {-1, -1, 0});
  const at::Tensor s = at::zeros({4, 5});
  Rng rng(0);
  Fixed v;
  v.values = {2, 1, 0, 2, -1};  // a kept path: root -> 0 -> 2, then token 1
  EXPECT_EQ(v.verify(s, c, rng).path, (std::vector<int64_t>{0, 2}));
  EXPECT_TRUE(v.settled);
  for (const std::vector<int64_t>& values : std::vector<std::vector<int64_t>>{
           {4, 1, 0, 2, -1},   // more kept than proposed
           {2, 1, 1, 2, -1},   // candidate 2 is no child of candidate 1
           {1, 1, 2, -1, -1},  // candidate 2 is no child of the root
           {1, 1, 3, -1, -1},  // no candidate 3
           {0, 5, -1, -1, -1},
           {0, -1, -1, -1, -1}}) {  // tokens outside the vocabulary of 5
    v.values = values;
    v.settled = false;
    EXPECT_THROW(v.verify(s, c, rng), Error) << values[0] << " " << values[1] << " " << values[2];
    EXPECT_FALSE(v.settled);
  }
  for (const std::vector<int64_t>& values : std::vector<std::vector<int64_t>>{{2, 1}, {1}, {}}) {
    v.values = values;  // no path for the tree, no token
    EXPECT_THROW(v.verify(s, c, rng), Error) << values.size() << " values";
  }
  struct Floats final : Verifier {
    at::Tensor decide(const at::Tensor&, const Candidates&, Rng&) const override {
      return at::zeros({2});
    }
  };
  EXPECT_THROW(Floats().verify(at::zeros({3, 5}), cands({2, 3}), rng), Error);
  Fixed chain;
  chain.values = {1, 7};
  EXPECT_THROW(chain.verify(at::zeros({3, 5}), cands({2, 3}), rng), Error);
  chain.values = {2, 4};
  EXPECT_EQ(chain.verify(at::zeros({3, 5}), cands({2, 3}), rng).path, (std::vector<int64_t>{0, 1}));
}

// Two candidates under the root (tokens 0 and 1) and one under the first: the first token is
// drawn from p exactly, and after candidate 0 the second from its row; frequencies of 40000
// decisions within 5 standard deviations.
TEST(RejectionSamplingVerifier, TreeOfPointMassesKeepsTheTargetDistribution) {
  const at::Tensor p0 = at::tensor({0.3f, 0.2f, 0.4f, 0.1f}),
                   p1 = at::tensor({0.1f, 0.1f, 0.2f, 0.6f});
  const at::Tensor scores = at::stack({p0.log(), p1.log(), at::zeros({4}), at::zeros({4})});
  const Candidates c = tree({0, 1, 3}, {-1, -1, 0});
  RejectionSamplingVerifier v;
  Rng rng(11);
  const int n = 40000;
  std::vector<int> first(4, 0), second(4, 0);
  int after_zero = 0;
  for (int i = 0; i < n; ++i) {
    const Verdict r = v.verify(scores, c, rng);
    std::vector<int64_t> out;
    for (const int64_t node : r.path) out.push_back(c.tokens[node]);
    out.push_back(r.next_token);
    ++first[out[0]];
    if (out[0] == 0) ++after_zero, ++second[out[1]];
  }
  for (int t = 0; t < 4; ++t) {
    const double e = n * p0[t].item<double>(), sd = std::sqrt(e * (1 - p0[t].item<double>()));
    EXPECT_NEAR(first[t], e, 5 * sd) << "first token " << t;
    const double e2 = after_zero * p1[t].item<double>();
    EXPECT_NEAR(second[t], e2, 5 * std::sqrt(e2) + 1) << "second token " << t;
  }
}

}  // namespace specdec
