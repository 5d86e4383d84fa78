// Suffix speculation's trees against a slow oracle that counts occurrences in the raw sequences,
// and hand-worked cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "specdec/error.hpp"
#include "specdec/suffix.hpp"

namespace specdec {
namespace {

using Seq = std::vector<int64_t>;

// Occurrences of s in the sequences (any start), strings up to `depth` tokens.
int64_t brute_count(const std::map<int64_t, Seq>& seqs, const Seq& s, int64_t depth) {
  if (s.empty() || static_cast<int64_t>(s.size()) > depth) return 0;
  int64_t n = 0;
  for (const auto& [id, q] : seqs)
    for (size_t i = 0; i + s.size() <= q.size(); ++i)
      n += std::equal(s.begin(), s.end(), q.begin() + static_cast<int64_t>(i));
  return n;
}

// The proposal rule of SuffixTree::propose, from raw counts over a vocabulary of `vocab` ids.
Seq brute_propose(const std::map<int64_t, Seq>& seqs, const Seq& ctx, int64_t depth, int64_t vocab,
                  int64_t max_tokens, double min_prob, double factor, double* score = nullptr) {
  const auto followers = [&](const Seq& s) {
    std::vector<int64_t> c(vocab, 0);
    if (static_cast<int64_t>(s.size()) + 1 > depth) return c;
    Seq t = s;
    t.push_back(0);
    for (int64_t v = 0; v < vocab; ++v) {
      t.back() = v;
      c[v] = brute_count(seqs, t, depth);
    }
    return c;
  };
  const auto any = [](const std::vector<int64_t>& c) {
    return std::any_of(c.begin(), c.end(), [](int64_t x) { return x > 0; });
  };
  Seq best;
  double best_score = 0;
  const auto len = static_cast<int64_t>(ctx.size());
  for (int64_t m = 1; m <= std::min(len, depth - 1); ++m) {
    Seq s(ctx.end() - m, ctx.end());
    if (!any(followers(s))) continue;
    const int64_t limit =
        std::min<int64_t>(max_tokens, std::max<int64_t>(1, static_cast<int64_t>(factor * m)));
    Seq out;
    double prob = 1, sum = 0;
    while (static_cast<int64_t>(out.size()) < limit) {
      const std::vector<int64_t> c = followers(s);
      if (!any(c)) break;
      const auto next = std::max_element(c.begin(), c.end()) - c.begin();  // first max: smallest id
      int64_t total = 0;
      for (int64_t x : c) total += x;
      // the continuation's count, with the pseudo-count 1 / (x - 0.8) for what was not seen (x: the
      // match's length plus the continuation's depth)
      const double x = static_cast<double>(m + static_cast<int64_t>(out.size()));
      prob *= static_cast<double>(c[next]) / (static_cast<double>(total) + 1.0 / (x - 0.8));
      if (prob < min_prob) break;
      out.push_back(next);
      sum += prob;
      s.push_back(next);
    }
    if (!out.empty() && sum >= best_score) {
      best = out;
      best_score = sum;
    }
  }
  if (score) *score = best_score;
  return best;
}

TEST(SuffixTree, CountsEveryStringUpToItsDepthAsTheSequencesGrowAndGo) {
  std::mt19937 rng(7);
  for (const int64_t depth : {1, 2, 3, 5}) {
    SuffixTree tree(depth);
    std::map<int64_t, Seq> seqs;
    std::uniform_int_distribution<int64_t> tok(0, 2), len(0, 9);
    for (int64_t id = 0; id < 12; ++id)
      for (int chunk = 0; chunk < 3; ++chunk) {  // grown in three pieces
        Seq piece(len(rng));
        for (auto& t : piece) t = tok(rng);
        tree.extend(id, piece);
        seqs[id].insert(seqs[id].end(), piece.begin(), piece.end());
      }
    const auto check_all = [&] {
      int64_t tokens = 0;
      for (const auto& [id, q] : seqs) tokens += static_cast<int64_t>(q.size());
      EXPECT_EQ(tree.tokens(), tokens);
      // Every string over {0, 1, 2} of 1 to depth + 1 tokens.
      for (int64_t n = 1; n <= depth + 1; ++n) {
        Seq s(n, 0);
        for (int64_t code = 0; code < static_cast<int64_t>(std::pow(3, n)); ++code) {
          int64_t c = code;
          for (auto& t : s) t = c % 3, c /= 3;
          ASSERT_EQ(tree.count(s), brute_count(seqs, s, depth)) << "depth " << depth;
        }
      }
    };
    check_all();
    for (const int64_t id : {3, 0, 11, 5, 42}) {  // 42: not held, nothing happens
      tree.remove(id);
      seqs.erase(id);
      check_all();
    }
    for (int64_t id = 0; id < 12; ++id) tree.remove(id);
    EXPECT_EQ(tree.tokens(), 0);
    EXPECT_EQ(tree.nodes(), 0);  // every node went with its last occurrence
  }
}

TEST(SuffixTree, ProposesAsTheOracleOnRandomSequences) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> tok(0, 3), len(5, 40);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t depth = 2 + trial % 7;
    SuffixTree tree(depth);
    std::map<int64_t, Seq> seqs;
    for (int64_t id = 0; id < 4; ++id) {
      Seq q(len(rng));
      for (auto& t : q) t = tok(rng) % (trial % 2 ? 4 : 2);  // half the trials on 2 ids: repeats
      tree.extend(id, q);
      seqs[id] = q;
    }
    for (int c = 0; c < 10; ++c) {
      Seq ctx(len(rng) % 12);
      for (auto& t : ctx) t = tok(rng);
      const double min_prob = (c % 3) * 0.2, factor = 0.5 + c % 4;
      const int64_t max_tokens = 1 + c % 9;
      double want_score = 0;
      const Seq want =
          brute_propose(seqs, ctx, depth, 4, max_tokens, min_prob, factor, &want_score);
      const SuffixTree::Proposal got = tree.propose(ctx, max_tokens, min_prob, factor);
      ASSERT_EQ(got.tokens, want) << "trial " << trial << " context " << c;
      EXPECT_NEAR(got.score, want_score, 1e-12);
    }
  }
}

// Depth 8 over [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5, 6] (ids 0, 1, 2).
SuffixTree hand_worked_tree() {
  SuffixTree tree(8);
  tree.extend(0, {1, 2, 3, 4});
  tree.extend(1, {1, 2, 3, 5});
  tree.extend(2, {1, 2, 3, 5, 6});
  return tree;
}

// A continuation seen `count` of `total` times after a match of x tokens (plus its depth).
double continues(double count, double total, double x) { return count / (total + 1 / (x - 0.8)); }

TEST(SuffixTree, HandWorkedProposals) {
  SuffixTree tree = hand_worked_tree();
  // [9, 1, 2]: [2] and [1, 2] occur ([9, 1, 2] does not). After [1, 2], 3 follows 3 times of 3
  // (x = 2: 18/23), then 5 twice of 3 (x = 3: 11/19); the factor 1 allows it 2 tokens (score
  // 18/23 + 18/23 * 11/19). After [2], 3 (x = 1: 3/8) is all the factor allows. [1, 2] wins.
  const double p3 = continues(3, 3, 2), p5 = p3 * continues(2, 3, 3);
  SuffixTree::Proposal p = tree.propose({9, 1, 2}, 10, 0.1, 1.0);
  EXPECT_EQ(p.tokens, (Seq{3, 5}));
  EXPECT_EQ(p.match, 2);
  EXPECT_NEAR(p3, 18.0 / 23.0, 1e-12);
  EXPECT_NEAR(p.score, p3 + p5, 1e-12);
  // The factor 3 allows 6: after [3, 5], 6 is all that followed (one of its two occurrences ends
  // its sequence, which says nothing): x = 4, 1 of 1; then nothing follows.
  const double p6 = p5 * continues(1, 1, 4);
  p = tree.propose({9, 1, 2}, 10, 0.1, 3.0);
  EXPECT_EQ(p.tokens, (Seq{3, 5, 6}));
  EXPECT_EQ(p.match, 2);
  EXPECT_NEAR(p.score, p3 + p5 + p6, 1e-12);
  EXPECT_EQ(tree.propose({9, 1, 2}, 10, 0.3, 3.0).tokens, (Seq{3, 5, 6}));  // p6 = 0.345
  EXPECT_EQ(tree.propose({9, 1, 2}, 10, 0.4, 3.0).tokens, (Seq{3, 5}));     // p5 = 0.453
  EXPECT_EQ(tree.propose({9, 1, 2}, 10, 0.5, 3.0).tokens, (Seq{3}));
  EXPECT_EQ(tree.propose({9, 1, 2}, 1, 0.1, 3.0).tokens, (Seq{3}));           // max_tokens
  EXPECT_EQ(tree.propose({9, 1, 2}, 10, 0.1, 3.0, {5}).tokens, (Seq{3, 5}));  // stops after 5
  // [4]: it occurs, but nothing follows it; no shorter suffix: no proposal.
  EXPECT_TRUE(tree.propose({4}, 10, 0.1, 1.0).tokens.empty());
  EXPECT_TRUE(tree.propose({7}, 10, 0.1, 1.0).tokens.empty());
  EXPECT_TRUE(tree.propose({}, 10, 0.1, 1.0).tokens.empty());
  EXPECT_TRUE(tree.propose({1, 2}, 0, 0.1, 1.0).tokens.empty());
  // A tie (4 once, 5 once after [2, 3] once sequence 2 is gone): the smaller id.
  tree.remove(2);
  EXPECT_EQ(tree.propose({2, 3}, 10, 0.1, 1.0).tokens, (Seq{4}));
  // Depth 3 keeps strings of 3 tokens: after [1, 2] (x = 2) 3, and nothing deeper; after [2]
  // alone, 3 (x = 1) and 4 (x = 2).
  SuffixTree shallow(3);
  shallow.extend(0, {1, 2, 3, 4, 1, 2});
  p = shallow.propose({1, 2}, 10, 0.0, 10.0);
  EXPECT_EQ(p.tokens, (Seq{3}));
  EXPECT_EQ(p.match, 2);
  EXPECT_NEAR(p.score, continues(1, 1, 2), 1e-12);  // more than [2]'s 3, 4: 1/6 + 1/6 * 6/11
  p = shallow.propose({5, 2}, 10, 0.0, 10.0);
  EXPECT_EQ(p.tokens, (Seq{3, 4}));
  EXPECT_EQ(p.match, 1);
  EXPECT_EQ(shallow.count({1, 2, 3}), 1);
  EXPECT_EQ(shallow.count({1, 2, 3, 4}), 0);
  EXPECT_EQ(shallow.count({1, 2}), 2);
}

TEST(SuffixTree, HandWorkedTreeProposals) {
  SuffixTree tree = hand_worked_tree();
  // After [1, 2] (as in HandWorkedProposals, factor 3: 6 levels): 3 (p3); under it 5 (p5) and 4
  // (p3 * 1 of 3 at x = 3); under the 5, 6 (p6). Best first: 3, 5, 6, 4; the score is their sum.
  // [2]'s tree (3 at x = 1, ...) scores less.
  const double p3 = continues(3, 3, 2), p5 = p3 * continues(2, 3, 3), p4 = p3 * continues(1, 3, 3),
               p6 = p5 * continues(1, 1, 4);
  SuffixTree::Proposal p = tree.propose_tree({9, 1, 2}, 10, 0.1, 3.0);
  EXPECT_EQ(p.tokens, (Seq{3, 5, 6, 4}));
  EXPECT_EQ(p.parents, (Seq{-1, 0, 1, 0}));
  EXPECT_EQ(p.match, 2);
  EXPECT_NEAR(p.score, p3 + p5 + p6 + p4, 1e-12);
  EXPECT_EQ(tree.propose_tree({9, 1, 2}, 2, 0.1, 3.0).tokens, (Seq{3, 5}));  // the node budget
  EXPECT_EQ(tree.propose_tree({9, 1, 2}, 2, 0.1, 3.0).parents, (Seq{-1, 0}));
  p = tree.propose_tree({9, 1, 2}, 10, 0.3, 3.0);  // 4's 0.23 is below 0.3, 6's 0.35 is not
  EXPECT_EQ(p.tokens, (Seq{3, 5, 6}));
  EXPECT_EQ(p.parents, (Seq{-1, 0, 1}));
  p = tree.propose_tree({9, 1, 2}, 10, 0.1, 3.0, {5});  // nothing under a stop token
  EXPECT_EQ(p.tokens, (Seq{3, 5, 4}));
  EXPECT_EQ(p.parents, (Seq{-1, 0, 0}));
  p = tree.propose_tree({9, 1, 2}, 10, 0.1, 1.0);  // factor 1: [1, 2] allows 2 levels
  EXPECT_EQ(p.tokens, (Seq{3, 5, 4}));
  EXPECT_EQ(p.parents, (Seq{-1, 0, 0}));
  EXPECT_TRUE(tree.propose_tree({7}, 10, 0.1, 1.0).tokens.empty());
  EXPECT_TRUE(tree.propose_tree({1, 2}, 0, 0.1, 1.0).tokens.empty());
}

// On random sequences: every node's path continues the matched suffix somewhere in them, parents
// come first, siblings differ, the budget holds, and the tree's expected tokens are at least the
// chain's (best first takes the most probable nodes, the chain's among them).
TEST(SuffixTree, TreeProposalsOnRandomSequencesAreSoundAndScoreAtLeastTheChain) {
  std::mt19937_64 gen(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t depth = 3 + trial % 6, vocab = 2 + trial % 5;
    SuffixTree tree(depth);
    std::map<int64_t, Seq> seqs;
    for (int64_t id = 0; id < 4; ++id) {
      Seq s(5 + gen() % 20);
      for (auto& t : s) t = static_cast<int64_t>(gen() % vocab);
      tree.extend(id, s);
      seqs[id] = s;
    }
    for (int q = 0; q < 10; ++q) {
      Seq ctx(1 + gen() % 6);
      for (auto& t : ctx) t = static_cast<int64_t>(gen() % vocab);
      const int64_t budget = 1 + static_cast<int64_t>(gen() % 8);
      const double min_prob = (gen() % 4) * 0.1, factor = 0.5 + (gen() % 4);
      const SuffixTree::Proposal t = tree.propose_tree(ctx, budget, min_prob, factor);
      const SuffixTree::Proposal c = tree.propose(ctx, budget, min_prob, factor);
      ASSERT_LE(static_cast<int64_t>(t.tokens.size()), budget);
      ASSERT_EQ(t.parents.size(), t.tokens.size());
      EXPECT_GE(t.score, c.score - 1e-12) << "trial " << trial << " query " << q;
      EXPECT_EQ(t.tokens.empty(), c.tokens.empty());
      for (size_t i = 0; i < t.tokens.size(); ++i) {
        ASSERT_LT(t.parents[i], static_cast<int64_t>(i));
        Seq path;
        for (int64_t n = static_cast<int64_t>(i); n >= 0; n = t.parents[n])
          path.insert(path.begin(), t.tokens[n]);
        Seq s(ctx.end() - t.match, ctx.end());
        s.insert(s.end(), path.begin(), path.end());
        EXPECT_GT(brute_count(seqs, s, depth), 0) << "trial " << trial << " node " << i;
        for (size_t j = 0; j < i; ++j)
          EXPECT_FALSE(t.parents[j] == t.parents[i] && t.tokens[j] == t.tokens[i]);
      }
    }
  }
}

TEST(SuffixCache, HoldsAtMostItsTokensAndEvictsTheOldestFirst) {
  SuffixOptions o;
  o.max_depth = 6;
  o.cache_tokens = 100;
  SuffixCache cache(o);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> tok(0, 50000), len(1, 40);
  for (int r = 0; r < 300; ++r) {
    Seq q(len(rng) + 10);
    for (auto& t : q) t = tok(rng);
    cache.add(q, 10);  // 10 prompt tokens, of which kContextTokens are kept
    EXPECT_LE(cache.tokens(), o.cache_tokens);
    EXPECT_LE(cache.nodes(), o.cache_tokens * o.max_depth);
  }
  EXPECT_GT(cache.tokens(), 50);
  // Oldest first: an early output is gone, the last one is held and proposed from.
  SuffixCache small(o);
  small.add({1, 2, 3, 4, 5, 6}, 0);
  small.add(Seq(60, 7), 0);
  EXPECT_EQ(small.propose({1, 2}, 4, {}).tokens, (Seq{3, 4}));
  small.add(Seq(40, 8), 0);  // 6 + 60 + 40 > 100: the first goes
  EXPECT_TRUE(small.propose({1, 2}, 4, {}).tokens.empty());
  EXPECT_EQ(small.tokens(), 100);
  // A sequence longer than the cache keeps its end; the prompt before kContextTokens goes.
  SuffixCache one(o);
  Seq q(20, 1);
  q.push_back(2);
  q.push_back(3);
  one.add(q, 20);
  EXPECT_EQ(one.tokens(), SuffixCache::kContextTokens + 2);
  o.cache_tokens = 0;
  SuffixCache none(o);
  none.add(q, 0);
  EXPECT_EQ(none.tokens(), 0);
}

TEST(SuffixGenerator, ProposesFromItsOwnSequenceAndFromEarlierOutputs) {
  SuffixOptions o;
  o.max_spec_factor = 4;
  auto cache = std::make_shared<SuffixCache>(o);
  // Its own sequence: [5, 6] was followed by 7, 8, 1, 5, 6 (prompt lookup proposes the same).
  SuffixGenerator own(cache, {99});
  EXPECT_EQ(own.propose({5, 6, 7, 8, 1, 5, 6}, 8).tokens, (Seq{7, 8, 1, 5, 6}));
  EXPECT_EQ(own.propose({5, 6, 7, 8, 1, 5, 6}, 2).tokens, (Seq{7, 8}));
  // An earlier request's output, seen from the prompt's last tokens: [30, 31] then 40..45, EOS.
  cache->add({20, 30, 31, 40, 41, 42, 43, 44, 45, 99}, 3);
  SuffixGenerator next(cache, {99});
  EXPECT_EQ(next.propose({10, 30, 31}, 20).tokens, (Seq{40, 41, 42, 43, 44, 45, 99}));  // EOS kept
  // The higher score wins: the own tree's [30, 31] -> 50, 30, 31 (3 tokens) loses to the cache's
  // 7 tokens after the same match.
  SuffixGenerator mixed(cache, {99});
  EXPECT_EQ(mixed.propose({30, 31, 50, 30, 31}, 20).tokens, (Seq{40, 41, 42, 43, 44, 45, 99}));
  EXPECT_TRUE(mixed.propose({30, 31, 50, 30, 31}, 0).tokens.empty());
  // Without a shared cache: its own tree only.
  SuffixGenerator alone(nullptr, {});
  EXPECT_TRUE(alone.propose({10, 30, 31}, 20).tokens.empty());
}

TEST(SuffixOptions, RefusesWhatItCannotHold) {
  for (const auto& bad : std::vector<std::function<void(SuffixOptions&)>>{
           [](SuffixOptions& o) { o.max_depth = 1; }, [](SuffixOptions& o) { o.max_depth = 5000; },
           [](SuffixOptions& o) { o.min_token_prob = 1.5; },
           [](SuffixOptions& o) { o.max_spec_factor = 0; },
           [](SuffixOptions& o) { o.cache_tokens = -1; }}) {
    SuffixOptions o;
    bad(o);
    EXPECT_THROW(SuffixCache{o}, Error);
  }
}

}  // namespace
}  // namespace specdec
