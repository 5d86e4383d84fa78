#include "specdec/generator.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <exception>

#include "engine.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "util.hpp"

namespace specdec {

Generator::Generator(std::shared_ptr<const Model> target, std::shared_ptr<const Model> draft)
    : target_(std::move(target)), draft_(std::move(draft)) {
  SPECDEC_CHECK(target_ != nullptr, "Generator: target model is null");
  state_ = std::make_unique<detail::GeneratorState>(*target_);
  if (!draft_) return;
  const ModelConfig& t = target_->config();
  const ModelConfig& d = draft_->config();
  // Vocabulary sizes may differ by padding rows (Qwen2.5-7B has 152064, Qwen2.5-0.5B 151936): the
  // draft proposes over the target's ids with q = 0 where it has none. Whether the two tokenizers
  // agree on every real id is for the caller to check (require_same_tokenizer; the program does);
  // output stays exact either way, only acceptance depends on it.
  const auto ids = [](const std::vector<int64_t>& v) {
    std::vector<std::string> s;
    for (const int64_t id : v) s.push_back(std::to_string(id));
    return "[" + join(s) + "]";
  };
  SPECDEC_CHECK(t.eos_token_ids == d.eos_token_ids,
                "draft and target have different eos_token_id (", ids(d.eos_token_ids), " and ",
                ids(t.eos_token_ids), "): they must share a tokenizer");
  SPECDEC_CHECK(target_->device() == draft_->device(), "draft and target are on different devices");
  SPECDEC_CHECK(t.is_encoder_decoder == d.is_encoder_decoder, "draft (", d.model_type,
                ") and target (", t.model_type,
                ") must both be decoder-only or both encoder-decoder");
  SPECDEC_CHECK(t.decoder_start_token_id == d.decoder_start_token_id,
                "draft and target have different decoder_start_token_id");
  SPECDEC_CHECK(d.feature_size == 0 || (!t.is_encoder_decoder && d.feature_size == t.hidden_size),
                "the draft is feature-fed (specdec_feature_size ", d.feature_size,
                "): it needs a decoder-only target with hidden_size ", d.feature_size, ", not ",
                t.model_type, " with ", t.hidden_size);
  share_encoder_ = t.is_encoder_decoder && target_->same_encoder(*draft_);
}

Generator::~Generator() = default;

void Generator::set_suffix_options(const SuffixOptions& options) {
  auto fresh = std::make_shared<SuffixCache>(options);  // validates
  std::lock_guard<std::mutex> lock(state_->carried_mutex);
  state_->suffix = std::move(fresh);
}

std::shared_ptr<const SuffixCache> Generator::suffix_cache() const {
  std::lock_guard<std::mutex> lock(state_->carried_mutex);
  return state_->suffix;
}

detail::EngineModels Generator::models() const {
  return {target_, draft_, custom_verifier_, share_encoder_};
}

GenerationResult Generator::generate(const std::vector<int64_t>& prompt,
                                     const GenerationConfig& config,
                                     const TokenCallback& on_token) const {
  return generate_one(prompt, config, on_token, nullptr);
}

GenerationResult Generator::generate(const std::vector<int64_t>& prompt,
                                     const GenerationConfig& config, PromptCache& cache,
                                     const TokenCallback& on_token) const {
  const detail::Claim claim(cache.in_use_,
                            "generate: the PromptCache is in use by another request (one at a "
                            "time per cache: give each conversation its own)");
  return generate_one(prompt, config, on_token, &cache);
}

GenerationResult Generator::generate_one(const std::vector<int64_t>& prompt,
                                         const GenerationConfig& config,
                                         const TokenCallback& on_token, PromptCache* cache) const {
  BatchTokenCallback each;
  if (on_token) each = [&](size_t, const std::vector<int64_t>& fresh) { on_token(fresh); };
  // The exception the callback threw (the engine keeps it on the row) goes on to the caller.
  std::exception_ptr failure;
  BatchResult out = torch_errors_as_specdec(
      "generate", [&] { return run({prompt}, {config}, each, {}, cache, &failure); });
  if (failure) std::rethrow_exception(failure);
  return std::move(out.results[0]);
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

void Generator::check(const std::vector<int64_t>& prompt, const GenerationConfig& config) const {
  detail::Row row;
  (void)detail::prepare_row(row, models(), prompt, config);
}

BatchResult Generator::run(const std::vector<std::vector<int64_t>>& prompts,
                           const std::vector<GenerationConfig>& configs,
                           const BatchTokenCallback& on_tokens, const BatchOptions& options,
                           PromptCache* prompt_cache, std::exception_ptr* failure) const {
  SPECDEC_CHECK(!prompts.empty(),
                "generate_batch: the batch is empty (at least one prompt is needed)");
  SPECDEC_CHECK(configs.size() == 1 || configs.size() == prompts.size(),
                "generate_batch: ", configs.size(), " configs for ", prompts.size(),
                " prompts (give one, or one per prompt)");
  const auto batch = static_cast<int64_t>(prompts.size());
  // Validation first: nothing runs unless every row is valid.
  std::vector<detail::Row> rows(batch);
  int64_t max_length = 0;
  for (int64_t r = 0; r < batch; ++r) {
    detail::Row& row = rows[r];
    row.index = static_cast<size_t>(r);
    row.name = batch == 1 ? "" : "row " + std::to_string(r) + ": ";
    const GenerationConfig& config = configs.size() == 1 ? configs[0] : configs[r];
    max_length = std::max(max_length, detail::prepare_row(row, models(), prompts[r], config));
  }

  c10::InferenceMode inference_guard;
  const int64_t width = options.max_rows > 0 ? std::min(options.max_rows, batch) : batch;

  detail::VectorSource source(rows);
  // Rows that ask for prompt lookup or suffix speculation draft by it, the others with the draft
  // model when one is set.
  const bool use_draft =
      draft_ && std::any_of(rows.begin(), rows.end(), [](const detail::Row& row) {
        return !row.config.speculates_without_model();
      });
  detail::Engine engine(models(), *state_, source, use_draft, width, max_length, on_tokens, options,
                        prompt_cache);
  while (engine.step()) {
  }
  BatchResult out = engine.finish(rows);
  if (failure) *failure = rows[0].error;
  return out;
}

}  // namespace specdec
