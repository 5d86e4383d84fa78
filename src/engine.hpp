// The request engine (private): the rows of one batch from admission to their results, one
// iteration (step) at a time. Generator::generate, generate_batch and --prompts-file all run on it.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "goodput.hpp"
#include "specdec/candidates.hpp"
#include "specdec/generator.hpp"
#include "specdec/sampling.hpp"
#include "specdec/verifier.hpp"
#include "util.hpp"

namespace specdec::detail {

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
  // the last goodput request), for the draft model [0] and for prompt lookup [1].
  std::optional<std::pair<double, double>> carried_evidence[2];
};

// One sequence of a batch: its request, its state between iterations, and its result.
struct Row {
  size_t index = 0;  // the prompt's position in the batch
  std::string name;  // "" for a single request, else "row N: " (error messages)
  GenerationConfig config;
  std::vector<int64_t> tokens;  // the sequence the target continues; the cache holds a prefix of it
  std::unique_ptr<Rng> rng;
  std::unique_ptr<LookaheadSchedule> schedule;
  std::unique_ptr<LogitsProcessorChain> processors;
  std::unique_ptr<PromptLookupGenerator> lookup;
  const Verifier* verifier = nullptr;
  GenerationResult result;
  std::exception_ptr error;  // what its callback threw (stop_reason "error")
  // This iteration: the proposal, the length of the verified sequence it follows, the verdict.
  Candidates cand;
  int64_t verified_len = 0;
  Verdict verdict;
  // When it joined the batch, and the seconds of its prefill and first iteration.
  std::chrono::steady_clock::time_point admitted;
  double prefill_seconds = 0;
};

// The models of a Generator, as the engine uses them.
struct EngineModels {
  std::shared_ptr<const Model> target, draft;
  const Verifier* custom_verifier = nullptr;  // Generator::set_verifier's, or null
  bool share_encoder = false;  // encoder-decoder: the draft reuses the target's encoder output
};

// A batch of validated rows (Generator::run validates them): at most `width` at once, the others
// joining as rows finish (continuous batching). Each step drafts for the running rows, verifies
// them in one target pass, commits a different number of tokens per row and streams them, retires
// the rows that finished and admits the next ones. Decoder-only models, or encoder-decoder ones
// with every row at once.
class Engine {
 public:
  Engine(EngineModels models, GeneratorState& state, std::vector<Row>& rows,
         const std::vector<std::vector<int64_t>>& prompts, int64_t width, int64_t max_length,
         const BatchTokenCallback& on_tokens, const BatchOptions& options,
         PromptCache* prompt_cache);
  // One iteration over the running rows; false once every row is done.
  bool step();
  // The results, once step() returned false; carries the Generator's state to the next request
  // and fills the prompt cache.
  BatchResult finish();

 private:
  // A row's state is set up when it joins the batch (so that it starts from what the Generator
  // carries at that moment). `evidence`: goodput's acceptance evidence to start from, when not the
  // one the Generator carries.
  void set_up(Row& row, std::optional<std::pair<double, double>> evidence = {});
  void start();  // the caches, encoder passes, the drafter and the batch's first prefill
  void plan(bool may_calibrate);
  void draft();
  void verify();
  void commit();
  void retire();
  void admit();
  // The row's stats when it leaves the batch, and its on_finished.
  void finish_row(Row& row);
  bool uses_goodput(const Row& row) const;
  // Tokens of the slot's sequence before its last that the target's cache does not hold.
  int64_t uncached(int64_t slot) const;

  EngineModels m_;
  const ModelConfig& tc_;
  GeneratorState& state_;
  std::vector<Row>& rows_;
  const std::vector<std::vector<int64_t>>& prompts_;
  const int64_t width_, max_length_;
  const BatchTokenCallback& on_tokens_;
  const BatchOptions& options_;
  PromptCache* prompt_cache_;
  const GreedyVerifier greedy_;
  const RejectionSamplingVerifier rejection_;
  Clock::time_point start_ = Clock::now();

  // slots_[i]: the row in cache row i (and the drafter's row i). A batch starts longest prompt
  // first (chunked prefill); finished rows leave (compaction); the next prompts join in the freed
  // slots at the end.
  std::vector<Row*> slots_;
  int64_t queued_ = 0;  // the next prompt to join
  bool use_draft_ = false, goodput_ = false, first_ = true;
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
