#include "goodput.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "util.hpp"

namespace specdec::detail {

GoodputPlanner::Plan GoodputPlanner::plan(const std::vector<LookaheadSchedule*>& schedules,
                                          KVCache& cache, const std::vector<int64_t>& tokens,
                                          int64_t rows, bool free_drafts, bool may_calibrate) {
  // Every cost is the pass's, over all its rows, goodput's or not (they are timed that way).
  const int64_t batch = std::max(rows, static_cast<int64_t>(schedules.size()));
  // With a draft model, the calibration pass first; proposals without a model (`free_drafts`,
  // which cost nothing beside a pass) run no pass of their own: cut() times the curve with real
  // passes.
  if (!free_drafts && may_calibrate) calibrate(cache, tokens, batch);
  int64_t cap = 0;
  for (const LookaheadSchedule* s : schedules) cap = std::max(cap, s->cap());
  // The acceptance bounds (plan_lookahead) for one row only: in a batch, drafting one token to
  // bring evidence would cost every row a draft pass and a padded verification.
  std::vector<double> alphas, bounds;
  for (const LookaheadSchedule* s : schedules) {
    alphas.push_back(s->acceptance());
    bounds.push_back(batch == 1 ? s->acceptance_bound() : s->acceptance());
  }
  PassCost target;
  std::optional<double> draft;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    target = target_cost_;
    if (free_drafts)
      draft = 0.0;
    else if (!draft_cost_.empty())
      draft = draft_cost_(batch);
  }
  // Until a draft pass has been timed, K stays where it is (at first the schedule's probe:
  // LookaheadSchedule's constructor).
  if (!draft) return Plan::kUnknownDraft;
  // Drafting cannot pay if it loses even when every pass of K > 0 costs what one over `batch`
  // tokens (K = 0) costs, at a flat cost no less than that: the gain of drafting only shrinks as
  // the flat cost falls to the real one and as the real passes over more tokens cost more. Then
  // (at the estimates and at their bounds: plan_lookahead) K = 0 without the long pass.
  const double flat = target.ceiling(batch);
  const auto cost = [&](int64_t tokens_in_pass) { return target(tokens_in_pass); };
  if (flat > 0) {
    const auto flat_cost = [flat](int64_t) { return flat; };
    if (LookaheadSchedule::plan_lookahead(flat_cost, *draft, alphas, bounds, cap, batch) == 0) {
      for (LookaheadSchedule* s : schedules) s->set_num_tokens(0);
      if (batch == 1 && !free_drafts) retime_draft(*schedules[0], cost, alphas);
      return Plan::kPlanned;
    }
  }
  // K is planned on the curve once it holds a timed pass for every K it could plan, from 1 up to
  // one whose pass has cap / 2 + 1 tokens or more. A draft model gets there with real iterations,
  // K = 1, 2, ... in turn, once per Generator (LookaheadSchedule::exploration): between observed
  // sizes the curve would be interpolated, and a pass over more tokens can cost less than one over
  // fewer (the kernels' tile shapes), which kept goodput from the K it should plan. Proposals
  // without a model, which can be shorter than asked, get there with the real passes that cut()
  // leaves whole. Above the largest pass observed the curve is extrapolated, and a plan that goes
  // there is a real pass that refines it.
  if (!free_drafts) {
    if (const int64_t k =
            LookaheadSchedule::exploration(target, flat, *draft, bounds, cap, batch)) {
      for (LookaheadSchedule* s : schedules) s->set_num_tokens(std::min(k, s->cap()));
      return Plan::kExploring;
    }
  } else {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      timed_free_ = std::max(timed_free_, LookaheadSchedule::timed_pass_tokens(cap));
    }
    if (target.size() <= 1) return Plan::kPlanned;
  }
  if (batch == 1) {
    schedules[0]->plan(cost, *draft);
    if (!free_drafts) retime_draft(*schedules[0], cost, alphas);
    return Plan::kPlanned;
  }
  const int64_t k = LookaheadSchedule::plan_lookahead(cost, *draft, alphas, bounds, cap, batch);
  for (LookaheadSchedule* s : schedules) s->set_num_tokens(std::min(k, s->cap()));
  return Plan::kPlanned;
}

void GoodputPlanner::calibrate(KVCache& cache, const std::vector<int64_t>& tokens, int64_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (calibrated_first_) return;
    calibrated_first_ = true;
  }
  const int64_t length = cache.length(0);
  if (length >= static_cast<int64_t>(tokens.size()) || length + n > cache.capacity()) return;
  const at::Tensor ids = at::full({1, n}, tokens[length], at::kLong);
  const auto t0 = Clock::now();
  (void)target_.forward(ids, cache, 1);
  const double s = seconds_since(t0);
  cache.crop(0, length);
  std::lock_guard<std::mutex> lock(mutex_);
  target_cost_.observe(n, s);
}

void GoodputPlanner::retime_draft(LookaheadSchedule& schedule,
                                  const std::function<double(int64_t)>& target_cost,
                                  const std::vector<double>& alphas) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (schedule.num_tokens() > 0) {  // drafting (again): the next stretch without it waits the least
    costly_draft_iterations_ = 0;
    retime_after_ = Generator::kRetimeFirst;
    return;
  }
  // K = 0 whatever the draft costs: nothing to learn from timing it
  if (LookaheadSchedule::best_lookahead(target_cost, 0.0, alphas, schedule.cap()) == 0) return;
  if (costly_draft_iterations_++ < retime_after_) return;
  costly_draft_iterations_ = 0;
  retime_after_ = std::min(2 * retime_after_, Generator::kRetimeLast);
  schedule.set_num_tokens(
      std::min<int64_t>(2, schedule.cap()));  // as the first probe: its second pass is timed
}

double GoodputPlanner::Calibration::factor(size_t slot) const {
  return slot < kept.size() ? (kept[slot] + 1.0) / (estimated[slot] + 1.0) : 1.0;
}

std::vector<size_t> GoodputPlanner::slots(const Candidates& c) {
  const std::vector<int64_t> depths = c.depths();
  std::vector<size_t> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    const bool later = c.tree() && std::find(c.parents.begin(), c.parents.begin() + i,
                                             c.parents[i]) != c.parents.begin() + i;
    out[i] = 2 * static_cast<size_t>(depths[i]) + (later ? 1 : 0);
  }
  return out;
}

void GoodputPlanner::cut(const std::vector<Cuttable>& rows, int64_t batch, int64_t others) {
  size_t fewest =
      std::all_of(rows.begin(), rows.end(), [](const Cuttable& r) { return r.kind != kDraftModel; })
          ? 0
          : 1;
  std::vector<std::vector<double>> gains;  // each row's calibrated reach, best first
  size_t longest = 0;
  int64_t before = 0;  // the most tokens a row of `rows` puts in before its last one
  PassCost target_cost;
  int64_t timed_free = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    target_cost = target_cost_;
    timed_free = timed_free_;
    for (const Cuttable& row : rows) {
      const std::vector<double> reach = row.candidates->reach();
      const std::vector<size_t> slot = slots(*row.candidates);
      const Calibration& cal = calibration_[row.kind];
      gains.emplace_back();
      for (size_t i = 0; i < reach.size(); ++i)
        gains.back().push_back(std::min(1.0, reach[i] * cal.factor(slot[i])));
      longest = std::max(longest, reach.size());
      before = std::max(before, row.before);
    }
  }
  const auto truncate = [&rows](size_t n) {
    for (const Cuttable& row : rows) row.candidates->truncate(n);
  };
  if (fewest == 0 && before == 0) {  // see the header: the curve timed on real passes
    if (others == 0 && !target_cost.observed(batch)) {
      truncate(0);
      return;
    }
    if (target_cost.largest() < std::min(timed_free, batch * static_cast<int64_t>(longest + 1))) {
      truncate(static_cast<size_t>(std::max<int64_t>(1, (timed_free + batch - 1) / batch - 1)));
      return;
    }
  }
  if (target_cost.empty()) {
    if (before > 0) truncate(0);  // a prefill's tokens are costly, and this cost is not known
    return;
  }
  // Verifying nothing is weighed against a measured pass over one candidate per row, not an
  // interpolated one (a cost overstated there would never be timed again).
  if (fewest == 0 && before == 0 && target_cost.first_unobserved(batch, 1) != 0) fewest = 1;
  if (longest <= fewest) return;
  // A pass that prefills a row: the time its candidates save (see the header). Otherwise, the
  // pass's tokens per second.
  const double token_seconds = target_cost(batch) / static_cast<double>(batch);
  size_t best = fewest;
  double best_score = -std::numeric_limits<double>::infinity();
  for (size_t n = fewest; n <= longest; ++n) {
    double gained = 0;
    int64_t in_pass = others;  // the most tokens a row puts in after its last one
    for (size_t r = 0; r < rows.size(); ++r) {
      const size_t kept = std::min(n, gains[r].size());
      for (size_t i = 0; i < kept; ++i) gained += gains[r][i];
      in_pass = std::max(in_pass, rows[r].before + static_cast<int64_t>(kept));
    }
    const double seconds = target_cost(batch * (in_pass + 1));
    const double score = before > 0 ? gained * token_seconds - seconds
                                    : (static_cast<double>(batch) + gained) / seconds;
    if (score > best_score) best_score = score, best = n;  // ties keep the smaller n
  }
  {
    // Every candidate cut: the costs and calibration that say so learn nothing more unless a
    // candidate is verified now and then (a pass timed on a busy moment, or a calibration driven
    // down by weak proposals, would otherwise keep speculation off for the Generator's life).
    std::lock_guard<std::mutex> lock(mutex_);
    if (best > 0) {
      empty_cuts_ = 0;
      recheck_after_ = Generator::kRetimeFirst;
    } else if (before == 0 && ++empty_cuts_ > recheck_after_) {
      best = 1;
      empty_cuts_ = 0;
      recheck_after_ = std::min(2 * recheck_after_, Generator::kRetimeLast);
    }
  }
  truncate(best);
}

void GoodputPlanner::observe_kept(Proposer kind, const Candidates& c,
                                  const std::vector<int64_t>& path) {
  const std::vector<double> reach = c.reach();
  const std::vector<size_t> slot = slots(c);
  std::lock_guard<std::mutex> lock(mutex_);
  Calibration& cal = calibration_[kind];
  const size_t used = slot.empty() ? 0 : *std::max_element(slot.begin(), slot.end()) + 1;
  if (cal.kept.size() < used) cal.kept.resize(used, 0.0), cal.estimated.resize(used, 0.0);
  constexpr double kDecay = 0.95;  // a proposal's weight against the one after it
  for (size_t s = 0; s < cal.kept.size(); ++s) cal.kept[s] *= kDecay, cal.estimated[s] *= kDecay;
  for (size_t i = 0; i < reach.size(); ++i) cal.estimated[slot[i]] += reach[i];
  for (const int64_t node : path) cal.kept[slot[static_cast<size_t>(node)]] += 1.0;
}

void GoodputPlanner::observe_target(int64_t rows, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  target_cost_.observe(rows, seconds);
}

void GoodputPlanner::observe_draft(int64_t rows, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  draft_cost_.observe(rows, seconds);
}

}  // namespace specdec::detail
