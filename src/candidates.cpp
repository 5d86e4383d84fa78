#include "specdec/candidates.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "specdec/error.hpp"

namespace specdec {

namespace {
bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
}  // namespace

DraftModelGenerator::DraftModelGenerator(std::shared_ptr<const Model> draft,
                                         const GenerationConfig& config,
                                         LookaheadSchedule& schedule, Rng& rng, int64_t max_length,
                                         const at::Tensor& encoder_states, int64_t target_vocab)
    : draft_(std::move(draft)),
      vocab_(target_vocab > 0 ? target_vocab : draft_->config().vocab_size),
      config_(config),
      schedule_(schedule),
      rng_(rng),
      processors_(config),
      cache_(draft_->make_cache(max_length)) {
  if (draft_->config().is_encoder_decoder) draft_->attach_encoder(encoder_states, cache_);
}

Candidates DraftModelGenerator::propose(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  Candidates out;
  const int64_t k = std::min(schedule_.num_tokens(), max_tokens);
  if (k <= 0) return out;
  const bool sampling = config_.sampling();
  const bool need_probs = sampling || schedule_.kind() == "dynamic";
  std::vector<at::Tensor> q_rows;
  // Processor history: tokens + drafted so far (only history-dependent processors need it).
  std::vector<int64_t> history;
  if (!processors_.empty()) history = tokens;
  // The cache holds a prefix of `tokens`; feed the rest, then one drafted token per step.
  std::vector<int64_t> pending(tokens.begin() + cache_.length(), tokens.end());
  const int64_t own = draft_->config().vocab_size;
  // A token the draft has no row for (the target's vocabulary is larger): the draft cannot follow
  // this sequence any more, so the rest of the request runs without proposals.
  for (int64_t id : pending) out_of_vocab_ = out_of_vocab_ || id >= own;
  if (out_of_vocab_) return out;
  for (int64_t i = 0; i < k; ++i) {
    const at::Tensor ids = at::tensor(pending, at::kLong).view({1, -1});
    at::Tensor scores = draft_->forward(ids, cache_, 1)[0];  // [1, V_draft]
    ++passes_;
    if (own > vocab_) scores = scores.narrow(-1, 0, vocab_);  // [1, V]: the draft's padding rows go
    if (own < vocab_)
      scores = at::constant_pad_nd(scores, {0, vocab_ - own}, -std::numeric_limits<double>::infinity());
    if (!processors_.empty()) scores = processors_.apply(scores, history);
    int64_t tok;
    double p = 1.0;
    if (sampling) {
      const at::Tensor q = scores.softmax(-1)[0];  // [V]
      tok = sample_index(q, rng_.uniform());
      p = q[tok].item<double>();
      q_rows.push_back(q);
    } else {
      tok = scores[0].argmax().item<int64_t>();
      if (need_probs) p = scores[0].softmax(-1)[tok].item<double>();
    }
    out.tokens.push_back(tok);
    out.probs.push_back(p);
    if (!processors_.empty()) history.push_back(tok);
    if (contains(config_.eos_token_ids, tok) || schedule_.stop_after(p)) break;
    pending.assign(1, tok);
  }
  if (sampling) out.q = at::stack(q_rows);  // [K, V]
  return out;
}

void DraftModelGenerator::on_verified(const Candidates& proposed, int64_t accepted,
                                      const std::vector<int64_t>& tokens) {
  // Keep only positions whose tokens the target confirmed; the newest token is never cached yet.
  const int64_t valid = static_cast<int64_t>(tokens.size()) - 1;
  if (cache_.length() > valid) cache_.crop(valid);
  schedule_.update(proposed.probs, accepted);
}

PromptLookupGenerator::PromptLookupGenerator(int64_t num_tokens, int64_t max_ngram,
                                             std::vector<int64_t> eos_ids, bool most_recent)
    : num_tokens_(num_tokens), max_ngram_(max_ngram), eos_ids_(std::move(eos_ids)), most_recent_(most_recent) {
  SPECDEC_CHECK(num_tokens_ >= 1, "prompt lookup: prompt_lookup_num_tokens must be >= 1");
  SPECDEC_CHECK(max_ngram_ >= 1, "prompt lookup: max_matching_ngram_size must be >= 1");
}

Candidates PromptLookupGenerator::propose(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  Candidates out;
  const int64_t k = std::min(num_tokens_, max_tokens);
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return out;
  // Hugging Face's rule: the longest n-gram first; its leftmost earlier occurrence whose
  // continuation is not empty; the continuation is cut before its first EOS (an empty proposal then
  // means no speculation this step).
  for (int64_t n = std::min(max_ngram_, len - 1); n >= 1; --n) {
    const int64_t tail = len - n;  // the last n tokens are tokens[tail, len)
    for (int64_t i = 0; i < tail; ++i) {
      const int64_t s = most_recent_ ? tail - 1 - i : i;
      if (!std::equal(tokens.begin() + s, tokens.begin() + s + n, tokens.begin() + tail)) continue;
      const int64_t end = std::min(s + n + k, len);
      for (int64_t j = s + n; j < end && !contains(eos_ids_, tokens[j]); ++j) out.tokens.push_back(tokens[j]);
      return out;
    }
  }
  return out;
}

}  // namespace specdec
