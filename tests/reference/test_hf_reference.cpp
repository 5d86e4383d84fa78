// Conformance with Hugging Face transformers on small random checkpoints: logits, greedy tokens,
// assisted tokens and per-pass traces. Those of ../shared/fixtures/hf (transformers 4.47; skipped
// when absent), and the project's own tests/data/hf for Qwen3 and Gemma 3 (transformers 5, written
// by scripts/hf_reference_archs.py).
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <dirent.h>
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace specdec::test {
namespace {

// The architectures of tests/data/hf; the others are in ../shared/fixtures/hf.
bool own_fixture(const std::string& arch) { return arch == "qwen3" || arch == "gemma3"; }

// The folder holding "arch/name" ("" when that is the shared fixtures and they are absent).
std::string hf_dir(const std::string& arch_and_name) {
  if (own_fixture(arch_and_name.substr(0, arch_and_name.find('/'))))
    return test_data("hf/") + arch_and_name;
  return fixtures_dir().empty() ? "" : fixtures_dir() + "/hf/" + arch_and_name;
}

std::vector<std::string> reference_folders(bool assisted_only = false) {
  std::vector<std::string> out;
  for (const char* arch :
       {"llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt_neox", "gpt2", "opt", "t5"}) {
    const std::string dir = hf_dir(arch);
    if (dir.empty()) continue;
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n[0] == '.') continue;
      const std::string text = read_file(dir + "/" + n + "/reference.json");
      if (text.empty()) continue;
      if (assisted_only && !nlohmann::json::parse(text).contains("assisted")) continue;
      names.push_back(std::string(arch) + "/" + n);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    out.insert(out.end(), names.begin(), names.end());
  }
  return out;
}

class HfReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = hf_dir(GetParam());
    ref_ = read_json(dir_ + "/reference.json");
  }
  std::string dir_;
  nlohmann::json ref_;
};

std::vector<int64_t> ids(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }

TEST_P(HfReference, LogitsMatch) {
  // Computed in float32 whatever the saved dtype (the reference was computed that way too).
  const auto model = load_model(dir_, test_load_options());
  c10::InferenceMode guard;
  const auto input = ids(ref_["logits"]["input_ids"]);
  auto tensor = [](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).view({1, -1});
  };
  at::Tensor got;
  if (ref_["logits"].contains(
          "decoder_input_ids")) {  // encoder-decoder: input_ids go to the encoder
    ASSERT_TRUE(model->config().is_encoder_decoder);
    const auto decoder_input = ids(ref_["logits"]["decoder_input_ids"]);
    KVCache cache = model->make_cache(static_cast<int64_t>(decoder_input.size()));
    model->attach_encoder(model->encode(tensor(input)), cache);
    got = model->forward(tensor(decoder_input), cache);
  } else {
    KVCache cache = model->make_cache(static_cast<int64_t>(input.size()));
    got = model->forward(tensor(input), cache);
  }
  got = got.cpu();
  const auto data = ref_["logits"]["data"].get<std::vector<float>>();
  const auto shape = ref_["logits"]["shape"].get<std::vector<int64_t>>();
  const at::Tensor want = at::tensor(data).view(shape);
  ASSERT_EQ(got.sizes(), want.sizes());
  const double rel = ((got - want).abs().max() / want.abs().max()).item<double>();
  EXPECT_LT(rel, 1e-4) << "max relative error of the logits";
}

TEST_P(HfReference, GreedyTokensMatch) {
  const auto model = load_model(dir_, test_load_options());
  Generator gen(model);
  for (const auto& g : ref_["greedy"]) {
    GenerationConfig cfg;
    cfg.max_new_tokens = g["max_new_tokens"].get<int64_t>();
    const auto result = gen.generate(ids(g["input_ids"]), cfg);
    EXPECT_EQ(result.tokens, ids(g["new_tokens"]))
        << "prompt " << g["input_ids"] << " max_new_tokens " << cfg.max_new_tokens;
  }
}

class HfAssistedReference : public HfReference {};

TEST_P(HfAssistedReference, AssistedTokensAndTraceMatch) {
  const auto& a = ref_["assisted"];
  const auto target = load_model(dir_, test_load_options());
  const auto draft = load_model(hf_dir(a["draft"].get<std::string>()), test_load_options());
  // One generator for every run, in order: the heuristic lookahead carries over between
  // requests exactly as it does on a Hugging Face assistant model.
  Generator gen(target, draft);
  for (const auto& run : a["runs"]) {
    GenerationConfig cfg;
    cfg.max_new_tokens = run["max_new_tokens"].get<int64_t>();
    cfg.num_assistant_tokens = a["settings"]["num_assistant_tokens"].get<int64_t>();
    cfg.num_assistant_tokens_schedule =
        a["settings"]["num_assistant_tokens_schedule"].get<std::string>();
    const auto prompt = ids(run["input_ids"]);
    const auto result = gen.generate(prompt, cfg);
    // output_ids: prompt + new tokens, or for encoder-decoder models decoder start + new tokens.
    auto expected = ids(run["output_ids"]);
    expected.erase(expected.begin(), expected.begin() + (target->config().is_encoder_decoder
                                                             ? 1
                                                             : static_cast<long>(prompt.size())));
    EXPECT_EQ(result.tokens, expected)
        << "prompt " << run["input_ids"] << " max_new_tokens " << cfg.max_new_tokens;
    std::vector<std::array<int64_t, 2>> trace;
    for (const auto& p : run["trace"]) trace.push_back({p[0].get<int64_t>(), p[1].get<int64_t>()});
    EXPECT_EQ(result.stats.trace, trace)
        << "prompt " << run["input_ids"] << " max_new_tokens " << cfg.max_new_tokens;
    EXPECT_EQ(result.stats.target_passes, static_cast<int64_t>(trace.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfReference, ::testing::ValuesIn(reference_folders()),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '/', '_');
                           return n;
                         });
INSTANTIATE_TEST_SUITE_P(Fixtures, HfAssistedReference,
                         ::testing::ValuesIn(reference_folders(/*assisted_only=*/true)),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '/', '_');
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HfReference);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HfAssistedReference);

TEST(HfReferencePresence, FixturesFoundOrSkipped) {
  EXPECT_GE(reference_folders().size(), 4u) << "expected the qwen3 and gemma3 reference folders";
  if (fixtures_dir().empty()) GTEST_SKIP() << "../shared/fixtures absent: reference tests skipped";
  EXPECT_GE(reference_folders().size(), 9u) << "expected llama/mistral/qwen2 reference folders";
  EXPECT_GE(reference_folders(true).size(), 7u) << "expected assisted references";
}

// transformers 4.5x's dialect of Gemma 3's config (rope_theta, rope_local_base_freq,
// sliding_window_pattern, rope_scaling), written by the reference script for the same model as
// transformers 5's config.json (layer_types, rope_parameters per layer type): both read alike.
TEST(HfReferenceDialects, Gemma3ConfigOfTransformers4ReadsAsThatOf5) {
  const std::string dir = test_data("hf/gemma3/target");
  const ModelConfig v5 = ModelConfig::from_dir(dir);
  const ModelConfig v4 = ModelConfig::from_json_text(read_file(dir + "/config_v4.json"), "v4");
  EXPECT_EQ(v4.layer_types, v5.layer_types);
  EXPECT_EQ(v5.layer_types, (std::vector<std::string>{"sliding_attention", "full_attention",
                                                      "sliding_attention", "full_attention"}));
  EXPECT_EQ(v4.rope_theta, v5.rope_theta);
  EXPECT_EQ(v5.rope_theta, 1e6);
  EXPECT_EQ(v4.rope_local_theta, v5.rope_local_theta);
  EXPECT_EQ(v5.rope_local_theta, 1e4);
  EXPECT_EQ(v4.rope_scaling.type, "linear");
  EXPECT_EQ(v5.rope_scaling.type, "linear");
  EXPECT_EQ(v4.rope_scaling.factor, v5.rope_scaling.factor);
  EXPECT_EQ(v5.rope_local_scaling.type, "");
  EXPECT_EQ(v4.sliding_window, v5.sliding_window);
  EXPECT_EQ(v4.query_pre_attn_scalar, v5.query_pre_attn_scalar);
  EXPECT_EQ(v4.hidden_act, v5.hidden_act);
  EXPECT_TRUE(v4.qk_norm && v5.qk_norm && v4.tie_word_embeddings && v5.tie_word_embeddings);
}

}  // namespace
}  // namespace specdec::test
