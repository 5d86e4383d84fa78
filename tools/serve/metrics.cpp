#include "serve/metrics.hpp"

#include <prometheus/text_serializer.h>

namespace specdec::serve {
namespace {

prometheus::Counter& counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}
prometheus::Gauge& gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram& histogram(prometheus::Registry& r, const std::string& name,
                                 const std::string& help,
                                 prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("specdec:requests_total")
                    .Help("Requests by how they ended: ok, refused (4xx), error (failed, 5xx), "
                          "cancelled")
                    .Register(*registry_)),
      prompt_tokens_(
          counter(*registry_, "specdec:prompt_tokens_total", "Prompt tokens of finished requests")),
      generation_tokens_(
          counter(*registry_, "specdec:generation_tokens_total", "Generated tokens")),
      drafts_(counter(*registry_, "specdec:spec_decode_num_drafts_total",
                      "Verification passes of a row with at least one drafted token")),
      draft_tokens_(
          counter(*registry_, "specdec:spec_decode_num_draft_tokens_total", "Drafted tokens")),
      accepted_(counter(*registry_, "specdec:spec_decode_num_accepted_tokens_total",
                        "Drafted tokens the target accepted")),
      accepted_per_pos_(
          prometheus::BuildCounter()
              .Name("specdec:spec_decode_num_accepted_tokens_per_pos_total")
              .Help("Accepted drafted tokens by their position in the draft (0: the first)")
              .Register(*registry_)),
      waiting_(gauge(*registry_, "specdec:num_requests_waiting", "Requests in the queue")),
      running_(gauge(*registry_, "specdec:num_requests_running", "Requests in the running batch")),
      ttft_(histogram(*registry_, "specdec:time_to_first_token_seconds",
                      "From the request's arrival to its first token",
                      {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60})),
      itl_(histogram(
          *registry_, "specdec:inter_token_latency_seconds",
          "Between consecutive tokens of a request (a group verified together shares its interval)",
          {0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2})) {
  for (const char* status : {"ok", "refused", "error", "cancelled"})
    requests_.Add({{"status", status}});
  accepted_per_pos_.Add({{"position", "0"}});  // the family is listed before the first draft
}

void Metrics::finished(const std::string& status, const GenerationStats& s) {
  requests_.Add({{"status", status}}).Increment();
  prompt_tokens_.Increment(static_cast<double>(s.prompt_tokens));
  generation_tokens_.Increment(static_cast<double>(s.new_tokens));
  for (const auto& [drafted, accepted] : s.trace)
    if (drafted > 0) drafts_.Increment();
  draft_tokens_.Increment(static_cast<double>(s.drafted_tokens));
  accepted_.Increment(static_cast<double>(s.accepted_tokens));
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < s.accepted_at_position.size(); ++i)
    accepted_per_pos_.Add({{"position", std::to_string(i)}})
        .Increment(static_cast<double>(s.accepted_at_position[i]));
}

void Metrics::refused(int http_status) {
  requests_.Add({{"status", http_status >= 500 ? "error" : "refused"}}).Increment();
}

std::string Metrics::render(int64_t waiting, int64_t running) {
  waiting_.Set(static_cast<double>(waiting));
  running_.Set(static_cast<double>(running));
  std::lock_guard<std::mutex> lock(mutex_);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace specdec::serve
