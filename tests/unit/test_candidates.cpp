// Prompt lookup on crafted token sequences; expected proposals worked out by hand from Hugging
// Face's PromptLookupCandidateGenerator.get_candidates (transformers 4.47).
#include <gtest/gtest.h>

#include "specdec/candidates.hpp"

namespace specdec {
namespace {

std::vector<int64_t> lookup(const std::vector<int64_t>& tokens, int64_t n, int64_t k = 10,
                            int64_t max_tokens = 100, std::vector<int64_t> eos = {99},
                            bool last = false) {
  return PromptLookupGenerator(k, n, eos, last).propose(tokens, max_tokens).tokens;
}

TEST(PromptLookup, TheLastMatchOption) {
  EXPECT_EQ(lookup({1, 2, 5, 1, 2, 6, 1, 2}, 2, 10, 100, {99}, true),
            (std::vector<int64_t>{6, 1, 2}));
  EXPECT_EQ(lookup({1, 2, 3, 99, 5, 1, 2}, 2, 10, 100, {99}, true), (std::vector<int64_t>{3}));
}

TEST(PromptLookup, ProposesTheContinuationOfTheLeftmostMatch) {
  EXPECT_EQ(lookup({1, 2, 3, 4, 1, 2}, 2), (std::vector<int64_t>{3, 4, 1, 2}));
  EXPECT_EQ(lookup({1, 2, 3, 4, 1, 2}, 2, 3), (std::vector<int64_t>{3, 4, 1}));
  // [1, 2] occurs at 0 and 3: the first occurrence wins (not the most recent, which gives 6, 1, 2).
  EXPECT_EQ(lookup({1, 2, 5, 1, 2, 6, 1, 2}, 2), (std::vector<int64_t>{5, 1, 2, 6, 1, 2}));
  EXPECT_EQ(lookup({1, 2, 3, 4, 1, 2}, 2, 10, 2), (std::vector<int64_t>{3, 4}));  // length clamp
}

TEST(PromptLookup, FallsBackToShorterNgramsAndProposesNothingWithoutMatch) {
  EXPECT_EQ(lookup({7, 8, 9, 8}, 2), (std::vector<int64_t>{9, 8}));  // [9,8] unseen, [8] seen
  EXPECT_TRUE(lookup({1, 2, 3}, 2).empty());
  EXPECT_TRUE(lookup({5}, 2).empty());
  EXPECT_EQ(lookup({4, 5, 6, 4, 5}, 3), (std::vector<int64_t>{6, 4, 5}));  // n capped by length
}

TEST(PromptLookup, CutsTheProposalBeforeEos) {
  EXPECT_EQ(lookup({1, 2, 3, 99, 5, 1, 2}, 2, 10, 100, {99}), (std::vector<int64_t>{3}));
  // EOS right after the leftmost match: no proposal at all (later matches are not tried).
  EXPECT_TRUE(lookup({1, 2, 99, 1, 2, 7, 1, 2}, 2, 10, 100, {99}).empty());
}

// Each candidate's estimate, worked by hand from the rule in PromptLookupGenerator's comment:
// hits / N * (x - 0.8) / (x + 0.2), N the places where its context occurs followed by a token,
// hits those followed by the candidate, x the match's span plus the candidate's depth.
TEST(PromptLookup, EstimatesEachCandidateFromTheSequencesOwnCounts) {
  const auto probs = [](const std::vector<int64_t>& tokens, int64_t n, int64_t k = 10) {
    return PromptLookupGenerator(k, n, {99}).propose(tokens, 100).probs;
  };
  // How often a copy of a match spanning x tokens goes on: (x - 0.8) / (x + 0.2).
  const auto goes_on = [](double x) { return (x - 0.8) / (x + 0.2); };
  // [1, 2] is followed by 3 at 1 and by 4 at 5; the leftmost copy is 3, 9, 1, 2, 4, 7, 1, 2 and
  // the match spans 2 tokens (5 before it, 7 before the tail). Depth 0: 1 of 2 places; from depth
  // 1 on only the place at 1 continues as the copy, and the match spans 2 + d.
  const std::vector<int64_t> seq = {5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2};
  const std::vector<double> p = probs(seq, 2);
  ASSERT_EQ(p.size(), 8u);
  EXPECT_DOUBLE_EQ(p[0], 0.5 * goes_on(2));
  for (size_t d = 1; d < p.size(); ++d)
    EXPECT_DOUBLE_EQ(p[d], goes_on(static_cast<double>(2 + d))) << d;
  // A common token: 1 is followed by 10, 11 and 12; the copy of its leftmost place, a 1-token
  // match, gets 1 / 3 of goes_on(1).
  EXPECT_DOUBLE_EQ(probs({1, 10, 1, 11, 1, 12, 1}, 2)[0], goes_on(1) / 3);
  // A match that spans more than the n-gram: 6, 7 before both places of [1, 2] make it span 4.
  EXPECT_DOUBLE_EQ(probs({6, 7, 1, 2, 3, 8, 6, 7, 1, 2}, 2)[0], goes_on(4));
  // A place whose continuation is the first candidate itself counts: in 3, 3, 3, 3 the copy of
  // [3, 3] at 0 is 3, 3; [3, 3] at 0 and 1 is followed by 3 (2 of 2), and [3, 3, 3] at 1 by the
  // first candidate, also a 3 (2 of 2).
  const std::vector<double> q = probs({3, 3, 3, 3}, 2);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_DOUBLE_EQ(q[0], goes_on(2));
  EXPECT_DOUBLE_EQ(q[1], goes_on(3));
}

}  // namespace
}  // namespace specdec
