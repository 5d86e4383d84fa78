// The /metrics of `specdec serve` (Prometheus text format, through prometheus-cpp): request and
// token counters, queue and batch gauges, latency histograms, and the speculative counters under
// vLLM's names (spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens, _per_pos).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "specdec/stats.hpp"

namespace specdec::serve {

class Metrics {
 public:
  Metrics();
  // A request that ended: "ok", "error" or "cancelled", with its stats.
  void finished(const std::string& status, const GenerationStats& stats);
  // A request refused before it ran: status "refused" for a 4xx (bad input, an unknown model, a
  // full queue), "error" for a 5xx.
  void refused(int http_status);
  void first_token(double seconds) { ttft_.Observe(seconds); }
  void inter_token(double seconds) { itl_.Observe(seconds); }
  // The Prometheus text exposition, with the queue and batch now.
  std::string render(int64_t waiting, int64_t running);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter &prompt_tokens_, &generation_tokens_, &drafts_, &draft_tokens_, &accepted_;
  prometheus::Family<prometheus::Counter>& accepted_per_pos_;
  prometheus::Gauge &waiting_, &running_;
  prometheus::Histogram &ttft_, &itl_;
  std::mutex mutex_;  // guards the per-position counters' creation
};

}  // namespace specdec::serve
