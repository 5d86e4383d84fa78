// Logits processors (Hugging Face semantics and order) and seeded sampling.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "specdec/config.hpp"

namespace specdec {

// A per-request random source: std::mt19937_64, whose output the C++ standard fixes, so the same
// seed gives the same stream on every platform (uniforms are built from its raw bits, not from
// the implementation-defined std:: distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // in [0, 1)

 private:
  std::mt19937_64 engine_;
};

// One step of logits processing. `scores` is [R, V] float32 for R consecutive positions; row r
// belongs to the position whose history (the tokens before it) is history[0 .. base + r), where
// `base` = history.size() - (R - 1). Processors modify `scores` (returning the new tensor).
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  virtual at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>& history) const = 0;
  // Whether apply() reads `history` (else it may be given an empty one).
  virtual bool reads_history() const { return false; }
};

// The chain Hugging Face builds for a GenerationConfig, in its order: the logit bias (its
// sequence_bias), repetition penalty, min_new_tokens (over config.eos_token_ids), then (sampling
// only) temperature, top-k, top-p, min-p;
// OpenAI's frequency and presence penalties after the bias and before the repetition penalty. The
// same chain processes the draft's logits (giving q) and the target's (giving p). `prompt_length`:
// where the generated tokens start in the history (the OpenAI penalties count only those; a draft's
// chain, made without it, counts the prompt too: its q differs, which lowers acceptance only).
class LogitsProcessorChain {
 public:
  explicit LogitsProcessorChain(const GenerationConfig& config, int64_t prompt_length = 0);
  bool empty() const { return processors_.empty(); }
  // Whether a processor reads the history (the repetition penalty): the callers copy the sequence
  // for it only then (a sampled request's chain otherwise copied it per row per iteration).
  bool reads_history() const;
  // See LogitsProcessor::apply for the history convention.
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>& history) const;
  // `scores` [K+1, V] of a tree of candidates (`tokens`, `parents` as Candidates'): row 0 follows
  // `history`, row 1 + i candidate i, whose history is `history` and the path down to it.
  at::Tensor apply(const at::Tensor& scores, const std::vector<int64_t>& history,
                   const std::vector<int64_t>& tokens, const std::vector<int64_t>& parents) const;

 private:
  std::vector<std::unique_ptr<LogitsProcessor>> processors_;
};

// Individual processors (exposed for tests and custom chains).
// OpenAI's logit_bias: each (token id, bias) adds bias to that token's logit in every row.
std::unique_ptr<LogitsProcessor> make_logit_bias(std::vector<std::pair<int64_t, double>> bias);
std::unique_ptr<LogitsProcessor> make_repetition_penalty(double penalty);
// Hugging Face's MinNewTokensLengthLogitsProcessor: the `eos` ids get -inf at every position with
// fewer than `min_new_tokens` tokens after history[prompt_length] before it.
std::unique_ptr<LogitsProcessor> make_min_new_tokens(int64_t min_new_tokens,
                                                     std::vector<int64_t> eos,
                                                     int64_t prompt_length);
// OpenAI's: logit - frequency x count - presence x (count > 0), counting history[prompt_length ..).
std::unique_ptr<LogitsProcessor> make_occurrence_penalty(double frequency, double presence,
                                                         int64_t prompt_length);
std::unique_ptr<LogitsProcessor> make_temperature(double temperature);
std::unique_ptr<LogitsProcessor> make_top_k(int64_t k);
std::unique_ptr<LogitsProcessor> make_top_p(double p);
std::unique_ptr<LogitsProcessor> make_min_p(double p);

// Draws an index from `probs` ([V], non-negative, any positive sum) by inverse CDF with the
// uniform `u` in [0, 1). Indices of probability 0 are never drawn.
int64_t sample_index(const at::Tensor& probs, double u);
// The same without leaving the device: a one-element int64 tensor on probs' device.
at::Tensor sample_index_tensor(const at::Tensor& probs, double u);
// ... with `u` a one-element double tensor on probs' device (no host value needed).
at::Tensor sample_index_tensor(const at::Tensor& probs, const at::Tensor& u);
// Row r's index drawn from probs[r] ([R, V]) with u[r] ([R] double on probs' device), each as
// sample_index draws it: [R] int64 on the device.
at::Tensor sample_rows_tensor(const at::Tensor& probs, const at::Tensor& u);

}  // namespace specdec
