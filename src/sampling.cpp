#include "specdec/sampling.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "device.hpp"
#include "specdec/error.hpp"

namespace specdec {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class RepetitionPenalty final : public LogitsProcessor {
 public:
  explicit RepetitionPenalty(double penalty) : penalty_(penalty) {}
  bool reads_history() const override { return true; }
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>& history) const override {
    const int64_t rows = scores.size(0), vocab = scores.size(1);
    const int64_t base = static_cast<int64_t>(history.size()) - (rows - 1);
    SPECDEC_CHECK(base >= 0, "repetition penalty: history shorter than the rows");
    // Only the tokens seen are touched: row 0's distinct history, then each row adds one token.
    std::vector<int64_t> seen;
    std::vector<bool> in(static_cast<size_t>(vocab), false);
    const auto add = [&](int64_t tok) {
      if (tok >= 0 && tok < vocab && !in[tok]) in[tok] = true, seen.push_back(tok);
    };
    for (int64_t i = 0; i < base; ++i) add(history[i]);
    at::Tensor out = scores.clone();  // [R, V]
    for (int64_t r = 0; r < rows; ++r) {
      if (r > 0) add(history[base + r - 1]);
      if (seen.empty()) continue;
      const at::Tensor idx =
          detail::to_device(at::tensor(seen, at::kLong), scores.device());  // [S]
      const at::Tensor v = out[r].index_select(0, idx);                     // [S]
      out[r].index_copy_(0, idx, at::where(v < 0, v * penalty_, v / penalty_));
    }
    return out;
  }

 private:
  double penalty_;
};

class LogitBias final : public LogitsProcessor {
 public:
  // The ids and biases as tensors once, on the CPU (moved per call where the scores are elsewhere).
  explicit LogitBias(const std::vector<std::pair<int64_t, double>>& bias) {
    std::vector<int64_t> ids;
    std::vector<float> values;
    for (const auto& [id, b] : bias) {
      ids.push_back(id);
      values.push_back(static_cast<float>(b));
      largest_ = std::max(largest_, id);
    }
    ids_ = at::tensor(ids, at::kLong);
    values_ = at::tensor(values, at::kFloat);
  }
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>&) const override {
    const int64_t vocab = scores.size(-1);
    SPECDEC_CHECK(largest_ < vocab, "logit_bias: token id ", largest_,
                  " is not in the vocabulary of ", vocab, " tokens");
    const at::Tensor add = detail::to_device(values_, scores.device())
                               .to(scores.scalar_type())
                               .expand({scores.size(0), values_.size(0)});
    return scores.index_add(-1, detail::to_device(ids_, scores.device()), add);
  }

 private:
  at::Tensor ids_, values_;  // [N]
  int64_t largest_ = -1;
};

class MinNewTokens final : public LogitsProcessor {
 public:
  MinNewTokens(int64_t min_new_tokens, std::vector<int64_t> eos, int64_t prompt_length)
      : min_(min_new_tokens), eos_(std::move(eos)), prompt_length_(prompt_length) {}
  bool reads_history() const override { return true; }  // (its length)
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>& history) const override {
    const int64_t rows = scores.size(0), vocab = scores.size(1);
    const int64_t end = static_cast<int64_t>(history.size()) - (rows - 1);  // row 0's history
    // Row r follows end + r - prompt_length new tokens: rows [0, banned) have fewer than min.
    const int64_t banned = std::clamp<int64_t>(prompt_length_ + min_ - end, 0, rows);
    if (banned == 0) return scores;
    at::Tensor out = scores.clone();
    for (const int64_t id : eos_)
      if (id >= 0 && id < vocab)
        out.narrow(0, 0, banned).select(1, id).fill_(-std::numeric_limits<float>::infinity());
    return out;
  }

 private:
  int64_t min_;
  std::vector<int64_t> eos_;
  int64_t prompt_length_;
};

class OccurrencePenalty final : public LogitsProcessor {
 public:
  OccurrencePenalty(double frequency, double presence, int64_t prompt_length)
      : frequency_(frequency), presence_(presence), prompt_length_(prompt_length) {}
  bool reads_history() const override { return true; }
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>& history) const override {
    const int64_t rows = scores.size(0), vocab = scores.size(1);
    const int64_t end = static_cast<int64_t>(history.size()) - (rows - 1);  // row 0's history
    SPECDEC_CHECK(end >= 0, "frequency/presence penalty: history shorter than the rows");
    // Only the tokens that occurred are touched: the penalty is sparse, the rows share row 0's.
    std::vector<std::pair<int64_t, int64_t>> counts;  // (token, count), in order of appearance
    const auto add = [&](int64_t tok) {
      if (tok < 0 || tok >= vocab) return;
      for (auto& c : counts)
        if (c.first == tok) return void(++c.second);
      counts.emplace_back(tok, 1);
    };
    for (int64_t i = std::min(prompt_length_, end); i < end; ++i) add(history[i]);
    at::Tensor penalty = at::zeros({rows, vocab}, at::kFloat);  // [R, V] on CPU
    auto acc = penalty.accessor<float, 2>();
    for (int64_t r = 0; r < rows; ++r) {
      if (r > 0 && end + r - 1 >= prompt_length_) add(history[end + r - 1]);
      for (const auto& [tok, n] : counts)
        acc[r][tok] = static_cast<float>(frequency_ * static_cast<double>(n) + presence_);
    }
    return scores - detail::to_device(penalty, scores.device()).to(scores.scalar_type());
  }

 private:
  double frequency_, presence_;
  int64_t prompt_length_;
};

class Temperature final : public LogitsProcessor {
 public:
  explicit Temperature(double t) : t_(t) {}
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>&) const override {
    return scores / t_;
  }

 private:
  double t_;
};

class TopK final : public LogitsProcessor {
 public:
  explicit TopK(int64_t k) : k_(k) {}
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>&) const override {
    const int64_t k = std::min<int64_t>(std::max<int64_t>(k_, 1), scores.size(-1));
    // Keep every token whose score reaches the k-th largest (ties at the boundary are kept).
    const at::Tensor kth = std::get<0>(at::topk(scores, k, -1)).narrow(-1, k - 1, 1);  // [R, 1]
    return scores.masked_fill(scores < kth, kNegInf);
  }

 private:
  int64_t k_;
};

class TopP final : public LogitsProcessor {
 public:
  explicit TopP(double p) : p_(p) {}
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>&) const override {
    // Hugging Face sorts ascending and drops the tokens whose cumulative probability is
    // <= 1 - top_p, always keeping the most likely one. Equivalently, a token is kept when the
    // mass of the tokens above it is < top_p: only the most likely tokens up to that mass need
    // ranking, so the top k are ranked with k growing until they hold top_p (no sort of a
    // 262k-token vocabulary).
    const at::Tensor probs = scores.softmax(-1);  // [R, V]
    const int64_t v = scores.size(-1);
    at::Tensor vals, idx, cum;
    for (int64_t k = std::min<int64_t>(64, v);; k = std::min(v, 8 * k)) {
      std::tie(vals, idx) = at::topk(probs, k, -1);  // [R, k], descending
      cum = vals.cumsum(-1);
      if (k == v || (cum.select(-1, k - 1) >= p_).all().item<bool>()) break;
    }
    at::Tensor keep = (cum - vals) < p_;  // the mass above each ranked token
    keep.select(-1, 0).fill_(true);
    const at::Tensor remove = at::ones_like(scores, scores.options().dtype(at::kBool));
    return scores.masked_fill(remove.scatter(-1, idx, keep.logical_not()), kNegInf);
  }

 private:
  double p_;
};

class MinP final : public LogitsProcessor {
 public:
  explicit MinP(double p) : p_(p) {}
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>&) const override {
    const at::Tensor probs = scores.softmax(-1);                          // [R, V]
    const at::Tensor top = std::get<0>(probs.max(-1, /*keepdim=*/true));  // [R, 1]
    at::Tensor remove = probs < (top * p_);
    // Never remove the most likely token (Hugging Face keeps min_tokens_to_keep = 1).
    const at::Tensor best = probs.argmax(-1, /*keepdim=*/true);
    remove = remove.scatter(-1, best, false);
    return scores.masked_fill(remove, kNegInf);
  }

 private:
  double p_;
};

}  // namespace

std::unique_ptr<LogitsProcessor> make_min_new_tokens(int64_t min_new_tokens,
                                                     std::vector<int64_t> eos,
                                                     int64_t prompt_length) {
  return std::make_unique<MinNewTokens>(min_new_tokens, std::move(eos), prompt_length);
}

std::unique_ptr<LogitsProcessor> make_repetition_penalty(double penalty) {
  SPECDEC_CHECK(penalty > 0, "repetition_penalty must be > 0, got ", penalty);
  return std::make_unique<RepetitionPenalty>(penalty);
}
std::unique_ptr<LogitsProcessor> make_logit_bias(std::vector<std::pair<int64_t, double>> bias) {
  for (const auto& [id, b] : bias)
    SPECDEC_CHECK(id >= 0, "logit_bias: token id ", id, " is negative");
  return std::make_unique<LogitBias>(bias);
}
std::unique_ptr<LogitsProcessor> make_occurrence_penalty(double frequency, double presence,
                                                         int64_t prompt_length) {
  SPECDEC_CHECK(prompt_length >= 0, "occurrence penalty: prompt_length must be >= 0");
  return std::make_unique<OccurrencePenalty>(frequency, presence, prompt_length);
}
std::unique_ptr<LogitsProcessor> make_temperature(double t) {
  SPECDEC_CHECK(t > 0, "temperature must be > 0 for the temperature processor, got ", t);
  return std::make_unique<Temperature>(t);
}
std::unique_ptr<LogitsProcessor> make_top_k(int64_t k) {
  SPECDEC_CHECK(k > 0, "top_k must be > 0, got ", k);
  return std::make_unique<TopK>(k);
}
std::unique_ptr<LogitsProcessor> make_top_p(double p) {
  SPECDEC_CHECK(p >= 0 && p <= 1, "top_p must be in [0, 1], got ", p);
  return std::make_unique<TopP>(p);
}
std::unique_ptr<LogitsProcessor> make_min_p(double p) {
  SPECDEC_CHECK(p >= 0 && p < 1, "min_p must be in [0, 1), got ", p);
  return std::make_unique<MinP>(p);
}

LogitsProcessorChain::LogitsProcessorChain(const GenerationConfig& c, int64_t prompt_length) {
  c.validate();
  if (!c.logit_bias.empty()) processors_.push_back(make_logit_bias(c.logit_bias));
  if (c.frequency_penalty != 0.0 || c.presence_penalty != 0.0)
    processors_.push_back(
        make_occurrence_penalty(c.frequency_penalty, c.presence_penalty, prompt_length));
  if (c.repetition_penalty != 1.0)
    processors_.push_back(make_repetition_penalty(c.repetition_penalty));
  if (c.min_new_tokens > 0)
    processors_.push_back(make_min_new_tokens(c.min_new_tokens, c.eos_token_ids, prompt_length));
  if (!c.sampling()) return;
  if (c.temperature != 1.0) processors_.push_back(make_temperature(c.temperature));
  if (c.top_k > 0) processors_.push_back(make_top_k(c.top_k));
  if (c.top_p < 1.0) processors_.push_back(make_top_p(c.top_p));
  if (c.min_p > 0.0) processors_.push_back(make_min_p(c.min_p));
}

bool LogitsProcessorChain::reads_history() const {
  return std::any_of(processors_.begin(), processors_.end(),
                     [](const auto& p) { return p->reads_history(); });
}

at::Tensor LogitsProcessorChain::apply(const at::Tensor& scores,
                                       const std::vector<int64_t>& history) const {
  at::Tensor s = scores;
  for (const auto& p : processors_) s = p->apply(s, history);
  return s;
}

at::Tensor LogitsProcessorChain::apply(const at::Tensor& scores,
                                       const std::vector<int64_t>& history,
                                       const std::vector<int64_t>& tokens,
                                       const std::vector<int64_t>& parents) const {
  if (!reads_history()) return apply(scores, {});
  std::vector<at::Tensor> rows{apply(scores.narrow(0, 0, 1), history)};
  for (size_t c = 0; c < tokens.size(); ++c) {
    std::vector<int64_t> path = history;
    const auto at = static_cast<std::ptrdiff_t>(path.size());
    for (auto n = static_cast<int64_t>(c); n >= 0; n = parents[static_cast<size_t>(n)])
      path.insert(path.begin() + at, tokens[static_cast<size_t>(n)]);
    rows.push_back(apply(scores.narrow(0, static_cast<int64_t>(c) + 1, 1), path));
  }
  return at::cat(rows);
}

namespace {
// Inverse-CDF draws along the last dimension of probs ([V], or [R, V] with u [R, 1]), u in [0, 1)
// a double or a double tensor on probs' device: [1], or [R, 1].
template <class U>
at::Tensor inverse_cdf(const at::Tensor& probs, const U& u) {
  const int64_t v = probs.size(-1);
  const at::Tensor cdf = probs.to(at::kDouble).cumsum(-1);
  const at::Tensor target = cdf.narrow(-1, v - 1, 1) * u;
  return at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).clamp_max(v - 1);
}
}  // namespace

at::Tensor sample_index_tensor(const at::Tensor& probs, double u) { return inverse_cdf(probs, u); }
at::Tensor sample_index_tensor(const at::Tensor& probs, const at::Tensor& u) {
  return inverse_cdf(probs, u);
}

at::Tensor sample_rows_tensor(const at::Tensor& probs, const at::Tensor& u) {
  return inverse_cdf(probs, u.view({-1, 1})).view({-1});
}

int64_t sample_index(const at::Tensor& probs, double u) {
  SPECDEC_CHECK(probs.dim() == 1 && probs.numel() > 0,
                "sample_index: expected probabilities [V], got ", probs.sizes());
  SPECDEC_CHECK(u >= 0.0 && u < 1.0, "sample_index: u must be in [0, 1), got ", u);
  // The index and its probability in one copy to the host (the draw lands on a positive entry
  // whenever the sum is positive and finite).
  const at::Tensor i = sample_index_tensor(probs, u).view({1});
  const at::Tensor both = at::cat({i.to(at::kDouble), probs.index_select(0, i).to(at::kDouble)});
  const at::Tensor host = both.cpu();
  SPECDEC_CHECK(host.data_ptr<double>()[1] > 0.0,
                "sample_index: the probabilities must be non-negative with a positive, finite sum");
  return static_cast<int64_t>(host.data_ptr<double>()[0]);
}

}  // namespace specdec
