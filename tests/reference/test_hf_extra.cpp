// Options the shared fixtures do not exercise, against Hugging Face 4.47 running the same small
// checkpoints (tests/data/hf_extra, written by scripts/hf_reference_extra.py): Mistral with an
// 8-token sliding_window over a 40-token prompt, Llama with mlp_bias. Logits within 1e-4 relative,
// greedy tokens exactly, and assisted greedy (an early-exit draft cut from the checkpoint) equal.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

class HfExtra : public ::testing::TestWithParam<std::string> {};

TEST_P(HfExtra, LogitsGreedyAndAssistedMatchHuggingFace) {
  const std::string dir = test_data("hf_extra/") + GetParam();
  const auto ref = read_json(dir + "/reference.json");
  const auto m = load_model(dir, test_load_options());
  const auto prompt = ref["prompt"].get<std::vector<int64_t>>();
  {
    c10::InferenceMode guard;
    KVCache cache = m->make_cache(static_cast<int64_t>(prompt.size()));
    const at::Tensor logits =
        m->forward(at::tensor(prompt).unsqueeze(0), cache)[0].cpu();  // [T, V]
    std::vector<float> flat;
    for (const auto& row : ref["logits"])
      for (float v : row) flat.push_back(v);
    const at::Tensor want = at::tensor(flat).view(logits.sizes());
    const double rel = ((logits - want).abs() / want.abs().clamp_min(1.0)).max().item<double>();
    EXPECT_LT(rel, 1e-4) << GetParam();
  }
  GenerationConfig g;
  g.max_new_tokens = 24;
  g.eos_token_ids = {63};  // not HF's EOS: the reference ran all 24 steps
  const auto greedy = Generator(m).generate(prompt, g).tokens;
  const auto expected = ref["greedy"].get<std::vector<int64_t>>();
  EXPECT_EQ(std::vector<int64_t>(greedy.begin(), greedy.end()),
            std::vector<int64_t>(expected.begin(), expected.begin() + greedy.size()));
  const std::string draft_dir = temp_dir("hf_extra_draft_" + GetParam());
  make_draft_of(dir, draft_dir, 1);
  EXPECT_EQ(Generator(m, load_model(draft_dir, test_load_options())).generate(prompt, g).tokens,
            greedy);
}

INSTANTIATE_TEST_SUITE_P(Extra, HfExtra,
                         ::testing::Values("mistral_sliding_window", "llama_mlp_bias"));
