// Greedy vs assisted generation on one prompt: same output, fewer target passes, less time.
//
// Usage: greedy_vs_assisted [MODELS_DIR] [MAX_NEW_TOKENS]
// MODELS_DIR (default ./demo-models) receives a generated checkpoint pair on first use: a Llama
// target (hidden 1024, 16 layers, vocab 4096) whose layers above the first barely change its output
// (o_proj/down_proj scaled by 0.03), and its 1-layer early-exit draft. Random weights, real costs:
// every target layer costs what it costs, so the timings are those of a model of this size.
#include <sys/stat.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include <specdec/specdec.hpp>

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void ensure_pair(const std::string& dir) {
  if (exists(dir + "/target/config.json") && exists(dir + "/draft/config.json")) return;
  ::mkdir(dir.c_str(), 0755);
  std::cerr << "generating the demo checkpoint pair in " << dir << " (once) ...\n";
  specdec::FixtureOptions o;
  o.layers = 16;
  o.hidden = 1024;
  o.heads = 16;
  o.kv_heads = 4;
  o.intermediate = 4096;
  o.vocab = 4096;
  o.seed = 7;
  o.exit_layers = 1;
  o.exit_scale = 0.03;
  specdec::make_fixture(dir + "/target", o);
  specdec::make_draft_of(dir + "/target", dir + "/draft", 1);
}

std::string ids(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "demo-models";
  const int64_t max_new = argc > 2 ? std::stoll(argv[2]) : 64;
  try {
    // Debian's libtorch starts with one intra-op thread here; use every core.
    at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    ensure_pair(dir);
    const auto target = specdec::load_model(dir + "/target");
    const auto draft = specdec::load_model(dir + "/draft");
    const std::vector<int64_t> prompt = {1, 306, 4658, 278, 6593, 310, 2834, 338, 29871, 29946,
                                         29906, 29889, 450, 1234, 338, 29871};
    std::vector<int64_t> in_vocab;
    for (int64_t t : prompt) in_vocab.push_back(t % target->config().vocab_size);

    specdec::GenerationConfig cfg;
    cfg.max_new_tokens = max_new;
    cfg.num_assistant_tokens = 5;
    specdec::Generator plain(target), assisted(target, draft);
    // Warm up both paths (first-touch page faults, allocator) before timing.
    specdec::GenerationConfig warm = cfg;
    warm.max_new_tokens = 4;
    plain.generate(in_vocab, warm);
    assisted.generate(in_vocab, warm);

    std::cout << "target only: " << std::flush;
    const auto a = plain.generate(in_vocab, cfg, [](const std::vector<int64_t>& t) {
      std::cout << ids(t) << ' ' << std::flush;
    });
    std::cout << "\nassisted:    " << std::flush;
    const auto b = assisted.generate(in_vocab, cfg, [](const std::vector<int64_t>& t) {
      std::cout << ids(t) << ' ' << std::flush;
    });
    const auto e = specdec::estimate_speedup(a.stats, b.stats);
    std::printf("\n\nidentical outputs:        %s\n", a.tokens == b.tokens ? "yes" : "NO");
    std::printf("target only:              %.3f s (%.1f ms/token, %lld target passes)\n",
                a.stats.total_seconds, 1e3 * a.stats.total_seconds / a.stats.new_tokens,
                static_cast<long long>(a.stats.target_passes));
    std::printf("assisted (K=5, constant): %.3f s (%.1f ms/token, %lld target passes)\n",
                b.stats.total_seconds, 1e3 * b.stats.total_seconds / b.stats.new_tokens,
                static_cast<long long>(b.stats.target_passes));
    std::printf("acceptance rate:          %.1f%% (alpha per judged token %.3f)\n",
                100 * b.stats.acceptance_rate(), e.alpha);
    std::printf("tokens per target pass:   %.2f\n", b.stats.tokens_per_target_pass());
    std::printf("cost ratio draft/target:  %.3f (target costs %.1fx the draft)\n", e.cost_ratio,
                e.cost_ratio > 0 ? 1 / e.cost_ratio : 0.0);
    std::printf("speedup:                  %.2fx measured, %.2fx predicted (Leviathan et al.)\n",
                e.measured, e.predicted);
    std::printf("threads: %d\n", at::get_num_threads());
    return a.tokens == b.tokens ? 0 : 1;
  } catch (const std::exception& ex) {
    std::cerr << "error: " << ex.what() << "\n";
    return 1;
  }
}
