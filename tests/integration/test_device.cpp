// The device path. Device choice and its errors run everywhere; the rest needs a GPU: run the suite
// with SPECDEC_TEST_DEVICE=cuda on a CUDA host (the references, exactness, statistical and batch
// tests then load their models there too). Without one, the CUDA tests report themselves skipped.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "torch_compat.hpp"

#if SPECDEC_CUDA_SYNC_HOOK
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#endif

namespace specdec::test {
namespace {

TEST(Device, NamesAreParsedAndCudaIsRefusedWhereAbsent) {
  EXPECT_TRUE(parse_device("cpu").is_cpu());
  EXPECT_THROW(parse_device("gpu"), Error);
  EXPECT_THROW(parse_device("cuda:x"), Error);
  if (!at::hasCUDA()) {
    EXPECT_THROW(parse_device("cuda"), Error);
    LoadOptions o;
    o.device = c10::Device(c10::kCUDA);
    EXPECT_THROW(load_model(cached_fixture("dev_llama", small_fixture(1, 2)), o), Error);
  } else {
    EXPECT_TRUE(parse_device("cuda:0").is_cuda());
  }
}

bool on_cuda() { return test_device().is_cuda(); }

TEST(Device, DraftAndTargetOnDifferentDevicesAreRefused) {
  if (!on_cuda()) GTEST_SKIP() << "needs SPECDEC_TEST_DEVICE=cuda on a CUDA host";
  const std::string dir = cached_fixture("dev_llama", small_fixture(1, 2));
  EXPECT_THROW(Generator(test_model(dir), cached_model(dir)), Error);
}

#if SPECDEC_CUDA_SYNC_HOOK
// Counts libtorch's "called a synchronizing CUDA operation" warnings
// (torch.cuda.set_sync_debug_mode in C++): every blocking copy in either direction, .item() and
// stream synchronisation of this thread.
struct SyncCounter : c10::WarningHandler {
  int64_t syncs = 0;
  void process(const c10::Warning& w) override {
    if (w.msg().find("synchroniz") != std::string::npos) ++syncs;
  }
};

// The synchronisations `run` makes.
template <class F>
int64_t count_syncs(F&& run) {
  SyncCounter counter;
  c10::WarningUtils::WarningHandlerGuard guard(&counter);
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  run();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  return counter.syncs;
}

struct SyncCase {
  const char* name;
  std::string arch;
  at::ScalarType dtype;
  bool assisted;
  bool sample;
  std::string schedule;
};

void PrintTo(const SyncCase& c, std::ostream* os) { *os << c.name; }

class CudaSyncs : public ::testing::TestWithParam<SyncCase> {};

// The hot loop may wait for the device once per target pass (the acceptance decision) and once per
// drafted token (its id, and its probability where the schedule or the verifier needs it), plus
// once for the prompt's set-up; anything more is a stall a GPU pays for at every step.
TEST_P(CudaSyncs, AtMostOnePerPassPlusSetUp) {
  if (!on_cuda()) GTEST_SKIP() << "needs SPECDEC_TEST_DEVICE=cuda on a CUDA host";
  const SyncCase& c = GetParam();
  const std::string t = cached_fixture("sync_t" + c.arch, small_fixture(5, 3, c.arch));
  const std::string d = temp_dir("sync_d" + c.arch);
  make_draft_of(t, d, 1, 0.0, 5);
  LoadOptions o = test_load_options();
  o.dtype = c.dtype;
  const auto target = load_model(t, o);
  std::unique_ptr<Generator> gen = c.assisted
                                       ? std::make_unique<Generator>(target, load_model(d, o))
                                       : std::make_unique<Generator>(target);
  GenerationConfig cfg;
  cfg.max_new_tokens = 40;
  cfg.do_sample = c.sample;
  cfg.seed = 3;
  cfg.num_assistant_tokens = 4;
  cfg.num_assistant_tokens_schedule = c.schedule;
  const std::vector<int64_t> prompt = {3, 17, 5, 42, 9, 11};
  (void)gen->generate(prompt, cfg);  // warm-up: lazily built tables, allocator
  GenerationResult r;
  const int64_t syncs = count_syncs([&] { r = gen->generate(prompt, cfg); });
  const int64_t allowed = r.stats.target_passes + r.stats.draft_passes + 1;
  std::cout << "[ syncs    ] " << c.name << ": " << syncs << " for " << r.stats.target_passes
            << " target and " << r.stats.draft_passes << " draft passes, " << r.stats.new_tokens
            << " tokens\n";
  EXPECT_GT(syncs, 0) << "the hook saw nothing: is the sync debug mode wired?";
  EXPECT_LE(syncs, allowed) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaSyncs,
    ::testing::Values(
        SyncCase{"llama_greedy_target_only", "llama", at::kFloat, false, false, "constant"},
        SyncCase{"llama_greedy_constant", "llama", at::kFloat, true, false, "constant"},
        SyncCase{"llama_greedy_dynamic", "llama", at::kFloat, true, false, "dynamic"},
        SyncCase{"llama_sampling_heuristic", "llama", at::kFloat, true, true, "heuristic"},
        SyncCase{"gpt2_greedy_constant", "gpt2", at::kFloat, true, false, "constant"},
        SyncCase{"gpt_neox_sampling_constant", "gpt_neox", at::kFloat, true, true, "constant"},
        SyncCase{"opt_greedy_constant", "opt", at::kFloat, true, false, "constant"},
        SyncCase{"t5_float16_greedy_constant", "t5", at::kHalf, true, false, "constant"},
        SyncCase{"t5_float16_sampling_constant", "t5", at::kHalf, true, true, "constant"},
        SyncCase{"llama_bfloat16_sampling_dynamic", "llama", at::kBFloat16, true, true, "dynamic"}),
    [](const auto& info) { return std::string(info.param.name); });
// A batch of ragged rows: still one wait per pass of the whole batch (every row's verdict, or every
// drafting row's token, in one copy), not one per row.
TEST(CudaBatchSyncs, RaggedRowsAtMostOnePerPassPlusSetUp) {
  if (!on_cuda()) GTEST_SKIP() << "needs SPECDEC_TEST_DEVICE=cuda on a CUDA host";
  const std::string t = cached_fixture("sync_tllama", small_fixture(5, 3, "llama"));
  const std::string d = temp_dir("sync_batch_d");
  make_draft_of(t, d, 1, 0.0, 5);
  const Generator gen(load_model(t, test_load_options()), load_model(d, test_load_options()));
  const std::vector<std::vector<int64_t>> prompts = {
      {3, 17, 5, 42, 9, 11}, {8, 4}, {30, 31, 32, 33}};
  for (const bool sample : {false, true}) {
    std::vector<GenerationConfig> cfgs(3);
    for (size_t i = 0; i < cfgs.size(); ++i) {
      cfgs[i].max_new_tokens = 20 + 8 * static_cast<int64_t>(i);
      cfgs[i].do_sample = sample;
      cfgs[i].seed = i;
      cfgs[i].num_assistant_tokens = 4;
      cfgs[i].num_assistant_tokens_schedule = "constant";
    }
    (void)gen.generate_batch(prompts, cfgs);  // warm-up
    BatchResult r;
    const int64_t syncs = count_syncs([&] { r = gen.generate_batch(prompts, cfgs); });
    std::cout << "[ syncs    ] batch of 3, " << (sample ? "sampling" : "greedy") << ": " << syncs
              << " for " << r.stats.target_passes << " target and " << r.stats.draft_passes
              << " draft passes, " << r.stats.new_tokens << " tokens\n";
    EXPECT_GT(syncs, 0);
    EXPECT_LE(syncs, r.stats.target_passes + r.stats.draft_passes + 1)
        << (sample ? "sampling" : "greedy");
  }
}
#else
TEST(CudaSyncs, NeedsALibtorchBuiltWithCuda) {
  GTEST_SKIP()
      << "this libtorch has no CUDA: the synchronisation count runs with a CUDA libtorch 2.x";
}
#endif

}  // namespace
}  // namespace specdec::test
