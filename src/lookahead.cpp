#include "specdec/lookahead.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace specdec {

LookaheadSchedule::LookaheadSchedule(const GenerationConfig& c)
    : kind_(c.schedule()),
      // Until costs have been measured, goodput probes a draft model with 2 tokens (enough to time
      // it and to see whether the target accepts it, cheap when it does not) and proposals
      // without a model, which cost nothing to make, with 5; the cap, if smaller.
      k_(kind_ == Schedule::kGoodput ? std::min<int64_t>(c.speculates_without_model() ? 5 : 2,
                                                         c.resolved_num_assistant_tokens())
                                     : c.resolved_num_assistant_tokens()),
      // a proposal longer than the request's tokens is never used
      cap_(std::min(c.resolved_num_assistant_tokens(), std::max<int64_t>(1, c.max_new_tokens))),
      threshold_(c.assistant_confidence_threshold),
      adaptive_(c.adaptive_threshold) {}

void LookaheadSchedule::update(const std::vector<double>& probs, int64_t accepted) {
  const auto drafted = static_cast<int64_t>(probs.size());
  if (kind_ == Schedule::kHeuristic || kind_ == Schedule::kHeuristicTransient) {
    // (Hugging Face's rule, bounded by the most one iteration may propose.)
    k_ = accepted == drafted ? std::min(k_ + 2, GenerationConfig::kMaxLookahead)
                             : std::max<int64_t>(1, k_ - 1);
  } else if (kind_ == Schedule::kGoodput) {
    accepted_ = 0.95 * accepted_ + static_cast<double>(accepted);
    rejected_ = 0.95 * rejected_ + (accepted < drafted ? 1.0 : 0.0);
  } else if (kind_ == Schedule::kDynamic && adaptive_) {
    // Keep the accepted tokens and the first rejected one; later drafts were never judged.
    for (int64_t i = 0; i < drafted && i <= accepted; ++i) {
      const std::pair<double, bool> entry{probs[i], i < accepted};
      history_.insert(
          std::upper_bound(history_.begin(), history_.end(), entry,
                           [](const auto& a, const auto& b) { return a.first > b.first; }),
          entry);
      history_accepted_ += entry.second;
    }
    threshold_ = fit_sorted(history_, static_cast<size_t>(history_accepted_), threshold_);
  }
}

void LookaheadSchedule::plan(const std::function<double(int64_t)>& target_cost, double draft_cost) {
  if (kind_ == Schedule::kGoodput)
    k_ = plan_lookahead(target_cost, draft_cost, {acceptance()}, {acceptance_bound()}, cap_);
}

double LookaheadSchedule::acceptance_bound() const {
  const double mean = acceptance();
  return mean + std::sqrt(mean * (1.0 - mean) / (accepted_ + rejected_ + 3.0));
}

int64_t LookaheadSchedule::plan_lookahead(const std::function<double(int64_t)>& target_cost,
                                          double draft_cost, const std::vector<double>& alphas,
                                          const std::vector<double>& bounds, int64_t max_k,
                                          int64_t rows) {
  const int64_t k = best_lookahead(target_cost, draft_cost, alphas, max_k, rows);
  if (k > 0 || max_k == 0) return k;
  return best_lookahead(target_cost, draft_cost, bounds, max_k, rows) > 0 ? 1 : 0;
}

std::pair<double, double> LookaheadSchedule::carry_evidence(
    const std::vector<const LookaheadSchedule*>& schedules, double weight) {
  double accepted = 0, rejected = 0;
  for (const LookaheadSchedule* s : schedules) accepted += s->accepted_, rejected += s->rejected_;
  const double total = accepted + rejected;
  if (total <= 0) return {0.0, 0.0};
  const double scale = std::min(1.0 / static_cast<double>(schedules.size()), weight / total);
  return {accepted * scale, rejected * scale};
}

double LookaheadSchedule::expected_tokens(double alpha, int64_t k) {
  double sum = 0, term = 1;
  for (int64_t i = 0; i <= k; ++i, term *= alpha) sum += term;
  return sum;
}

int64_t LookaheadSchedule::best_lookahead(const std::function<double(int64_t)>& target_cost,
                                          double draft_cost, double alpha, int64_t max_k) {
  return best_lookahead(target_cost, draft_cost, std::vector<double>{alpha}, max_k);
}

int64_t LookaheadSchedule::best_lookahead(const std::function<double(int64_t)>& target_cost,
                                          double draft_cost, const std::vector<double>& alphas,
                                          int64_t max_k, int64_t rows) {
  if (rows == 0) rows = static_cast<int64_t>(alphas.size());
  int64_t best = 0;
  double best_rate = -1;
  // expected_tokens(alpha, k) of each row, a term more per k
  std::vector<double> tokens(alphas.size(), 1.0), term(alphas.size(), 1.0);
  for (int64_t k = 0; k <= max_k; ++k) {
    if (k > 0)
      for (size_t r = 0; r < alphas.size(); ++r) tokens[r] += (term[r] *= alphas[r]);
    const double seconds = target_cost(rows * (k + 1)) + static_cast<double>(k) * draft_cost;
    const double total = std::accumulate(tokens.begin(), tokens.end(), 0.0);
    const double rate = seconds > 0 ? total / seconds : 0;
    if (rate > best_rate) best_rate = rate, best = k;
  }
  return best;
}

int64_t LookaheadSchedule::exploration(const PassCost& target, double flat, double draft_cost,
                                       const std::vector<double>& bounds, int64_t cap,
                                       int64_t rows) {
  const int64_t batch = rows > 0 ? rows : static_cast<int64_t>(bounds.size());
  const int64_t mid = timed_pass_tokens(cap);
  int64_t reach = std::max<int64_t>(1, (mid + batch - 1) / batch - 1);
  if (flat > 0)
    reach = std::min(reach, std::max<int64_t>(1, best_lookahead([flat](int64_t) { return flat; },
                                                                draft_cost, bounds, cap, batch)));
  return target.first_unobserved(batch, reach);
}

void PassCost::observe(int64_t rows, double seconds) {
  // A row count's first pass counts at the present speed; a pass faster than its least lowers it.
  auto [it, fresh] = points_.emplace(rows, seconds / speed_);
  if (fresh) return;
  if (seconds < it->second) it->second = seconds;
  if (it->second > 0) speed_ += 0.2 * (seconds / it->second - speed_);
}

double PassCost::operator()(int64_t rows) const {
  if (points_.empty()) return 0;
  auto hi = points_.lower_bound(rows);
  if (hi != points_.end() && hi->first == rows) return at(hi);
  if (hi == points_.begin()) return at(hi);  // below every observation
  if (hi == points_.end()) {  // above: the mean slope over the observed range, no less than 0
    auto last = std::prev(hi);
    auto first = points_.begin();
    if (last == first) return at(last);
    const double slope = (at(last) - at(first)) / static_cast<double>(last->first - first->first);
    return at(last) + std::max(0.0, slope) * static_cast<double>(rows - last->first);
  }
  auto lo = std::prev(hi);
  const double t =
      static_cast<double>(rows - lo->first) / static_cast<double>(hi->first - lo->first);
  return at(lo) + t * (at(hi) - at(lo));
}

int64_t PassCost::first_unobserved(int64_t batch, int64_t max_k) const {
  for (int64_t k = 1; k <= max_k; ++k)
    if (!points_.count(batch * (k + 1))) return k;
  return 0;
}

double PassCost::ceiling(int64_t rows) const {
  double least = 0;  // over the observations for `rows` tokens or more
  for (auto it = points_.lower_bound(rows); it != points_.end(); ++it)
    if (least == 0 || it->second < least) least = it->second;
  double one = 0;  // over all of them
  for (const auto& [n, seconds] : points_)
    if (one == 0 || seconds < one) one = seconds;
  const double many = static_cast<double>(rows) * one;
  return speed_ * (least > 0 ? std::min(least, many) : many);  // every row count at the same speed
}

double LookaheadSchedule::fit_threshold(const std::vector<double>& probs,
                                        const std::vector<bool>& accepted, double current) {
  std::vector<std::pair<double, bool>> sorted;
  for (size_t i = 0; i < probs.size(); ++i) sorted.emplace_back(probs[i], accepted[i]);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  return fit_sorted(sorted, static_cast<size_t>(std::count(accepted.begin(), accepted.end(), true)),
                    current);
}

double LookaheadSchedule::fit_sorted(const std::vector<std::pair<double, bool>>& sorted, size_t pos,
                                     double current) {
  const size_t n = sorted.size();
  const size_t neg = n - pos;
  if (n <= 5 || pos == 0 || neg == 0) return current;
  // ROC over distinct scores, highest first (as sklearn's roc_curve): predicting "accepted" for
  // p >= t. The first point (t = +inf) predicts nothing. Ties in cost keep the higher threshold.
  double best_cost = 3.0;  // fpr 0 + 3 * fnr 1 at t = +inf
  double best_t = std::numeric_limits<double>::infinity();
  size_t tp = 0, fp = 0;
  for (size_t i = 0; i < n; ++i) {
    (sorted[i].second ? tp : fp) += 1;
    if (i + 1 < n && sorted[i + 1].first == sorted[i].first) continue;  // same threshold
    const double cost = static_cast<double>(fp) / neg + 3.0 * (1.0 - static_cast<double>(tp) / pos);
    if (cost < best_cost) {
      best_cost = cost;
      best_t = sorted[i].first;
    }
  }
  return best_t;
}

}  // namespace specdec
