#include "specdec/stats.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

namespace specdec {

namespace {
double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }
}  // namespace

double GenerationStats::acceptance_rate() const {
  return ratio(static_cast<double>(accepted_tokens), static_cast<double>(drafted_tokens));
}
double GenerationStats::tokens_per_target_pass() const {
  return ratio(static_cast<double>(new_tokens), static_cast<double>(target_passes));
}
double GenerationStats::tokens_per_second() const {
  return ratio(static_cast<double>(new_tokens), total_seconds);
}
double GenerationStats::draft_seconds_per_token() const {
  return ratio(drafting_seconds, static_cast<double>(draft_passes - prefill_draft_passes));
}
double GenerationStats::target_seconds_per_pass() const {
  return ratio(verification_seconds, static_cast<double>(target_passes - 1));
}
double GenerationStats::cost_ratio() const {
  return ratio(draft_seconds_per_token(), target_seconds_per_pass());
}

std::string GenerationStats::to_json() const {
  nlohmann::json j;
  j["prompt_tokens"] = prompt_tokens;
  j["cached_prompt_tokens"] = cached_prompt_tokens;
  j["encoder_passes"] = encoder_passes;
  j["new_tokens"] = new_tokens;
  j["target_passes"] = target_passes;
  j["prefill_passes"] = prefill_passes;
  j["draft_passes"] = draft_passes;
  j["prefill_draft_passes"] = prefill_draft_passes;
  j["drafted_tokens"] = drafted_tokens;
  j["tree_passes"] = tree_passes;
  j["accepted_tokens"] = accepted_tokens;
  j["acceptance_rate"] = acceptance_rate();
  j["tokens_per_target_pass"] = tokens_per_target_pass();
  j["trace"] = trace;
  j["accepted_at_position"] = accepted_at_position;
  j["drafted_at_position"] = drafted_at_position;
  j["final_confidence_threshold"] = std::isfinite(final_confidence_threshold)
                                        ? nlohmann::json(final_confidence_threshold)
                                        : nlohmann::json("inf");
  j["stop_reason"] = stop_reason;
  j["prefill_seconds"] = prefill_seconds;
  j["drafting_seconds"] = drafting_seconds;
  j["verification_seconds"] = verification_seconds;
  j["other_seconds"] = other_seconds;
  j["total_seconds"] = total_seconds;
  j["tokens_per_second"] = tokens_per_second();
  j["draft_seconds_per_token"] = draft_seconds_per_token();
  j["target_seconds_per_pass"] = target_seconds_per_pass();
  j["cost_ratio"] = cost_ratio();
  return j.dump();
}

double predicted_speedup(double alpha, double gamma, double c, double pass_ratio) {
  const double denom_c = gamma * c + pass_ratio;
  if (alpha >= 1.0) return (gamma + 1.0) / denom_c;  // limit of the formula as alpha -> 1
  return (1.0 - std::pow(alpha, gamma + 1.0)) / ((1.0 - alpha) * denom_c);
}

SpeedupEstimate estimate_speedup(const GenerationStats& target_only,
                                 const GenerationStats& assisted) {
  SpeedupEstimate e;
  e.measured = ratio(target_only.total_seconds, assisted.total_seconds);
  int64_t rejections = 0;
  for (const auto& p : assisted.trace) rejections += p[1] < p[0] ? 1 : 0;
  e.alpha = ratio(static_cast<double>(assisted.accepted_tokens),
                  static_cast<double>(assisted.accepted_tokens + rejections));
  e.gamma = ratio(static_cast<double>(assisted.drafted_tokens),
                  static_cast<double>(assisted.target_passes));
  e.cost_ratio = ratio(assisted.draft_seconds_per_token(), target_only.target_seconds_per_pass());
  e.cost_measured =
      assisted.draft_passes == 0 || assisted.draft_passes > assisted.prefill_draft_passes;
  e.predicted = assisted.tree_passes > 0 || assisted.drafted_tokens == 0 || !e.cost_measured
                    ? 0.0
                    : predicted_speedup(e.alpha, e.gamma, e.cost_ratio);
  e.pass_ratio = ratio(assisted.target_seconds_per_pass(), target_only.target_seconds_per_pass());
  if (e.predicted > 0 && e.pass_ratio > 0)
    e.predicted_with_passes = predicted_speedup(e.alpha, e.gamma, e.cost_ratio, e.pass_ratio);
  return e;
}

}  // namespace specdec
