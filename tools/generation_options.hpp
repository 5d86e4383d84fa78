// The `specdec` program's generation flags (--max-new-tokens ... --seed), shared by the program and
// the fuzz target that feeds them CLI-like strings (tests/fuzz/fuzz_generation_options.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <random>
#include <string>

#include "cli_range.hpp"
#include "specdec/config.hpp"

namespace specdec::cli {

// Every --seed: an integer in [0, 2^64) (CLI11 alone would wrap -1 and values past 2^64 around);
// with `random`, also -1 for a random seed (llama.cpp's convention).
inline CLI::Validator seed_validator(bool random = false) {
  return CLI::Validator(
      [random](std::string& v) {
        if (random && v == "-1") {
          v = std::to_string(std::random_device{}());
          return std::string();
        }
        errno = 0;
        const bool digits =
            !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
        if (digits) std::strtoull(v.c_str(), nullptr, 10);
        return digits && errno != ERANGE
                   ? std::string()
                   : "the seed must be an integer from 0 to 2^64 - 1" +
                         std::string(random ? " (or -1 for a random one)" : "") + ", got " + v;
      },
      "");  // (a description would follow the type in --help: "UINT:UINT")
}

// Adds the flags that fill `gen`; `no_adaptive` receives --no-adaptive-threshold (apply it with
// finish_generation_options once parsed).
inline void add_generation_options(CLI::App* app, GenerationConfig& gen, bool& no_adaptive) {
  app->add_option("--max-new-tokens", gen.max_new_tokens, "Tokens to generate at most (at least 1)")
      ->capture_default_str();
  app->add_option("--min-new-tokens", gen.min_new_tokens,
                  "No end of sequence before this many new tokens (>= 0; 0 = off)")
      ->capture_default_str();
  app->add_option("--num-assistant-tokens", gen.num_assistant_tokens,
                  "Draft tokens per iteration; the start for heuristic, the cap for dynamic and "
                  "goodput (0 = 12 under goodput, greedy's default; 5 under constant, sampling's, "
                  "and heuristic; 20 for dynamic; 16 with --speculate suffix; at most 256); with "
                  "--prompt-lookup N, N is the cap "
                  "instead")
      ->capture_default_str();
  app->add_option("--schedule,--num-assistant-tokens-schedule", gen.num_assistant_tokens_schedule,
                  "Lookahead schedule (default: goodput, which never plans a pass that costs more "
                  "than it gains, when greedy; constant when sampling; --prompt-lookup and "
                  "--speculate suffix follow constant or goodput only)")
      ->check(
          CLI::IsMember({"constant", "heuristic", "heuristic_transient", "dynamic", "goodput"}));
  app->add_option("--draft-tree-width", gen.draft_tree_width,
                  "With --draft: the draft's W most probable tokens at each position, "
                  "verified as a tree in one pass (1 = a chain; goodput cuts the ones that do not "
                  "pay)")
      ->check(in_range(1, 16))
      ->capture_default_str();
  app->add_option("--confidence-threshold,--assistant-confidence-threshold",
                  gen.assistant_confidence_threshold,
                  "dynamic: stop drafting below this draft probability, in [0, 1]")
      ->capture_default_str();
  app->add_flag("--no-adaptive-threshold", no_adaptive,
                "dynamic: keep the confidence threshold fixed");
  app->add_option("--prompt-lookup,--prompt-lookup-num-tokens", gen.prompt_lookup_num_tokens,
                  "Prompt lookup decoding with up to N tokens per iteration (at most 256), as in "
                  "Hugging Face (no draft model: not with --draft)")
      ->capture_default_str();
  app->add_option("--max-matching-ngram,--max-matching-ngram-size", gen.max_matching_ngram_size,
                  "Prompt lookup: longest n-gram to match (at least 1)")
      ->capture_default_str();
  app->add_option_function<std::string>(
         "--speculate",
         [&gen](const std::string& how) { gen.suffix_speculation = how == "suffix"; },
         "suffix: suffix speculation (SuffixDecoding) without a draft model: the most frequent "
         "continuation of the text's last tokens in this request and in earlier outputs; up to "
         "--num-assistant-tokens per iteration (default 16); none (the default): no suffix "
         "speculation (--draft and --prompt-lookup still draft)")
      ->check(CLI::IsMember({"suffix", "none"}));
  app->add_option(
         "--prompt-lookup-match", gen.prompt_lookup_match,
         "Prompt lookup: copy after the first (Hugging Face) or the last earlier occurrence")
      ->check(CLI::IsMember({"first", "last"}))
      ->capture_default_str();
  app->add_flag("--do-sample", gen.do_sample, "Sample instead of greedy decoding");
  app->add_option("--temperature", gen.temperature,
                  "Sampling temperature (>= 0; 0, or below 1e-5, = greedy)")
      ->capture_default_str();
  app->add_option("--top-k", gen.top_k, "Keep the k most likely tokens (>= 0; 0 = off)")
      ->capture_default_str();
  app->add_option("--top-p", gen.top_p,
                  "Nucleus sampling mass, in [0, 1] (1 = off; 0 keeps the most likely token)")
      ->capture_default_str();
  app->add_option("--min-p", gen.min_p,
                  "Drop tokens below min_p * max probability, in [0, 1) (0 = off)")
      ->capture_default_str();
  app->add_option("--repetition-penalty", gen.repetition_penalty,
                  "Divide the logit of a token already in the prompt or answer by this where the "
                  "logit is positive, multiply it where negative (>= 1e-6; 1 = off)")
      ->capture_default_str();
  app->add_option(
         "--frequency-penalty", gen.frequency_penalty,
         "OpenAI's: lower a token's logit by this times its count in the answer so far, in [-2, 2]")
      ->capture_default_str();
  app->add_option(
         "--presence-penalty", gen.presence_penalty,
         "OpenAI's: lower the logit of a token the answer already holds by this, in [-2, 2]")
      ->capture_default_str();
  app->add_option("--seed", gen.seed,
                  "Seed of the request's random generator: the same seed, the same draws (-1: a "
                  "random seed)")
      ->transform(seed_validator(true))
      ->capture_default_str();
}

// Applies --no-adaptive-threshold and validates (throws specdec::Error).
inline void finish_generation_options(GenerationConfig& gen, bool no_adaptive) {
  gen.adaptive_threshold = !no_adaptive;
  gen.validate();
}

}  // namespace specdec::cli
