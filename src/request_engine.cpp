#include "specdec/request_engine.hpp"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "engine.hpp"
#include "specdec/error.hpp"
#include "util.hpp"

namespace specdec {

// The queue and the rows of the running batch. The engine (detail::Engine) takes its rows from
// here (next(), on the engine's thread, during step()); submit and cancel come from any thread.
struct RequestEngine::Impl final : detail::RowSource {
  Impl(const Generator& g, detail::EngineModels m) : generator(g), models(std::move(m)) {}
  const Generator& generator;
  const detail::EngineModels models;

  detail::InUse stepping;    // a step() is running (one thread steps the engine)
  mutable std::mutex mutex;  // guards the members below it
  std::condition_variable wake;
  std::deque<std::unique_ptr<detail::Row>> waiting;
  std::vector<std::unique_ptr<detail::Row>> running;  // admitted rows (the engine points at them)
  std::unordered_map<Id, detail::Row*> rows;          // waiting or running, by id
  Id next_id = 1;
  bool stopping = false;

  // Built by the first step (on the engine's thread, in inference mode), rebuilt after a failure.
  std::unique_ptr<detail::Engine> engine;
  const BatchTokenCallback no_callback;
  const BatchOptions no_options;

  bool admits_all() const override { return true; }
  // The admitted rows that have not finished (one that finished in the step under way is out:
  // its client has its answer, and its row is free at the next step). Under `mutex`.
  int64_t unfinished() const {
    return std::count_if(running.begin(), running.end(),
                         [](const auto& row) { return !row->done; });
  }
  detail::Row* next() override {
    std::lock_guard<std::mutex> lock(mutex);
    if (waiting.empty()) return nullptr;
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
    return running.back().get();
  }

  // Every running row fails with `message` (a model call threw: the batch's caches are then in no
  // known state, so the engine starts afresh at the next step).
  void fail_running(const std::string& message) {
    engine.reset();
    std::vector<std::unique_ptr<detail::Row>> failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      failed.swap(running);
      for (const auto& row : failed) rows.erase(row->index);
    }
    for (const auto& row : failed) {
      if (row->done) continue;
      row->result.stats.stop_reason = "error";
      row->result.error = message;
      detail::finished(*row);
    }
  }
};

RequestEngine::RequestEngine(const Generator& generator, Options options)
    : options_(options), impl_(std::make_unique<Impl>(generator, generator.models())) {
  SPECDEC_CHECK(options_.max_rows >= 1, "RequestEngine: max_rows must be >= 1, got ",
                options_.max_rows);
  SPECDEC_CHECK(options_.context >= 2, "RequestEngine: context must be >= 2 positions, got ",
                options_.context);
  SPECDEC_CHECK(options_.prefill_chunk >= 1, "RequestEngine: prefill_chunk must be >= 1, got ",
                options_.prefill_chunk);
  SPECDEC_CHECK(options_.prefix_cache >= 0, "RequestEngine: prefix_cache must be >= 0, got ",
                options_.prefix_cache);
  SPECDEC_CHECK(options_.max_queue >= 0, "RequestEngine: max_queue must be >= 0, got ",
                options_.max_queue);
  const ModelConfig& tc = generator.target().config();
  // (T5's relative positions have no such limit.)
  SPECDEC_CHECK(tc.is_encoder_decoder || options_.context <= tc.max_position_embeddings,
                "RequestEngine: a context of ", options_.context,
                " positions is more than the target's max_position_embeddings (",
                tc.max_position_embeddings, ")");
}

RequestEngine::~RequestEngine() = default;

RequestEngine::Id RequestEngine::submit(Request request) {
  auto row = std::make_unique<detail::Row>();
  const int64_t length = detail::prepare_row(*row, impl_->models, request.prompt, request.config);
  const auto prompt = static_cast<int64_t>(request.prompt.size());
  SPECDEC_CHECK(prompt < options_.context, "the prompt is ", count_of(prompt, "token"),
                ", the context holds ", options_.context,
                " positions (prompt and new tokens) per request");
  SPECDEC_CHECK(length <= options_.context, "the prompt (", count_of(prompt, "token"),
                ") plus max_new_tokens (", request.config.max_new_tokens, ") is ", length,
                " positions, more than the context of ", options_.context);
  SPECDEC_CHECK(request.top_logprobs >= -1 && request.top_logprobs <= 20,
                "top_logprobs must be in [0, 20] (-1: none), got ", request.top_logprobs);
  row->sink = std::move(request.on_tokens);
  row->on_finished = std::move(request.on_finished);
  row->top_logprobs = request.top_logprobs;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // The waiting requests that the free rows take at the next step do not wait for a row.
  const auto free_rows = std::max<int64_t>(0, options_.max_rows - impl_->unfinished());
  if (static_cast<int64_t>(impl_->waiting.size()) >= options_.max_queue + free_rows)
    throw QueueFull("the queue is full (" + count_of(options_.max_queue, "request") +
                    " waiting for a row)");
  const Id id = impl_->next_id++;
  row->index = id;
  impl_->rows[id] = row.get();
  impl_->waiting.push_back(std::move(row));
  impl_->wake.notify_all();
  return id;
}

void RequestEngine::cancel(Id id) {
  std::unique_ptr<detail::Row> dropped;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    const auto it = impl_->rows.find(id);
    if (it == impl_->rows.end()) return;
    detail::Row* row = it->second;
    row->cancelled = true;  // a running row leaves at its next commit
    for (auto w = impl_->waiting.begin(); w != impl_->waiting.end(); ++w) {
      if (w->get() != row) continue;
      dropped = std::move(*w);
      impl_->waiting.erase(w);
      impl_->rows.erase(it);
      break;
    }
  }
  if (!dropped) return;
  dropped->result.stats.prompt_tokens = static_cast<int64_t>(dropped->prompt.size());
  dropped->result.stats.stop_reason = "cancelled";
  detail::finished(*dropped);
}

bool RequestEngine::step() {
  Impl& s = *impl_;
  const detail::Claim claim(s.stepping,
                            "RequestEngine::step: called while another thread steps the engine "
                            "(step and run from one thread)");
  bool worked = false;
  try {
    // (A libtorch error's message without its C++ backtrace: it goes to the failed rows' results.)
    worked = torch_errors_as_specdec("RequestEngine::step", [&] {
      c10::InferenceMode guard;
      if (!s.engine)
        s.engine = std::make_unique<detail::Engine>(
            s.models, *s.generator.state_, s, static_cast<bool>(s.models.draft), options_.max_rows,
            options_.context, s.no_callback, s.no_options, nullptr, options_.prefix_cache,
            options_.prefill_chunk);
      return s.engine->step();
    });
  } catch (const std::exception& e) {
    s.fail_running(e.what());
    return true;
  }
  // The rows that left the batch in this step are done with (the engine no longer points at them).
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& row : s.running)
    if (row->done) {
      s.rows.erase(row->index);
      row.reset();
    }
  s.running.erase(std::remove(s.running.begin(), s.running.end(), nullptr), s.running.end());
  return worked;
}

void RequestEngine::run() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      if (impl_->stopping) {
        impl_->stopping = false;
        return;
      }
    }
    if (step()) continue;
    std::unique_lock<std::mutex> lock(impl_->mutex);
    impl_->wake.wait(lock, [&] { return impl_->stopping || !impl_->waiting.empty(); });
  }
}

void RequestEngine::stop() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stopping = true;
  impl_->wake.notify_all();
}

RequestEngine::Load RequestEngine::load() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return {static_cast<int64_t>(impl_->waiting.size()), impl_->unfinished()};
}

}  // namespace specdec
