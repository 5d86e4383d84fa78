// CandidateGenerator: proposes the tokens the target verifies in one pass.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "specdec/config.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/model.hpp"
#include "specdec/sampling.hpp"

namespace specdec {

struct Candidates {
  std::vector<int64_t> tokens;  // [K] proposed continuation
  at::Tensor q;                 // [K, V] float32 distributions the tokens were sampled from;
                                // undefined = deterministic proposal (q one-hot at each token)
  std::vector<double> probs;    // [K] draft probability of each token (draft models only)
  size_t size() const { return tokens.size(); }
};

// Per-request state of a candidate source. Created by the Generator for each request.
class CandidateGenerator {
 public:
  virtual ~CandidateGenerator() = default;
  // Up to `max_tokens` (>= 1) candidates to follow `tokens` (prompt + generated so far).
  virtual Candidates propose(const std::vector<int64_t>& tokens, int64_t max_tokens) = 0;
  // The target kept `accepted` of `proposed`; `tokens` now holds the verified sequence.
  virtual void on_verified(const Candidates& proposed, int64_t accepted,
                           const std::vector<int64_t>& tokens) = 0;
  // Draft forward passes made so far (0 for sources without a model).
  virtual int64_t passes() const { return 0; }
};

// Runs a draft model with its own KV cache under a LookaheadSchedule. Greedy requests draft the
// argmax; sampling requests sample from q = processed draft distribution (same processor chain as
// the target). Drafting stops at EOS. An encoder-decoder draft attends to `encoder_states` (the
// output of its own encoder, or of the target's when they have the same encoder).
class DraftModelGenerator final : public CandidateGenerator {
 public:
  // `target_vocab`: the width of the target's logits (0 = the draft's own). A draft whose
  // vocabulary differs only by padding rows proposes over the target's ids: its scores are cut to,
  // or padded with -inf up to, that width (q = 0 for ids the draft cannot produce).
  DraftModelGenerator(std::shared_ptr<const Model> draft, const GenerationConfig& config,
                      LookaheadSchedule& schedule, Rng& rng, int64_t max_length,
                      const at::Tensor& encoder_states = {}, int64_t target_vocab = 0);
  Candidates propose(const std::vector<int64_t>& tokens, int64_t max_tokens) override;
  void on_verified(const Candidates& proposed, int64_t accepted,
                   const std::vector<int64_t>& tokens) override;
  int64_t passes() const override { return passes_; }

 private:
  std::shared_ptr<const Model> draft_;
  int64_t vocab_;  // width of the proposals (the target's vocabulary)
  bool out_of_vocab_ = false;  // the sequence holds an id the draft has no row for
  const GenerationConfig& config_;
  LookaheadSchedule& schedule_;
  Rng& rng_;
  LogitsProcessorChain processors_;
  KVCache cache_;
  int64_t passes_ = 0;
};

// Prompt lookup decoding, Hugging Face's rule: copy the continuation of the leftmost earlier
// occurrence of the last n tokens (n = max_matching_ngram_size down to 1) in prompt + output, cut
// before its first EOS. With `most_recent`, the rightmost earlier occurrence instead (specdec's
// option, GenerationConfig::prompt_lookup_match = "last").
class PromptLookupGenerator final : public CandidateGenerator {
 public:
  PromptLookupGenerator(int64_t num_tokens, int64_t max_ngram, std::vector<int64_t> eos_ids,
                        bool most_recent = false);
  Candidates propose(const std::vector<int64_t>& tokens, int64_t max_tokens) override;
  void on_verified(const Candidates&, int64_t, const std::vector<int64_t>&) override {}

 private:
  int64_t num_tokens_;
  int64_t max_ngram_;
  std::vector<int64_t> eos_ids_;
  bool most_recent_;
};

}  // namespace specdec
