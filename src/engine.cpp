#include "engine.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "device.hpp"
#include "prefill.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"

namespace specdec::detail {

namespace {

bool is_eos(const std::vector<int64_t>& eos, int64_t tok) {
  return std::find(eos.begin(), eos.end(), tok) != eos.end();
}

// A one-row cache of at least `capacity` positions holding what `held` (one row, a prefix of `old`)
// holds of the common prefix of `old` and `tokens`, all but the last of `tokens` at most (a pass
// must compute that one); a new cache when `held` holds nothing, or no hidden states where
// `keep_hidden` asks for them.
KVCache continue_cache(const Model& model, KVCache held, int64_t capacity,
                       const std::vector<int64_t>& old, const std::vector<int64_t>& tokens,
                       bool keep_hidden = false) {
  if (held.num_layers() == 0 || (keep_hidden && !held.keeps_hidden()))
    return model.make_cache(capacity, 1, keep_hidden);
  const int64_t common =
      std::mismatch(old.begin(), old.end(), tokens.begin(), tokens.end()).first - old.begin();
  held.crop(0, std::min({common, static_cast<int64_t>(tokens.size()) - 1, held.length(0)}));
  if (held.capacity() >= capacity) return held;
  KVCache grown = model.make_cache(capacity, 1, held.keeps_hidden());
  grown.copy_row(held, 0, 0);
  return grown;
}

// The path through each node's first child (a draft's tree, best first: its chain).
Candidates first_children(const Candidates& c) {
  Candidates out;
  int64_t node = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c.parents[i] != node) continue;
    out.tokens.push_back(c.tokens[i]);
    if (!c.probs.empty()) out.probs.push_back(c.probs[i]);
    node = static_cast<int64_t>(i);
  }
  return out;
}

}  // namespace

int64_t prepare_row(Row& row, const EngineModels& m, const std::vector<int64_t>& prompt,
                    const GenerationConfig& user_config) {
  const ModelConfig& tc = m.target->config();
  try {
    user_config.validate();
  } catch (const Error& e) {
    throw Error(row.name + e.what());
  }
  row.prompt = prompt;
  row.config = user_config;
  GenerationConfig& config = row.config;
  if (config.eos_token_ids.empty()) config.eos_token_ids = tc.eos_token_ids;
  SPECDEC_CHECK(!prompt.empty(), row.name, "the prompt is empty (at least one token is needed)");
  for (int64_t id : prompt)
    SPECDEC_CHECK(id >= 0 && id < tc.vocab_size, row.name, "prompt token id ", id,
                  " is outside the vocabulary [0, ", tc.vocab_size, ")");
  for (const auto& bias : config.logit_bias)  // before it runs, not when its scores arrive
    SPECDEC_CHECK(bias.first < tc.vocab_size, row.name, "logit_bias token id ", bias.first,
                  " is outside the vocabulary [0, ", tc.vocab_size, ")");
  // Encoder-decoder models: the decoder starts from its start token (the prompt goes to the
  // encoder).
  row.tokens = tc.is_encoder_decoder ? std::vector<int64_t>{*tc.decoder_start_token_id} : prompt;
  // Bounded before anything is sized from them (and before the sum below could overflow).
  const int64_t max_sequence = limits().max_sequence_length;
  for (const size_t n : {prompt.size(), row.tokens.size()})
    SPECDEC_CHECK(static_cast<int64_t>(n) <= max_sequence &&
                      config.max_new_tokens <= max_sequence - static_cast<int64_t>(n),
                  row.name, "the prompt (", count_of(static_cast<int64_t>(n), "token"),
                  ") plus max_new_tokens (", config.max_new_tokens, ") exceeds the limit of ",
                  max_sequence, " positions (Limits::max_sequence_length)");
  const int64_t length = static_cast<int64_t>(row.tokens.size()) + config.max_new_tokens;
  // Positions past max_position_embeddings are refused up front, not met as a failure mid-way
  // (T5's relative positions have no such limit).
  for (const Model* model : {m.target.get(), m.draft.get()}) {
    if (!model || model->config().is_encoder_decoder) continue;
    SPECDEC_CHECK(length <= model->config().max_position_embeddings, row.name, "the prompt (",
                  count_of(static_cast<int64_t>(row.tokens.size()), "token"),
                  ") plus max_new_tokens (", config.max_new_tokens, ") is ", length,
                  " positions, more than the ", model == m.target.get() ? "target" : "draft",
                  "'s max_position_embeddings (", model->config().max_position_embeddings, ")");
  }
  return length;
}

Engine::Engine(EngineModels models, GeneratorState& state, RowSource& source, bool use_draft,
               int64_t width, int64_t max_length, const BatchTokenCallback& on_tokens,
               const BatchOptions& options, PromptCache* prompt_cache, int64_t max_prefixes,
               int64_t prefill_chunk)
    : m_(std::move(models)),
      tc_(m_.target->config()),
      state_(state),
      source_(source),
      width_(width),
      max_length_(max_length),
      on_tokens_(on_tokens),
      options_(options),
      prompt_cache_(prompt_cache),
      use_draft_(use_draft),
      // (An encoder-decoder model's decoder cache depends on its prompt's encoder output.)
      max_prefixes_(
          tc_.is_encoder_decoder ? 0 : static_cast<size_t>(std::max<int64_t>(0, max_prefixes))),
      prefill_chunk_(std::max<int64_t>(1, prefill_chunk)) {
  start();
}

// goodput: for a draft model and for proposals without one alike.
bool Engine::uses_goodput(const Row& row) const {
  return (use_draft_ || row.config.speculates_without_model()) &&
         row.schedule->kind() == Schedule::kGoodput;
}

// Trees where the target and the verifier take them.
DraftModelGenerator::Row Engine::draft_row(Row& row) const {
  const bool trees = !tc_.is_encoder_decoder && row.verifier->verifies_trees();
  return {&row.config, row.schedule.get(), row.rng.get(), trees ? row.config.draft_tree_width : 1,
          row.draft_encoder_states};
}

int64_t Engine::encode(Row& row, int64_t slot) {
  const at::Tensor ids = at::tensor(row.prompt, at::kLong).view({1, -1});
  const at::Tensor states = m_.target->encode(ids);  // [1, S, H]
  cache_.crop(slot, 0);                              // (a finished row's slot)
  m_.target->attach_encoder(states, cache_, slot);
  if (!use_draft_) return 1;
  row.draft_encoder_states = m_.share_encoder ? states : m_.draft->encode(ids);
  return m_.share_encoder ? 1 : 2;
}

void Engine::set_up(Row& row, std::optional<std::pair<double, double>> evidence) {
  GenerationConfig& config = row.config;
  row.admitted = Clock::now();
  row.result.stats.prompt_tokens = static_cast<int64_t>(row.prompt.size());
  row.result.stats.stop_reason = "max_new_tokens";
  row.rng = std::make_unique<Rng>(config.seed);
  row.schedule = std::make_unique<LookaheadSchedule>(config);
  goodput_ = goodput_ || uses_goodput(row);
  // A sampled request starts from num_assistant_tokens, not from the carried value: the lookahead
  // decides how many random draws each step takes, so carrying it would make a seed's tokens depend
  // on earlier or concurrent requests. (Greedy output never depends on the lookahead.)
  if (row.schedule->kind() == Schedule::kHeuristic && !config.sampling()) {
    std::lock_guard<std::mutex> lock(state_.carried_mutex);
    if (state_.carried_lookahead) row.schedule->set_num_tokens(*state_.carried_lookahead);
  }
  // goodput starts from the acceptance the last goodput request ended with (its tokens already
  // depend on timings, sampled or not).
  if (row.schedule->kind() == Schedule::kGoodput) {
    if (!evidence) {
      std::lock_guard<std::mutex> lock(state_.carried_mutex);
      evidence = state_.carried_evidence[proposer_kind(row)];
    }
    if (evidence) row.schedule->set_evidence(*evidence);
  }
  row.processors =
      std::make_unique<LogitsProcessorChain>(config, static_cast<int64_t>(row.tokens.size()));
  row.verifier = m_.custom_verifier  ? m_.custom_verifier.get()
                 : config.sampling() ? static_cast<const Verifier*>(&rejection_)
                                     : &greedy_;
  {  // every row's answer goes into the shared tree as it finishes, whatever it drafted by
    std::lock_guard<std::mutex> lock(state_.carried_mutex);
    row.suffix = state_.suffix;
  }
  if (config.prompt_lookup_num_tokens > 0) {
    row.proposer = std::make_unique<PromptLookupGenerator>(
        config.prompt_lookup_num_tokens, config.max_matching_ngram_size, config.eos_token_ids,
        config.prompt_lookup_match == "last");
  } else if (config.suffix_speculation) {
    // Trees where the target and the verifier take them.
    row.proposer = std::make_unique<SuffixGenerator>(
        row.suffix, config.eos_token_ids,
        !m_.target->config().is_encoder_decoder && row.verifier->verifies_trees());
  }
}

void Engine::start() {
  while (!source_.admits_all() && static_cast<int64_t>(slots_.size()) < width_) {
    Row* row = source_.next();
    if (!row) break;
    set_up(*row);
    slots_.push_back(row);
  }
  // An engine that starts empty (a RequestEngine's) admits every row in admit().
  first_ = !slots_.empty();
  std::stable_sort(slots_.begin(), slots_.end(),
                   [](const Row* a, const Row* b) { return a->tokens.size() > b->tokens.size(); });
  std::vector<const std::vector<int64_t>*> sequences;
  for (Row* row : slots_) sequences.push_back(&row->tokens);

  // A prompt cache (one request): its caches are taken, so that a request that fails leaves it
  // empty; they continue this request when they belong to these models (decoder-only).
  PromptCache held;
  if (prompt_cache_) {
    SPECDEC_CHECK(slots_.size() == 1, "generate: a PromptCache serves one request at a time");
    held = std::move(*prompt_cache_);
    prompt_cache_->clear();
  }
  const bool resume = prompt_cache_ && !tc_.is_encoder_decoder && held.target_ == m_.target;
  Row* const first = first_ ? slots_[0] : nullptr;
  // A feature-fed draft reads the target's hidden states from its cache.
  const bool features = use_draft_ && m_.draft->config().feature_size > 0;
  cache_ = resume ? continue_cache(*m_.target, std::move(held.target_cache_), max_length_,
                                   held.tokens_, first->tokens, features)
                  : m_.target->make_cache(max_length_, width_, features);
  if (resume) first->result.stats.cached_prompt_tokens = cache_.length(0);
  KVCache draft_cache;
  if (use_draft_ && resume && held.draft_ == m_.draft)
    draft_cache = continue_cache(*m_.draft, std::move(held.draft_cache_), max_length_, held.tokens_,
                                 first->tokens);
  double prefill_seconds =
      0;  // encoder passes and batch prefill, shared by the rows that start the batch
  if (tc_.is_encoder_decoder) {
    const auto t0 = Clock::now();
    for (size_t slot = 0; slot < slots_.size(); ++slot)
      slots_[slot]->result.stats.encoder_passes = encode(*slots_[slot], static_cast<int64_t>(slot));
    prefill_seconds += seconds_since(t0);
  }

  if (use_draft_) {
    std::vector<DraftModelGenerator::Row> draft_rows;
    for (Row* row : slots_) draft_rows.push_back(draft_row(*row));
    // The slots no row holds yet (admit() resets each as a row joins).
    placeholder_.rng = std::make_unique<Rng>(0);
    placeholder_.schedule = std::make_unique<LookaheadSchedule>(placeholder_.config);
    while (static_cast<int64_t>(draft_rows.size()) < width_)
      draft_rows.push_back(
          {&placeholder_.config, placeholder_.schedule.get(), placeholder_.rng.get(), 1, {}});
    DraftModelGenerator::Options options;
    options.target_vocab = tc_.vocab_size;
    options.cache = std::move(draft_cache);
    options.target_cache = features ? &cache_ : nullptr;
    drafter_ = std::make_unique<DraftModelGenerator>(m_.draft, std::move(draft_rows), max_length_,
                                                     std::move(options));
  }
  bool stopped = false;
  if (first_ && (width_ > 1 || uncached(0) > kPrefillChunk)) {
    // Prompts of different lengths: every row's prompt but its last token goes in first, in chunks
    // over the rows that still have tokens (no row padded to the longest prompt). One request keeps
    // Hugging Face's first pass over the whole prompt while it fits in one chunk. After each chunk
    // the rows' callbacks may cancel them (BatchTokenCallback); once all are, the prefill stops.
    const auto t0 = Clock::now();
    const int64_t passes = prefill_rows(*m_.target, cache_, sequences, 16, [&] {
      for (Row* row : slots_) prefill_progress(*row);
      return stopped = std::all_of(slots_.begin(), slots_.end(),
                                   [](const Row* row) { return row->cancelled.load(); });
    });
    for (Row* row : slots_) row->result.stats.prefill_passes = passes;
    prefill_seconds += seconds_since(t0);
  }
  for (Row* row : slots_) row->prefill_seconds = prefill_seconds;
  bs_.prefill_seconds = prefill_seconds;
  if (stopped) {  // (their caches hold part of their prompts: none is kept as a prefix)
    for (Row*& row : slots_) {
      row->result.stats.stop_reason = "cancelled";
      finish_row(*row);
      row = nullptr;
    }
    first_ = false;
  }
}

void Engine::prefill_progress(Row& row) {
  if (!on_tokens_ || row.sink || row.cancelled.load()) return;
  try {
    on_tokens_(row.index, {});
  } catch (const Cancelled&) {
    row.cancelled = true;
  } catch (...) {
    row.error = std::current_exception();
    row.cancelled = true;
  }
}

int64_t Engine::uncached(int64_t slot) const {
  return static_cast<int64_t>(slots_[slot]->tokens.size()) - 1 - cache_.length(slot);
}

bool Engine::step() {
  const bool decoding = running() > 0;
  const int64_t budget = admit(decoding);
  const bool prefilled = advance_joining(decoding, budget);
  compact();
  if (slots_.empty()) return prefilled;
  // goodput plans the first iteration too once the Generator has measured its costs: a request
  // after one whose draft the target rejected starts without speculation (and without the
  // draft's prefill).
  plan(!first_);
  draft();
  verify();
  commit();
  retire();
  first_ = false;
  return true;
}

// goodput: every goodput row's K for the next pass. Until the draft's cost is known (the first
// batch of a Generator), one row probes the draft and the others wait for what it shows: the
// shortest of those that can draft, so that a draft the target rejects costs one prompt's draft
// prefill, not the whole batch's. The waiting rows then start from the probe's evidence. In a
// batch the probe drafts one token (not the schedule's 2): the draft has prefilled its row
// (draft()), so its first pass already gives the draft's cost, and every row of the verification
// pass is padded to the probe's.
void Engine::plan(bool may_calibrate) {
  exploring_ = false;
  if (!goodput_) return;
  // The draft-model rows and the others are planned apart (proposals without a model cost nothing).
  for (const bool lookup : {false, true}) {
    std::vector<LookaheadSchedule*> schedules;
    const Row* shortest = nullptr;
    for (Row* row : slots_) {
      if (!uses_goodput(*row) || by_model(*row) == lookup) continue;
      schedules.push_back(row->schedule.get());
      const bool can_draft = row->config.max_new_tokens - row->result.stats.new_tokens > 1;
      if (can_draft && (!shortest || row->tokens.size() < shortest->tokens.size())) shortest = row;
    }
    if (schedules.empty()) continue;
    const GoodputPlanner::Plan planned =
        state_.goodput.plan(schedules, cache_, slots_[0]->tokens,
                            static_cast<int64_t>(slots_.size()), lookup, may_calibrate);
    exploring_ = exploring_ || planned == GoodputPlanner::Plan::kExploring;
    if (planned != GoodputPlanner::Plan::kUnknownDraft || lookup || !shortest) continue;
    probe_ = shortest->schedule.get();
    if (width_ > 1) probe_->set_num_tokens(std::min<int64_t>(probe_->num_tokens(), 1));
    for (LookaheadSchedule* s : schedules)
      if (s != probe_ && s->num_tokens() > 0) {
        s->set_num_tokens(0);
        waiting_.push_back(s);
      }
  }
}

// Proposals: at most remaining - 1 tokens per row, the target always adds one of its own.
void Engine::draft() {
  const auto b = static_cast<int64_t>(slots_.size());
  max_tokens_.clear();
  std::vector<const std::vector<int64_t>*> sequences;
  for (Row* row : slots_) {
    max_tokens_.push_back(
        std::max<int64_t>(0, row->config.max_new_tokens - row->result.stats.new_tokens - 1));
    sequences.push_back(&row->tokens);
  }
  row_passes_before_.assign(b, 0);
  // The draft prefills the rows that draft in this pass and that it has not seen yet, in passes of
  // their own: at the start every row that drafts (in chunks like the target's, rows still sorted
  // longest first), later a row that joined the batch or waited for goodput's probe. A row that
  // drafts again after iterations without drafts catches up in its proposal, in one pass padded to
  // the longest row (as one request's first proposal always does). One request with more to catch
  // up on than a chunk (a long prompt, or many tokens generated without drafting) puts its share
  // in in chunks too, after what the draft's cache holds.
  std::vector<int64_t> cold;
  std::vector<const std::vector<int64_t>*> cold_tokens;
  for (int64_t i = 0; drafter_ && !tc_.is_encoder_decoder && i < b; ++i) {
    const int64_t behind = static_cast<int64_t>(slots_[i]->tokens.size()) - 1 - drafter_->cached(i);
    if (by_model(*slots_[i]) && max_tokens_[i] > 0 && slots_[i]->schedule->num_tokens() > 0 &&
        (width_ > 1 ? drafter_->cached(i) == 0 : behind > kPrefillChunk)) {
      cold.push_back(i);
      cold_tokens.push_back(&slots_[i]->tokens);
    }
  }
  if (!cold.empty()) {
    const auto t0 = Clock::now();
    if (width_ == 1 || (first_ && static_cast<int64_t>(cold.size()) == b))
      drafter_->prefill(sequences);
    else
      drafter_->prefill(cold_tokens, cold);
    const double s = seconds_since(t0);
    bs_.prefill_seconds += s;
    for (const int64_t i : cold) slots_[i]->prefill_seconds += s;
  }
  const auto t0 = Clock::now();
  if (drafter_) {
    // The draft model proposes for its rows; the others ride along in its passes, feeding nothing.
    std::vector<int64_t> limits = max_tokens_;
    for (int64_t i = 0; i < b; ++i) {
      if (!by_model(*slots_[i])) limits[i] = 0;
      row_passes_before_[i] = drafter_->row_passes(i);
    }
    std::vector<Candidates> proposals = drafter_->propose_batch(sequences, limits);
    for (int64_t i = 0; i < b; ++i) {
      if (!by_model(*slots_[i])) continue;
      Candidates& cand = slots_[i]->cand = std::move(proposals[i]);
      // While goodput times each pass size, a tree's chain only: a pass of K + 1 tokens.
      if (exploring_ && cand.tree() && uses_goodput(*slots_[i])) cand = first_children(cand);
    }
    // The draft's cost per drafted token, from its passes that drafted one token per row.
    const DraftModelGenerator::SteadyPasses steady = drafter_->last_steady();
    if (goodput_ && steady.passes > 0)
      state_.goodput.observe_draft(b, steady.seconds / static_cast<double>(steady.passes));
  }
  for (int64_t i = 0; i < b; ++i) {
    Row& row = *slots_[i];
    if (by_model(row)) continue;
    // goodput: suffix speculation proposes up to the cap once drafting pays, prompt lookup
    // always (the cut may drop all of it: its estimates price in what it has not seen, so it
    // needs no evidence that drafting pays), and the cut below decides.
    const bool goodput = row.schedule->kind() == Schedule::kGoodput;
    const bool cut_later = row.proposer && (row.schedule->num_tokens() > 0 ||
                                            proposer_kind(row) == detail::kPromptLookup);
    const int64_t k = std::min(
        max_tokens_[i], !goodput || cut_later ? row.schedule->cap() : row.schedule->num_tokens());
    row.cand = row.proposer ? row.proposer->propose(row.tokens, k) : Candidates{};
  }
  // goodput's cut of the proposals whose tokens come with probabilities: prompt lookup's and
  // suffix speculation's (in a pass that prefills their row too: a prompt's tokens are computed,
  // not read, and the candidates after them cost what they add), a draft's trees (its chains are
  // goodput's K already; not in a pass that prefills, after the draft's own prefill).
  std::vector<detail::GoodputPlanner::Cuttable> cuttable;
  int64_t others = 0;  // the most tokens a row that is not cut puts in after its last one
  for (int64_t i = 0; i < b; ++i) {
    Row* row = slots_[i];
    const int64_t extra = uncached(i);
    row->cut = goodput_ && uses_goodput(*row) && !row->cand.probs.empty() &&
               !row->cand.q.defined() &&
               (!by_model(*row) || (row->cand.tree() && !first_ && extra == 0));
    if (row->cut)
      cuttable.push_back({proposer_kind(*row), &row->cand, extra});
    else
      others = std::max(others, extra + static_cast<int64_t>(row->cand.size()));
  }
  if (!cuttable.empty()) state_.goodput.cut(cuttable, b, others);
  draft_seconds_ = seconds_since(t0);
}

// The pass's trees (Model::forward), none when every row proposes a chain: a row's uncached
// tokens are a chain, its candidates hang under the last of them.
std::vector<TokenTree> Engine::pass_trees(const std::vector<std::vector<int64_t>>& inputs) const {
  std::vector<TokenTree> trees;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Candidates& c = slots_[i]->cand;
    if (!c.tree()) continue;
    trees.resize(slots_.size());
    const auto root = static_cast<int64_t>(inputs[i].size() - c.size()) - 1;
    TokenTree& tree = trees[i];
    for (int64_t j = 0; j <= root; ++j) tree.push_back(j - 1);
    for (const int64_t parent : c.parents) tree.push_back(parent < 0 ? root : root + 1 + parent);
  }
  return trees;
}

// One target pass over every row: [uncached tokens, c1..cK], padded to the longest row; keep the
// logits of each row's last K+1 positions, and every row's verdict.
void Engine::verify() {
  const auto b = static_cast<int64_t>(slots_.size());
  const auto t0 = Clock::now();
  std::vector<std::vector<int64_t>> inputs(b);
  int64_t keep = 1;
  for (int64_t i = 0; i < b; ++i) {
    Row& row = *slots_[i];
    row.verified_len = static_cast<int64_t>(row.tokens.size());
    inputs[i].assign(row.tokens.begin() + cache_.length(i), row.tokens.end());
    inputs[i].insert(inputs[i].end(), row.cand.tokens.begin(), row.cand.tokens.end());
    keep = std::max<int64_t>(keep, static_cast<int64_t>(row.cand.size()) + 1);
  }
  std::vector<int64_t> counts;
  const at::Tensor ids = padded_ids(inputs, counts);
  const int64_t t = ids.size(1);
  const at::Tensor logits =
      m_.target->forward(ids, cache_, keep, counts, pass_trees(inputs));  // [B, keep, V]
  std::vector<at::Tensor> decisions(b);  // [2] int64 each ([2 + K] for a tree), on the device
  int64_t width = 2;
  for (int64_t i = 0; i < b; ++i) {
    Row& row = *slots_[i];
    const auto k = static_cast<int64_t>(row.cand.size());
    at::Tensor scores = logits[i].narrow(0, logits.size(1) - (k + 1), k + 1);  // [K+1, V]
    if (row.top_logprobs >= 0)
      row.logprobs = at::log_softmax(scores.to(at::kFloat), -1).to(at::kCPU).contiguous();
    if (row.cand.tree() && !row.processors->empty()) {  // each node after its own path
      scores = row.processors->apply(scores, row.tokens, row.cand.tokens, row.cand.parents);
    } else if (row.processors->reads_history()) {
      std::vector<int64_t> history = row.tokens;
      history.insert(history.end(), row.cand.tokens.begin(), row.cand.tokens.end());
      scores = row.processors->apply(scores, history);
    } else if (!row.processors->empty()) {
      scores = row.processors->apply(scores, {});
    }
    decisions[i] = to_device(row.verifier->decide(scores, row.cand, *row.rng), logits.device());
    detail::check_decision(decisions[i], row.cand);
    width = std::max(width, decisions[i].size(0));
  }
  for (at::Tensor& d : decisions)
    if (d.size(0) < width) d = at::constant_pad_nd(d, {0, width - d.size(0)}, -1);
  // Every row's verdict in one copy: the pass's one wait for the device.
  const at::Tensor host = at::stack(decisions).to(at::kCPU).contiguous();  // [B, width]
  for (int64_t i = 0; i < b; ++i) {
    Row& row = *slots_[i];
    row.verdict = verdict_of(host.data_ptr<int64_t>() + width * i, row.cand, logits.size(-1));
    row.verifier->settle(row.verdict, row.cand, *row.rng);
    if (row.cand.tree() && row.logprobs.defined()) {  // the rows of the kept path, in order
      std::vector<int64_t> rows{0};
      for (const int64_t c : row.verdict.path) rows.push_back(c + 1);
      row.logprobs = row.logprobs.index_select(0, at::tensor(rows, at::kLong));
    }
  }
  target_seconds_ = seconds_since(t0);
  if (goodput_ && !first_) state_.goodput.observe_target(b * t, target_seconds_);
  if (first_) bs_.prefill_seconds += draft_seconds_ + target_seconds_;
  ++bs_.target_passes;
}

// Each row's new tokens: the accepted candidates, then the target's own; streamed; the rows that
// are done noted in finished_. A row whose callback throws fails alone (stop_reason "error").
void Engine::commit() {
  finished_.clear();
  for (int64_t i = 0; i < static_cast<int64_t>(slots_.size()); ++i) {
    Row& row = *slots_[i];
    GenerationStats& st = row.result.stats;
    const Candidates& cand = row.cand;
    const Verdict& verdict = row.verdict;
    const auto k = static_cast<int64_t>(cand.size());
    // A row's first iteration is part of its prefill.
    if (st.target_passes == 0) {
      row.prefill_seconds += draft_seconds_ + target_seconds_;
      if (drafter_) st.prefill_draft_passes = drafter_->row_passes(i) - row_passes_before_[i];
    } else {
      st.drafting_seconds += draft_seconds_;
      st.verification_seconds += target_seconds_;
    }
    ++st.target_passes;
    // An EOS among the new tokens ends the request right there; an accepted EOS candidate counts
    // as the target's token (as in Hugging Face, whose trace then shows one acceptance fewer).
    std::vector<int64_t> fresh;
    for (const int64_t c : verdict.path) fresh.push_back(cand.tokens[c]);
    fresh.push_back(verdict.next_token);
    int64_t accepted = verdict.accepted;
    bool stop_eos = false;
    for (size_t j = 0; j < fresh.size(); ++j) {
      if (is_eos(row.config.eos_token_ids, fresh[j])) {
        fresh.resize(j + 1);
        accepted = std::min<int64_t>(accepted, static_cast<int64_t>(j));
        stop_eos = true;
        break;
      }
    }
    const int64_t remaining = row.config.max_new_tokens - st.new_tokens;
    if (static_cast<int64_t>(fresh.size()) > remaining) fresh.resize(remaining);  // defensive

    // The kept candidates' keys/values (a tree's moved where a chain's would be), the rest dropped.
    cache_.keep_path(i, row.verified_len, verdict.path);
    row.tokens.insert(row.tokens.end(), fresh.begin(), fresh.end());
    row.result.tokens.insert(row.result.tokens.end(), fresh.begin(), fresh.end());
    st.new_tokens += static_cast<int64_t>(fresh.size());
    st.drafted_tokens += k;
    st.accepted_tokens += accepted;
    st.trace.push_back({k, accepted});
    st.tree_passes += cand.tree();
    // By position after the verified tokens: a tree's nodes by depth.
    const std::vector<int64_t> depths = cand.depths();
    const int64_t levels = depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end()) + 1;
    if (static_cast<int64_t>(st.drafted_at_position.size()) < levels) {
      st.drafted_at_position.resize(levels, 0);
      st.accepted_at_position.resize(levels, 0);
    }
    for (const int64_t d : depths) ++st.drafted_at_position[d];
    for (int64_t j = 0; j < accepted; ++j) ++st.accepted_at_position[j];
    if (drafter_ && by_model(row)) drafter_->on_verified_row(i, cand, accepted, row.tokens);
    if (row.cut && cand.size() > 0)  // (a proposal cut to nothing says nothing of its estimates)
      state_.goodput.observe_kept(proposer_kind(row), cand, verdict.path);
    // goodput's acceptance: a tree counts as a chain of its depth.
    if (row.proposer && row.schedule->kind() == Schedule::kGoodput)
      row.schedule->update(std::vector<double>(levels, 1.0), accepted);
    bs_.new_tokens += static_cast<int64_t>(fresh.size());
    if (stop_eos) st.stop_reason = "eos";
    bool done = stop_eos || st.new_tokens >= row.config.max_new_tokens;
    if (row.cancelled.load()) {
      // Cancelled before this pass's tokens went out: the result is what was delivered.
      keep_first(row, fresh.size(), 0, accepted);
      st.stop_reason = "cancelled";
      done = true;
    } else if (row.sink || on_tokens_) {
      try {
        deliver(i, fresh);
      } catch (const Cancelled& c) {
        // A row that had ended keeps its reason, unless the token that ended it is dropped.
        if (c.kept() < fresh.size()) {
          keep_first(row, fresh.size(), c.kept(), accepted);
          done = false;
        }
        if (!done) st.stop_reason = "cancelled";
        done = true;
      } catch (...) {
        row.error = std::current_exception();
        done = true;
      }
    }
    if (!done) continue;
    if (drafter_) st.draft_passes = drafter_->row_passes(i);
    finish_row(row);
    finished_.push_back(i);
  }
  for (LookaheadSchedule* s : waiting_)
    s->set_evidence(LookaheadSchedule::carry_evidence({probe_}));
  waiting_.clear();
}

void Engine::keep_first(Row& row, size_t delivered, size_t kept, int64_t accepted) {
  GenerationStats& st = row.result.stats;
  const auto dropped = static_cast<int64_t>(delivered - kept);
  row.tokens.resize(row.tokens.size() - dropped);
  row.result.tokens.resize(row.result.tokens.size() - dropped);
  st.new_tokens -= dropped;
  bs_.new_tokens -= dropped;
  // The last token kept counts as the target's own, as an accepted EOS does.
  const int64_t still =
      std::min<int64_t>(accepted, std::max<int64_t>(0, static_cast<int64_t>(kept) - 1));
  st.accepted_tokens -= accepted - still;
  st.trace.back()[1] = still;
  for (int64_t j = still; j < accepted; ++j) --st.accepted_at_position[j];
}

void Engine::deliver(int64_t slot, const std::vector<int64_t>& fresh) {
  Row& row = *slots_[slot];
  if (!row.sink) return on_tokens_(row.index, fresh);
  std::vector<TokenLogprob> logprobs;
  if (row.top_logprobs >= 0) {
    const int64_t vocab = row.logprobs.size(1);
    for (size_t j = 0; j < fresh.size(); ++j) {
      const at::Tensor lp = row.logprobs[static_cast<int64_t>(j)];  // [V]
      TokenLogprob t{fresh[j], lp.data_ptr<float>()[fresh[j]], {}};
      if (row.top_logprobs > 0) {
        const auto top = lp.topk(std::min(row.top_logprobs, vocab));
        const at::Tensor values = std::get<0>(top), ids = std::get<1>(top);  // [k] each
        for (int64_t r = 0; r < values.size(0); ++r)
          t.top.emplace_back(ids[r].item<int64_t>(), values[r].item<float>());
      }
      logprobs.push_back(std::move(t));
    }
  }
  row.sink(fresh, logprobs);
}

void Engine::finish_row(Row& row) {
  GenerationStats& st = row.result.stats;
  st.final_confidence_threshold = row.schedule->threshold();
  st.prefill_seconds = row.prefill_seconds;
  st.total_seconds = seconds_since(row.admitted);
  st.other_seconds = std::max(
      0.0, st.total_seconds - st.prefill_seconds - st.drafting_seconds - st.verification_seconds);
  if (options_.on_finished && !row.error) {
    try {
      options_.on_finished(row.index, row.result);
    } catch (...) {
      row.error = std::current_exception();
    }
  }
  if (row.error) {
    st.stop_reason = "error";
    try {
      std::rethrow_exception(row.error);
    } catch (const std::exception& e) {
      row.result.error = e.what();
    } catch (...) {
      row.result.error = "unknown exception";
    }
  }
  // What the next request starts from. "heuristic": the lookahead this row reached (Hugging Face
  // keeps it on the assistant model's generation config); "goodput": its acceptance evidence.
  {
    std::lock_guard<std::mutex> lock(state_.carried_mutex);
    if (by_model(row) && row.schedule->kind() == Schedule::kHeuristic)
      state_.carried_lookahead = row.schedule->num_tokens();
    if (uses_goodput(row))
      state_.carried_evidence[proposer_kind(row)] =
          LookaheadSchedule::carry_evidence({row.schedule.get()});
  }
  // Suffix speculation remembers what the target wrote (the tokens it verified), for every row.
  if (row.suffix)
    row.suffix->add(row.tokens, static_cast<int64_t>(row.tokens.size() - row.result.tokens.size()));
  row.done = true;
  finished(row);
}

void finished(Row& row) {
  if (!row.on_finished) return;
  try {
    row.on_finished(row.result);
  } catch (...) {  // the request is over: nothing is left for its exception to fail
  }
}

// Finished rows leave the batch; the next step's joining rows take their slots (admit(),
// advance_joining()) and compact() fills the rest.
BatchResult Engine::finish(std::vector<Row>& rows) {
  bs_.rows = static_cast<int64_t>(rows.size());
  bs_.draft_passes = drafter_ ? drafter_->passes() : 0;
  bs_.total_seconds = seconds_since(start_);
  BatchResult out;
  for (Row& row : rows) out.results.push_back(std::move(row.result));
  out.stats = bs_;
  // What the next request of this conversation continues (a failed request leaves it empty).
  if (prompt_cache_ && !tc_.is_encoder_decoder && !rows[0].error) {
    prompt_cache_->target_ = m_.target;
    prompt_cache_->tokens_ = rows[0].tokens;
    // (An EOS accepted from the draft can leave the positions after it in the cache.)
    cache_.crop(0, std::min(cache_.length(0), static_cast<int64_t>(rows[0].tokens.size())));
    prompt_cache_->target_cache_ = std::move(cache_);
    if (drafter_) {
      prompt_cache_->draft_ = m_.draft;
      prompt_cache_->draft_cache_ = drafter_->release_cache();
    }
  }
  return out;
}

}  // namespace specdec::detail
