// Logits processors on hand-built logits against hand-computed expectations.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "specdec/error.hpp"
#include "specdec/sampling.hpp"

namespace specdec {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

at::Tensor row(std::vector<float> v) { return at::tensor(v).view({1, -1}); }
std::vector<float> vec(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().view(-1);
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}
at::Tensor log_probs(std::vector<float> p) { return row(p).log(); }

TEST(Processors, Temperature) {
  EXPECT_EQ(vec(make_temperature(0.5)->apply(row({1, 2, 3}), {})), (std::vector<float>{2, 4, 6}));
  EXPECT_THROW(make_temperature(0), Error);
}

TEST(Processors, TopKKeepsTiesAndClampsToVocab) {
  EXPECT_EQ(vec(make_top_k(2)->apply(row({1, 3, 2, 3}), {})),
            (std::vector<float>{-kInf, 3, -kInf, 3}));
  // Tie at the k-th value: both 2s reach it and are kept.
  EXPECT_EQ(vec(make_top_k(2)->apply(row({1, 2, 2, 3}), {})), (std::vector<float>{-kInf, 2, 2, 3}));
  EXPECT_EQ(vec(make_top_k(10)->apply(row({1, 2, 3}), {})), (std::vector<float>{1, 2, 3}));
}

TEST(Processors, TopPBoundaryAndMinimumOneToken) {
  const at::Tensor s = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  // Ascending cumulative mass: 0.05, 0.20, 0.50, 1.0. Removed: cumulative <= 1 - top_p.
  auto kept = [&](double p) {
    std::vector<int> k;
    const auto v = vec(make_top_p(p)->apply(s, {}));
    for (size_t i = 0; i < v.size(); ++i)
      if (std::isfinite(v[i])) k.push_back(static_cast<int>(i));
    return k;
  };
  EXPECT_EQ(kept(0.9), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(kept(0.6), (std::vector<int>{0, 1}));
  EXPECT_EQ(kept(0.45), (std::vector<int>{0}));
  EXPECT_EQ(kept(0.01), (std::vector<int>{0}));  // the most likely token always survives
  EXPECT_EQ(kept(0.0), (std::vector<int>{0}));   // (OpenAI and Hugging Face take 0)
  EXPECT_EQ(kept(1.0), (std::vector<int>{0, 1, 2, 3}));
}

// On a 262,144-token vocabulary, against a slow oracle: two rows of Zipf distributions over
// shuffled ids (p ~ rank^-1.2, and rank^-2 with its 1000 least likely tokens at -inf, as an earlier
// top-k leaves them), the mass above each rank computed in double. top_p is set halfway between
// row 0's masses above ranks n and n + 1, so exactly its n + 1 most likely tokens survive, and
// row 1 keeps the ranks whose mass above is below top_p (far fewer: the rows need different
// numbers of ranked tokens). n = 700 is past the first two ranked blocks, so the ranked count has
// to grow twice.
TEST(Processors, TopPOnALargeVocabularyKeepsExactlyTheRankedPrefix) {
  const int64_t v = 262144, masked = 1000;
  const at::Tensor ranks = at::arange(v, at::kDouble) + 1;
  const at::Tensor w0 = ranks.pow(-1.2), w1 = ranks.pow(-2.0).narrow(0, 0, v - masked);
  auto above = [](const at::Tensor& w) { return (w / w.sum()).cumsum(0) - w / w.sum(); };
  const at::Tensor above0 = above(w0), above1 = above(w1);  // by rank
  at::manual_seed(7);
  const at::Tensor perm0 = at::randperm(v), perm1 = at::randperm(v);  // rank -> token id
  at::Tensor s = at::empty({2, v});
  s[0].index_put_({perm0}, w0.log().to(at::kFloat));
  s[1].index_put_({perm1},
                  at::cat({w1.log(), at::full({masked}, -INFINITY, at::kDouble)}).to(at::kFloat));
  for (int64_t n : {0, 3, 40, 700}) {
    const double p = 0.5 * (above0[n].item<double>() + above0[n + 1].item<double>());
    const int64_t n1 = (above1 < p).sum().item<int64_t>();
    ASSERT_GT(((above1 - p).abs().min()).item<double>(), 1e-5) << "row 1 too near the boundary";
    const at::Tensor kept = make_top_p(p)->apply(s, {}).isfinite();  // [2, V]
    for (int r = 0; r < 2; ++r) {
      const int64_t want = r == 0 ? n + 1 : n1;
      const at::Tensor by_rank = kept[r].index_select(0, r == 0 ? perm0 : perm1);
      EXPECT_TRUE(by_rank.narrow(0, 0, want).all().item<bool>()) << "n " << n << " row " << r;
      EXPECT_EQ(by_rank.sum().item<int64_t>(), want) << "n " << n << " row " << r;
    }
    if (n == 700) EXPECT_LT(n1, 100);
  }
}

TEST(Processors, MinP) {
  const at::Tensor s = log_probs({0.5f, 0.3f, 0.15f, 0.05f});
  const auto v = vec(make_min_p(0.5)->apply(s, {}));  // keep p >= 0.25
  EXPECT_TRUE(std::isfinite(v[0]) && std::isfinite(v[1]));
  EXPECT_FALSE(std::isfinite(v[2]) || std::isfinite(v[3]));
}

TEST(Processors, RepetitionPenaltyUsesEachRowsOwnPrefix) {
  EXPECT_EQ(vec(make_repetition_penalty(2.0)->apply(row({1, -1, 2, 0.5}), {0, 1, 1})),
            (std::vector<float>{0.5, -2, 2, 0.5}));
  // Two rows, history {3, 2}: row 0 sees [3], row 1 sees [3, 2].
  const at::Tensor two = at::tensor({4.f, 4.f, 4.f, 4.f, 4.f, 4.f, 4.f, 4.f}).view({2, 4});
  EXPECT_EQ(vec(make_repetition_penalty(2.0)->apply(two, {3, 2})),
            (std::vector<float>{4, 4, 4, 2, 4, 4, 2, 2}));
}

// OpenAI's frequency and presence penalties count the generated tokens only (history from
// prompt_length), each row its own prefix: logit - 0.5 x count - 0.25 x (count > 0).
TEST(Processors, OccurrencePenaltyCountsGeneratedTokensOnly) {
  // Prompt [1, 1] (not counted), generated [2, 2, 0]; row 0 sees [2, 2], row 1 also the 0.
  const at::Tensor two = at::zeros({2, 4});
  EXPECT_EQ(vec(make_occurrence_penalty(0.5, 0.25, 2)->apply(two, {1, 1, 2, 2, 0})),
            (std::vector<float>{0, 0, -1.25, 0, -0.75, 0, -1.25, 0}));
  // Negative penalties reward repetition; a prompt longer than the history counts nothing.
  EXPECT_EQ(vec(make_occurrence_penalty(-1, 0, 0)->apply(row({1, 1, 1}), {2, 2})),
            (std::vector<float>{1, 1, 3}));
  EXPECT_EQ(vec(make_occurrence_penalty(1, 1, 9)->apply(row({1, 1, 1}), {2, 2})),
            (std::vector<float>{1, 1, 1}));
  GenerationConfig c;
  c.presence_penalty = 0.5;
  EXPECT_TRUE(LogitsProcessorChain(c).reads_history());  // greedy too
  c.presence_penalty = 2.5;
  EXPECT_THROW(c.validate(), Error);
}

// OpenAI's logit_bias adds each token's bias in every row; the chain applies it before the
// repetition penalty, as Hugging Face its sequence_bias: a seen token of logit 2, bias +1, penalty
// 2 gives (2 + 1) / 2 = 1.5 (the other order would give 2 / 2 + 1 = 2).
TEST(Processors, LogitBiasComesFirst) {
  EXPECT_EQ(vec(make_logit_bias({{2, 100}, {0, -1.5}})->apply(at::zeros({2, 3}), {})),
            (std::vector<float>{-1.5, 0, 100, -1.5, 0, 100}));
  EXPECT_THROW(make_logit_bias({{3, 1}})->apply(at::zeros({1, 3}), {}), Error);  // not a token
  GenerationConfig c;
  c.logit_bias = {{1, 1.0}};
  c.repetition_penalty = 2;
  EXPECT_EQ(vec(LogitsProcessorChain(c).apply(row({2, 2, 2}), {1})),
            (std::vector<float>{2, 1.5, 2}));
  c.repetition_penalty = 1;
  EXPECT_FALSE(LogitsProcessorChain(c).empty());  // greedy too
  EXPECT_NO_THROW(c.validate());
  for (const std::vector<std::pair<int64_t, double>>& bad :
       {std::vector<std::pair<int64_t, double>>{{-1, 1}}, {{1, 100.5}}, {{1, 1}, {1, 2}}}) {
    c.logit_bias = bad;
    EXPECT_THROW(c.validate(), Error);
  }
  // Every token of Gemma 3's vocabulary (a server request may send them all), then one again.
  c.logit_bias.clear();
  for (int64_t id = 0; id < 262144; ++id) c.logit_bias.emplace_back(id, 0.5);
  EXPECT_NO_THROW(c.validate());
  c.logit_bias.emplace_back(7, 1.0);
  EXPECT_THROW(c.validate(), Error);
}

TEST(Processors, ChainFollowsConfigAndHuggingFaceOrder) {
  GenerationConfig c;
  EXPECT_TRUE(LogitsProcessorChain(c).empty());  // greedy, no penalty
  c.do_sample = true;
  c.top_k = 0;
  EXPECT_TRUE(LogitsProcessorChain(c).empty());  // T = 1, no filters
  c.temperature = 0.5;
  c.top_k = 1;
  // temperature then top-k: [2, 4, 6] -> only the best survives.
  EXPECT_EQ(vec(LogitsProcessorChain(c).apply(row({1, 2, 3}), {})),
            (std::vector<float>{-kInf, -kInf, 6}));
  EXPECT_FALSE(LogitsProcessorChain(c).reads_history());  // the callers copy no sequence for it
  c.repetition_penalty = 1.2;
  EXPECT_TRUE(LogitsProcessorChain(c).reads_history());
  c.repetition_penalty = 1.0;
  c.temperature = 0;  // temperature 0 means greedy: no warpers
  c.top_k = 1;
  EXPECT_TRUE(LogitsProcessorChain(c).empty());
}

TEST(Sampling, InverseCdfNeverDrawsZeroProbability) {
  const at::Tensor p = at::tensor({0.f, 0.5f, 0.f, 0.5f});
  EXPECT_EQ(sample_index(p, 0.0), 1);
  EXPECT_EQ(sample_index(p, 0.49), 1);
  EXPECT_EQ(sample_index(p, 0.5), 3);
  EXPECT_EQ(sample_index(p, 0.999999), 3);
  EXPECT_EQ(sample_index(at::tensor({0.f, 0.f, 2.f}), 0.7), 2);  // unnormalised is fine
}

// By hand: prompt of 2, then 1 new token and the 2 rows' tokens; min 3 bans the EOS ids (2 and 4)
// in rows 0 and 1 (1 and 2 new tokens before them), not in row 2 (3 before it).
TEST(Sampling, MinNewTokensBansTheEosIdsBeforeThen) {
  const auto p = make_min_new_tokens(3, {2, 4, -1, 99}, 2);
  const at::Tensor out = p->apply(at::zeros({3, 5}), {7, 7, 7, 7, 7});
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor want = at::tensor({0.f, 0.f, -inf, 0.f, -inf,  //
                                      0.f, 0.f, -inf, 0.f, -inf,  //
                                      0.f, 0.f, 0.f, 0.f, 0.f})
                              .view({3, 5});
  EXPECT_TRUE(at::equal(out, want)) << out;
  EXPECT_TRUE(at::equal(p->apply(at::zeros({1, 5}), {7, 7, 7, 7, 7}), at::zeros({1, 5})));
  GenerationConfig c;
  c.min_new_tokens = -1;
  EXPECT_THROW(c.validate(), Error);
}

// Bad input is a specdec::Error, never an index of probability 0 or a libtorch error.
TEST(Sampling, BadInputIsRefused) {
  EXPECT_THROW(sample_index(at::zeros({4}), 0.5), Error);
  EXPECT_THROW(sample_index(at::full({4}, NAN), 0.5), Error);
  EXPECT_THROW(sample_index(at::ones({4}), 1.0), Error);
  EXPECT_THROW(sample_index(at::ones({4}), -1.0), Error);
  EXPECT_THROW(sample_index(at::ones({2, 4}), 0.5), Error);
  GenerationConfig c;
  c.do_sample = true;
  c.top_p = 5;
  EXPECT_THROW(LogitsProcessorChain{c}, Error);  // as generate() refuses it
}

TEST(Sampling, RngIsTheStandardMt19937_64) {
  Rng a(42), b(42), c(43);
  std::mt19937_64 ref(42);
  for (int i = 0; i < 1000; ++i) {
    const double u = a.uniform();
    EXPECT_EQ(u, static_cast<double>(ref() >> 11) * 0x1.0p-53);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, b.uniform());
  }
  EXPECT_NE(Rng(42).uniform(), c.uniform());
}

}  // namespace
}  // namespace specdec
