// The request engine (private): the rows of one batch from admission to their results, one
// iteration (step) at a time. Generator::generate, generate_batch, --prompts-file and RequestEngine
// (hence specdec serve) all run on it.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "goodput.hpp"
#include "prefill.hpp"
#include "specdec/candidates.hpp"
#include "specdec/error.hpp"
#include "specdec/generator.hpp"
#include "specdec/request_engine.hpp"
#include "specdec/sampling.hpp"
#include "specdec/suffix.hpp"
#include "specdec/verifier.hpp"
#include "util.hpp"

namespace specdec::detail {

// Holds an InUse flag for a scope; throws specdec::Error with `message` where it is held already
// (a second thread on what serves one at a time).
class Claim {
 public:
  Claim(InUse& in_use, const char* message) : flag_(in_use.flag) {
    if (flag_.exchange(true)) throw Error(message);
  }
  ~Claim() { flag_ = false; }
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

 private:
  std::atomic<bool>& flag_;
};

// What a Generator keeps between requests, shared by its concurrent ones (each part guarded).
struct GeneratorState {
  explicit GeneratorState(const Model& target) : goodput(target) {}
  GoodputPlanner goodput;
  std::mutex carried_mutex;  // guards the two below
  // "heuristic": the lookahead reached by the last request, carried to the next greedy one (Hugging
  // Face keeps it on the assistant model's generation config). Sampled requests start from
  // num_assistant_tokens, so that a seed gives the same tokens whatever ran before or beside it.
  std::optional<int64_t> carried_lookahead;
  // "goodput": the acceptance evidence a request starts from (LookaheadSchedule::carry_evidence of
  // the last goodput request), by the row's proposer (Engine::proposer_kind).
  std::optional<std::pair<double, double>> carried_evidence[3];
  // Suffix speculation's tree of finished requests' outputs (Generator::set_suffix_options
  // replaces it; running rows keep the one they started with).
  std::shared_ptr<SuffixCache> suffix = std::make_shared<SuffixCache>();
};

// The models of a Generator, as the engine uses them.
struct EngineModels {
  std::shared_ptr<const Model> target, draft;
  // Generator::set_verifier's when the engine was made (a RequestEngine keeps it alive), or null.
  std::shared_ptr<const Verifier> custom_verifier;
  bool share_encoder = false;  // encoder-decoder: the draft reuses the target's encoder output
};

// One sequence of a batch: its request, its state between iterations, and its result.
struct Row {
  size_t index = 0;  // the prompt's position in the batch (a RequestEngine's: the request's id)
  std::string name;  // "" for a single request, else "row N: " (error messages)
  std::vector<int64_t> prompt;
  GenerationConfig config;
  // A RequestEngine's request: its sinks (instead of the batch's callbacks), the log-probabilities
  // it asks for (-1: none), and its cancel flag (read at each commit).
  Request::TokenSink sink;
  std::function<void(const GenerationResult&)> on_finished;
  int64_t top_logprobs = -1;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> done{false};  // it left the batch (finish_row; RequestEngine::load reads it)
  std::vector<int64_t> tokens;  // the sequence the target continues; the cache holds a prefix of it
  std::unique_ptr<Rng> rng;
  std::unique_ptr<LookaheadSchedule> schedule;
  std::unique_ptr<LogitsProcessorChain> processors;
  // Prompt lookup's or suffix speculation's (null for the draft model's rows and target-only ones).
  std::unique_ptr<SequenceProposer> proposer;
  std::shared_ptr<SuffixCache> suffix;  // the Generator's shared tree, which the row feeds
  at::Tensor draft_encoder_states;      // encoder-decoder: what the draft's decoder attends to
  const Verifier* verifier = nullptr;
  GenerationResult result;
  std::exception_ptr error;  // what its callback threw (stop_reason "error")
  // This iteration: the proposal, the length of the verified sequence it follows, the verdict.
  Candidates cand;
  bool cut = false;  // goodput cut cand by its probabilities (GoodputPlanner::cut)
  int64_t verified_len = 0;
  Verdict verdict;
  at::Tensor logprobs;  // [K+1, V] float: log-softmax of the target's logits (top_logprobs >= 0)
  // When it joined the batch, and the seconds of its prefill and first iteration.
  std::chrono::steady_clock::time_point admitted;
  double prefill_seconds = 0;
};

// Checks a request and fills `row` from it (prompt, config with the model's EOS ids, tokens):
// specdec::Error, prefixed with row.name, for a bad config, an empty prompt, an id outside the
// vocabulary, or more positions than the limits or the models allow. Returns the positions the
// row needs (its sequence plus max_new_tokens).
int64_t prepare_row(Row& row, const EngineModels& models, const std::vector<int64_t>& prompt,
                    const GenerationConfig& config);

// Calls row.on_finished (a RequestEngine request's) with its result; an exception from it is
// dropped: the request is over, and the other rows go on.
void finished(Row& row);

// Where an engine's rows come from: validated rows (Generator::validated_row), in order.
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual Row* next() = 0;  // the next row to admit, or null when none is waiting
  // Whether every row joins through admit(), the first ones too: a request queue's, whose first
  // long prompt must go in a chunk per step as later ones do. Otherwise (a batch) the engine starts
  // with the first rows, and a single short request keeps Hugging Face's first pass.
  virtual bool admits_all() const { return false; }
};

// A batch's rows, in order.
class VectorSource final : public RowSource {
 public:
  explicit VectorSource(std::vector<Row>& rows) : rows_(rows) {}
  Row* next() override { return next_ < rows_.size() ? &rows_[next_++] : nullptr; }

 private:
  std::vector<Row>& rows_;
  size_t next_ = 0;
};

// The rows of a RowSource, at most `width` at once, each joining as a row finishes (continuous
// batching) with caches of `max_length` positions per row. Each step admits rows, drafts for the
// running rows, verifies them in one target pass, commits a different number of tokens per row
// and streams them, and retires the rows that finished (an encoder-decoder model's rows too: each
// row's encoder pass runs as it joins). `use_draft`: the draft
// model is loaded, and the rows that do not ask for prompt lookup or suffix speculation draft with
// it (the others by those, or not at all, row by row).
class Engine {
 public:
  Engine(EngineModels models, GeneratorState& state, RowSource& source, bool use_draft,
         int64_t width, int64_t max_length, const BatchTokenCallback& on_tokens,
         const BatchOptions& options, PromptCache* prompt_cache, int64_t max_prefixes = 0,
         int64_t prefill_chunk = kPrefillChunk);
  // One iteration over the running rows, after admitting the waiting ones; false when no row is
  // running (nothing was done).
  bool step();
  // Rows in the batch now.
  int64_t running() const {
    return static_cast<int64_t>(slots_.size() - std::count(slots_.begin(), slots_.end(), nullptr));
  }
  // A batch's results (the rows, in order), once step() returned false; fills the prompt cache.
  BatchResult finish(std::vector<Row>& rows);

 private:
  // A row's state is set up when it joins the batch (so that it starts from what the Generator
  // carries at that moment). `evidence`: goodput's acceptance evidence to start from, when not the
  // one the Generator carries.
  void set_up(Row& row, std::optional<std::pair<double, double>> evidence = {});
  DraftModelGenerator::Row draft_row(Row& row) const;
  void start();  // the caches, encoder passes, the drafter and the first rows' prefill
  // Encoder-decoder: the row's encoder pass (the draft's too, unless they share the encoder), its
  // cross-attention entries in cache row `slot`, which starts empty; returns the encoder passes.
  int64_t encode(Row& row, int64_t slot);
  void plan(bool may_calibrate);
  void draft();
  void verify();
  void commit();
  void retire();
  // `decoding`: rows were running when the step began (their pass waits for its prefill). Returns
  // the prompt tokens the joining rows may still put in this step while rows decode.
  int64_t admit(bool decoding);
  // The slot a joining row takes: the first one a finished row freed (its cache row is
  // overwritten), else a new one at the end.
  int64_t take_slot(Row& row);
  // The slots no joining row took (the batch shrank): the last rows move into them, so that every
  // pass covers rows [0, B).
  void compact();
  // The joining rows' next prompt tokens, each row in its own 1-row cache: `budget` in all, in
  // order, while rows decode, else a chunk each; a row whose prompt is in (all but its last token)
  // takes a slot. True when there was such a row.
  bool advance_joining(bool decoding, int64_t budget);
  // The row's stats when it leaves the batch, its on_finished, and what the Generator carries
  // from it to the next request.
  void finish_row(Row& row);
  // Row `slot`'s new tokens to its sink or the batch's callback (their log-probabilities first).
  void deliver(int64_t slot, const std::vector<int64_t>& fresh);
  // A callback kept only the first `kept` of the `delivered` tokens: the row and its statistics
  // end there (`accepted`: the candidates this pass accepted).
  void keep_first(Row& row, size_t delivered, size_t kept, int64_t accepted);
  bool uses_goodput(const Row& row) const;  // (once set_up made its schedule)
  std::vector<TokenTree> pass_trees(const std::vector<std::vector<int64_t>>& inputs) const;
  // The row drafts with the draft model (else by prompt lookup, suffix speculation or not at all).
  bool by_model(const Row& row) const {
    return use_draft_ && !row.config.speculates_without_model();
  }
  // What proposes the row's candidates (kDraftModel: the draft model, or nothing); goodput's
  // evidence is carried for each apart.
  static detail::Proposer proposer_kind(const Row& row) {
    return row.config.suffix_speculation             ? detail::kSuffix
           : row.config.prompt_lookup_num_tokens > 0 ? detail::kPromptLookup
                                                     : detail::kDraftModel;
  }
  // Prefix reuse (max_prefixes_ > 0): a finished row's sequence and target cache join the LRU; a
  // joining row starts from the longest prefix of its sequence held there (admit()).
  void remember(int64_t slot);
  // The most a row's first verification pass takes of its prompt: every row of the pass is
  // padded to it.
  int64_t first_pass_limit() const { return std::min(prefill_chunk_, kPrefillChunk); }
  // Tokens of the slot's sequence before its last that the target's cache does not hold.
  int64_t uncached(int64_t slot) const;
  // A row whose prompt is still going in: its callback (generate()'s and generate_batch()'s; a
  // RequestEngine request has cancel()) is called with no tokens, so that it may cancel the row.
  void prefill_progress(Row& row);

  EngineModels m_;
  const ModelConfig& tc_;
  GeneratorState& state_;
  RowSource& source_;
  const int64_t width_, max_length_;
  const BatchTokenCallback& on_tokens_;
  const BatchOptions& options_;
  PromptCache* prompt_cache_;
  const GreedyVerifier greedy_;
  const RejectionSamplingVerifier rejection_;
  Clock::time_point start_ = Clock::now();

  // slots_[i]: the row in cache row i (and the drafter's row i), null for a slot a finished row
  // freed, until the next step's admission or compact(). A batch starts longest prompt first
  // (chunked prefill); the next rows join in the freed slots, in place, and only slots that none
  // took are compacted (so under load no row's cache is copied when another finishes).
  std::vector<Row*> slots_;
  const bool use_draft_;
  bool goodput_ = false, first_ = true;
  bool exploring_ = false;  // this step's plan times pass sizes (GoodputPlanner::Plan::kExploring)
  Row placeholder_;         // the drafter's row for a slot no request holds yet
  struct Prefix {
    std::vector<int64_t> tokens;  // the positions `cache` holds
    KVCache cache;                // one row
  };
  std::list<Prefix> prefixes_;  // most recently used first
  const size_t max_prefixes_;
  // The entry holding the longest prefix of `tokens` (all but its last), and its length; end()
  // and 0 when none.
  std::list<Prefix>::iterator longest_prefix(const std::vector<int64_t>& tokens, int64_t& longest);
  // Copies `entry`'s first `length` positions into row `row` of `cache` (its most recent use);
  // returns `length`, or 0 for end().
  int64_t take_prefix(std::list<Prefix>::iterator entry, int64_t length, KVCache& cache,
                      int64_t row);
  // Rows whose prompts go in a part per step (admit()), or after a cached prefix; each holds a
  // slot's place in the width.
  struct Joining {
    Row* row;
    KVCache cache;  // one row, the prompt's positions
  };
  std::vector<Joining> joining_;
  int64_t unprefilled(const Joining& j) const {
    return static_cast<int64_t>(j.row->tokens.size()) - 1 - j.cache.length(0);
  }
  const int64_t prefill_chunk_;
  KVCache cache_;
  std::unique_ptr<DraftModelGenerator> drafter_;
  BatchStats bs_;
  // goodput's probe of the draft's cost (plan()) and the rows waiting for its evidence.
  LookaheadSchedule* probe_ = nullptr;
  std::vector<LookaheadSchedule*> waiting_;
  // This iteration's: the proposal limits, the draft passes of each slot before it, the seconds
  // of its draft and target passes, and the slots that finished (ascending).
  std::vector<int64_t> max_tokens_, row_passes_before_, finished_;
  double draft_seconds_ = 0, target_seconds_ = 0;
};

}  // namespace specdec::detail
