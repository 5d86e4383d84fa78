// A draft model's trees (GenerationConfig::draft_tree_width) against an uncached oracle of the same
// draft, and goodput's cut of proposals (GoodputPlanner::cut) against costs and estimates worked
// out by hand.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "goodput.hpp"
#include "specdec/candidates.hpp"
#include "specdec/lookahead.hpp"
#include "test_util.hpp"

namespace specdec::test {
namespace {

// The draft's probabilities after `seq`, from one uncached pass over all of it.
at::Tensor oracle_probs(const Model& m, const std::vector<int64_t>& seq) {
  KVCache cache = m.make_cache(static_cast<int64_t>(seq.size()) + 1, 1);
  const at::Tensor ids = at::tensor(seq, at::kLong).view({1, -1});
  return m.forward(ids, cache, 1)[0][0].to(at::kDouble).softmax(-1);  // [V]
}

// Each candidate's path of tokens under the verified ones.
std::vector<std::vector<int64_t>> paths(const Candidates& c) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < c.size(); ++i) {
    const int64_t parent = c.tree() ? c.parents[i] : static_cast<int64_t>(i) - 1;
    out.push_back(parent < 0 ? std::vector<int64_t>{} : out[static_cast<size_t>(parent)]);
    out.back().push_back(c.tokens[i]);
  }
  return out;
}

struct Drafter {
  GenerationConfig config;
  LookaheadSchedule schedule{config};
  Rng rng{0};
  DraftModelGenerator gen;
  Drafter(std::shared_ptr<const Model> draft, int64_t width)
      : config(make_config()),
        schedule(config),
        gen(std::move(draft), {{&config, &schedule, &rng, width}}, 64,
            DraftModelGenerator::Options{}) {}
  static GenerationConfig make_config() {
    GenerationConfig c;
    c.num_assistant_tokens = 4;
    c.num_assistant_tokens_schedule = "constant";
    c.eos_token_ids = {-1};
    return c;
  }
  Candidates propose(const std::vector<int64_t>& seq) { return gen.propose_batch({&seq}, {16})[0]; }
};

TEST(DraftTree, EachDepthHoldsTheDraftsMostProbableTokensAfterItsChain) {
  const auto draft = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  Drafter d(draft, 3);
  const std::vector<int64_t> seq = {5, 17, 30, 8};
  const Candidates c = d.propose(seq);
  ASSERT_TRUE(c.tree());
  ASSERT_EQ(c.size(), 12u);  // 4 depths x 3 tokens
  // The oracle's tree: at each depth the 3 most probable tokens after the chain of first choices.
  std::map<std::vector<int64_t>, double> want;
  std::vector<int64_t> chain;
  for (int depth = 0; depth < 4; ++depth) {
    std::vector<int64_t> context = seq;
    context.insert(context.end(), chain.begin(), chain.end());
    const at::Tensor p = oracle_probs(*draft, context);
    const at::Tensor top = std::get<1>(p.topk(3));
    for (int64_t j = 0; j < 3; ++j) {
      std::vector<int64_t> path = chain;
      path.push_back(top[j].item<int64_t>());
      want[path] = p[top[j]].item<double>();
    }
    chain.push_back(top[0].item<int64_t>());
  }
  const auto got = paths(c);
  const std::vector<double> reach = c.reach();
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_TRUE(want.count(got[i])) << "candidate " << i << " is not in the oracle's tree";
    EXPECT_NEAR(c.probs[i], want[got[i]], 1e-5) << "candidate " << i;
    if (i > 0) EXPECT_GE(reach[i - 1], reach[i]) << "not best first at " << i;
    if (c.parents[i] >= 0) EXPECT_LT(c.parents[i], static_cast<int64_t>(i));
  }
  std::map<std::vector<int64_t>, int> seen;
  for (const auto& path : got) EXPECT_EQ(++seen[path], 1) << "a path twice";
}

// A path that leaves the chain (a second choice at depth 1): the draft's cache keeps what the
// verified sequence agrees with, so its next proposal equals a fresh draft's on that sequence.
TEST(DraftTree, APathThroughASiblingLeavesTheCacheAsAFreshDraftsOnTheVerifiedSequence) {
  const auto draft = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  Drafter d(draft, 3);
  std::vector<int64_t> seq = {5, 17, 30, 8};
  const Candidates c = d.propose(seq);
  const auto got = paths(c);
  // The first depth-2 path whose second token is not the chain's.
  const std::vector<int64_t> chain_path = got[0];  // best first: the chain's first token
  std::vector<int64_t> path;
  for (const auto& p : got)
    if (p.size() == 2 && p[0] == chain_path[0] && std::count(got.begin(), got.end(), p) == 1) {
      bool has_children = false;
      for (const auto& q : got) has_children = has_children || (q.size() == 3 && q[1] == p[1]);
      if (!has_children) {  // a sibling (the chain's node has children)
        path = p;
        break;
      }
    }
  ASSERT_EQ(path.size(), 2u);
  seq.insert(seq.end(), path.begin(), path.end());
  seq.push_back(42);  // the target's own token
  d.gen.on_verified_row(0, c, 2, seq);
  EXPECT_LE(d.gen.cached(0), static_cast<int64_t>(seq.size()) - 2);  // the sibling is not cached
  const Candidates next = d.propose(seq);
  Drafter fresh(draft, 3);
  const Candidates want = fresh.propose(seq);
  EXPECT_EQ(next.tokens, want.tokens);
  EXPECT_EQ(next.parents, want.parents);
  ASSERT_EQ(next.probs.size(), want.probs.size());
  for (size_t i = 0; i < next.probs.size(); ++i) EXPECT_NEAR(next.probs[i], want.probs[i], 1e-6);
}

TEST(Candidates, ReachAndTruncateFollowThePaths) {
  Candidates tree;
  tree.tokens = {10, 11, 12, 13};
  tree.parents = {-1, -1, 0, 2};
  tree.probs = {0.5, 0.25, 0.5, 0.5};
  EXPECT_EQ(tree.reach(), (std::vector<double>{0.5, 0.25, 0.25, 0.125}));
  Candidates cut = tree;
  cut.truncate(3);
  EXPECT_EQ(cut.tokens, (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(cut.parents, (std::vector<int64_t>{-1, -1, 0}));
  // Without its branch a tree is a chain.
  tree.parents = {-1, 0, -1, 1};
  tree.truncate(2);
  EXPECT_FALSE(tree.tree());
  EXPECT_EQ(tree.depths(), (std::vector<int64_t>{0, 1}));
}

// Costs: a pass over 2 tokens 1 s, over 3 tokens 1.1 s, over 4 tokens 2 s. One row, a chain of
// probabilities 0.9, 0.9, 0.5 (reach 0.9, 0.81, 0.405), no measured acceptance yet: 1 candidate
// gives 1.9 tokens/s, 2 give 2.71 / 1.1 = 2.46, 3 give 3.115 / 2: two are kept. Then two
// proposals of that chain whose first token the target rejected: the kept / estimated ratio (decay
// 0.95) at depth 0 falls to 1 / (0.95 x 0.9 + 0.9 + 1) = 0.363, at depth 1 to 1 / (0.95 x 0.81 +
// 0.81 + 1) = 0.388, so 2 candidates give (1 + 0.327 + 0.314) / 1.1 = 1.49 against 1.33 for one:
// still kept; but a tree whose second candidate is a first-depth sibling of reach 0.05 (1.345 / 1.1
// = 1.22) goes down to its first candidate, a chain.
TEST(GoodputCut, KeepsTheCandidatesThatPayAtTheMeasuredCostsAndAcceptance) {
  const auto model = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  detail::GoodputPlanner planner(*model);
  planner.observe_target(1, 1.0);  // (without it, a first pass of suffix rows verifies nothing)
  planner.observe_target(2, 1.0);
  planner.observe_target(3, 1.1);
  planner.observe_target(4, 2.0);
  Candidates chain;
  chain.tokens = {1, 2, 3};
  chain.probs = {0.9, 0.9, 0.5};
  Candidates c = chain;
  planner.cut({{detail::kSuffix, &c}}, 1, 0);
  EXPECT_EQ(c.tokens, (std::vector<int64_t>{1, 2}));
  // Another row of the pass verifying 3 candidates pads it: every n costs the 4-token pass.
  c = chain;
  planner.cut({{detail::kSuffix, &c}}, 1, 3);
  EXPECT_EQ(c.size(), 3u);
  for (int i = 0; i < 2; ++i) planner.observe_kept(detail::kSuffix, chain, {});
  c = chain;
  planner.cut({{detail::kSuffix, &c}}, 1, 0);
  EXPECT_EQ(c.size(), 2u);
  Candidates tree;
  tree.tokens = {1, 4};
  tree.parents = {-1, -1};
  tree.probs = {0.9, 0.05};
  planner.cut({{detail::kSuffix, &tree}}, 1, 0);
  EXPECT_EQ(tree.tokens, (std::vector<int64_t>{1}));
  EXPECT_FALSE(tree.tree());
  // Another proposer's estimates are its own: kind 0 has seen nothing, its chain keeps 2.
  c = chain;
  planner.cut({{detail::kDraftModel, &c}}, 1, 0);
  EXPECT_EQ(c.size(), 2u);
}

// No candidate at all when none pays, in a pass whose rows are all prompt lookup's or suffix
// speculation's: with a 1-token pass at 1 s and a 2-token one at 1.5 s, a candidate of
// probability 0.1 gives 1.1 / 1.5 = 0.73 tokens/s against 1 without it, one of 0.9 gives 1.9 / 1.5
// = 1.27. A draft's tree keeps its first candidate (so does every row of a pass that holds one),
// and so does every proposal until a pass over one candidate per row was timed.
TEST(GoodputCut, CutsAProposalThatDoesNotPayToNothingWithoutADraftModel) {
  const auto model = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  detail::GoodputPlanner planner(*model);
  planner.observe_target(1, 1.0);
  planner.observe_target(2, 1.5);
  Candidates weak;
  weak.tokens = {5};
  weak.probs = {0.1};
  // The candidates a one-row pass keeps of a proposal of `kind` with first probability `prob`.
  const auto kept = [&](detail::GoodputPlanner& p, detail::Proposer kind, double prob = 0.1) {
    Candidates c = weak;
    c.probs = {prob};
    p.cut({{kind, &c}}, 1, 0);
    return c.size();
  };
  EXPECT_EQ(kept(planner, detail::kPromptLookup), 0u);
  EXPECT_EQ(kept(planner, detail::kSuffix), 0u);
  EXPECT_EQ(kept(planner, detail::kDraftModel), 1u);
  EXPECT_EQ(kept(planner, detail::kPromptLookup, 0.9), 1u);
  // Two rows at the same costs per row (2 tokens 1 s, 4 tokens 1.5 s): 2.2 / 1.5 = 1.47 tokens/s
  // against 2, but a row drafts with the draft model.
  detail::GoodputPlanner pair(*model);
  pair.observe_target(2, 1.0);
  pair.observe_target(4, 1.5);
  Candidates c = weak, other = weak;
  pair.cut({{detail::kSuffix, &c}, {detail::kSuffix, &other}}, 2, 0);
  EXPECT_EQ(c.size() + other.size(), 0u);
  c = weak;
  other = weak;
  pair.cut({{detail::kSuffix, &c}, {detail::kDraftModel, &other}}, 2, 0);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(other.size(), 1u);
  // Not before a pass over one candidate was timed: here only 1- and 4-token passes were, and the
  // cost of 2 tokens would be interpolated (1.33 s: the weak candidate would go).
  detail::GoodputPlanner untimed(*model);
  untimed.observe_target(1, 1.0);
  untimed.observe_target(4, 2.0);
  EXPECT_EQ(kept(untimed, detail::kPromptLookup), 1u);
}

// A cut to nothing, again and again: after Generator::kRetimeFirst such passes the next keeps the
// first candidate (verified, it times the pass and calibrates the estimates again); the wait then
// doubles, and starts over once a cut keeps candidates of its own accord.
TEST(GoodputCut, VerifiesACandidateNowAndThenWhenEveryOneIsCut) {
  const auto model = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  detail::GoodputPlanner planner(*model);
  planner.observe_target(1, 1.0);
  planner.observe_target(2, 1.5);
  Candidates weak;
  weak.tokens = {5, 6};
  weak.probs = {0.1, 0.9};
  // The passes until one keeps a candidate (that one included).
  const auto until_kept = [&] {
    for (int64_t n = 1; n <= 4 * Generator::kRetimeLast; ++n) {
      Candidates c = weak;
      planner.cut({{detail::kPromptLookup, &c}}, 1, 0);
      if (c.size() > 0) {
        EXPECT_EQ(c.size(), 1u);
        return n;
      }
    }
    return int64_t{0};
  };
  EXPECT_EQ(until_kept(), Generator::kRetimeFirst + 1);
  EXPECT_EQ(until_kept(), 2 * Generator::kRetimeFirst + 1);
  Candidates strong = weak;
  strong.probs = {0.9, 0.9};
  planner.cut({{detail::kPromptLookup, &strong}}, 1, 0);
  EXPECT_EQ(strong.size(), 2u);
  EXPECT_EQ(until_kept(), Generator::kRetimeFirst + 1);
}

// Proposals without a model run no calibration pass: goodput times the curve on real passes. The
// first pass of a batch size verifies nothing (target-only's pass); until a pass over
// timed_pass_tokens(cap) = 6 tokens (cap 10) was timed, a proposal longer than every timed pass is
// verified whole up to such a pass (5 candidates), however weak; then it is cut. With a 1-token
// pass at 1 s, a 2-token one at 3 s and a 9-token one at 5 s, 8 candidates of probability 0.1 give
// at most 1.1 / 3 tokens/s against 1. A pass that prefills a row (20 tokens before its last one)
// prices its candidates by the time they save: the curve above 9 tokens rises 0.5 s a token (its
// mean slope), a token is worth the 1 s of a 1-token pass, so of a chain of reach 0.9 and 0.27 only
// the first pays (0.9 - 0.5 > 0, 0.27 - 0.5 < 0); without a timed pass, none.
TEST(GoodputCut, TimesTheCurveOnRealPassesWithoutAModel) {
  const auto model = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  detail::GoodputPlanner planner(*model);
  GenerationConfig config;
  config.max_new_tokens = 64;
  config.prompt_lookup_num_tokens = 10;
  config.num_assistant_tokens_schedule = "goodput";
  LookaheadSchedule schedule(config);
  KVCache cache = model->make_cache(32);
  planner.plan({&schedule}, cache, {3, 4, 5}, 1, /*free_drafts=*/true, /*may_calibrate=*/true);
  Candidates weak;
  weak.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  weak.probs.assign(8, 0.1);
  const auto kept = [&](Candidates c, int64_t before = 0) {
    planner.cut({{detail::kPromptLookup, &c, before}}, 1, 0);
    return c.size();
  };
  EXPECT_EQ(kept(weak), 0u);  // no pass timed, none run by plan()
  planner.observe_target(1, 1.0);
  planner.observe_target(2, 3.0);
  EXPECT_EQ(kept(weak), 5u);
  Candidates one = weak;
  one.truncate(1);
  EXPECT_EQ(kept(one), 0u);  // its pass (2 tokens) was timed
  planner.observe_target(9, 5.0);
  EXPECT_EQ(kept(weak), 0u);
  Candidates chain;
  chain.tokens = {1, 2};
  chain.probs = {0.9, 0.3};
  EXPECT_EQ(kept(chain, 20), 1u);
  detail::GoodputPlanner fresh(*model);
  Candidates c = chain;
  fresh.cut({{detail::kPromptLookup, &c, 20}}, 1, 0);
  EXPECT_EQ(c.size(), 0u);
}

// Acceptance is measured by rank too: a tree of a first choice (0.6) and its sibling (0.35) at a
// pass of 2 tokens costing 1 s and of 3 tokens 1.1 s keeps both (1.95 / 1.1 = 1.77 against 1.6).
// After 5 proposals in which the first choice was kept and the sibling never, the ratio (decay
// 0.95: 4.524 proposals' weight) is 5.524 / 3.715 = 1.487 for first choices, 1 / 2.583 = 0.387
// for siblings: (1 + 0.892 + 0.136) / 1.1 = 1.84 against 1.89 for the first choice alone, which is
// kept. (Pooled by depth alone, the ratio 5.524 / 5.298 would keep both: 1.81 against 1.63.)
TEST(GoodputCut, MeasuresSiblingsApartFromFirstChoices) {
  const auto model = test_model(cached_fixture("tree_draft", small_fixture(11, 1)));
  detail::GoodputPlanner planner(*model);
  planner.observe_target(1, 1.0);  // (without it, a first pass of suffix rows verifies nothing)
  planner.observe_target(2, 1.0);
  planner.observe_target(3, 1.1);
  Candidates tree;
  tree.tokens = {1, 4};
  tree.parents = {-1, -1};
  tree.probs = {0.6, 0.35};
  Candidates c = tree;
  planner.cut({{detail::kPromptLookup, &c}}, 1, 0);
  EXPECT_EQ(c.size(), 2u);
  for (int i = 0; i < 5; ++i) planner.observe_kept(detail::kPromptLookup, tree, {0});
  c = tree;
  planner.cut({{detail::kPromptLookup, &c}}, 1, 0);
  EXPECT_EQ(c.tokens, (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace specdec::test
