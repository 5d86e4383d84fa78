// The requests, models and runs that the RequestEngine tests share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "specdec/request_engine.hpp"
#include "test_util.hpp"

namespace specdec::test {

struct Models {
  std::shared_ptr<const Model> target, draft;
};

inline Models make_models(const std::string& arch) {
  const std::string t = cached_fixture("engine_" + arch, small_fixture(21, 3, arch));
  const std::string d = temp_dir("engine_d_" + arch);
  make_draft_of(t, d, 1, 0.02, 21);
  return Models{test_model(t), test_model(d)};
}

inline Models models() {
  static const Models m = make_models("llama");
  return m;
}

// An encoder-decoder pair: each request's encoder pass runs as it joins.
inline Models t5_models() {
  static const Models m = make_models("t5");
  return m;
}

// One request's output as the engine delivered it.
struct Output {
  std::vector<int64_t> streamed, finished;
  std::string stop_reason, error;
  int64_t cached = 0;  // prompt positions reused
  int64_t calls = 0;
  bool done = false;
};

inline Request request(const std::vector<int64_t>& prompt, const GenerationConfig& c, Output& out) {
  Request r;
  r.prompt = prompt;
  r.config = c;
  r.on_tokens = [&out](const std::vector<int64_t>& t, const std::vector<TokenLogprob>&) {
    out.streamed.insert(out.streamed.end(), t.begin(), t.end());
  };
  r.on_finished = [&out](const GenerationResult& g) {
    out.finished = g.tokens;
    out.stop_reason = g.stats.stop_reason;
    out.error = g.error;
    out.cached = g.stats.cached_prompt_tokens;
    ++out.calls;
    out.done = true;
  };
  return r;
}

// Steps the engine until it has nothing left to do.
inline void run_all(RequestEngine& engine) {
  while (engine.step()) {
  }
}

// One request run to its end, on an engine with nothing else to do.
inline Output run_alone(RequestEngine& engine, const std::vector<int64_t>& prompt,
                        const GenerationConfig& c) {
  Output out;
  engine.submit(request(prompt, c, out));
  run_all(engine);
  return out;
}

// A conversation's turn: `prompt` run to its end alone, then the prompt followed by its answer.
inline std::vector<int64_t> answered(RequestEngine& engine, std::vector<int64_t> prompt,
                                     const GenerationConfig& c) {
  const Output out = run_alone(engine, prompt, c);
  prompt.insert(prompt.end(), out.finished.begin(), out.finished.end());
  return prompt;
}

inline std::vector<int64_t> prompt_of(int64_t i) {
  std::vector<int64_t> p;
  for (int64_t j = 0; j < 3 + (i * 5) % 11; ++j) p.push_back((i * 7 + j * 3) % 60 + 2);
  if (i % 3 == 0) p.insert(p.end(), p.begin(), p.end());  // something prompt lookup can copy
  return p;
}

inline GenerationConfig config_of(int64_t i, bool sampled) {
  GenerationConfig c;
  c.max_new_tokens = 6 + (i * 3) % 13;
  c.num_assistant_tokens = 1 + i % 5;
  c.eos_token_ids = {-1};  // no EOS: every request runs to its length (long rows overlap)
  if (sampled) {
    c.do_sample = true;
    c.temperature = 0.9;
    c.seed = 100 + static_cast<uint64_t>(i);
  }
  return c;
}

}  // namespace specdec::test
