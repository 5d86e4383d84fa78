#include "specdec/generator.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "device.hpp"
#include "specdec/candidates.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/sampling.hpp"
#include "prefill.hpp"
#include "specdec/verifier.hpp"
#include "util.hpp"

namespace specdec {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool is_eos(const std::vector<int64_t>& eos, int64_t tok) {
  return std::find(eos.begin(), eos.end(), tok) != eos.end();
}

}  // namespace

Generator::Generator(std::shared_ptr<const Model> target, std::shared_ptr<const Model> draft)
    : target_(std::move(target)), draft_(std::move(draft)) {
  SPECDEC_CHECK(target_ != nullptr, "Generator: target model is null");
  if (!draft_) return;
  const ModelConfig& t = target_->config();
  const ModelConfig& d = draft_->config();
  // Vocabulary sizes may differ by padding rows (Qwen2.5-7B has 152064, Qwen2.5-0.5B 151936): the
  // draft proposes over the target's ids with q = 0 where it has none. Whether the two tokenizers
  // agree on every real id is for the caller to check (require_same_tokenizer; the program does);
  // output stays exact either way, only acceptance depends on it.
  SPECDEC_CHECK(t.eos_token_ids == d.eos_token_ids,
                "draft and target have different eos_token_id: they must share a tokenizer");
  SPECDEC_CHECK(target_->device() == draft_->device(), "draft and target are on different devices");
  SPECDEC_CHECK(t.is_encoder_decoder == d.is_encoder_decoder, "draft (", d.model_type, ") and target (",
                t.model_type, ") must both be decoder-only or both encoder-decoder");
  SPECDEC_CHECK(t.decoder_start_token_id == d.decoder_start_token_id,
                "draft and target have different decoder_start_token_id");
  SPECDEC_CHECK(d.feature_size == 0 || (!t.is_encoder_decoder && d.feature_size == t.hidden_size),
                "the draft is feature-fed (specdec_feature_size ", d.feature_size,
                "): it needs a decoder-only target with hidden_size ", d.feature_size, ", not ", t.model_type,
                " with ", t.hidden_size);
  share_encoder_ = t.is_encoder_decoder && target_->same_encoder(*draft_);
}

bool Generator::plan_goodput(const std::vector<LookaheadSchedule*>& schedules, KVCache& cache,
                             const std::vector<int64_t>& tokens, bool free_drafts,
                             bool may_calibrate) const {
  // Calibration, once per Generator: target passes of `rows` tokens timed on row 0 of this
  // request's cache (appended after what it holds, then cropped away); every real pass refines
  // the curve after that. `tokens`: row 0's. `free_drafts`: prompt lookup, whose proposals cost
  // nothing beside a pass. A pass over as many tokens as the batch has rows first (what K = 0
  // costs); with prompt lookup, cap / 2 + 1 tokens (a costly one) once drafting could pay.
  const int64_t length = cache.length(0);
  const auto calibrate = [&](bool& done, int64_t rows) {
    {
      std::lock_guard<std::mutex> lock(costs_mutex_);
      if (!may_calibrate || done) return;
      done = true;
    }
    if (length >= static_cast<int64_t>(tokens.size()) || length + rows > cache.capacity()) return;
    const at::Tensor ids = at::full({1, rows}, tokens[length], at::kLong);
    const auto t0 = Clock::now();
    (void)target_->forward(ids, cache, 1);
    const double s = seconds_since(t0);
    cache.crop(0, length);
    std::lock_guard<std::mutex> lock(costs_mutex_);
    target_cost_.observe(rows, s);
  };
  int64_t cap = 0;
  for (const LookaheadSchedule* s : schedules) cap = std::max(cap, s->cap());
  const auto batch = static_cast<int64_t>(schedules.size());
  // The acceptance bounds (plan_lookahead) for one row only: in a batch, drafting one token to
  // bring evidence would cost every row a draft pass and a padded verification.
  std::vector<double> alphas, bounds;
  for (const LookaheadSchedule* s : schedules) {
    alphas.push_back(s->acceptance());
    bounds.push_back(batch == 1 ? s->acceptance_bound() : s->acceptance());
  }
  const auto costs = [&](PassCost& target, std::optional<double>& draft) {
    std::lock_guard<std::mutex> lock(costs_mutex_);
    target = target_cost_;
    if (free_drafts)
      draft = 0.0;
    else if (!draft_cost_.empty())
      draft = draft_cost_(batch);
  };
  calibrate(calibrated_first_, batch);
  PassCost target;
  std::optional<double> draft;
  costs(target, draft);
  // Until a draft pass has been timed, K stays where it is (at first the schedule's probe:
  // LookaheadSchedule's constructor).
  if (!draft) return false;
  // Drafting cannot pay if it loses even when every pass of K > 0 costs what one over `batch`
  // tokens (K = 0) costs, at a flat cost no less than that: the gain of drafting only shrinks as
  // the flat cost falls to the real one and as the real passes over more tokens cost more. Then
  // (at the estimates and at their bounds: plan_lookahead) K = 0 without the long pass.
  const double flat = target.ceiling(batch);
  const auto cost = [&](int64_t rows) { return target(rows); };
  if (flat > 0) {
    const auto flat_cost = [flat](int64_t) { return flat; };
    if (LookaheadSchedule::plan_lookahead(flat_cost, *draft, alphas, bounds, cap) == 0) {
      for (LookaheadSchedule* s : schedules) s->set_num_tokens(0);
      if (batch == 1 && !free_drafts) retime_draft(*schedules[0], cost, alphas);
      return true;
    }
  }
  // K is planned on the curve once it holds a timed pass for every K it could plan, from 1 up to
  // one whose pass has cap / 2 + 1 tokens or more. A draft model gets there with real iterations,
  // K = 1, 2, ... in turn, once per Generator (LookaheadSchedule::exploration): between observed
  // sizes the curve would be interpolated, and a pass over more tokens can cost less than one over
  // fewer (the kernels' tile shapes), which kept goodput from the K it should plan. Prompt lookup,
  // whose proposals can be shorter than asked, gets one timed pass over cap / 2 + 1 tokens. Above
  // the largest pass observed the curve is extrapolated, and a plan that goes there is a real pass
  // that refines it.
  const int64_t mid = LookaheadSchedule::timed_pass_tokens(cap);
  if (!free_drafts) {
    if (const int64_t k = LookaheadSchedule::exploration(target, flat, *draft, bounds, cap)) {
      for (LookaheadSchedule* s : schedules) s->set_num_tokens(std::min(k, s->cap()));
      return true;
    }
  } else if (target.size() < 2 || target.largest() < mid) {
    calibrate(calibrated_, mid);
    costs(target, draft);
    if (target.size() <= 1) return true;
  }
  if (batch == 1) {
    schedules[0]->plan(cost, *draft);
    if (!free_drafts) retime_draft(*schedules[0], cost, alphas);
    return true;
  }
  const int64_t k = LookaheadSchedule::plan_lookahead(cost, *draft, alphas, bounds, cap);
  for (LookaheadSchedule* s : schedules) s->set_num_tokens(std::min(k, s->cap()));
  return true;
}

void Generator::retime_draft(LookaheadSchedule& schedule, const std::function<double(int64_t)>& target_cost,
                             const std::vector<double>& alphas) const {
  std::lock_guard<std::mutex> lock(costs_mutex_);
  if (schedule.num_tokens() > 0) {  // drafting (again): the next stretch without it waits the least
    costly_draft_iterations_ = 0;
    retime_after_ = kRetimeFirst;
    return;
  }
  // K = 0 whatever the draft costs: nothing to learn from timing it
  if (LookaheadSchedule::best_lookahead(target_cost, 0.0, alphas, schedule.cap()) == 0) return;
  if (costly_draft_iterations_++ < retime_after_) return;
  costly_draft_iterations_ = 0;
  retime_after_ = std::min(2 * retime_after_, kRetimeLast);
  schedule.set_num_tokens(std::min<int64_t>(2, schedule.cap()));  // as the first probe: its second pass is timed
}

GenerationResult Generator::generate(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                                     const TokenCallback& on_token) const {
  BatchTokenCallback each;
  if (on_token) each = [&](size_t, const std::vector<int64_t>& fresh) { on_token(fresh); };
  return torch_errors_as_specdec("generate", [&] { return run({prompt}, {config}, each, {}); })
      .results[0];
}

GenerationResult Generator::generate(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                                     PromptCache& cache, const TokenCallback& on_token) const {
  BatchTokenCallback each;
  if (on_token) each = [&](size_t, const std::vector<int64_t>& fresh) { on_token(fresh); };
  return torch_errors_as_specdec("generate", [&] { return run({prompt}, {config}, each, {}, &cache); })
      .results[0];
}

BatchResult Generator::generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                                      const std::vector<GenerationConfig>& configs,
                                      const BatchTokenCallback& on_tokens,
                                      const BatchOptions& options) const {
  SPECDEC_CHECK(options.max_rows >= 0,
                "generate_batch: max_rows must be >= 0 (0: every prompt at once), got ",
                options.max_rows);
  return torch_errors_as_specdec("generate_batch",
                                 [&] { return run(prompts, configs, on_tokens, options); });
}

namespace {

// A one-row cache of at least `capacity` positions holding what `held` (one row, a prefix of `old`)
// holds of the common prefix of `old` and `tokens`, all but the last of `tokens` at most (a pass
// must compute that one); a new cache when `held` holds nothing, or no hidden states where
// `keep_hidden` asks for them.
KVCache continue_cache(const Model& model, KVCache held, int64_t capacity, const std::vector<int64_t>& old,
                       const std::vector<int64_t>& tokens, bool keep_hidden = false) {
  if (held.num_layers() == 0 || (keep_hidden && !held.keeps_hidden())) return model.make_cache(capacity, 1, keep_hidden);
  const int64_t common = std::mismatch(old.begin(), old.end(), tokens.begin(), tokens.end()).first - old.begin();
  held.crop(0, std::min({common, static_cast<int64_t>(tokens.size()) - 1, held.length(0)}));
  if (held.capacity() >= capacity) return held;
  KVCache grown = model.make_cache(capacity, 1, held.keeps_hidden());
  grown.copy_row(held, 0, 0);
  return grown;
}

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
  // This iteration: the proposal, and the length of the verified sequence it follows.
  Candidates cand;
  int64_t verified_len = 0;
  // When it joined the batch, and the seconds of its prefill and first iteration.
  std::chrono::steady_clock::time_point admitted;
  double prefill_seconds = 0;
};

}  // namespace

BatchResult Generator::run(const std::vector<std::vector<int64_t>>& prompts,
                           const std::vector<GenerationConfig>& configs,
                           const BatchTokenCallback& on_tokens, const BatchOptions& options,
                           PromptCache* prompt_cache) const {
  const auto start = Clock::now();
  const ModelConfig& tc = target_->config();
  SPECDEC_CHECK(!prompts.empty(), "generate_batch: the batch is empty (at least one prompt is needed)");
  SPECDEC_CHECK(configs.size() == 1 || configs.size() == prompts.size(), "generate_batch: ", configs.size(),
                " configs for ", prompts.size(), " prompts (give one, or one per prompt)");
  const auto batch = static_cast<int64_t>(prompts.size());
  const GreedyVerifier greedy;
  const RejectionSamplingVerifier rejection;

  // Validation first: nothing runs unless every row is valid.
  std::vector<Row> rows(batch);
  int64_t max_length = 0;
  for (int64_t r = 0; r < batch; ++r) {
    Row& row = rows[r];
    row.index = static_cast<size_t>(r);
    row.name = batch == 1 ? "" : "row " + std::to_string(r) + ": ";
    const std::vector<int64_t>& prompt = prompts[r];
    const GenerationConfig& user_config = configs.size() == 1 ? configs[0] : configs[r];
    try {
      user_config.validate();
    } catch (const Error& e) {
      throw Error(row.name + e.what());
    }
    row.config = user_config;
    GenerationConfig& config = row.config;
    if (config.eos_token_ids.empty()) config.eos_token_ids = tc.eos_token_ids;
    SPECDEC_CHECK(!prompt.empty(), "generate: ", row.name, "the prompt is empty (at least one token is needed)");
    for (int64_t id : prompt)
      SPECDEC_CHECK(id >= 0 && id < tc.vocab_size, "generate: ", row.name, "prompt token id ", id,
                    " is outside the vocabulary [0, ", tc.vocab_size, ")");
    SPECDEC_CHECK((config.prompt_lookup_num_tokens > 0) == (rows[0].config.prompt_lookup_num_tokens > 0),
                  "generate_batch: ", row.name, "prompt_lookup_num_tokens is ", config.prompt_lookup_num_tokens,
                  " but ", rows[0].config.prompt_lookup_num_tokens,
                  " for row 0: every request of a batch must use prompt lookup, or none");
    // Encoder-decoder models: the decoder starts from its start token (the prompt goes to the encoder).
    row.tokens = tc.is_encoder_decoder ? std::vector<int64_t>{*tc.decoder_start_token_id} : prompt;
    // Bounded before anything is sized from them (and before the sum below could overflow).
    const int64_t max_sequence = limits().max_sequence_length;
    for (const size_t n : {prompt.size(), row.tokens.size()})
      SPECDEC_CHECK(static_cast<int64_t>(n) <= max_sequence && config.max_new_tokens <= max_sequence - static_cast<int64_t>(n),
                    row.name, "the prompt (", n, " tokens) plus max_new_tokens (", config.max_new_tokens,
                    ") exceeds the limit of ", max_sequence, " positions (Limits::max_sequence_length)");
    const int64_t length = static_cast<int64_t>(row.tokens.size()) + config.max_new_tokens;
    // Positions past max_position_embeddings are refused up front, not met as a failure mid-way
    // (T5's relative positions have no such limit).
    for (const Model* m : {target_.get(), draft_.get()}) {
      if (!m || m->config().is_encoder_decoder) continue;
      SPECDEC_CHECK(length <= m->config().max_position_embeddings, row.name, "the prompt (", row.tokens.size(),
                    " tokens) plus max_new_tokens (", config.max_new_tokens, ") is ", length,
                    " positions, more than the ", m == target_.get() ? "target" : "draft",
                    "'s max_position_embeddings (", m->config().max_position_embeddings, ")");
    }
    max_length = std::max(max_length, length);
  }

  c10::InferenceMode inference_guard;
  const int64_t width = options.max_rows > 0 ? std::min(options.max_rows, batch) : batch;
  if (width < batch && tc.is_encoder_decoder) {
    // Encoder-decoder models: consecutive groups of max_rows (a row's encoder output is attached
    // to the batch's cache when the batch starts).
    BatchResult out;
    out.stats.rows = batch;
    for (int64_t first = 0; first < batch; first += width) {
      const int64_t n = std::min(width, batch - first);
      const std::vector<std::vector<int64_t>> group(prompts.begin() + first,
                                                    prompts.begin() + first + n);
      std::vector<GenerationConfig> group_configs(configs);
      if (configs.size() > 1)
        group_configs.assign(configs.begin() + first, configs.begin() + first + n);
      BatchTokenCallback tokens;
      if (on_tokens)
        tokens = [&](size_t r, const std::vector<int64_t>& t) { on_tokens(first + r, t); };
      BatchOptions group_options;
      if (options.on_finished)
        group_options.on_finished = [&](size_t r, const GenerationResult& g) {
          options.on_finished(first + r, g);
        };
      BatchResult part = run(group, group_configs, tokens, group_options);
      for (GenerationResult& g : part.results) out.results.push_back(std::move(g));
      out.stats.new_tokens += part.stats.new_tokens;
      out.stats.target_passes += part.stats.target_passes;
      out.stats.draft_passes += part.stats.draft_passes;
      out.stats.prefill_seconds += part.stats.prefill_seconds;
    }
    out.stats.total_seconds = seconds_since(start);
    return out;
  }

  // A row's state is set up when it joins the batch (so that it starts from what the Generator
  // carries at that moment). `evidence`: goodput's acceptance evidence to start from, when not the
  // one the Generator carries.
  const auto set_up = [&](Row& row, std::optional<std::pair<double, double>> evidence = {}) {
    GenerationConfig& config = row.config;
    row.admitted = Clock::now();
    row.result.stats.prompt_tokens = static_cast<int64_t>(prompts[row.index].size());
    row.result.stats.stop_reason = "max_new_tokens";
    row.rng = std::make_unique<Rng>(config.seed);
    row.schedule = std::make_unique<LookaheadSchedule>(config);
    // A sampled request starts from num_assistant_tokens, not from the carried value: the lookahead
    // decides how many random draws each step takes, so carrying it would make a seed's tokens depend
    // on earlier or concurrent requests. (Greedy output never depends on the lookahead.)
    if (config.num_assistant_tokens_schedule == "heuristic" && !config.sampling()) {
      std::lock_guard<std::mutex> lock(carried_mutex_);
      if (carried_lookahead_) row.schedule->set_num_tokens(*carried_lookahead_);
    }
    // goodput starts from the acceptance the last goodput request ended with (its tokens already
    // depend on timings, sampled or not).
    if (config.num_assistant_tokens_schedule == "goodput") {
      if (!evidence) {
        std::lock_guard<std::mutex> lock(carried_mutex_);
        evidence = carried_evidence_[config.prompt_lookup_num_tokens > 0];
      }
      if (evidence) row.schedule->set_evidence(*evidence);
    }
    row.processors = std::make_unique<LogitsProcessorChain>(config);
    if (config.prompt_lookup_num_tokens > 0)
      row.lookup = std::make_unique<PromptLookupGenerator>(config.prompt_lookup_num_tokens, config.max_matching_ngram_size,
                                                           config.eos_token_ids, config.prompt_lookup_match == "last");
    row.verifier = custom_verifier_ ? custom_verifier_.get()
                   : config.sampling() ? static_cast<const Verifier*>(&rejection)
                                       : &greedy;
  };

  // slots[i]: the row in cache row i (and the drafter's row i). A batch starts longest prompt first
  // (chunked prefill below); finished rows leave (compaction); with max_rows, the next prompts join
  // in the freed slots at the end.
  std::vector<Row*> slots;
  for (int64_t r = 0; r < width; ++r) {
    set_up(rows[r]);
    slots.push_back(&rows[r]);
  }
  int64_t queued = width;  // the next prompt to join
  std::stable_sort(slots.begin(), slots.end(), [](const Row* a, const Row* b) { return a->tokens.size() > b->tokens.size(); });
  std::vector<const std::vector<int64_t>*> sequences;
  for (Row* row : slots) sequences.push_back(&row->tokens);

  const bool use_draft = draft_ && rows[0].config.prompt_lookup_num_tokens == 0;
  // A prompt cache (one request): its caches are taken, so that a request that fails leaves it
  // empty; they continue this request when they belong to these models (decoder-only).
  PromptCache held;
  if (prompt_cache) {
    SPECDEC_CHECK(batch == 1, "generate: a PromptCache serves one request at a time");
    held = std::move(*prompt_cache);
    prompt_cache->clear();
  }
  const bool resume = prompt_cache && !tc.is_encoder_decoder && held.target_ == target_;
  // A feature-fed draft reads the target's hidden states from its cache.
  const bool features = use_draft && draft_->config().feature_size > 0;
  KVCache cache = resume ? continue_cache(*target_, std::move(held.target_cache_), max_length, held.tokens_,
                                          rows[0].tokens, features)
                         : target_->make_cache(max_length, width, features);
  if (resume) rows[0].result.stats.cached_prompt_tokens = cache.length(0);
  KVCache draft_cache;
  if (use_draft && resume && held.draft_ == draft_)
    draft_cache = continue_cache(*draft_, std::move(held.draft_cache_), max_length, held.tokens_, rows[0].tokens);
  at::Tensor draft_states;  // encoder-decoder: what the draft's decoder attends to
  std::vector<int64_t> encoder_lengths;
  double prefill_seconds =
      0;  // encoder passes and batch prefill, shared by the rows that start the batch
  if (tc.is_encoder_decoder) {
    // One encoder pass per prompt (no padding inside the encoder), padded to the longest.
    const auto t0 = Clock::now();
    int64_t longest = 0;
    for (const Row* row : slots) {
      encoder_lengths.push_back(static_cast<int64_t>(prompts[row->index].size()));
      longest = std::max(longest, encoder_lengths.back());
    }
    const auto encode = [&](const Model& m) {
      std::vector<at::Tensor> states;
      for (const Row* row : slots) {
        const at::Tensor s = m.encode(at::tensor(prompts[row->index], at::kLong).view({1, -1}));  // [1, S_r, H]
        states.push_back(at::constant_pad_nd(s, {0, 0, 0, longest - s.size(1)}));
      }
      return at::cat(states);  // [B, S, H]
    };
    const at::Tensor states = encode(*target_);
    target_->attach_encoder(states, cache, encoder_lengths);
    int64_t passes = 1;
    if (use_draft) {
      draft_states = share_encoder_ ? states : encode(*draft_);
      if (!share_encoder_) ++passes;
    }
    for (Row* row : slots) row->result.stats.encoder_passes = passes;
    prefill_seconds += seconds_since(t0);
  }

  std::unique_ptr<DraftModelGenerator> drafter;
  if (use_draft) {
    std::vector<DraftModelGenerator::Row> draft_rows;
    for (Row* row : slots) draft_rows.push_back({&row->config, row->schedule.get(), row->rng.get()});
    drafter = std::make_unique<DraftModelGenerator>(draft_, std::move(draft_rows), max_length, draft_states,
                                                    encoder_lengths, tc.vocab_size, std::move(draft_cache),
                                                    features ? &cache : nullptr);
  }
  if (width > 1) {
    // Prompts of different lengths: every row's prompt but its last token goes in first, in chunks
    // over the rows that still have tokens (no row padded to the longest prompt). One request keeps
    // Hugging Face's first pass over the whole prompt.
    const auto t0 = Clock::now();
    prefill_rows(*target_, cache, sequences);
    prefill_seconds += seconds_since(t0);
  }
  for (Row* row : slots) row->prefill_seconds = prefill_seconds;
  BatchStats bs;
  bs.rows = batch;
  bs.prefill_seconds = prefill_seconds;
  // goodput: for a draft model and for prompt lookup alike.
  const auto uses_goodput = [&](const Row& row) {
    return (use_draft || row.config.prompt_lookup_num_tokens > 0) &&
           row.config.num_assistant_tokens_schedule == "goodput";
  };
  bool goodput = false;
  for (const Row& row : rows) goodput = goodput || uses_goodput(row);
  // A row's stats when it leaves the batch.
  const auto finish = [&](Row& row) {
    GenerationStats& st = row.result.stats;
    st.final_confidence_threshold = row.schedule->threshold();
    st.prefill_seconds = row.prefill_seconds;
    st.total_seconds = seconds_since(row.admitted);
    st.other_seconds = std::max(
        0.0, st.total_seconds - st.prefill_seconds - st.drafting_seconds - st.verification_seconds);
    if (options.on_finished) options.on_finished(row.index, row.result);
  };

  // goodput: every goodput row's K for the next pass. Until the draft's cost is known (the first
  // batch of a Generator), one row probes the draft and the others wait for what it shows: the
  // shortest of those that can draft, so that a draft the target rejects costs one prompt's draft
  // prefill, not the whole batch's. The waiting rows then start from the probe's evidence. In a
  // batch the probe drafts one token (not the schedule's 2): the draft has prefilled its row
  // (below), so its first pass already gives the draft's cost, and every row of the verification
  // pass is padded to the probe's.
  LookaheadSchedule* probe = nullptr;
  std::vector<LookaheadSchedule*> waiting;
  const auto plan = [&](bool may_calibrate) {
    if (!goodput) return;
    std::vector<LookaheadSchedule*> schedules;
    const Row* shortest = nullptr;
    for (Row* row : slots) {
      if (!uses_goodput(*row)) continue;
      schedules.push_back(row->schedule.get());
      const bool can_draft = row->config.max_new_tokens - row->result.stats.new_tokens > 1;
      if (can_draft && (!shortest || row->tokens.size() < shortest->tokens.size())) shortest = row;
    }
    if (schedules.empty() || plan_goodput(schedules, cache, slots[0]->tokens, !use_draft, may_calibrate) ||
        !use_draft || !shortest)
      return;
    probe = shortest->schedule.get();
    if (width > 1) probe->set_num_tokens(std::min<int64_t>(probe->num_tokens(), 1));
    for (LookaheadSchedule* s : schedules)
      if (s != probe && s->num_tokens() > 0) {
        s->set_num_tokens(0);
        waiting.push_back(s);
      }
  };

  for (bool first = true; !slots.empty(); first = false) {
    const auto b = static_cast<int64_t>(slots.size());
    // goodput plans the first iteration too once the Generator has measured its costs: a request
    // after one whose draft the target rejected starts without speculation (and without the
    // draft's prefill, below).
    plan(!first);
    // Proposals: at most remaining - 1 tokens per row, the target always adds one of its own.
    std::vector<int64_t> max_tokens;
    sequences.clear();
    bool drafting = false;
    for (Row* row : slots) {
      max_tokens.push_back(std::max<int64_t>(0, row->config.max_new_tokens - row->result.stats.new_tokens - 1));
      sequences.push_back(&row->tokens);
      drafting = drafting || (max_tokens.back() > 0 && row->schedule->num_tokens() > 0);
    }
    std::vector<int64_t> row_passes_before(b, 0);
    if (drafter && width > 1 && drafting && !tc.is_encoder_decoder) {
      // The draft prefills the rows that draft in this pass and that it has not seen yet, in
      // passes of their own: at the start every row that drafts (in chunks like the target's,
      // rows still sorted longest first), later a row that joined the batch or waited for goodput's
      // probe. A row that drafts again after iterations without drafts catches up in its proposal,
      // in one pass padded to the longest row (as one request's first proposal always does).
      std::vector<int64_t> cold;
      std::vector<const std::vector<int64_t>*> cold_tokens;
      for (int64_t i = 0; i < b; ++i)
        if (max_tokens[i] > 0 && slots[i]->schedule->num_tokens() > 0 && drafter->cached(i) == 0) {
          cold.push_back(i);
          cold_tokens.push_back(&slots[i]->tokens);
        }
      const auto t0 = Clock::now();
      if (first && static_cast<int64_t>(cold.size()) == b)
        drafter->prefill(sequences);
      else if (!cold.empty())
        drafter->prefill(cold_tokens, cold);
      const double s = seconds_since(t0);
      bs.prefill_seconds += s;
      for (const int64_t i : cold) slots[i]->prefill_seconds += s;
    }
    auto t0 = Clock::now();
    if (drafter) {
      for (int64_t i = 0; i < b; ++i) row_passes_before[i] = drafter->row_passes(i);
      std::vector<Candidates> proposals = drafter->propose_batch(sequences, max_tokens);
      for (int64_t i = 0; i < b; ++i) slots[i]->cand = std::move(proposals[i]);
      // The draft's cost per drafted token, from its passes that drafted one token per row.
      const DraftModelGenerator::SteadyPasses steady = drafter->last_steady();
      if (goodput && steady.passes > 0) {
        std::lock_guard<std::mutex> lock(costs_mutex_);
        draft_cost_.observe(b, steady.seconds / static_cast<double>(steady.passes));
      }
    } else {
      for (int64_t i = 0; i < b; ++i) {
        Row& row = *slots[i];
        const int64_t k = row.schedule->kind() == "goodput" ? std::min(max_tokens[i], row.schedule->num_tokens())
                                                            : max_tokens[i];
        row.cand = row.lookup && k > 0 ? row.lookup->propose(row.tokens, k) : Candidates{};
      }
    }
    const double draft_seconds = seconds_since(t0);

    // One target pass over every row: [uncached tokens, c1..cK], padded to the longest row; keep
    // the logits of each row's last K+1 positions.
    t0 = Clock::now();
    std::vector<std::vector<int64_t>> inputs(b);
    int64_t keep = 1;
    for (int64_t i = 0; i < b; ++i) {
      Row& row = *slots[i];
      row.verified_len = static_cast<int64_t>(row.tokens.size());
      inputs[i].assign(row.tokens.begin() + cache.length(i), row.tokens.end());
      inputs[i].insert(inputs[i].end(), row.cand.tokens.begin(), row.cand.tokens.end());
      keep = std::max<int64_t>(keep, static_cast<int64_t>(row.cand.size()) + 1);
    }
    std::vector<int64_t> counts;
    const at::Tensor ids = padded_ids(inputs, counts);
    const int64_t t = ids.size(1);
    const at::Tensor logits = target_->forward(ids, cache, keep, counts);  // [B, keep, V]
    std::vector<Verdict> verdicts(b);
    std::vector<at::Tensor> decisions(b);  // [2] int64 each, on the device
    for (int64_t i = 0; i < b; ++i) {
      Row& row = *slots[i];
      const auto k = static_cast<int64_t>(row.cand.size());
      at::Tensor scores = logits[i].narrow(0, logits.size(1) - (k + 1), k + 1);  // [K+1, V]
      if (!row.processors->empty()) {
        std::vector<int64_t> history = row.tokens;
        history.insert(history.end(), row.cand.tokens.begin(), row.cand.tokens.end());
        scores = row.processors->apply(scores, history);
      }
      decisions[i] = detail::to_device(row.verifier->decide(scores, row.cand, *row.rng), logits.device());
    }
    // Every row's verdict in one copy: the pass's one wait for the device.
    const at::Tensor host = at::stack(decisions).to(at::kCPU).contiguous();  // [B, 2]
    for (int64_t i = 0; i < b; ++i) {
      Row& row = *slots[i];
      verdicts[i].accepted = host.data_ptr<int64_t>()[2 * i];
      verdicts[i].next_token = host.data_ptr<int64_t>()[2 * i + 1];
      row.verifier->settle(verdicts[i], row.cand, *row.rng);
    }
    const double target_seconds = seconds_since(t0);
    if (goodput && !first) {
      std::lock_guard<std::mutex> lock(costs_mutex_);
      target_cost_.observe(b * t, target_seconds);
    }
    if (first) bs.prefill_seconds += draft_seconds + target_seconds;
    ++bs.target_passes;

    std::vector<int64_t> finished;  // slots, ascending
    for (int64_t i = 0; i < b; ++i) {
      Row& row = *slots[i];
      GenerationStats& st = row.result.stats;
      const Candidates& cand = row.cand;
      const Verdict& verdict = verdicts[i];
      const auto k = static_cast<int64_t>(cand.size());
      // A row's first iteration is part of its prefill.
      if (st.target_passes == 0) {
        row.prefill_seconds += draft_seconds + target_seconds;
        if (drafter) st.prefill_draft_passes = drafter->row_passes(i) - row_passes_before[i];
      } else {
        st.drafting_seconds += draft_seconds;
        st.verification_seconds += target_seconds;
      }
      ++st.target_passes;
      // New tokens: the accepted candidates, then the target's own token. An EOS among them ends
      // the request right there; an accepted EOS candidate counts as the target's token (as in
      // Hugging Face, whose trace then shows one acceptance fewer).
      std::vector<int64_t> fresh(cand.tokens.begin(), cand.tokens.begin() + verdict.accepted);
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

      cache.crop(i, row.verified_len + verdict.accepted);  // drop rejected candidates' keys/values
      row.tokens.insert(row.tokens.end(), fresh.begin(), fresh.end());
      row.result.tokens.insert(row.result.tokens.end(), fresh.begin(), fresh.end());
      st.new_tokens += static_cast<int64_t>(fresh.size());
      st.drafted_tokens += k;
      st.accepted_tokens += accepted;
      st.trace.push_back({k, accepted});
      if (static_cast<int64_t>(st.drafted_at_position.size()) < k) {
        st.drafted_at_position.resize(k, 0);
        st.accepted_at_position.resize(k, 0);
      }
      for (int64_t j = 0; j < k; ++j) {
        ++st.drafted_at_position[j];
        if (j < accepted) ++st.accepted_at_position[j];
      }
      if (drafter) drafter->on_verified_row(i, cand, accepted, row.tokens);
      if (row.lookup && row.schedule->kind() == "goodput") row.schedule->update(std::vector<double>(k, 1.0), accepted);
      bs.new_tokens += static_cast<int64_t>(fresh.size());
      if (stop_eos) st.stop_reason = "eos";
      bool done = stop_eos || st.new_tokens >= row.config.max_new_tokens;
      if (on_tokens) {
        try {
          on_tokens(row.index, fresh);
        } catch (const Cancelled&) {
          st.stop_reason = "cancelled";
          done = true;
        }
      }
      if (!done) continue;
      if (drafter) st.draft_passes = drafter->row_passes(i);
      finish(row);
      finished.push_back(i);
    }

    for (LookaheadSchedule* s : waiting) s->set_evidence(LookaheadSchedule::carry_evidence({probe}));
    waiting.clear();

    // Finished rows leave the batch: the last active row moves into each freed slot.
    for (auto it = finished.rbegin(); it != finished.rend(); ++it) {
      const int64_t last = static_cast<int64_t>(slots.size()) - 1;
      if (*it != last) {
        cache.copy_row(last, *it);
        if (drafter) drafter->move_row(last, *it);
        slots[*it] = slots[last];
      }
      slots.pop_back();
    }

    // Continuous batching: the next prompts take the freed slots, at the end, each prefilled on its
    // own (the draft's too when it drafts now); their last prompt token goes into the next pass.
    if (queued < batch && static_cast<int64_t>(slots.size()) < width) {
      const auto t1 = Clock::now();
      std::vector<int64_t> joined;
      std::vector<const std::vector<int64_t>*> joined_tokens;
      // goodput: a joining row starts from the evidence of the rows admitted before it, as the
      // next request would.
      std::optional<std::pair<double, double>> evidence;
      if (goodput) {
        std::vector<const LookaheadSchedule*> admitted;
        for (int64_t r = 0; r < queued; ++r)
          if (uses_goodput(rows[r])) admitted.push_back(rows[r].schedule.get());
        if (!admitted.empty()) evidence = LookaheadSchedule::carry_evidence(admitted);
      }
      while (queued < batch && static_cast<int64_t>(slots.size()) < width) {
        Row& row = rows[queued++];
        set_up(row, evidence);
        const auto slot =
            static_cast<int64_t>(slots.size());  // prefill_into overwrites its cache row
        slots.push_back(&row);
        joined.push_back(slot);
        joined_tokens.push_back(&row.tokens);
        if (drafter) drafter->reset_row(slot, {&row.config, row.schedule.get(), row.rng.get()});
      }
      // The draft prefills them at the next pass if they draft in it.
      prefill_into(*target_, cache, joined, joined_tokens);
      const double s = seconds_since(t1);
      bs.prefill_seconds += s;
      for (const int64_t slot : joined) slots[slot]->prefill_seconds = s;
    }
  }

  bs.draft_passes = drafter ? drafter->passes() : 0;
  bs.total_seconds = seconds_since(start);
  BatchResult out;
  for (Row& row : rows) out.results.push_back(std::move(row.result));
  // "heuristic": carry the lookahead the last row reached to the next request (Hugging Face keeps it
  // on the assistant model's generation config; a batch of one is exactly that).
  if (use_draft && rows.back().config.num_assistant_tokens_schedule == "heuristic") {
    std::lock_guard<std::mutex> lock(carried_mutex_);
    carried_lookahead_ = rows.back().schedule->num_tokens();
  }
  if (goodput) {
    std::vector<const LookaheadSchedule*> schedules;
    for (const Row& row : rows)
      if (row.schedule->kind() == "goodput") schedules.push_back(row.schedule.get());
    std::lock_guard<std::mutex> lock(carried_mutex_);
    carried_evidence_[!use_draft] = LookaheadSchedule::carry_evidence(schedules);
  }
  out.stats = bs;
  if (prompt_cache && !tc.is_encoder_decoder) {  // what the next request of this conversation continues
    prompt_cache->target_ = target_;
    prompt_cache->tokens_ = rows[0].tokens;
    // (An EOS accepted from the draft can leave the positions after it in the cache.)
    cache.crop(0, std::min(cache.length(0), static_cast<int64_t>(rows[0].tokens.size())));
    prompt_cache->target_cache_ = std::move(cache);
    if (drafter) {
      prompt_cache->draft_ = draft_;
      prompt_cache->draft_cache_ = drafter->release_cache();
    }
  }
  return out;
}

}  // namespace specdec
