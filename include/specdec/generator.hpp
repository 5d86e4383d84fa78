// Generator: the assisted-generation loop (and plain target-only generation).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "specdec/config.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/model.hpp"
#include "specdec/stats.hpp"

namespace specdec {

class Verifier;
class RequestEngine;
class SuffixCache;
struct SuffixOptions;
namespace detail {
class Engine;
struct EngineModels;
struct GeneratorState;
// Set while a request uses the object that holds it; a move leaves each object its own.
struct InUse {
  InUse() = default;
  InUse(InUse&&) noexcept {}
  InUse& operator=(InUse&&) noexcept { return *this; }
  std::atomic<bool> flag{false};
};
}  // namespace detail

struct GenerationResult {
  std::vector<int64_t> tokens;  // generated tokens only (prompt excluded), EOS included if hit
  GenerationStats stats;
  // Of a row of generate_batch whose callback threw (anything but Cancelled): what it said, with
  // stats.stop_reason "error" and the tokens delivered up to it (the group the callback threw on
  // included); "" otherwise. (generate() rethrows that exception instead.)
  std::string error;
};

// Called with each group of newly verified tokens, in order, as soon as they are known, and with no
// tokens between the passes of a prefill that takes several (a prompt past 256 tokens), so that it
// can stop that too. Throw specdec::Cancelled from it to stop the request (see error.hpp).
using TokenCallback = std::function<void(const std::vector<int64_t>& new_tokens)>;

// A batch (Generator::generate_batch): one result per prompt, in order, and the batch's totals.
struct BatchStats {
  int64_t rows = 0;
  int64_t new_tokens = 0;     // over every row
  int64_t target_passes = 0;  // passes of the whole batch (each verifies every active row)
  int64_t draft_passes = 0;
  double total_seconds = 0;
  // Of total_seconds: the passes over prompts (the first iteration, and each admission's prefill).
  double prefill_seconds = 0;
  double tokens_per_second() const {
    return total_seconds > 0 ? static_cast<double>(new_tokens) / total_seconds : 0.0;
  }
};
struct BatchResult {
  std::vector<GenerationResult> results;
  BatchStats stats;
};
// Called with row `row`'s newly verified tokens (row: the prompt's index in the batch), and with
// none between the passes of its prompt's prefill, as TokenCallback. Throw
// specdec::Cancelled to stop that row; the others go on. Any other exception fails that row alone
// (GenerationResult::error).
using BatchTokenCallback = std::function<void(size_t row, const std::vector<int64_t>& new_tokens)>;

struct BatchOptions {
  // Rows generated at once (0: every prompt). With fewer than the prompts, the first max_rows start
  // together and each row that finishes makes room for the next prompt, in order, which joins the
  // running batch after its own prefill (continuous batching; an encoder-decoder model's prompt
  // after its encoder pass).
  int64_t max_rows = 0;
  // Called once per row as it finishes (EOS, its length limit or cancelled), with its final result
  // (the one BatchResult holds at the end); not for a row whose token callback threw. An exception
  // from it fails that row alone, as the token callback's does.
  std::function<void(size_t row, const GenerationResult& result)> on_finished;
};

// The caches of one conversation, kept from one request to the next (Generator::generate with a
// prompt cache): a request computes only the tokens of its prompt after the common prefix of that
// prompt and the cache's last sequence (the last request's prompt and answer), so a chat's next
// turn computes its new message, not the conversation again. Its output is the one it gives
// without the cache: on the CPU in float32 its logits are bitwise the same (batch invariance: a
// prefill, a verification pass and decode steps agree bitwise). One request at a time per cache.
// A request with another target model starts afresh (the cache then holds its run; another draft
// only recomputes the draft's cache, as the output depends on the target alone); an
// encoder-decoder model's always does (its decoder depends on each prompt's encoding; the cache
// stays empty). A request refused by validation leaves the cache as it was, one that fails while
// running leaves it empty; a request while another uses the cache is refused (specdec::Error),
// but clear(), a move or positions() while a request uses it are the caller's to avoid.
class PromptCache {
 public:
  PromptCache() = default;
  PromptCache(PromptCache&&) =
      default;  // movable, not copyable: a copy would share the caches' memory
  PromptCache& operator=(PromptCache&&) = default;
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;
  // Positions the target's cache holds (0 before the first request).
  int64_t positions() const { return target_cache_.num_layers() ? target_cache_.length(0) : 0; }
  void clear() { *this = PromptCache(); }

 private:
  friend class detail::Engine;
  friend class Generator;                        // (claims in_use_)
  std::shared_ptr<const Model> target_, draft_;  // the models the caches belong to
  std::vector<int64_t> tokens_;  // the last request's sequence: prompt and new tokens
  KVCache target_cache_,
      draft_cache_;  // each holds a prefix of tokens_ (the draft's: empty if unused)
  detail::InUse in_use_;
};

class Generator {
 public:
  // `draft` may be null: generation is then target-only, or prompt lookup or suffix speculation
  // when the request sets prompt_lookup_num_tokens or suffix_speculation. Throws specdec::Error
  // when draft and target are incompatible (EOS ids, device, decoder-only with encoder-decoder,
  // decoder start token, feature size); their vocabularies may differ in size (padded rows), their
  // tokenizers must agree (require_same_tokenizer). Encoder-decoder pairs share one encoder pass
  // per request when Model::same_encoder says so.
  explicit Generator(std::shared_ptr<const Model> target,
                     std::shared_ptr<const Model> draft = nullptr);
  ~Generator();

  // Generates up to config.max_new_tokens tokens after `prompt` (non-empty, ids < vocab size).
  // Encoder-decoder models: `prompt` is the encoder's input, the decoder starts from
  // decoder_start_token_id, and the result holds the decoder's tokens after it.
  // Greedy output equals the target's own greedy output token for token; sampled output has the
  // target's distribution. Thread-safe: requests share only the immutable models and, each guarded,
  // the carried heuristic lookahead, goodput's measurements and suffix speculation's earlier
  // answers.
  GenerationResult generate(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                            const TokenCallback& on_token = {}) const;
  // The same, continuing `cache` (see PromptCache); GenerationStats::cached_prompt_tokens says how
  // many prompt positions came from it.
  GenerationResult generate(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                            PromptCache& cache, const TokenCallback& on_token = {}) const;

  // Throws the specdec::Error generate() would throw for this request before it runs anything (a
  // bad config, an empty prompt, an id outside the vocabulary, more positions than the limits or
  // the models allow); checks a list of requests before the first one runs.
  void check(const std::vector<int64_t>& prompt, const GenerationConfig& config) const;

  // Generates for several prompts at once: each step drafts for every active row (one draft pass
  // per drafted position), verifies every row in one target pass, and accepts a different number of
  // tokens per row; a row that hits EOS, its length limit or is cancelled leaves the batch while
  // the others go on. Prompts may have different lengths. `configs`: one per prompt, or one for
  // all; each row has its own schedule state, Rng (its config's seed) and stats, and its output is
  // the one generate() gives for that prompt and config alone (greedy: token for token; sampling:
  // the same tokens for the same seed). A row whose config sets prompt_lookup_num_tokens drafts by
  // prompt lookup, one that sets suffix_speculation by suffix speculation, the others with the
  // draft model (target-only without one), all in one batch.
  // generate() is the batch of one.
  // `options`: at most max_rows rows at once (continuous batching), and a callback per finished
  // row. A row's stats time it from its admission: prefill_seconds its own prefill and first
  // iteration, total_seconds up to its last token.
  BatchResult generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                             const std::vector<GenerationConfig>& configs,
                             const BatchTokenCallback& on_tokens = {},
                             const BatchOptions& options = {}) const;

  // Replaces the verifier chosen from the request (greedy or rejection sampling). For research and
  // tests, e.g. a deliberately wrong verifier that a statistical test must catch. Not thread-safe
  // with concurrent generate() calls. A RequestEngine made before keeps the verifier it was made
  // with (and keeps it alive). decide()'s values are checked: a verdict that names no candidate
  // or no token throws specdec::Error.
  void set_verifier(std::shared_ptr<const Verifier> verifier) {
    custom_verifier_ = std::move(verifier);
  }

  // Suffix speculation's settings (suffix.hpp), for the requests that start after this call; the
  // tree of earlier outputs starts empty. Throws specdec::Error for invalid ones.
  void set_suffix_options(const SuffixOptions& options);
  // The tree of earlier requests' outputs that suffix speculation shares.
  std::shared_ptr<const SuffixCache> suffix_cache() const;

  // goodput at B = 1 re-times a draft whose measured cost keeps drafting off (src/goodput.hpp):
  // after kRetimeFirst iterations without drafting, then after twice as many, up to kRetimeLast.
  static constexpr int64_t kRetimeFirst = 64, kRetimeLast = 4096;

  const Model& target() const { return *target_; }
  const Model* draft() const { return draft_.get(); }

 private:
  friend class RequestEngine;
  detail::EngineModels models() const;
  GenerationResult generate_one(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                                const TokenCallback& on_token, PromptCache* cache) const;
  // `failure`: set to the exception row 0's callback threw (one request: generate() rethrows it).
  BatchResult run(const std::vector<std::vector<int64_t>>& prompts,
                  const std::vector<GenerationConfig>& configs, const BatchTokenCallback& on_tokens,
                  const BatchOptions& options, PromptCache* prompt_cache = nullptr,
                  std::exception_ptr* failure = nullptr) const;
  std::shared_ptr<const Model> target_;
  std::shared_ptr<const Model> draft_;
  std::shared_ptr<const Verifier> custom_verifier_;
  bool share_encoder_ = false;  // encoder-decoder: the draft reuses the target's encoder output
  // What the Generator learns and carries from one request to the next (src/engine.hpp): goodput's
  // measured costs, the heuristic lookahead, goodput's acceptance evidence, the suffix tree of
  // earlier requests.
  std::unique_ptr<detail::GeneratorState> state_;
};

}  // namespace specdec
