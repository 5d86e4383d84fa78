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

}  // namespace
}  // namespace specdec
