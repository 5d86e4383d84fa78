// Weight formats (LoadOptions::weights): every architecture loads in each format; a verification
// pass, decode steps and a prefill give bitwise the same logits in each; assisted greedy output
// equals target-only greedy output with a quantized target and a draft in another format; a packed
// format computes bitwise what float32 computes on its dequantized values; bad requests are errors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

namespace {

FixtureOptions tiny(const std::string& arch, int64_t layers, uint64_t seed) {
  FixtureOptions o;
  o.arch = arch;
  o.layers = layers, o.hidden = 64, o.heads = 4,
  o.kv_heads = arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3" ? 2 : 0;
  o.vocab = 128, o.max_pos = 256, o.seed = seed, o.init_std = 0.1;
  return o;
}

std::shared_ptr<const Model> load(const std::string& dir, WeightFormat format,
                                  bool int8_activations = false) {
  LoadOptions o;
  o.weights = format;
  o.int8_activations = int8_activations;
  return load_model(dir, o);
}

const std::pair<WeightFormat, bool> kCases[] = {
    {WeightFormat::kBFloat16, false}, {WeightFormat::kFloat16, false}, {WeightFormat::kQ8_0, false},
    {WeightFormat::kQ4_0, false},     {WeightFormat::kQ8_0, true},     {WeightFormat::kQ4_0, true},
    {WeightFormat::kQ4_1, false},     {WeightFormat::kQ4_1, true}};

}  // namespace

TEST(WeightFormats, EveryArchitectureIsBatchInvariantInEveryFormat) {
  c10::InferenceMode guard;
  const ThreadsGuard restore;
  for (const std::string arch :
       {"llama", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const std::string dir = cached_fixture("wf_" + arch, tiny(arch, 2, 9));
    const auto f32 = load(dir, WeightFormat::kFloat32);
    for (const auto& [format, int8] : kCases) {
      const auto m = load(dir, format, int8);
      const std::string where =
          arch + " " + weight_format_name(format) + (int8 ? " int8 activations" : "");
      const at::Tensor ids =
          (at::arange(43, at::kLong) * 37 + 11).remainder(124).add(4).unsqueeze(0);  // [1, 43]
      for (int threads : {1, 2}) {
        at::set_num_threads(threads);
        const auto [verify, decode, prefill] = logits_three_ways(*m, ids, 6);
        EXPECT_TRUE(at::equal(verify, decode))
            << where << ", " << threads << " threads: verification vs decode";
        EXPECT_TRUE(at::equal(prefill, decode)) << where << ": prefill vs decode";
        // 16-bit and 8-bit weights change the logits a little (relative L2 error). (Q4_0 on these
        // tiny random models moves them by about their own size, Q4_1 too: not checked here; their
        // kernels and quantizers are checked exactly in the unit tests.)
        if (format != WeightFormat::kQ4_0 && format != WeightFormat::kQ4_1 && !int8) {
          const at::Tensor ref = logits_three_ways(*f32, ids, 6).prefill;
          const double tol = format == WeightFormat::kQ8_0 ? 0.05 : 0.02;
          EXPECT_LT((decode - ref).norm().item<double>(), tol * ref.norm().item<double>()) << where;
        }
      }
    }
  }
}

TEST(WeightFormats, AssistedEqualsTargetOnlyWithQuantizedTargetAndDraft) {
  const std::string target_dir = cached_fixture("wf_target", tiny("llama", 3, 21));
  const std::string draft_dir = temp_dir("wf_draft");
  make_draft_of(target_dir, draft_dir, 1);  // an early exit: its first layer, norm and head
  struct Case {
    WeightFormat target, draft;
    bool int8;  // 8-bit activations for both
  };
  const Case cases[] = {{WeightFormat::kQ8_0, WeightFormat::kQ4_0, false},
                        {WeightFormat::kFloat32, WeightFormat::kQ4_0, false},
                        {WeightFormat::kQ4_0, WeightFormat::kBFloat16, false},
                        {WeightFormat::kQ8_0, WeightFormat::kQ4_0, true},
                        {WeightFormat::kQ4_1, WeightFormat::kQ4_1, true}};
  for (const auto& [tf, df, int8] : cases) {
    const auto target = load(target_dir, tf, int8), draft = load(draft_dir, df, int8);
    for (const char* schedule : {"constant", "dynamic"}) {
      for (int64_t k : {1, 3, 6}) {
        GenerationConfig cfg;
        cfg.max_new_tokens = 40;
        cfg.num_assistant_tokens = k;
        cfg.num_assistant_tokens_schedule = schedule;
        cfg.eos_token_ids = {95};
        const std::vector<int64_t> prompt = {5, 17, 33, 9, 61};
        const auto want = Generator(target).generate(prompt, cfg).tokens;
        EXPECT_EQ(oracle_greedy(*target, prompt, 40, {95}), want) << weight_format_name(tf);
        EXPECT_EQ(Generator(target, draft).generate(prompt, cfg).tokens, want)
            << weight_format_name(tf) << " target, " << weight_format_name(df) << " draft, int8 "
            << int8 << ", " << schedule << " K " << k;
      }
    }
  }
}

TEST(WeightFormats, BadRequestsAreErrors) {
  EXPECT_THROW(parse_weight_format("q3_k"), Error);
  EXPECT_EQ(parse_weight_format("q4_0"), WeightFormat::kQ4_0);
  EXPECT_EQ(parse_weight_format("q4_1"), WeightFormat::kQ4_1);
  EXPECT_EQ(weight_format_name(WeightFormat::kAsStored), "as-stored");
  const std::string dir = cached_fixture("wf_target", tiny("llama", 3, 21));
  LoadOptions o;
  o.weights = WeightFormat::kQ8_0;
  o.dtype = at::kBFloat16;  // packed formats need float32 compute
  try {
    load_model(dir, o);
    ADD_FAILURE() << "q8_0 with bfloat16 compute was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
  // check_load_options refuses it alone, with no checkpoint, as it does a compute dtype load_model
  // has no layers for
  EXPECT_THROW(check_load_options(o), Error);
  LoadOptions int_compute;
  int_compute.dtype = at::kInt;
  EXPECT_THROW(check_load_options(int_compute), Error);
  o.weights = WeightFormat::kBFloat16;  // the compute dtype's own format is fine
  EXPECT_NO_THROW(check_load_options(o));
  EXPECT_NO_THROW(load_model(dir, o));
  // Columns that are not a whole number of blocks of 32: the message names the tensor.
  FixtureOptions odd = tiny("llama", 1, 4);
  odd.hidden = 48, odd.heads = 4, odd.kv_heads = 2;
  const std::string odd_dir = cached_fixture("wf_odd", odd);
  try {
    load(odd_dir, WeightFormat::kQ4_0);
    ADD_FAILURE() << "hidden 48 was quantized to q4_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed_tokens"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(load(odd_dir, WeightFormat::kBFloat16));
}
