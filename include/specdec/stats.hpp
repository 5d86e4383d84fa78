// GenerationStats: what one request did and where its time went.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace specdec {

struct GenerationStats {
  int64_t prompt_tokens = 0;         // encoder-decoder models: the encoder's input
  int64_t cached_prompt_tokens = 0;  // of them, positions a PromptCache held (not computed again)
  int64_t encoder_passes =
      0;  // encoder-decoder: 1 (target only, or a draft sharing its encoder) or 2
  int64_t new_tokens = 0;
  int64_t target_passes = 0;  // target forward passes (the first one includes the prompt)
  // Target passes over the prompt before them: a prompt longer than 256 tokens (or any in a
  // batch, after the first of a --prompts-file, or of a RequestEngine) goes in before the first
  // iteration, in chunks, all but its last token (0: the first pass took the whole prompt).
  int64_t prefill_passes = 0;
  int64_t draft_passes = 0;          // draft forward passes (each drafts one token)
  int64_t prefill_draft_passes = 0;  // of which in the first iteration (timed as prefill)
  int64_t drafted_tokens = 0;        // candidates proposed to the target
  int64_t tree_passes = 0;           // target passes that verified a tree of candidates
  int64_t accepted_tokens = 0;       // candidates the target kept
  // One entry per target pass: {candidates drafted, candidates accepted} (Hugging Face's trace).
  std::vector<std::array<int64_t, 2>> trace;
  // accepted_at_position[i]: how often candidate i+1 of an iteration was accepted;
  // drafted_at_position[i]: how often a candidate i+1 was proposed at all.
  std::vector<int64_t> accepted_at_position;
  std::vector<int64_t> drafted_at_position;
  double final_confidence_threshold = 0.0;  // dynamic schedule: threshold in use at the end
  std::string
      stop_reason;  // "eos", "max_new_tokens", "cancelled" or "error" (GenerationResult::error)

  // Wall time in seconds. prefill: the first iteration (draft and target passes over the prompt and
  // the first candidates); drafting and verification: the draft's and the target's passes after
  // it; other: everything else (bookkeeping, callbacks).
  double prefill_seconds = 0, drafting_seconds = 0, verification_seconds = 0, other_seconds = 0;
  double total_seconds = 0;

  double acceptance_rate() const;         // accepted / drafted (0 when nothing was drafted)
  double tokens_per_target_pass() const;  // new tokens / target passes
  double tokens_per_second() const;       // new tokens / total seconds
  double draft_seconds_per_token()
      const;  // drafting seconds / draft passes after the first iteration
  double target_seconds_per_pass() const;  // verification seconds / target passes after the first
  double cost_ratio() const;  // c = draft time per token / target time per pass (0 if unknown)
  // Every field above (derived ones included) as one JSON object.
  std::string to_json() const;
};

// Measured and predicted speedup of an assisted run over a target-only run of the same request.
struct SpeedupEstimate {
  double measured = 0;    // target-only seconds / assisted seconds
  double alpha = 0;       // per-token acceptance probability: accepted / candidates judged (a
                          // candidate after the first rejection of its iteration is never judged)
  double gamma = 0;       // mean candidates drafted per target pass
  double cost_ratio = 0;  // draft seconds per token / target-only seconds per decode pass
  // false when a draft model drafted in the first iteration only, whose passes are timed as the
  // prefill: its cost per token was not measured (cost_ratio 0 is not a free draft then)
  bool cost_measured = true;
  double predicted = 0;  // predicted_speedup(alpha, gamma, cost_ratio); 0 when the assisted run
                         // verified trees (the formula is a chain's), drafted nothing or did not
                         // measure the draft's cost
  // The assisted run's target seconds per verification pass / target-only's per decode pass (0:
  // not measured). Leviathan et al. take it as 1 (a pass of gamma + 1 tokens for the price of
  // one); on a CPU it is more, the more so the longer the proposals.
  double pass_ratio = 0;
  // predicted_speedup(alpha, gamma, cost_ratio, pass_ratio): the prediction with the verification
  // passes' measured cost; 0 where `predicted` is, or pass_ratio was not measured.
  double predicted_with_passes = 0;
};
SpeedupEstimate estimate_speedup(const GenerationStats& target_only,
                                 const GenerationStats& assisted);

// Speedup predicted by Leviathan et al. for acceptance rate alpha, gamma drafted tokens per
// iteration and cost ratio c: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)); with
// `pass_ratio`, a verification pass's cost in decode passes, the 1 becomes pass_ratio.
double predicted_speedup(double alpha, double gamma, double c, double pass_ratio = 1.0);

}  // namespace specdec
