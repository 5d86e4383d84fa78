// Greedy vs assisted generation on one prompt: same output, fewer target passes, less time.
//
// Usage: greedy_vs_assisted [MODELS_DIR] [MAX_NEW_TOKENS] [PROMPT]
// MODELS_DIR (default ./demo-models) receives a generated checkpoint pair on first use: a Llama
// target (hidden 1024, 16 layers) whose layers above the first barely change its output
// (o_proj/down_proj scaled by 0.03), and its 1-layer early-exit draft. Random weights, real costs:
// every target layer costs what it costs, so the timings are those of a model of this size. Both
// carry a real SentencePiece tokenizer (4096 pieces, trained here on the licence texts Debian ships
// in /usr/share/common-licenses), so prompts and outputs are text; random weights make the
// output text gibberish, but the same gibberish with and without the draft.
#include <sys/stat.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include <specdec/fixture.hpp>  // the demo checkpoints (specdec::tools)
#include <specdec/specdec.hpp>

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void ensure_pair(const std::string& dir) {
  if (exists(dir + "/target/config.json") && exists(dir + "/draft/config.json")) return;
  ::mkdir(dir.c_str(), 0755);
  std::cerr << "training a SentencePiece tokenizer in " << dir << "/tokenizer (once) ...\n";
  const std::string corpus = "/usr/share/common-licenses";
  std::string inputs;
  for (const char* f :
       {"GPL-3", "GPL-2", "LGPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic"})
    if (exists(corpus + "/" + f)) inputs += (inputs.empty() ? "" : ",") + corpus + "/" + f;
  if (inputs.empty())
    throw specdec::Error(corpus + " is empty: no text to train the demo tokenizer on");
  ::mkdir((dir + "/tokenizer").c_str(), 0755);
  specdec::train_sentencepiece("--input=" + inputs + " --model_prefix=" + dir +
                               "/tokenizer/tokenizer --vocab_size=4096 --model_type=bpe "
                               "--byte_fallback=true --character_coverage=1.0");
  std::cerr << "generating the demo checkpoint pair in " << dir << " (once) ...\n";
  specdec::FixtureOptions o;
  o.layers = 16;
  o.hidden = 1024;
  o.heads = 16;
  o.kv_heads = 4;
  o.intermediate = 4096;
  o.tokenizer_dir = dir + "/tokenizer";  // vocabulary, BOS and EOS from the tokenizer
  o.seed = 7;
  o.exit_layers = 1;
  o.exit_scale = 0.03;
  specdec::make_fixture(dir + "/target", o);
  specdec::make_draft_of(dir + "/target", dir + "/draft", 1);
}

// Streams the text of a generation to stdout as tokens are accepted.
specdec::GenerationResult run(const specdec::Generator& g, const specdec::Tokenizer& tok,
                              const std::vector<int64_t>& prompt,
                              const specdec::GenerationConfig& cfg) {
  specdec::StreamDecoder stream(tok, /*skip_special_tokens=*/true);
  auto r = g.generate(prompt, cfg, [&](const std::vector<int64_t>& t) {
    std::cout << stream.push(t) << std::flush;
  });
  std::cout << stream.finish() << std::flush;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: greedy_vs_assisted [MODELS_DIR] [MAX_NEW_TOKENS] [PROMPT]\n"
      "  MODELS_DIR (default ./demo-models) receives a generated target and draft pair (about 1 "
      "GB)\n"
      "  on first use; MAX_NEW_TOKENS defaults to 64.\n";
  if (argc > 4 || (argc > 1 && argv[1][0] == '-')) {  // -h, --help or an option it does not have
    std::cerr << usage;
    return argc > 1 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") ? 0 : 2;
  }
  const std::string dir = argc > 1 ? argv[1] : "demo-models";
  int64_t max_new = 64;
  if (argc > 2) {
    char* end = nullptr;
    max_new = std::strtoll(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0' || max_new < 1) {
      std::cerr << "greedy_vs_assisted: MAX_NEW_TOKENS must be a positive integer, got '" << argv[2]
                << "'\n"
                << usage;
      return 2;
    }
  }
  try {
    // Debian's libtorch starts with one intra-op thread here; use every core.
    specdec::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    ensure_pair(dir);
    const auto target = specdec::load_model(dir + "/target");
    const auto draft = specdec::load_model(dir + "/draft");
    const auto tok = specdec::load_tokenizer(dir + "/target");
    specdec::require_same_tokenizer(*tok, *specdec::load_tokenizer(dir + "/draft"));
    const std::string text =
        argc > 3 ? argv[3] : "This License applies to any program or other work which";
    const std::vector<int64_t> in_vocab = tok->encode(text, /*add_special_tokens=*/true);
    std::cout << "prompt (" << in_vocab.size() << " tokens): " << text << "\n";

    specdec::GenerationConfig cfg;
    cfg.max_new_tokens = max_new;
    cfg.num_assistant_tokens = 5;
    cfg.num_assistant_tokens_schedule = "constant";  // (greedy's default, goodput, picks K itself)
    specdec::Generator plain(target), assisted(target, draft);
    // Warm up both paths (first-touch page faults, allocator) before timing.
    specdec::GenerationConfig warm = cfg;
    warm.max_new_tokens = 4;
    plain.generate(in_vocab, warm);
    assisted.generate(in_vocab, warm);

    std::cout << "target only: " << std::flush;
    const auto a = run(plain, *tok, in_vocab, cfg);
    std::cout << "\nassisted:    " << std::flush;
    const auto b = run(assisted, *tok, in_vocab, cfg);
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
    std::printf(
        "speedup:                  %.2fx measured, %.2fx predicted (Leviathan et al.), %.2fx with "
        "the verification passes' measured cost\n",
        e.measured, e.predicted, e.predicted_with_passes);
    std::printf("threads: %d\n", at::get_num_threads());
    return a.tokens == b.tokens ? 0 : 1;
  } catch (const std::exception& ex) {
    std::cerr << "error: " << ex.what() << "\n";
    return 1;
  }
}
