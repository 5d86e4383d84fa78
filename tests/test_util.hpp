// Helpers shared by the tests: temporary folders, generated checkpoints, fixture paths.
#pragma once

#include <ATen/Parallel.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specdec/fixture.hpp"
#include "specdec/make_draft.hpp"
#include "specdec/specdec.hpp"

namespace specdec::test {

// libtorch's intra-op thread count: set for a scope (or only saved) and restored at its end, also
// when an assertion leaves the test early.
class ThreadsGuard {
 public:
  ThreadsGuard() = default;
  explicit ThreadsGuard(int threads) { at::set_num_threads(threads); }
  ~ThreadsGuard() { at::set_num_threads(saved_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int saved_ = at::get_num_threads();
};

// A fresh empty folder under the build tree, unique per call.
std::string temp_dir(const std::string& name);
// A generated checkpoint cached per options key (generated once per test process).
std::string cached_fixture(const std::string& key, const FixtureOptions& options);
// Loaded on the CPU (cached_model) or on test_device() (test_model), cached per folder and device.
std::shared_ptr<const Model> cached_model(const std::string& dir);
std::shared_ptr<const Model> test_model(const std::string& dir);
// The device the device-agnostic tests (references, exactness, statistics, batches) load their
// models on: SPECDEC_TEST_DEVICE ("cpu" when unset; "cuda" on a GPU host). Bitwise batch-invariance
// and kernel tests stay on the CPU whatever it says.
c10::Device test_device();
LoadOptions test_load_options();
// The small generated checkpoint of the exactness and batch tests: hidden 64, 4 heads (2 KV heads
// for the Llama family), MLP 128, vocabulary 96, weights of std 0.1 (larger than Hugging Face's
// 0.02: peaked, input-dependent outputs), layers >= 1 scaled by 0.2 (an early exit agrees often).
FixtureOptions small_fixture(uint64_t seed, int64_t layers, const std::string& arch = "llama");
// Suffix speculation proposing trees that branch readily: continuations down to 2% of the mass,
// up to 4 times the match's length.
SuffixOptions branching_suffix_trees();
// tests/data/<rel>, the committed test data.
std::string test_data(const std::string& rel);
// ../shared/fixtures, or "" when absent.
std::string fixtures_dir();
// The real SmolLM2-135M-Instruct GGUF under models/smollm2 (scripts/get_models.sh), or "" when
// absent.
std::string smollm2_path();
// models/gemma3/gemma-3-270m-q4_k_m.gguf, or "" when absent.
std::string gemma3_path();
nlohmann::json read_json(const std::string& path);
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& data);

// Target-only greedy continuation computed the slow, obvious way: the whole sequence is re-run
// through the model without any cache for every token (encoder-decoder models: the decoder's
// sequence, with the prompt re-encoded each time). An independent oracle for the cached paths.
// `min_new_tokens`: the eos ids are never picked before that many new tokens.
std::vector<int64_t> oracle_greedy(const Model& model, const std::vector<int64_t>& prompt,
                                   int64_t max_new_tokens, const std::vector<int64_t>& eos,
                                   int64_t min_new_tokens = 0);

// The logits of the last `n` tokens of `ids` ([1, T], after T - n tokens of context) computed three
// ways: one verification pass over the n tokens, n one-token decode steps, and the last n rows of
// one prefill over all of `ids`; each [n, V]. The decode steps' context goes in by a cache-only
// pass (Model::kCacheOnly; throws if it returns logits). Encoder-decoder models get a fixed
// 16-token encoder input.
struct ThreeWays {
  at::Tensor verify, decode, prefill;
};
ThreeWays logits_three_ways(const Model& model, const at::Tensor& ids, int64_t n);

// Sets the process-wide Limits for the lifetime of the object, then puts the old ones back.
struct ScopedLimits {
  explicit ScopedLimits(const Limits& l) : saved(limits()) { set_limits(l); }
  ~ScopedLimits() { set_limits(saved); }
  Limits saved;
};

// Runs make_draft(o) and expects a specdec::Error containing `needle`, and no folder at o.out when
// there was none before.
void expect_error(const MakeDraftOptions& o, const std::string& needle);

}  // namespace specdec::test
