// LookaheadSchedule: how many tokens the draft proposes per iteration.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "specdec/config.hpp"

namespace specdec {

class PassCost;

// constant:  always K.
// heuristic / heuristic_transient: start at K; +2 after an iteration whose drafted tokens were all
//   accepted (vacuously true when none could be drafted, as in Hugging Face), else -1, floor 1.
// dynamic:   up to K, but the draft stops right after a token it drafted with probability below
//   the confidence threshold; with adaptive_threshold the threshold is re-fit from the request's
//   acceptance history (Hugging Face's rule: minimise FPR + 3 FNR over the observed probabilities).
// goodput:   specdec's own. Before each iteration, the K in [0, num_assistant_tokens] that
// maximises
//   the expected tokens per second of the iteration (best_lookahead), from the measured cost of a
//   target pass as a function of its rows, the measured draft cost per token (none for prompt
//   lookup), and the acceptance rate estimated from the request's history. K = 0 means no
//   speculation for that iteration.
class LookaheadSchedule {
 public:
  explicit LookaheadSchedule(const GenerationConfig& config);

  Schedule kind() const { return kind_; }
  int64_t cap() const { return cap_; }             // the largest K (dynamic, goodput)
  int64_t num_tokens() const { return k_; }        // tokens to draft next (before length clamps)
  double threshold() const { return threshold_; }  // dynamic only
  // True when drafting must stop after a token drafted with probability `p` (dynamic only).
  bool stop_after(double p) const { return kind_ == Schedule::kDynamic && p < threshold_; }
  // Record one verification: `probs` are the draft probabilities of the drafted tokens
  // (probs.size() == drafted tokens), `accepted` how many of them the target kept.
  void update(const std::vector<double>& probs, int64_t accepted);
  // Seeds the heuristic value (carried over between requests for "heuristic").
  void set_num_tokens(int64_t k) { k_ = k; }

  // goodput: sets num_tokens() to plan_lookahead(target_cost, draft_cost, {acceptance()},
  // {acceptance_bound()}, cap) with cap = num_assistant_tokens. `target_cost(rows)` is the seconds
  // of a target pass over `rows` tokens, `draft_cost` the seconds per drafted token. Other
  // schedules ignore it.
  void plan(const std::function<double(int64_t)>& target_cost, double draft_cost);
  // goodput: the estimated probability that a drafted token is accepted, given that the ones before
  // it were: accepted / (accepted + rejections) over the history, each step weighing 0.95 of the
  // one after it, with one accepted and one rejected token as a prior (0.5 before any evidence).
  double acceptance() const { return (accepted_ + 1.0) / (accepted_ + rejected_ + 2.0); }
  // goodput: acceptance() plus one standard deviation of the Beta(accepted + 1, rejections + 1)
  // posterior it is the mean of: the wider, the less evidence there is (see plan_lookahead).
  double acceptance_bound() const;
  // goodput: seeds the decayed counts behind acceptance() (accepted tokens, iterations with a
  // rejection); a Generator carries them from one request to the next (carry_evidence()).
  void set_evidence(std::pair<double, double> e) { std::tie(accepted_, rejected_) = e; }
  // The mean evidence of `schedules`, scaled down to at most `weight` counts in all: what the next
  // request starts from, so that it begins near the last ones' acceptance and adapts within a few
  // iterations of its own.
  static std::pair<double, double> carry_evidence(
      const std::vector<const LookaheadSchedule*>& schedules, double weight = 4.0);

  // Expected tokens of one iteration that drafts k tokens, each accepted with probability `alpha`
  // once the ones before it were: 1 + alpha + ... + alpha^k (the target always adds one).
  static double expected_tokens(double alpha, int64_t k);
  // The k in [0, max_k] maximising expected_tokens(alpha, k) / (target_cost(k + 1) + k *
  // draft_cost): tokens per second of the iteration. Ties keep the smaller k.
  static int64_t best_lookahead(const std::function<double(int64_t)>& target_cost,
                                double draft_cost, double alpha, int64_t max_k);
  // The same for a batch whose rows have acceptance rates `alphas`: a target pass computes every
  // row padded to the longest, and each drafted position is one draft pass over the batch, so an
  // iteration drafting k tokens costs target_cost(B * (k + 1)) + k * draft_cost whatever the
  // rows' own k <= k, and every row gains from drafting the full k. The k in [0, max_k] maximising
  // sum_r expected_tokens(alphas[r], k) / that cost; one row: best_lookahead. B: `rows`, the rows
  // of the pass (0: alphas.size()), which may hold rows that goodput does not plan.
  static int64_t best_lookahead(const std::function<double(int64_t)>& target_cost,
                                double draft_cost, const std::vector<double>& alphas, int64_t max_k,
                                int64_t rows = 0);
  // What goodput drafts: best_lookahead at the estimates `alphas`, except that K = 0 becomes 1 when
  // drafting would pay at the rows' acceptance bounds `bounds`. At K = 0 no evidence comes in and
  // the counts only decay, so a row the estimate turned away (after a hard stretch, or on little
  // evidence) keeps drafting one token until the evidence says no with confidence. (The Generator
  // gives bounds for a single row only; a batch passes its estimates, i.e. best_lookahead.)
  static int64_t plan_lookahead(const std::function<double(int64_t)>& target_cost,
                                double draft_cost, const std::vector<double>& alphas,
                                const std::vector<double>& bounds, int64_t max_k, int64_t rows = 0);

  // The tokens of the longest pass goodput times before it plans on the curve: cap / 2 + 1 (a
  // pass drafting half the cap; longer passes are timed when a plan goes there).
  static int64_t timed_pass_tokens(int64_t cap) { return cap / 2 + 1; }
  // What goodput drafts while it times the passes it could plan (a draft model, before K is
  // planned on the curve `target`): the smallest K in [1, reach] whose pass, over B (K + 1)
  // tokens, was not observed (B = bounds.size()), or 0 when there is none. reach is the K that
  // best_lookahead picks at the rows' acceptance bounds when every pass costs `flat` (no pass for
  // K > 0 costs less), at most the first K whose pass has cap / 2 + 1 tokens or more: the K that
  // could be planned, so a draft the target often rejects times only short passes.
  static int64_t exploration(const PassCost& target, double flat, double draft_cost,
                             const std::vector<double>& bounds, int64_t cap, int64_t rows = 0);

  // The adaptive rule on its own: given draft probabilities and whether each was accepted, the
  // threshold minimising FPR + 3 * FNR. Returns `current` when there are <= 5 samples or only one
  // outcome.
  static double fit_threshold(const std::vector<double>& probs, const std::vector<bool>& accepted,
                              double current);

 private:
  Schedule kind_;
  int64_t k_;
  int64_t cap_;                         // goodput: the largest K considered
  double accepted_ = 0, rejected_ = 0;  // goodput: decayed counts
  double threshold_;
  bool adaptive_;
  // dynamic+adaptive: (draft probability, accepted) per drafted token up to the first rejection,
  // kept sorted by probability, highest first (each update inserts; nothing is re-sorted).
  std::vector<std::pair<double, bool>> history_;
  int64_t history_accepted_ = 0;
  // fit_threshold over history sorted highest first, `pos` of them accepted.
  static double fit_sorted(const std::vector<std::pair<double, bool>>& sorted, size_t pos,
                           double current);
};

// The measured cost (seconds) of a model pass as a function of the rows (tokens) in it: for each
// row count observed, the least time seen for it (timing noise on a shared machine only adds; its
// first pass divided by the speed at the time) times a speed, which every repeated observation
// moves a fifth of the way to its ratio over its row count's least. The machine's state (other
// processes, clocks, a longer cache) moves every row count at once, so a row count timed once
// early follows the drift measured on the ones in use and keeps its cost relative to theirs.
// Between row counts, piecewise-linear; below them, the smallest one's; above them, the largest
// one's rising at the mean slope from the smallest to the largest (never falling: a last segment
// that falls, where a pass over more tokens happened to cost less, would make every longer pass
// look cheaper still).
class PassCost {
 public:
  void observe(int64_t rows, double seconds);
  double operator()(int64_t rows) const;  // 0 when nothing was observed
  // An upper bound on the seconds of a pass over `rows` tokens (0 without observations): the least
  // cost of an observed row count of `rows` or more (a pass costs no less for more tokens) or, when
  // smaller, `rows` times the least of all (nor more than passes over one token each).
  double ceiling(int64_t rows) const;
  bool empty() const { return points_.empty(); }
  bool observed(int64_t rows) const { return points_.count(rows) > 0; }
  size_t size() const { return points_.size(); }
  int64_t largest() const {
    return points_.empty() ? 0 : points_.rbegin()->first;
  }  // most rows observed
  // The smallest k in [1, max_k] for which no pass over batch * (k + 1) rows (a batch of `batch`
  // rows drafting k tokens each) was observed; 0 when all were.
  int64_t first_unobserved(int64_t batch, int64_t max_k) const;

 private:
  double at(std::map<int64_t, double>::const_iterator it) const { return speed_ * it->second; }
  std::map<int64_t, double> points_;  // each row count's least seconds (the first: at speed 1)
  double speed_ = 1.0;
};

}  // namespace specdec
