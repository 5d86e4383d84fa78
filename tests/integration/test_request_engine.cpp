// RequestEngine: requests that join a running batch at any step and leave it at any step. Each
// request's output equals Generator::generate of that request alone (greedy: token for token;
// sampled: the same seed's tokens), for target-only, a draft model and prompt lookup, whatever
// else runs beside it; cancellation, queue limits and bad requests.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "request_engine_cases.hpp"
#include "specdec/request_engine.hpp"
#include "test_util.hpp"

namespace specdec::test {
namespace {

// kMixed: a draft model loaded; a third of the requests ask for prompt lookup, the others draft
// with the model (a third under the constant schedule, the rest under the default: goodput when
// greedy).
enum class Kind { kTargetOnly, kDraft, kLookup, kMixed };

// A request joins the running batch at every step position: the first request runs alone for `s`
// steps before the others arrive, one per step; each output equals generate() alone. A small
// `prefill_chunk` makes the joining prompts share a few prompt tokens per step.
void check_joins(Kind kind, bool sampled, const Models& m = models(), int64_t prefill_chunk = 256) {
  const bool draft = kind == Kind::kDraft || kind == Kind::kMixed;
  const Generator alone(m.target, draft ? m.draft : nullptr);
  const int64_t n = 7;
  std::vector<GenerationConfig> configs;
  std::vector<std::vector<int64_t>> expected;
  for (int64_t i = 0; i < n; ++i) {
    GenerationConfig c = config_of(i, sampled);
    if (kind == Kind::kLookup || (kind == Kind::kMixed && i % 3 == 0))
      c.prompt_lookup_num_tokens = 1 + i % 4;
    if (kind == Kind::kMixed && i % 3 == 2) c.num_assistant_tokens_schedule = "constant";
    configs.push_back(c);
    expected.push_back(alone.generate(prompt_of(i), c).tokens);
  }
  for (int64_t first_steps = 0; first_steps < 8; ++first_steps) {
    SCOPED_TRACE("the others join after " + std::to_string(first_steps) + " steps");
    const Generator gen(m.target, draft ? m.draft : nullptr);
    RequestEngine::Options o;
    o.max_rows = 3;  // fewer rows than requests: some wait in the queue
    o.context = 64;
    o.prefill_chunk = prefill_chunk;
    RequestEngine engine(gen, o);
    std::vector<Output> out(n);
    engine.submit(request(prompt_of(0), configs[0], out[0]));
    for (int64_t s = 0; s < first_steps; ++s) engine.step();
    for (int64_t i = 1; i < n; ++i) {
      engine.submit(request(prompt_of(i), configs[i], out[i]));
      engine.step();
    }
    run_all(engine);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(out[i].calls, 1) << "request " << i;
      EXPECT_EQ(out[i].finished, expected[i]) << "request " << i;
      EXPECT_EQ(out[i].streamed, expected[i]) << "request " << i;
      EXPECT_EQ(out[i].stop_reason, "max_new_tokens") << "request " << i;
    }
    EXPECT_EQ(engine.load().running, 0);
    EXPECT_EQ(engine.load().waiting, 0);
  }
}

TEST(RequestEngine, GreedyRequestsJoiningAtEveryStepEqualGenerateAlone) {
  check_joins(Kind::kTargetOnly, false);
  check_joins(Kind::kDraft, false);
  check_joins(Kind::kLookup, false);
  check_joins(Kind::kMixed, false);
  for (const Kind kind : {Kind::kTargetOnly, Kind::kDraft, Kind::kLookup})
    check_joins(kind, false, t5_models());
}

TEST(RequestEngine, SeededSampledRequestsJoiningAtEveryStepEqualGenerateAlone) {
  check_joins(Kind::kTargetOnly, true);
  check_joins(Kind::kDraft, true);
  check_joins(Kind::kMixed, true);
  check_joins(Kind::kDraft, true, t5_models());
}

TEST(RequestEngine, RequestsSharingAFewPromptTokensPerStepEqualGenerateAlone) {
  for (const int64_t chunk : {1, 5}) {
    SCOPED_TRACE("prefill_chunk " + std::to_string(chunk));
    check_joins(Kind::kTargetOnly, false, models(), chunk);
    check_joins(Kind::kMixed, false, models(), chunk);
    check_joins(Kind::kMixed, true, models(), chunk);
  }
}

// Cancelled at every step: the row leaves at that step with the tokens it had, the others go on.
TEST(RequestEngine, ACancelledRequestLeavesAtThatStep) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  GenerationConfig c = config_of(1, false);
  c.max_new_tokens = 12;
  const std::vector<int64_t> full = gen.generate(prompt_of(1), c).tokens;
  const std::vector<int64_t> other = gen.generate(prompt_of(2), c).tokens;
  for (int64_t at = 0; at < 6; ++at) {
    SCOPED_TRACE("cancelled after " + std::to_string(at) + " steps");
    RequestEngine engine(gen, {});
    Output a, b;
    const RequestEngine::Id id = engine.submit(request(prompt_of(1), c, a));
    engine.submit(request(prompt_of(2), c, b));
    for (int64_t s = 0; s < at; ++s) engine.step();
    const size_t before = a.streamed.size();
    engine.cancel(id);
    run_all(engine);
    EXPECT_EQ(a.calls, 1);
    EXPECT_TRUE(a.done);
    if (!a.done || a.stop_reason == "max_new_tokens") continue;  // it had finished already
    EXPECT_EQ(a.stop_reason, "cancelled");
    EXPECT_EQ(a.streamed.size(), before) << "tokens after the cancellation";
    EXPECT_EQ(a.finished, a.streamed) << "the result is what was delivered";
    EXPECT_EQ(
        a.finished,
        std::vector<int64_t>(full.begin(), full.begin() + static_cast<int64_t>(a.finished.size())));
    EXPECT_EQ(b.finished, other);
  }
}

TEST(RequestEngine, AQueuedRequestCancelledLeavesTheQueueAtOnce) {
  const Models m = models();
  const Generator gen(m.target);
  RequestEngine::Options o;
  o.max_rows = 1;
  RequestEngine engine(gen, o);
  Output a, b;
  engine.submit(request(prompt_of(1), config_of(1, false), a));
  const RequestEngine::Id queued = engine.submit(request(prompt_of(2), config_of(2, false), b));
  EXPECT_EQ(engine.load().waiting, 2);
  engine.cancel(queued);
  EXPECT_TRUE(b.done);
  EXPECT_EQ(b.stop_reason, "cancelled");
  EXPECT_TRUE(b.finished.empty());
  run_all(engine);
  EXPECT_EQ(a.stop_reason, "max_new_tokens");
  EXPECT_EQ(b.calls, 1);
}

TEST(RequestEngine, AFailingSinkFailsItsRequestAlone) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  RequestEngine engine(gen, {});
  Output good;
  GenerationResult failed;
  Request bad = request(prompt_of(3), config_of(3, false), good);
  Output unused;
  bad.on_tokens = [](const std::vector<int64_t>&, const std::vector<TokenLogprob>&) {
    throw std::runtime_error("the client is gone");
  };
  bad.on_finished = [&](const GenerationResult& g) { failed = g; };
  engine.submit(std::move(bad));
  engine.submit(request(prompt_of(4), config_of(4, false), good));
  run_all(engine);
  EXPECT_EQ(failed.stats.stop_reason, "error");
  EXPECT_EQ(failed.error, "the client is gone");
  EXPECT_EQ(good.finished, gen.generate(prompt_of(4), config_of(4, false)).tokens);
}

// step() while another step runs (here from a sink, which runs inside the step, as a second
// thread would) is refused; the engine goes on.
TEST(RequestEngine, ASecondSteppingThreadIsRefused) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  RequestEngine engine(gen, {});
  Output out;
  std::string refused;
  Request r = request(prompt_of(5), config_of(5, false), out);
  auto sink = r.on_tokens;
  r.on_tokens = [&](const std::vector<int64_t>& ids, const std::vector<TokenLogprob>& lps) {
    if (refused.empty()) try {
        engine.step();
        refused = "(not refused)";
      } catch (const Error& e) {
        refused = e.what();
      }
    sink(ids, lps);
  };
  engine.submit(std::move(r));
  run_all(engine);
  EXPECT_NE(refused.find("called while another thread steps the engine"), std::string::npos)
      << refused;
  EXPECT_EQ(out.finished, gen.generate(prompt_of(5), config_of(5, false)).tokens);
}

// The log-probabilities are the target's own: log-softmax of a target-only forward pass over the
// prompt and the tokens generated before each one. With a draft model, and with suffix trees
// (whose kept path is not the first candidates: the rows of the path, in order), after sampled
// answers that make the shared tree branch.
TEST(RequestEngine, LogprobsAreTheTargetsOwn) {
  const Models m = models();
  for (const bool trees : {false, true}) {
    Generator gen(m.target, trees ? nullptr : m.draft);
    gen.set_suffix_options(branching_suffix_trees());
    RequestEngine engine(gen, {});
    GenerationConfig config = config_of(5, false);
    if (trees) {
      config.suffix_speculation = true;
      config.num_assistant_tokens_schedule = "constant";
      config.num_assistant_tokens = 6;
      config.max_new_tokens = 24;
      for (uint64_t i = 0; i < 6; ++i) {
        Request warm;
        warm.prompt = prompt_of(static_cast<int>(i));
        warm.config = config;
        warm.config.do_sample = true;
        warm.config.temperature = 1.5;
        warm.config.seed = i;
        engine.submit(std::move(warm));
      }
      run_all(engine);
    }
    std::vector<TokenLogprob> got;
    std::vector<int64_t> tokens;
    int64_t tree_passes = 0;
    Request r;
    r.prompt = prompt_of(5);
    r.config = config;
    r.top_logprobs = 3;
    r.on_tokens = [&](const std::vector<int64_t>& t, const std::vector<TokenLogprob>& lp) {
      tokens.insert(tokens.end(), t.begin(), t.end());
      got.insert(got.end(), lp.begin(), lp.end());
    };
    r.on_finished = [&](const GenerationResult& res) { tree_passes = res.stats.tree_passes; };
    engine.submit(std::move(r));
    run_all(engine);
    if (trees) EXPECT_GT(tree_passes, 0) << "no tree was verified";
    ASSERT_EQ(got.size(), tokens.size());
    std::vector<int64_t> seq = prompt_of(5);
    const auto p = static_cast<int64_t>(seq.size());
    seq.insert(seq.end(), tokens.begin(), tokens.end());
    c10::InferenceMode guard;
    KVCache cache = m.target->make_cache(static_cast<int64_t>(seq.size()), 1);
    const at::Tensor ids = at::tensor(seq, at::kLong).view({1, -1});
    const at::Tensor lp =
        at::log_softmax(m.target->forward(ids, cache, ids.size(1))[0].to(at::kFloat), -1);
    for (size_t j = 0; j < tokens.size(); ++j) {
      const at::Tensor row = lp[p - 1 + static_cast<int64_t>(j)];  // [V]
      EXPECT_EQ(got[j].token, tokens[j]);
      EXPECT_NEAR(got[j].logprob, row[tokens[j]].item<double>(), 1e-5)
          << (trees ? "trees, " : "draft, ") << "token " << j;
      ASSERT_EQ(got[j].top.size(), 3u);
      const auto top = row.topk(3);
      for (int64_t k = 0; k < 3; ++k) {
        EXPECT_EQ(got[j].top[k].first, std::get<1>(top)[k].item<int64_t>());
        EXPECT_NEAR(got[j].top[k].second, std::get<0>(top)[k].item<double>(), 1e-5);
      }
      EXPECT_EQ(got[j].top[0].first, tokens[j]) << "greedy keeps the most likely token";
    }
  }
}

// A verifier of one's own that takes no trees (Verifier::verifies_trees) gets chains from suffix
// speculation set to propose trees, and the same tokens; the built-in one gets trees.
TEST(RequestEngine, AVerifierWithoutTreesGetsChains) {
  class Chains final : public Verifier {
   public:
    at::Tensor decide(const at::Tensor& s, const Candidates& c, Rng& rng) const override {
      return GreedyVerifier().decide(s, c, rng);
    }
  };
  const Models m = models();
  const auto want = Generator(m.target).generate(prompt_of(3), config_of(3, false)).tokens;
  for (const bool own : {true, false}) {
    Generator gen(m.target);
    gen.set_suffix_options(branching_suffix_trees());
    GenerationConfig config = config_of(3, false);
    config.suffix_speculation = true;
    config.num_assistant_tokens_schedule = "constant";
    for (uint64_t i = 0; i < 6; ++i) {  // sampled answers: the shared tree branches
      GenerationConfig sampled = config;
      sampled.do_sample = true;
      sampled.temperature = 1.5;
      sampled.seed = i;
      gen.generate(prompt_of(static_cast<int64_t>(i)), sampled);
    }
    if (own) gen.set_verifier(std::make_shared<Chains>());
    const GenerationResult r = gen.generate(prompt_of(3), config);
    EXPECT_EQ(r.tokens, want) << (own ? "own verifier" : "built-in verifier");
    if (own)
      EXPECT_EQ(r.stats.tree_passes, 0);
    else
      EXPECT_GT(r.stats.tree_passes, 0);
  }
}

// A verifier of one's own whose verdict names a candidate or a token that does not exist fails
// the request with specdec::Error (it read past the proposal); a RequestEngine keeps the verifier
// it was made with, alive, whatever is set after.
TEST(RequestEngine, AVerdictOutOfRangeIsAnErrorAndTheEngineKeepsItsVerifier) {
  struct Wrong final : Verifier {
    int64_t accepted, token;
    Wrong(int64_t a, int64_t t) : accepted(a), token(t) {}
    at::Tensor decide(const at::Tensor&, const Candidates&, Rng&) const override {
      return at::tensor(std::vector<int64_t>{accepted, token}, at::kLong);
    }
  };
  const Models m = models();
  GenerationConfig c = config_of(0, false);
  c.prompt_lookup_num_tokens = 3;
  c.num_assistant_tokens_schedule = "constant";
  const int64_t vocab = m.target->config().vocab_size;
  for (const auto& [accepted, token] :
       {std::pair<int64_t, int64_t>{1000, 5}, {0, vocab}, {0, -1}, {-1, 5}}) {
    Generator gen(m.target);
    gen.set_verifier(std::make_shared<Wrong>(accepted, token));
    EXPECT_THROW(gen.generate(prompt_of(3), c), Error) << accepted << " " << token;
  }
  Generator gen(m.target);
  gen.set_verifier(std::make_shared<Wrong>(0, 5));  // always token 5
  RequestEngine::Options o;
  o.context = 64;
  RequestEngine engine(gen, o);
  gen.set_verifier(nullptr);  // (the engine's verifier stays alive and in use)
  const Output out = run_alone(engine, prompt_of(3), c);
  EXPECT_EQ(out.finished, std::vector<int64_t>(static_cast<size_t>(c.max_new_tokens), 5));
}

TEST(RequestEngine, BadRequestsAreClearErrorsAndTheQueueIsBounded) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  RequestEngine::Options o;
  o.context = 32;
  o.max_rows = 1;
  o.max_queue = 2;
  RequestEngine engine(gen, o);
  Output out;
  const auto message = [&](std::vector<int64_t> prompt, GenerationConfig c) {
    try {
      engine.submit(request(prompt, c, out));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  GenerationConfig c = config_of(0, false);
  EXPECT_NE(message(std::vector<int64_t>(40, 3), c).find("context holds 32"), std::string::npos);
  c.max_new_tokens = 30;
  EXPECT_NE(message({1, 2, 3}, c).find("more than the context of 32"), std::string::npos);
  c.max_new_tokens = 4;
  EXPECT_NE(message({}, c).find("empty"), std::string::npos);
  c.prompt_lookup_num_tokens = 3;  // beside the draft model's rows
  EXPECT_EQ(message({1, 2}, c), "accepted");
  c.prompt_lookup_num_tokens = 0;
  EXPECT_EQ(message({1, 2}, c), "accepted");
  EXPECT_EQ(message({1, 2}, c), "accepted");  // the free row's, and two waiting for a row
  EXPECT_THROW(engine.submit(request({1, 2}, c, out)), QueueFull);
  EXPECT_EQ(engine.load().waiting, 3);
  // No queue: a request is taken while a row is free, and refused while none is.
  RequestEngine::Options no_queue = o;
  no_queue.max_queue = 0;
  RequestEngine unqueued(gen, no_queue);
  unqueued.submit(request({1, 2}, c, out));
  EXPECT_THROW(unqueued.submit(request({1, 2}, c, out)), QueueFull);
  unqueued.step();  // the row is taken: still none free
  EXPECT_THROW(unqueued.submit(request({1, 2}, c, out)), QueueFull);
  RequestEngine::Options zero;
  zero.max_rows = 0;
  EXPECT_THROW(RequestEngine(gen, zero), Error);
  // A context past max_position_embeddings: refused for a decoder-only target, not for T5, whose
  // relative positions have no such limit (its fixture's config says 2048 all the same).
  RequestEngine::Options long_context;
  long_context.context = 4096;
  ASSERT_EQ(m.target->config().max_position_embeddings, 2048);
  EXPECT_THROW(RequestEngine(gen, long_context), Error);
  const Models t5 = t5_models();
  ASSERT_EQ(t5.target->config().max_position_embeddings, 2048);
  const Generator t5_gen(t5.target, nullptr);
  RequestEngine t5_engine(t5_gen, long_context);
  Output t5_out;
  c.max_new_tokens = 3000;  // the decoder's positions: more than max_position_embeddings
  t5_engine.submit(request({1, 2}, c, t5_out));
}

// One request's fault stays its own: a logit_bias id past the vocabulary is refused at submit
// (it failed every running row when its scores arrived), and an on_finished that throws leaves
// the other requests to finish with their tokens.
TEST(RequestEngine, OneRequestsFaultStaysItsOwn) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  RequestEngine engine(gen, RequestEngine::Options{});
  GenerationConfig c = config_of(0, false);
  c.max_new_tokens = 6;
  Output a, b, bad;
  Request throwing = request(prompt_of(1), c, a);
  throwing.on_finished = [](const GenerationResult&) {
    throw std::runtime_error("a's on_finished");
  };
  engine.submit(std::move(throwing));
  engine.submit(request(prompt_of(2), c, b));
  engine.step();
  GenerationConfig biased = c;
  biased.logit_bias = {{m.target->config().vocab_size + 10, 1.0}};
  try {
    engine.submit(request(prompt_of(3), biased, bad));
    ADD_FAILURE() << "a logit_bias id past the vocabulary was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logit_bias token id"), std::string::npos) << e.what();
  }
  run_all(engine);
  EXPECT_EQ(b.stop_reason, "max_new_tokens");
  EXPECT_EQ(b.finished, gen.generate(prompt_of(2), c).tokens);
  EXPECT_EQ(b.calls, 1);
  EXPECT_EQ(engine.load().running, 0);
  EXPECT_FALSE(bad.done);
}

// A request's client may ask /metrics as soon as it has its answer: a row that finished is no
// longer counted running, while the step it finished in goes on with the other rows.
TEST(RequestEngine, AFinishedRowIsNotCountedRunning) {
  const Models& m = models();
  const Generator gen(m.target, nullptr);
  RequestEngine::Options o;
  o.context = 64;
  RequestEngine engine(gen, o);
  GenerationConfig shorter = config_of(0, false), longer = shorter;
  shorter.max_new_tokens = 3;
  longer.max_new_tokens = 12;
  Output a, b;
  std::vector<int64_t> seen;  // load().running in a's on_finished, in the step a finished in
  Request first = request(prompt_of(1), shorter, a);
  first.on_finished = [&](const GenerationResult&) { seen.push_back(engine.load().running); };
  engine.submit(std::move(first));
  engine.submit(request(prompt_of(2), longer, b));
  run_all(engine);
  EXPECT_EQ(seen, std::vector<int64_t>{1}) << "b runs on; a is done";
  EXPECT_EQ(b.calls, 1);
}

// The engine thread runs while four client threads submit, and cancel every third request: every
// request finishes exactly once, the uncancelled ones with the tokens they get alone.
TEST(RequestEngineThreads, ClientsSubmitAndCancelWhileTheEngineRuns) {
  const Models m = models();
  const Generator gen(m.target, m.draft);
  const int64_t kinds = 6;
  std::vector<std::vector<int64_t>> expected;
  for (int64_t i = 0; i < kinds; ++i)
    expected.push_back(gen.generate(prompt_of(i), config_of(i, false)).tokens);
  RequestEngine::Options o;
  o.max_rows = 3;
  o.context = 64;
  o.max_queue = 1000;
  RequestEngine engine(gen, o);
  std::thread runner([&] { engine.run(); });
  std::mutex mutex;
  std::vector<std::unique_ptr<Output>> outputs(4 * 12);
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      for (int64_t j = 0; j < 12; ++j) {
        const int64_t n = c * 12 + j;
        auto out = std::make_unique<Output>();
        Request r = request(prompt_of(n % kinds), config_of(n % kinds, false), *out);
        std::condition_variable done;
        bool finished = false;
        r.on_finished = [&, inner = r.on_finished](const GenerationResult& g) {
          inner(g);
          std::lock_guard<std::mutex> lock(mutex);
          finished = true;
          done.notify_all();
        };
        const RequestEngine::Id id = engine.submit(std::move(r));
        if (n % 3 == 0) engine.cancel(id);
        std::unique_lock<std::mutex> lock(mutex);
        done.wait(lock, [&] { return finished; });
        outputs[n] = std::move(out);
      }
    });
  for (std::thread& t : clients) t.join();
  engine.stop();
  runner.join();
  for (int64_t n = 0; n < static_cast<int64_t>(outputs.size()); ++n) {
    const Output& out = *outputs[n];
    EXPECT_EQ(out.calls, 1) << "request " << n;
    if (out.stop_reason == "cancelled") {
      EXPECT_EQ(n % 3, 0) << "request " << n;
      continue;
    }
    EXPECT_EQ(out.finished, expected[n % kinds])
        << "request " << n << " (" << out.stop_reason << ": " << out.error << ")";
  }
  EXPECT_EQ(engine.load().running, 0);
}

}  // namespace
}  // namespace specdec::test
