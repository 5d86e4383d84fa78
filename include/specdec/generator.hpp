// Generator: the assisted-generation loop (and plain target-only generation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "specdec/config.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/model.hpp"
#include "specdec/stats.hpp"

namespace specdec {

class Verifier;

struct GenerationResult {
  std::vector<int64_t> tokens;  // generated tokens only (prompt excluded), EOS included if hit
  GenerationStats stats;
};

// Called with each group of newly verified tokens, in order, as soon as they are known. Throw
// specdec::Cancelled from it to stop the request (see error.hpp).
using TokenCallback = std::function<void(const std::vector<int64_t>& new_tokens)>;

class Generator {
 public:
  // `draft` may be null: generation is then target-only, or prompt lookup when the request sets
  // prompt_lookup_num_tokens. Throws specdec::Error when draft and target are incompatible
  // (vocabulary size, EOS ids, device, decoder-only with encoder-decoder, decoder start token).
  // Encoder-decoder pairs share one encoder pass per request when Model::same_encoder says so.
  explicit Generator(std::shared_ptr<const Model> target,
                     std::shared_ptr<const Model> draft = nullptr);

  // Generates up to config.max_new_tokens tokens after `prompt` (non-empty, ids < vocab size).
  // Encoder-decoder models: `prompt` is the encoder's input, the decoder starts from
  // decoder_start_token_id, and the result holds the decoder's tokens after it.
  // Greedy output equals the target's own greedy output token for token; sampled output has the
  // target's distribution. Thread-safe: requests share only the immutable models (and the carried
  // heuristic lookahead, guarded by a mutex).
  GenerationResult generate(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                            const TokenCallback& on_token = {}) const;

  // Replaces the verifier chosen from the request (greedy or rejection sampling). For research and
  // tests, e.g. a deliberately wrong verifier that a statistical test must catch. Not thread-safe
  // with concurrent generate() calls.
  void set_verifier(std::shared_ptr<const Verifier> verifier) { custom_verifier_ = std::move(verifier); }

  const Model& target() const { return *target_; }
  const Model* draft() const { return draft_.get(); }

 private:
  GenerationResult run(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                       const TokenCallback& on_token) const;
  std::shared_ptr<const Model> target_;
  std::shared_ptr<const Model> draft_;
  std::shared_ptr<const Verifier> custom_verifier_;
  bool share_encoder_ = false;  // encoder-decoder: the draft reuses the target's encoder output
  // "heuristic" schedule: the lookahead reached by the last request, carried to the next greedy one
  // (Hugging Face keeps it on the assistant model's generation config). Sampled requests start from
  // num_assistant_tokens, so that a seed gives the same tokens whatever ran before or beside it.
  mutable std::mutex carried_mutex_;
  mutable std::optional<int64_t> carried_lookahead_;
  // "goodput" schedule: target pass cost by rows (calibrated by the first request, refined by
  // every one) and draft cost per token, measured on this Generator's models.
  void plan_goodput(LookaheadSchedule& schedule, KVCache& cache, const std::vector<int64_t>& tokens) const;
  mutable std::mutex costs_mutex_;
  mutable PassCost target_cost_, draft_cost_;
  mutable bool calibrating_ = false;
};

}  // namespace specdec
