// LookaheadSchedule: how many tokens the draft proposes per iteration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "specdec/config.hpp"

namespace specdec {

// constant:  always K.
// heuristic / heuristic_transient: start at K; +2 after an iteration whose drafted tokens were all
//   accepted (vacuously true when none could be drafted, as in Hugging Face), else -1, floor 1.
// dynamic:   up to K, but the draft stops right after a token it drafted with probability below
//   the confidence threshold; with adaptive_threshold the threshold is re-fit from the request's
//   acceptance history (Hugging Face's rule: minimise FPR + 3 FNR over the observed probabilities).
class LookaheadSchedule {
 public:
  explicit LookaheadSchedule(const GenerationConfig& config);

  const std::string& kind() const { return kind_; }
  int64_t num_tokens() const { return k_; }        // tokens to draft next (before length clamps)
  double threshold() const { return threshold_; }  // dynamic only
  // True when drafting must stop after a token drafted with probability `p` (dynamic only).
  bool stop_after(double p) const { return kind_ == "dynamic" && p < threshold_; }
  // Record one verification: `probs` are the draft probabilities of the drafted tokens
  // (probs.size() == drafted tokens), `accepted` how many of them the target kept.
  void update(const std::vector<double>& probs, int64_t accepted);
  // Seeds the heuristic value (carried over between requests for "heuristic").
  void set_num_tokens(int64_t k) { k_ = k; }

  // The adaptive rule on its own: given draft probabilities and whether each was accepted, the
  // threshold minimising FPR + 3 * FNR. Returns `current` when there are <= 5 samples or only one
  // outcome.
  static double fit_threshold(const std::vector<double>& probs, const std::vector<bool>& accepted,
                              double current);

 private:
  std::string kind_;
  int64_t k_;
  double threshold_;
  bool adaptive_;
  std::vector<double> hist_probs_;    // dynamic+adaptive: one per drafted token up to first reject
  std::vector<bool> hist_accepted_;
};

}  // namespace specdec
