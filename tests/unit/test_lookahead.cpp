// Lookahead schedules as pure logic.
#include <gtest/gtest.h>

#include <cmath>

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
  s.update({.5, .5}, 1);      // not all: -1
  EXPECT_EQ(s.num_tokens(), 4);
  for (int i = 0; i < 10; ++i) s.update({.5}, 0);
  EXPECT_EQ(s.num_tokens(), 1);  // floor
  s.update({}, 0);               // nothing could be drafted: counts as all accepted (HF)
  EXPECT_EQ(s.num_tokens(), 3);
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
  EXPECT_DOUBLE_EQ(LookaheadSchedule::fit_threshold({.9, .8, .7, .6, .5, .4}, std::vector<bool>(6, true), 0.4), 0.4);
  // Perfect separation: the lowest accepted probability.
  EXPECT_DOUBLE_EQ(LookaheadSchedule::fit_threshold({.9, .8, .7, .3, .2, .1},
                                                    {true, true, true, false, false, false}, 0.4),
                   0.7);
}

TEST(Lookahead, AdaptiveUpdateKeepsOnlyJudgedDrafts) {
  GenerationConfig c = with("dynamic", 8);
  LookaheadSchedule s(c);
  // Each iteration: drafts after the first rejection were never judged and are dropped.
  s.update({0.9, 0.8, 0.05, 0.05}, 2);  // keeps (.9,1) (.8,1) (.05,0)
  s.update({0.7, 0.3, 0.01}, 1);        // keeps (.7,1) (.3,0)
  EXPECT_DOUBLE_EQ(s.threshold(), 0.4);  // 5 samples: not enough yet
  s.update({0.6}, 1);                   // (.6,1): 6 samples
  // Samples: .9+ .8+ .7+ .6+ / .3- .05-: perfect split at 0.6.
  EXPECT_DOUBLE_EQ(s.threshold(), 0.6);
  GenerationConfig fixed = c;
  fixed.adaptive_threshold = false;
  LookaheadSchedule f(fixed);
  for (int i = 0; i < 5; ++i) f.update({0.9, 0.1}, 1);
  EXPECT_DOUBLE_EQ(f.threshold(), 0.4);
}

}  // namespace
}  // namespace specdec
