// Candidate sources: propose the tokens the target verifies in one pass (a draft model; prompt
// lookup and suffix speculation, which need no model).
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
  // [K] each token's probability given the ones before it on its path, as its proposer estimates
  // it (a draft model's; prompt lookup's and suffix speculation's counts); empty: none.
  std::vector<double> probs;
  // A tree of candidates (empty: a chain): parents[i] is candidate i's parent, an earlier
  // candidate, or -1 for one that follows the verified tokens (Model's TokenTree). Deterministic
  // proposals only (q undefined); siblings hold different tokens.
  std::vector<int64_t> parents;
  size_t size() const { return tokens.size(); }
  bool tree() const { return !parents.empty(); }
  std::vector<int64_t> depths() const;  // each candidate's under the verified tokens (a chain: i)
  // Each candidate's estimated probability of being kept: the product of probs along its path
  // (empty without probs).
  std::vector<double> reach() const;
  // Keeps the first n candidates (a proposer's best first, parents before children, so they are a
  // tree still); a tree left without a branch becomes a chain.
  void truncate(size_t n);
  // A tree without a branch (each candidate's parent the one before it) becomes a chain.
  void chain_if_unbranched();
};

// Runs a draft model with its own KV cache for a batch of sequences (rows), each under its own
// request config, LookaheadSchedule and Rng. Greedy rows draft the argmax; sampling rows sample
// from q = processed draft distribution (same processor chain as the target). A row stops drafting
// at EOS. Each drafted position is one draft pass over every row still drafting (rows of different
// lengths share it; see Model::forward).
class DraftModelGenerator final {
 public:
  struct Row {  // the request's state, owned by the caller, alive as long as this generator
    const GenerationConfig* config;
    LookaheadSchedule* schedule;
    Rng* rng;
    // A row's candidates per position (GenerationConfig::draft_tree_width): 1 drafts a chain
    // (sampled from the draft's distribution when the row samples); W > 1 a deterministic tree,
    // the draft's W most probable tokens at each position, the first of which continues (one draft
    // pass per position either way), best first (Candidates::reach), at most the row's max_tokens
    // of them.
    int64_t tree_width = 1;
    // An encoder-decoder draft: what this row's decoder attends to ([1, S, H]), the output of the
    // draft's own encoder over the row's prompt, or of the target's when they have the
    // same_encoder (Model::attach_encoder).
    at::Tensor encoder_states;
  };
  // What only some drafts need. (No default argument: Options' member initializers cannot be used
  // within this class's definition.)
  struct Options {
    // The width of the target's logits (0 = the draft's own). A draft whose vocabulary differs only
    // by padding rows proposes over the target's ids: its scores are cut to, or padded with -inf up
    // to, that width (q = 0 for ids the draft cannot produce).
    int64_t target_vocab = 0;
    // A cache to continue (decoder-only; one row per row, capacity >= max_length, each row holding
    // a prefix of its sequence, as PromptCache keeps it) instead of a new one.
    KVCache cache;
    // The target's cache of these rows, keeping hidden states (Model::make_cache), which a
    // feature-fed draft (ModelConfig::feature_size) reads; it must outlive this generator's
    // proposals. Such a draft proposes for a row only once the target holds every position but the
    // sequence's last (so a request's first target pass runs without proposals), and keeps in its
    // cache only the positions it computed from the target's own hidden states.
    const KVCache* target_cache = nullptr;
  };
  DraftModelGenerator(std::shared_ptr<const Model> draft, std::vector<Row> rows, int64_t max_length,
                      Options options);

  // Proposals for rows [0, tokens.size()): row b continues *tokens[b] with up to max_tokens[b]
  // candidates (0: none).
  std::vector<Candidates> propose_batch(const std::vector<const std::vector<int64_t>*>& tokens,
                                        const std::vector<int64_t>& max_tokens);
  // Fills the draft's cache with all but the last token of each row's sequence before the first
  // proposal, in chunks (rows sorted longest first; see Generator::generate_batch). Rows whose
  // sequence holds an id the draft has no row for are left to propose_batch.
  // With `slots`, the sequences are new rows at those slots of a running batch (after reset_row),
  // prefilled on their own (see Generator::generate_batch's continuous batching); a feature-fed
  // draft leaves those to propose_batch.
  void prefill(const std::vector<const std::vector<int64_t>*>& tokens,
               const std::vector<int64_t>& slots = {});
  // Row `slot` starts over as a new request's row `row`: its cache row is emptied (continuous
  // batching; the next proposal, or prefill, fills it) and attends to the row's encoder_states.
  void reset_row(int64_t slot, Row row);
  // Row `row` kept `accepted` of `proposed`; `tokens` is its verified sequence.
  void on_verified_row(int64_t row, const Candidates& proposed, int64_t accepted,
                       const std::vector<int64_t>& tokens);
  // Moves row `from` (cache, state) into row `to`'s slot (compaction when a row finishes).
  void move_row(int64_t from, int64_t to);
  // Positions row `row` holds in the draft's cache (0: the draft has not seen its sequence yet).
  int64_t cached(int64_t row) const { return cache_.length(row); }
  // Hands the cache over (to a PromptCache) once the request is done: this generator is then spent.
  // (It no longer points at the target's cache: the next request's generator sets that.)
  KVCache release_cache() {
    cache_.set_feature_source(nullptr);
    return std::move(cache_);
  }
  // Draft passes row `row` took part in.
  int64_t row_passes(int64_t row) const { return rows_[row].passes; }
  // The passes of the last propose_batch that drafted one token per drafting row (every row fed at
  // most 2 tokens: its last accepted ones, or the one drafted before), and their seconds, host
  // work included. A pass that catches a row up on its prompt or on iterations without drafts
  // costs more and is left out. What goodput takes as the draft's cost per drafted token.
  struct SteadyPasses {
    int64_t passes = 0;
    double seconds = 0;
  };
  SteadyPasses last_steady() const { return last_steady_; }

  // Draft forward passes made so far, over all rows.
  int64_t passes() const { return passes_; }

 private:
  struct State {
    Row row;
    std::shared_ptr<const LogitsProcessorChain> processors;
    bool out_of_vocab = false;  // the sequence holds an id the draft has no row for
    bool unable = false;  // the last proposal had room to draft but could not (see on_verified_row)
    int64_t proposed_from = 0;  // the sequence's length at the last proposal
    // The last proposal's chain (a tree's first tokens at each depth, the ones the draft fed) and
    // their probabilities: the cache keeps what the verified sequence agrees with.
    std::vector<int64_t> chain = {};
    std::vector<double> chain_probs = {};
    int64_t passes = 0;
  };
  void attach(int64_t slot);  // an encoder-decoder draft: the row's encoder_states into its cache
  std::shared_ptr<const Model> draft_;
  int64_t vocab_;  // width of the proposals (the target's vocabulary)
  std::vector<State> rows_;
  KVCache cache_;  // a feature-fed draft's points at the target's (KVCache::feature_source)
  int64_t passes_ = 0;
  SteadyPasses last_steady_;
};

// A proposer that needs no model: one request's, reading its sequence (and what it remembers).
class SequenceProposer {
 public:
  virtual ~SequenceProposer() = default;
  // Up to `max_tokens` candidates to follow `tokens` (prompt + generated so far, which only grows
  // between calls); none when max_tokens <= 0.
  virtual Candidates propose(const std::vector<int64_t>& tokens, int64_t max_tokens) = 0;
};

// Prompt lookup decoding, Hugging Face's rule: copy the continuation of the leftmost earlier
// occurrence of the last n tokens (n = max_matching_ngram_size down to 1) in prompt + output, cut
// before its first EOS. With `most_recent`, the rightmost earlier occurrence instead (specdec's
// option, GenerationConfig::prompt_lookup_match = "last").
class PromptLookupGenerator final : public SequenceProposer {
 public:
  PromptLookupGenerator(int64_t num_tokens, int64_t max_ngram, std::vector<int64_t> eos_ids,
                        bool most_recent = false);
  Candidates propose(const std::vector<int64_t>& tokens, int64_t max_tokens) override;

 private:
  int64_t num_tokens_;
  int64_t max_ngram_;
  std::vector<int64_t> eos_ids_;
  bool most_recent_;
};

}  // namespace specdec
