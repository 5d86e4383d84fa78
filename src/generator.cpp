#include "specdec/generator.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "specdec/candidates.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/sampling.hpp"
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
  share_encoder_ = t.is_encoder_decoder && target_->same_encoder(*draft_);
}

void Generator::plan_goodput(LookaheadSchedule& schedule, KVCache& cache,
                             const std::vector<int64_t>& tokens) const {
  // Once per Generator: time target passes of 1 to cap + 1 rows on this request's cache (appended
  // after what it holds, then cropped away; the best of two runs each).
  bool calibrate = false;
  {
    std::lock_guard<std::mutex> lock(costs_mutex_);
    calibrate = !calibrating_;
    calibrating_ = true;
  }
  const int64_t length = cache.length();
  if (calibrate && length < static_cast<int64_t>(tokens.size())) {
    const at::Tensor last = at::tensor(std::vector<int64_t>{tokens[length]}, at::kLong);
    for (int64_t rows = 1; rows <= schedule.cap() + 1 && length + rows <= cache.capacity(); ++rows) {
      const at::Tensor ids = last.expand({rows}).reshape({1, rows});
      double best = 0;
      for (int rep = 0; rep < 2; ++rep) {
        const auto t0 = Clock::now();
        (void)target_->forward(ids, cache, 1);
        const double s = seconds_since(t0);
        cache.crop(length);
        best = rep == 0 ? s : std::min(best, s);
      }
      std::lock_guard<std::mutex> lock(costs_mutex_);
      target_cost_.observe(rows, best);
    }
  }
  PassCost target;
  std::optional<double> draft;
  {
    std::lock_guard<std::mutex> lock(costs_mutex_);
    target = target_cost_;
    if (!draft_cost_.empty()) draft = draft_cost_(1);
  }
  // Until a draft pass has been timed (and while another request calibrates), K stays where it is.
  if (draft && target.size() > 1) schedule.plan([&](int64_t rows) { return target(rows); }, *draft);
}

GenerationResult Generator::generate(const std::vector<int64_t>& prompt, const GenerationConfig& config,
                                     const TokenCallback& on_token) const {
  return torch_errors_as_specdec("generate", [&] { return run(prompt, config, on_token); });
}

GenerationResult Generator::run(const std::vector<int64_t>& prompt, const GenerationConfig& user_config,
                                const TokenCallback& on_token) const {
  const auto start = Clock::now();
  user_config.validate();
  GenerationConfig config = user_config;
  const ModelConfig& tc = target_->config();
  if (config.eos_token_ids.empty()) config.eos_token_ids = tc.eos_token_ids;
  SPECDEC_CHECK(!prompt.empty(), "generate: the prompt is empty (at least one token is needed)");
  for (int64_t id : prompt)
    SPECDEC_CHECK(id >= 0 && id < tc.vocab_size, "generate: prompt token id ", id,
                  " is outside the vocabulary [0, ", tc.vocab_size, ")");

  c10::InferenceMode inference_guard;
  // The sequence the target continues: the prompt, or for encoder-decoder models the decoder's
  // start token (the prompt goes to the encoder). The cache holds a prefix of it.
  std::vector<int64_t> tokens = tc.is_encoder_decoder ? std::vector<int64_t>{*tc.decoder_start_token_id} : prompt;
  // Bounded before anything is sized from them (and before the sum below could overflow).
  const int64_t max_sequence = limits().max_sequence_length;
  for (const size_t n : {prompt.size(), tokens.size()})
    SPECDEC_CHECK(static_cast<int64_t>(n) <= max_sequence && config.max_new_tokens <= max_sequence - static_cast<int64_t>(n),
                  "the prompt (", n, " tokens) plus max_new_tokens (", config.max_new_tokens,
                  ") exceeds the limit of ", max_sequence, " positions (Limits::max_sequence_length)");
  const int64_t max_length = static_cast<int64_t>(tokens.size()) + config.max_new_tokens;
  // Positions past max_position_embeddings are refused up front, not met as a failure mid-way
  // (T5's relative positions have no such limit).
  for (const Model* m : {target_.get(), draft_.get()}) {
    if (!m || m->config().is_encoder_decoder) continue;
    SPECDEC_CHECK(max_length <= m->config().max_position_embeddings, "the prompt (", tokens.size(),
                  " tokens) plus max_new_tokens (", config.max_new_tokens, ") is ", max_length,
                  " positions, more than the ", m == target_.get() ? "target" : "draft",
                  "'s max_position_embeddings (", m->config().max_position_embeddings, ")");
  }

  GenerationResult result;
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  Rng rng(config.seed);
  LookaheadSchedule schedule(config);
  const bool carry = config.num_assistant_tokens_schedule == "heuristic";
  // A sampled request starts from num_assistant_tokens, not from the carried value: the lookahead
  // decides how many random draws each step takes, so carrying it would make a seed's tokens depend
  // on earlier or concurrent requests. (Greedy output never depends on the lookahead.)
  if (carry && !config.sampling()) {
    std::lock_guard<std::mutex> lock(carried_mutex_);
    if (carried_lookahead_) schedule.set_num_tokens(*carried_lookahead_);
  }

  KVCache cache = target_->make_cache(max_length);
  const bool use_draft = draft_ && config.prompt_lookup_num_tokens == 0;
  at::Tensor draft_states;  // encoder-decoder: what the draft's decoder attends to
  if (tc.is_encoder_decoder) {
    const auto t0 = Clock::now();
    const at::Tensor ids = at::tensor(prompt, at::kLong).view({1, -1});
    const at::Tensor states = target_->encode(ids);
    target_->attach_encoder(states, cache);
    ++st.encoder_passes;
    if (use_draft) {
      draft_states = share_encoder_ ? states : draft_->encode(ids);
      if (!share_encoder_) ++st.encoder_passes;
    }
    st.prefill_seconds += seconds_since(t0);
  }

  std::unique_ptr<CandidateGenerator> candidates;
  if (config.prompt_lookup_num_tokens > 0) {
    candidates = std::make_unique<PromptLookupGenerator>(
        config.prompt_lookup_num_tokens, config.max_matching_ngram_size, config.eos_token_ids,
        config.prompt_lookup_match == "last");
  } else if (use_draft) {
    candidates = std::make_unique<DraftModelGenerator>(draft_, config, schedule, rng, max_length, draft_states,
                                                       tc.vocab_size);
  }
  const LogitsProcessorChain processors(config);
  const GreedyVerifier greedy;
  const RejectionSamplingVerifier rejection;
  const Verifier& verifier = custom_verifier_ ? *custom_verifier_
                             : config.sampling() ? static_cast<const Verifier&>(rejection)
                                                 : greedy;

  std::vector<int64_t> history;  // tokens + candidates (processor history)
  std::vector<int64_t> input;
  st.stop_reason = "max_new_tokens";

  const bool goodput = use_draft && schedule.kind() == "goodput";
  while (st.new_tokens < config.max_new_tokens) {
    const int64_t remaining = config.max_new_tokens - st.new_tokens;
    const bool first = st.target_passes == 0;
    if (goodput && !first) plan_goodput(schedule, cache, tokens);
    // Draft at most remaining - 1 tokens: the target always adds one of its own.
    auto t0 = Clock::now();
    const int64_t draft_passes_before = candidates ? candidates->passes() : 0;
    Candidates cand = (candidates && remaining > 1) ? candidates->propose(tokens, remaining - 1)
                                                    : Candidates{};
    const double draft_seconds = seconds_since(t0);
    (first ? st.prefill_seconds : st.drafting_seconds) += draft_seconds;
    if (first && candidates) st.prefill_draft_passes = candidates->passes() - draft_passes_before;
    const auto k = static_cast<int64_t>(cand.size());
    if (goodput && !first && k > 0) {
      std::lock_guard<std::mutex> lock(costs_mutex_);
      draft_cost_.observe(1, draft_seconds / static_cast<double>(candidates->passes() - draft_passes_before));
    }

    // One target pass over [uncached tokens, c1..cK]; keep the logits of the last K+1 positions.
    t0 = Clock::now();
    input.assign(tokens.begin() + cache.length(), tokens.end());
    input.insert(input.end(), cand.tokens.begin(), cand.tokens.end());
    const int64_t verified_len = static_cast<int64_t>(tokens.size());
    at::Tensor scores = target_->forward(at::tensor(input, at::kLong).view({1, -1}), cache, k + 1)[0];
    if (!processors.empty()) {
      history = tokens;
      history.insert(history.end(), cand.tokens.begin(), cand.tokens.end());
      scores = processors.apply(scores, history);  // [K+1, V]
    }
    if (goodput && !first) {
      std::lock_guard<std::mutex> lock(costs_mutex_);
      target_cost_.observe(static_cast<int64_t>(input.size()), seconds_since(t0));
    }
    Verdict verdict = verifier.verify(scores, cand, rng);
    (first ? st.prefill_seconds : st.verification_seconds) += seconds_since(t0);
    ++st.target_passes;

    // New tokens: the accepted candidates, then the target's own token. An EOS among them ends
    // the request right there; an accepted EOS candidate counts as the target's token (as in
    // Hugging Face, whose trace then shows one acceptance fewer).
    std::vector<int64_t> fresh(cand.tokens.begin(), cand.tokens.begin() + verdict.accepted);
    fresh.push_back(verdict.next_token);
    int64_t accepted = verdict.accepted;
    bool stop_eos = false;
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (is_eos(config.eos_token_ids, fresh[i])) {
        fresh.resize(i + 1);
        accepted = std::min<int64_t>(accepted, static_cast<int64_t>(i));
        stop_eos = true;
        break;
      }
    }
    if (static_cast<int64_t>(fresh.size()) > remaining) fresh.resize(remaining);  // defensive

    cache.crop(verified_len + verdict.accepted);  // drop rejected candidates' keys/values
    tokens.insert(tokens.end(), fresh.begin(), fresh.end());
    result.tokens.insert(result.tokens.end(), fresh.begin(), fresh.end());
    st.new_tokens += static_cast<int64_t>(fresh.size());
    st.drafted_tokens += k;
    st.accepted_tokens += accepted;
    st.trace.push_back({k, accepted});
    if (static_cast<int64_t>(st.drafted_at_position.size()) < k) {
      st.drafted_at_position.resize(k, 0);
      st.accepted_at_position.resize(k, 0);
    }
    for (int64_t i = 0; i < k; ++i) {
      ++st.drafted_at_position[i];
      if (i < accepted) ++st.accepted_at_position[i];
    }
    if (candidates) candidates->on_verified(cand, accepted, tokens);
    if (on_token) {
      try {
        on_token(fresh);
      } catch (const Cancelled&) {
        st.stop_reason = "cancelled";
        break;
      }
    }
    if (stop_eos) {
      st.stop_reason = "eos";
      break;
    }
  }

  if (candidates) st.draft_passes = candidates->passes();
  st.final_confidence_threshold = schedule.threshold();
  if (carry) {
    std::lock_guard<std::mutex> lock(carried_mutex_);
    carried_lookahead_ = schedule.num_tokens();
  }
  st.total_seconds = seconds_since(start);
  st.other_seconds = std::max(0.0, st.total_seconds - st.prefill_seconds - st.drafting_seconds -
                                       st.verification_seconds);
  return result;
}

}  // namespace specdec
