// Lookahead schedules as pure logic.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "specdec/error.hpp"
#include "specdec/lookahead.hpp"

namespace specdec {
namespace {

GenerationConfig with(const std::string& schedule, int64_t k) {
  GenerationConfig c;
  c.num_assistant_tokens_schedule = schedule;
  c.num_assistant_tokens = k;
  return c;
}

TEST(Lookahead, ConstantNeverMoves) {
  LookaheadSchedule s(with("constant", 5));
  s.update({0.9, 0.9}, 0);
  s.update({0.9, 0.9}, 2);
  EXPECT_EQ(s.num_tokens(), 5);
  EXPECT_FALSE(s.stop_after(0.0));
}

TEST(Lookahead, HeuristicPlusTwoMinusOneFloorOne) {
  LookaheadSchedule s(with("heuristic", 3));
  s.update({.5, .5, .5}, 3);  // all accepted: +2
  EXPECT_EQ(s.num_tokens(), 5);
  s.update({.5, .5}, 1);  // not all: -1
  EXPECT_EQ(s.num_tokens(), 4);
  for (int i = 0; i < 10; ++i) s.update({.5}, 0);
  EXPECT_EQ(s.num_tokens(), 1);  // floor
  s.update({}, 0);               // nothing could be drafted: counts as all accepted (HF)
  EXPECT_EQ(s.num_tokens(), 3);
  // Bounded by the most one iteration may propose (Hugging Face's has no bound).
  for (int i = 0; i < 200; ++i) s.update({}, 0);
  EXPECT_EQ(s.num_tokens(), GenerationConfig::kMaxLookahead);
}

TEST(Lookahead, DynamicStopsBelowThreshold) {
  GenerationConfig c = with("dynamic", 0);
  c.assistant_confidence_threshold = 0.4;
  LookaheadSchedule s(c);
  EXPECT_EQ(s.num_tokens(), 20);
  EXPECT_FALSE(s.stop_after(0.4));
  EXPECT_TRUE(s.stop_after(0.39));
}

TEST(Lookahead, AdaptiveThresholdOnHandMadeHistory) {
  // Costs (FPR + 3 FNR) by threshold: inf 3, .9 2.25, .8 1.5, .7 .75, .6 1.25, .3 .5, .2 1.
  EXPECT_DOUBLE_EQ(LookaheadSchedule::fit_threshold({0.9, 0.8, 0.7, 0.6, 0.3, 0.2},
                                                    {true, true, true, false, true, false}, 0.4),
                   0.3);
  // Too few samples, or one outcome only: unchanged.
  EXPECT_DOUBLE_EQ(LookaheadSchedule::fit_threshold({0.9, 0.1}, {true, false}, 0.4), 0.4);
  EXPECT_DOUBLE_EQ(
      LookaheadSchedule::fit_threshold({.9, .8, .7, .6, .5, .4}, std::vector<bool>(6, true), 0.4),
      0.4);
  // Perfect separation: the lowest accepted probability.
  EXPECT_DOUBLE_EQ(LookaheadSchedule::fit_threshold({.9, .8, .7, .3, .2, .1},
                                                    {true, true, true, false, false, false}, 0.4),
                   0.7);
}

TEST(Lookahead, AdaptiveUpdateKeepsOnlyJudgedDrafts) {
  GenerationConfig c = with("dynamic", 8);
  LookaheadSchedule s(c);
  // Each iteration: drafts after the first rejection were never judged and are dropped.
  s.update({0.9, 0.8, 0.05, 0.05}, 2);   // keeps (.9,1) (.8,1) (.05,0)
  s.update({0.7, 0.3, 0.01}, 1);         // keeps (.7,1) (.3,0)
  EXPECT_DOUBLE_EQ(s.threshold(), 0.4);  // 5 samples: not enough yet
  s.update({0.6}, 1);                    // (.6,1): 6 samples
  // Samples: .9+ .8+ .7+ .6+ / .3- .05-: perfect split at 0.6.
  EXPECT_DOUBLE_EQ(s.threshold(), 0.6);
  GenerationConfig fixed = c;
  fixed.adaptive_threshold = false;
  LookaheadSchedule f(fixed);
  for (int i = 0; i < 5; ++i) f.update({0.9, 0.1}, 1);
  EXPECT_DOUBLE_EQ(f.threshold(), 0.4);
}

// goodput: tokens per second of an iteration, worked out by hand. Target pass 1 + 0.1 (rows - 1) s,
// draft 0.05 s per token, acceptance 0.8: rate(k) = (1 - 0.8^(k+1)) / 0.2 / (1 + 0.15 k) =
// 1, 1.5652, 1.8769, 2.0359, 2.1010, 2.1082, 2.0797 for k = 0..6: best 5.
TEST(Lookahead, GoodputPicksTheMostTokensPerSecond) {
  const auto linear = [](int64_t rows) { return 1.0 + 0.1 * static_cast<double>(rows - 1); };
  EXPECT_NEAR(LookaheadSchedule::expected_tokens(0.8, 5), 3.68928, 1e-12);
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, 0.8, 12), 5);
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, 0.8, 3), 3);  // the cap
  // Acceptance 0.3: 1, 1.1304, 1.0692: best 1.
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, 0.3, 12), 1);
  // A draft token costing half a target pass at acceptance 0.5: 1.5 / 1.6 < 1: no speculation.
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.5, 0.5, 12), 0);
  // Memory-bound target (every pass costs the same) and a free draft: as many as allowed.
  EXPECT_EQ(LookaheadSchedule::best_lookahead([](int64_t) { return 1.0; }, 0.0, 0.9, 8), 8);
}

// goodput over a batch, by hand, with the same target and draft costs: a pass over B rows padded
// to k + 1 tokens costs 1 + 0.1 (B (k + 1) - 1) s, a draft pass 0.05 s.
TEST(Lookahead, GoodputForABatchPaysForEveryRowPaddedToTheLongest) {
  const auto linear = [](int64_t rows) { return 1.0 + 0.1 * static_cast<double>(rows - 1); };
  // Two rows at 0.8: 2 E(k) / (1.1 + 0.25 k) = 1.818, 2.667, 3.050, 3.191, 3.2015, 3.140: best 4
  // (one row alone: 5).
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, std::vector<double>{0.8, 0.8}, 12), 4);
  // Four rows at 0.5: 4 E(k) / (1.3 + 0.45 k) = 3.077, 3.429, 3.182: best 1.
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, std::vector<double>(4, 0.5), 12), 1);
  // Eight rows at 0.3: 8 / 1.7 = 4.706 > 10.4 / 2.55 = 4.078: no speculation (one row alone: 1).
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, std::vector<double>(8, 0.3), 12), 0);
  // One row: the single-row rule.
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, std::vector<double>{0.3}, 12), 1);
  // One goodput row at 0.8 in a pass of 8 rows: its K pads all 8, E(k) / (1.7 + 0.85 k) = 0.588,
  // 0.706, 0.718, 0.695: best 2 (planned as if it were alone in the pass: 5).
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, std::vector<double>{0.8}, 12, 8), 2);
  EXPECT_EQ(LookaheadSchedule::best_lookahead(linear, 0.05, std::vector<double>{0.8}, 12), 5);
}

TEST(Lookahead, GoodputScheduleUsesTheAcceptanceHistory) {
  GenerationConfig c = with("goodput", 0);
  LookaheadSchedule s(c);
  EXPECT_EQ(s.cap(), 12);
  EXPECT_EQ(s.num_tokens(), 2);  // before any measurement
  EXPECT_DOUBLE_EQ(s.acceptance(), 0.5);
  s.update({1, 1, 1, 1, 1}, 3);  // 3 accepted, then a rejection
  EXPECT_DOUBLE_EQ(s.acceptance(), 4.0 / 6.0);
  s.update({1, 1}, 2);  // all accepted: no rejection
  EXPECT_DOUBLE_EQ(s.acceptance(), (0.95 * 3 + 2 + 1) / (0.95 * 3 + 2 + 0.95 + 2));
  const auto linear = [](int64_t rows) { return 1.0 + 0.1 * static_cast<double>(rows - 1); };
  s.plan(linear, 0.05);
  EXPECT_EQ(s.num_tokens(), LookaheadSchedule::best_lookahead(linear, 0.05, s.acceptance(), 12));
  LookaheadSchedule constant(with("constant", 4));
  constant.plan(linear, 10.0);  // other schedules ignore plan()
  EXPECT_EQ(constant.num_tokens(), 4);
}

// A row the estimate turns away still drafts one token while its acceptance bound says drafting
// could pay, since at K = 0 no evidence comes in. By hand: passes cost 1 + 0.3 (rows - 1), a draft
// token 0.1, so K = 1 pays exactly when the acceptance a exceeds 0.4 ((1 + a) / 1.4 > 1).
TEST(Lookahead, GoodputDraftsOneTokenWhileTheBoundSaysDraftingCouldPay) {
  const auto cost = [](int64_t rows) { return 1.0 + 0.3 * static_cast<double>(rows - 1); };
  LookaheadSchedule s(with("goodput", 0));
  s.set_evidence({1.0, 4.0});  // estimate 2/7 = 0.29, bound 0.29 + sqrt(0.29 x 0.71 / 8) = 0.45
  EXPECT_DOUBLE_EQ(s.acceptance(), 2.0 / 7.0);
  EXPECT_NEAR(s.acceptance_bound(), 2.0 / 7.0 + std::sqrt(2.0 / 7.0 * 5.0 / 7.0 / 8.0), 1e-12);
  EXPECT_EQ(LookaheadSchedule::best_lookahead(cost, 0.1, s.acceptance(), 12), 0);
  s.plan(cost, 0.1);
  EXPECT_EQ(s.num_tokens(), 1);
  s.set_evidence({5.0, 20.0});  // estimate 6/27 = 0.22, bound 0.30: no
  s.plan(cost, 0.1);
  EXPECT_EQ(s.num_tokens(), 0);
  // A row whose estimate already drafts keeps best_lookahead's K.
  s.set_evidence({20.0, 5.0});
  s.plan(cost, 0.1);
  EXPECT_EQ(s.num_tokens(), LookaheadSchedule::best_lookahead(cost, 0.1, s.acceptance(), 12));
  EXPECT_GT(s.num_tokens(), 1);
}

// What the next goodput request starts from, by hand: the mean of the schedules' decayed counts,
// scaled to at most `weight` counts in all (the acceptance estimate stays near theirs).
TEST(Lookahead, GoodputCarriesTheMeanEvidenceScaledDown) {
  LookaheadSchedule a(with("goodput", 0)), b(with("goodput", 0));
  a.update({1, 1, 1}, 1);  // accepted 1, rejected 1
  b.update({1, 1, 1}, 3);  // accepted 3, rejected 0
  EXPECT_EQ(LookaheadSchedule::carry_evidence({&a, &b}),
            std::make_pair(2.0, 0.5));  // mean: 2.5 counts <= 4
  // Weight 1: the mean (2, 0.5) scaled by 1 / 2.5.
  const auto [acc, rej] = LookaheadSchedule::carry_evidence({&a, &b}, 1.0);
  EXPECT_DOUBLE_EQ(acc, 0.8);
  EXPECT_DOUBLE_EQ(rej, 0.2);
  for (int i = 0; i < 40; ++i) a.update({1}, 0);  // a rejected draft for 40 iterations
  const auto e = LookaheadSchedule::carry_evidence({&a});
  EXPECT_DOUBLE_EQ(e.first + e.second, 4.0);
  LookaheadSchedule next(with("goodput", 0));
  next.set_evidence(e);
  EXPECT_LT(next.acceptance(), 0.2);  // a useless draft: the next request starts near 1 / (4 + 2)
  const auto again = LookaheadSchedule::carry_evidence({&next});  // already within the weight: kept
  EXPECT_NEAR(again.first, e.first, 1e-12);
  EXPECT_NEAR(again.second, e.second, 1e-12);
  LookaheadSchedule fresh(with("goodput", 0));
  EXPECT_EQ(LookaheadSchedule::carry_evidence({&fresh}), std::make_pair(0.0, 0.0));
}

// Under prompt lookup, prompt_lookup_num_tokens is the lookahead: goodput's cap, and its start
// value when below 5.
TEST(Lookahead, PromptLookupTokensAreGoodputsCap) {
  for (const auto& [lookup, cap, start] : {std::tuple{7, 7, 5}, std::tuple{3, 3, 3}}) {
    GenerationConfig c = with("goodput", 9);
    c.prompt_lookup_num_tokens = lookup;
    const LookaheadSchedule s(c);
    EXPECT_EQ(s.cap(), cap);
    EXPECT_EQ(s.num_tokens(), start);
  }
}

// A request never proposes more than its own tokens: the cap stops at max_new_tokens, so that the
// cost of planning follows what a request can use, not the number it was given.
TEST(Lookahead, TheCapIsNoMoreThanTheRequestsTokens) {
  GenerationConfig c = with("goodput", GenerationConfig::kMaxLookahead);
  c.max_new_tokens = 6;
  EXPECT_EQ(LookaheadSchedule(c).cap(), 6);
  c.max_new_tokens = 1000;
  EXPECT_EQ(LookaheadSchedule(c).cap(), GenerationConfig::kMaxLookahead);
  c.num_assistant_tokens = GenerationConfig::kMaxLookahead + 1;
  EXPECT_THROW(c.validate(), Error);
  c.num_assistant_tokens = 0;
  c.prompt_lookup_num_tokens = GenerationConfig::kMaxLookahead + 1;
  EXPECT_THROW(c.validate(), Error);
}

TEST(Lookahead, PassCostInterpolatesAndExtrapolates) {
  PassCost c;
  EXPECT_EQ(c(3), 0.0);
  EXPECT_EQ(c.largest(), 0);
  c.observe(1, 1.0);
  EXPECT_EQ(c(5), 1.0);  // one point: flat
  c.observe(4, 1.6);
  EXPECT_EQ(c.largest(), 4);
  EXPECT_DOUBLE_EQ(c(2), 1.2);
  EXPECT_DOUBLE_EQ(c(8), 2.4);  // slope 0.2 per row beyond the last point
  // Beyond the last point the slope is the mean one from the first point, never below 0: with
  // (1, 1.0), (4, 1.6), (6, 1.5) the last segment falls (-0.05 a row) but the mean slope is
  // 0.5 / 5 = 0.1 a row: 1.5 + 4 x 0.1 at 10 rows.
  c.observe(6, 1.5);
  EXPECT_DOUBLE_EQ(c(10), 1.9);
  PassCost falling;
  falling.observe(2, 1.0);
  falling.observe(4, 0.8);
  EXPECT_DOUBLE_EQ(falling(9), 0.8);  // flat, not falling
}

// Each row count's least time, times a speed that repeated observations move a fifth of the way
// to their ratio over their row count's least (worked out by hand).
TEST(Lookahead, PassCostFollowsTheMachineAtEveryRowCount) {
  PassCost c;
  c.observe(2, 1.0);
  c.observe(3, 1.2);
  c.observe(2, 2.0);  // speed 1 + 0.2 x (2.0 / 1.0 - 1) = 1.2, the least stays 1.0
  EXPECT_DOUBLE_EQ(c(2), 1.2);
  EXPECT_DOUBLE_EQ(c(3), 1.44);                   // 1.2 x 1.2: the 3-row pass, timed once, follows
  EXPECT_DOUBLE_EQ(c(1), 1.2);                    // below every row count: the smallest one's
  for (int i = 0; i < 9; ++i) c.observe(2, 2.0);  // the machine stays twice as slow
  // speed 2 - 0.8^10 after ten observations: every row count keeps its ratio to the others (an
  // average per row count would put the 2-row pass at 1.89 and the 3-row one at 1.2, cheaper)
  const double speed = 2.0 - std::pow(0.8, 10);
  EXPECT_DOUBLE_EQ(c(2), speed);
  EXPECT_DOUBLE_EQ(c(3), 1.2 * speed);
  // A row count first timed now, at this speed: 4.0 s there is 4.0 / speed at speed 1, so the
  // curve gives it 4.0 now, not speed x 4.0.
  c.observe(5, 4.0);
  EXPECT_DOUBLE_EQ(c(5), 4.0);
  c.observe(2, 0.5);  // a faster pass: the least drops to 0.5, the speed moves towards 1
  const double quieter = speed + 0.2 * (1.0 - speed);
  EXPECT_DOUBLE_EQ(c(2), 0.5 * quieter);
  EXPECT_DOUBLE_EQ(c(5), 4.0 / speed * quieter);
  // A row count first timed during a burst of noise: its next, quieter pass sets it.
  PassCost burst;
  burst.observe(3, 3.0);
  burst.observe(3, 1.0);
  EXPECT_DOUBLE_EQ(burst(3), 1.0);
}

// Which K goodput tries next to time its pass (worked out by hand).
TEST(Lookahead, PassCostFirstUnobserved) {
  PassCost c;
  EXPECT_EQ(c.first_unobserved(1, 3), 1);  // nothing observed: K = 1, a pass over 2 rows
  c.observe(1, 1.0);
  c.observe(2, 1.1);
  c.observe(4, 1.3);
  EXPECT_EQ(c.first_unobserved(1, 3), 2);  // 3 rows missing
  c.observe(3, 1.4);
  EXPECT_EQ(c.first_unobserved(1, 3), 0);  // 2, 3 and 4 rows observed
  EXPECT_EQ(c.first_unobserved(1, 4), 4);  // 5 rows missing
  EXPECT_EQ(c.first_unobserved(2, 3), 2);  // a batch of 2: 4 rows observed, 6 missing
}

// Which K goodput drafts to time a pass it could plan (worked out by hand). A flat cost of 1 s a
// pass, 0.12 s a drafted token, cap 12 (passes up to 7 tokens timed at most):
// - acceptance bound 0.55: K = 1, 2, 3 give 1.55 / 1.12 = 1.384, 1.8525 / 1.24 = 1.494 and
//   2.0189 / 1.36 = 1.484 tokens/s, so only K = 1 and 2 could be planned and only their passes
//   are timed;
// - bound 0.9: every K up to 6 could (the cap / 2 + 1 = 7-token pass).
TEST(Lookahead, GoodputTimesOnlyThePassesItCouldPlan) {
  PassCost c;
  c.observe(1, 1.0);
  EXPECT_EQ(LookaheadSchedule::exploration(c, 1.0, 0.12, {0.55}, 12), 1);
  c.observe(2, 1.1);
  EXPECT_EQ(LookaheadSchedule::exploration(c, 1.0, 0.12, {0.55}, 12), 2);
  c.observe(3, 1.3);
  EXPECT_EQ(LookaheadSchedule::exploration(c, 1.0, 0.12, {0.55}, 12), 0);
  EXPECT_EQ(LookaheadSchedule::exploration(c, 1.0, 0.12, {0.9}, 12), 3);
  for (int64_t rows = 4; rows <= 7; ++rows) c.observe(rows, 1.0 + 0.1 * static_cast<double>(rows));
  EXPECT_EQ(LookaheadSchedule::exploration(c, 1.0, 0.12, {0.9}, 12), 0);
  // Two rows: passes of 4, 6 and 8 tokens (K = 1, 2, 3: 8 >= 7); 4 and 6 are observed.
  EXPECT_EQ(LookaheadSchedule::exploration(c, 1.0, 0.12, {0.9, 0.9}, 12), 3);
  // Nothing timed yet at the flat cost (0): reach by the pass length alone.
  EXPECT_EQ(LookaheadSchedule::exploration(PassCost(), 0.0, 0.12, {0.1}, 12), 1);
}

// The ceiling on a pass's cost that lets goodput skip its costly calibration: the least observed
// for as many rows or more, or rows times the least observed at all (worked out by hand).
TEST(Lookahead, PassCostCeiling) {
  PassCost c;
  EXPECT_EQ(c.ceiling(4), 0.0);
  c.observe(10, 3.0);
  EXPECT_DOUBLE_EQ(c.ceiling(4), 3.0);    // a 10-row pass: no cheaper than a 4-row one
  EXPECT_DOUBLE_EQ(c.ceiling(12), 36.0);  // 12 x 3.0: nothing observed at 12 rows or more
  c.observe(1, 1.0);
  c.observe(16, 5.0);
  EXPECT_DOUBLE_EQ(c.ceiling(2), 2.0);   // 2 x 1.0 beats the 10-row pass
  EXPECT_DOUBLE_EQ(c.ceiling(4), 3.0);   // the 10-row pass beats 4 x 1.0
  EXPECT_DOUBLE_EQ(c.ceiling(12), 5.0);  // the 16-row pass
  EXPECT_DOUBLE_EQ(c.ceiling(20), 20.0);
}

// Why goodput may set K = 0 from that ceiling alone: if drafting loses at a flat cost U that is at
// least a 1-row pass's, it loses at the real, rising cost too. Draft 0.3 s a token, acceptance
// 0.5: at a flat 0.5 s, K = 1 gives 1.5 tokens in 0.8 s (1.875/s) against 2/s for K = 0; at the
// real costs (0.4 s for 1 row, rising) it loses by more.
TEST(Lookahead, NoDraftingAtAFlatCeilingMeansNoDraftingAtTheRealCost) {
  const auto flat = [](int64_t) { return 0.5; };
  EXPECT_EQ(LookaheadSchedule::best_lookahead(flat, 0.3, 0.5, 8), 0);
  const auto real = [](int64_t rows) { return 0.4 + 0.05 * static_cast<double>(rows - 1); };
  EXPECT_EQ(LookaheadSchedule::best_lookahead(real, 0.3, 0.5, 8), 0);
  // A cheaper draft pays at the flat cost (then goodput calibrates before it decides).
  EXPECT_GT(LookaheadSchedule::best_lookahead(flat, 0.05, 0.5, 8), 0);
}

}  // namespace
}  // namespace specdec
