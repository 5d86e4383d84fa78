// What a service needs from one shared Generator: concurrent requests that do not interfere, and
// requests that a streaming callback stops (specdec::Cancelled) or that fail inside the callback,
// after which the Generator goes on as before.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "test_util.hpp"
#include "torch_compat.hpp"

namespace specdec::test {
namespace {

FixtureOptions small_llama(uint64_t seed, int64_t layers) {
  FixtureOptions o;
  o.seed = seed, o.layers = layers, o.hidden = 64, o.heads = 4, o.kv_heads = 2, o.vocab = 96;
  o.init_std = 0.1, o.exit_layers = 1, o.exit_scale = 0.2;
  return o;
}

struct Request {
  std::vector<int64_t> prompt;
  GenerationConfig config;
};

std::vector<Request> mixed_requests() {
  std::vector<Request> out;
  const char* schedules[] = {"constant", "heuristic", "heuristic_transient", "dynamic"};
  for (int i = 0; i < 24; ++i) {
    Request r;
    for (int j = 0; j <= i % 9; ++j) r.prompt.push_back((i * 13 + j * 7) % 90 + 3);
    r.config.max_new_tokens = 8 + (i * 5) % 30;
    r.config.eos_token_ids = {95};
    r.config.num_assistant_tokens_schedule = schedules[i % 4];
    if (i % 3 == 1) r.config.do_sample = true, r.config.seed = 100 + i, r.config.temperature = 0.8;
    if (i % 5 == 4) r.config.prompt_lookup_num_tokens = 4;
    out.push_back(r);
  }
  return out;
}

}  // namespace

// Failing and cancelled requests run among them and change nothing for the others.
TEST(Service, EightThreadsOnOneGeneratorGiveWhatEachRequestGivesAlone) {
  const auto target = cached_model(cached_fixture("svc_t", small_llama(4, 3)));
  const std::string draft_dir = temp_dir("svc_d");
  make_draft_of(cached_fixture("svc_t", small_llama(4, 3)), draft_dir, 1);
  const auto draft = load_model(draft_dir);
  const auto requests = mixed_requests();
  std::vector<std::vector<int64_t>> alone;
  for (const Request& r : requests) {
    // Alone: a fresh Generator each, so no lookahead carried from another request.
    alone.push_back(Generator(target, draft).generate(r.prompt, r.config).tokens);
  }
  const Generator shared(target, draft);
  std::vector<std::vector<int64_t>> got(requests.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < requests.size();) {
        const Request& r = requests[i];
        if (i % 4 == 3) {
          // Beside the others: a request whose client fails mid-way, and one it cancels.
          int64_t n = 0;
          EXPECT_THROW(shared.generate(r.prompt, r.config,
                                       [&](const std::vector<int64_t>&) {
                                         if (++n == 2) throw std::runtime_error("client gone");
                                       }),
                       std::runtime_error);
          EXPECT_EQ(shared
                        .generate(r.prompt, r.config,
                                  [](const std::vector<int64_t>&) { throw Cancelled(); })
                        .stats.stop_reason,
                    "cancelled");
        }
        got[i] = shared.generate(r.prompt, r.config).tokens;
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], alone[i]) << "request " << i;
}

TEST(Service, CallbackCancelsOrFailsAndTheGeneratorGoesOn) {
  const auto target = cached_model(cached_fixture("svc_t", small_llama(4, 3)));
  const Generator g(target, target);
  GenerationConfig c;
  c.max_new_tokens = 30;
  c.eos_token_ids = {95};
  const std::vector<int64_t> prompt = {5, 9, 12};
  const auto full = g.generate(prompt, c).tokens;
  ASSERT_EQ(full.size(), 30u);
  std::vector<int64_t> streamed;
  const auto stopped = g.generate(prompt, c, [&](const std::vector<int64_t>& t) {
    streamed.insert(streamed.end(), t.begin(), t.end());
    if (streamed.size() >= 5) throw Cancelled();
  });
  EXPECT_EQ(stopped.stats.stop_reason, "cancelled");
  EXPECT_EQ(stopped.tokens, streamed);  // what was delivered, nothing after
  EXPECT_GE(stopped.tokens.size(), 5u);
  EXPECT_LT(stopped.tokens.size(), full.size());
  EXPECT_TRUE(std::equal(stopped.tokens.begin(), stopped.tokens.end(), full.begin()));
  EXPECT_THROW(
      g.generate(prompt, c,
                 [](const std::vector<int64_t>&) { throw std::runtime_error("client gone"); }),
      std::runtime_error);
  EXPECT_EQ(g.generate(prompt, c).tokens, full);
}

// Cancelled(n) keeps the first n tokens of the group just delivered (a stop string that ended
// inside it): the result and its statistics end there, as if the pass had verified no further.
TEST(Service, CancelledKeepingSomeTokensEndsTheResultAndItsStatisticsThere) {
  const auto target = cached_model(cached_fixture("svc_t", small_llama(4, 3)));
  const Generator g(target, target);  // its own draft: every candidate accepted
  GenerationConfig c;
  c.max_new_tokens = 30;
  c.num_assistant_tokens = 4;
  c.num_assistant_tokens_schedule = "constant";
  const std::vector<int64_t> prompt = {5, 9, 12};
  const auto full = g.generate(prompt, c).tokens;
  for (const size_t kept : {0, 1, 2, 5}) {
    std::vector<int64_t> streamed;
    int groups = 0;
    int64_t before = 0;  // tokens of the first two passes
    const auto r = g.generate(prompt, c, [&](const std::vector<int64_t>& t) {
      if (++groups < 3) return streamed.insert(streamed.end(), t.begin(), t.end()), void();
      ASSERT_EQ(t.size(), 5u);  // 4 accepted candidates and the target's own token
      before = static_cast<int64_t>(streamed.size());
      streamed.insert(streamed.end(), t.begin(), t.begin() + kept);
      throw Cancelled(kept);
    });
    SCOPED_TRACE(kept);
    EXPECT_EQ(r.stats.stop_reason, "cancelled");
    EXPECT_EQ(r.tokens, streamed);
    EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), full.begin()));
    const GenerationStats& s = r.stats;
    EXPECT_EQ(s.new_tokens, static_cast<int64_t>(r.tokens.size()));
    EXPECT_EQ(s.target_passes, 3);
    // Each pass keeps its accepted candidates and one token of the target's; the last one kept
    // counts as the target's (as an accepted EOS does).
    EXPECT_EQ(s.accepted_tokens,
              (before - 2) + std::max<int64_t>(0, static_cast<int64_t>(kept) - 1));
    int64_t traced = 0, by_position = 0;
    for (const auto& [drafted, accepted] : s.trace) traced += accepted;
    for (const int64_t a : s.accepted_at_position) by_position += a;
    EXPECT_EQ(traced, s.accepted_tokens);
    EXPECT_EQ(by_position, s.accepted_tokens);
  }
}

// --threads (set_num_threads) governs both pools the library computes with: libtorch's intra-op
// pool and OpenBLAS's own, which at::set_num_threads alone leaves at every core.
TEST(Service, SetNumThreadsGovernsLibtorchAndOpenBlas) {
  using GetThreads = int (*)();
  const auto blas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  // Debian's libtorch (1.13) calls OpenBLAS (scripts/setup.sh installs libopenblas0-pthread);
  // PyPI's (2.x) links MKL into itself, whose threads at::set_num_threads sets.
  if (compat::kMajor < 2)
    ASSERT_NE(blas, nullptr) << "Debian's libtorch does not use OpenBLAS here";
  const int saved = at::get_num_threads();
  for (int n : {1, 2, 1}) {
    set_num_threads(n);
    EXPECT_EQ(at::get_num_threads(), n);
    if (blas) EXPECT_EQ(blas(), n);
  }
  EXPECT_THROW(set_num_threads(0), Error);
  // A count no machine runs well is refused at once, not spun up (100000 took over a minute).
  const int most =
      kMaxThreadsPerCpu * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_THROW(set_num_threads(most + 1), Error);
  EXPECT_THROW(set_num_threads(100000), Error);
  set_num_threads(most);
  EXPECT_EQ(at::get_num_threads(), most);
  // Process-wide: a thread started afterwards (one calling generate) computes with the same count,
  // not OpenMP's default for a new thread (every core).
  set_num_threads(1);
  int seen = 0;
  std::thread([&] { seen = at::get_num_threads(); }).join();
  EXPECT_EQ(seen, 1);
  set_num_threads(saved);
}

// The program's default thread count: one per physical core the process may run on. Within its
// CPUs, at least one; and one where the process may run on one CPU (its affinity, as taskset or
// a container's cpuset sets it), whatever the machine has.
TEST(Service, DefaultThreadsFollowTheProcessCpus) {
  // OMP_NUM_THREADS (which ctest sets to 1 here) comes first.
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string omp = env ? env : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(default_num_threads(), 3);
  setenv("OMP_NUM_THREADS", "none", 1);  // not a number: as if unset
  const int ignored = default_num_threads();
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(ignored, default_num_threads());
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  const int n = default_num_threads();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, CPU_COUNT(&saved));
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int on_one = default_num_threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  if (env) setenv("OMP_NUM_THREADS", omp.c_str(), 1);
  EXPECT_EQ(on_one, 1);
}

}  // namespace specdec::test
