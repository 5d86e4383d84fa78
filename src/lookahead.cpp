#include "specdec/lookahead.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace specdec {

LookaheadSchedule::LookaheadSchedule(const GenerationConfig& c)
    : kind_(c.num_assistant_tokens_schedule),
      k_(c.resolved_num_assistant_tokens()),
      threshold_(c.assistant_confidence_threshold),
      adaptive_(c.adaptive_threshold) {}

void LookaheadSchedule::update(const std::vector<double>& probs, int64_t accepted) {
  const auto drafted = static_cast<int64_t>(probs.size());
  if (kind_ == "heuristic" || kind_ == "heuristic_transient") {
    k_ = accepted == drafted ? k_ + 2 : std::max<int64_t>(1, k_ - 1);
  } else if (kind_ == "dynamic" && adaptive_) {
    // Keep the accepted tokens and the first rejected one; later drafts were never judged.
    for (int64_t i = 0; i < drafted && i <= accepted; ++i) {
      hist_probs_.push_back(probs[i]);
      hist_accepted_.push_back(i < accepted);
    }
    threshold_ = fit_threshold(hist_probs_, hist_accepted_, threshold_);
  }
}

double LookaheadSchedule::fit_threshold(const std::vector<double>& probs,
                                        const std::vector<bool>& accepted, double current) {
  const size_t n = probs.size();
  const auto pos = static_cast<size_t>(std::count(accepted.begin(), accepted.end(), true));
  const size_t neg = n - pos;
  if (n <= 5 || pos == 0 || neg == 0) return current;
  // ROC over distinct scores, highest first (as sklearn's roc_curve): predicting "accepted" for
  // p >= t. The first point (t = +inf) predicts nothing. Ties in cost keep the higher threshold.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probs[a] > probs[b]; });
  double best_cost = 3.0;  // fpr 0 + 3 * fnr 1 at t = +inf
  double best_t = std::numeric_limits<double>::infinity();
  size_t tp = 0, fp = 0;
  for (size_t i = 0; i < n; ++i) {
    (accepted[order[i]] ? tp : fp) += 1;
    if (i + 1 < n && probs[order[i + 1]] == probs[order[i]]) continue;  // same threshold
    const double cost = static_cast<double>(fp) / neg + 3.0 * (1.0 - static_cast<double>(tp) / pos);
    if (cost < best_cost) {
      best_cost = cost;
      best_t = probs[order[i]];
    }
  }
  return best_t;
}

}  // namespace specdec
