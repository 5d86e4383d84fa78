// The real Gemma 3 270M (the pretrained base model, Q4_K_M GGUF: Q8_0 embeddings and tied head,
// Q5_0 / Q4_K / Q6_K matrices) against Hugging Face transformers 5 loading the same file (float32),
// recorded by scripts/hf_reference_gemma3.py in tests/data/gemma3/reference.json: tokenizer ids,
// the top-20 logits at every position of 3 prompts, and 64 greedy tokens of 12 text continuations;
// plus assisted generation on them. Skipped with a message when the model file is absent
// (scripts/get_models.sh; CI downloads it, so there they run).
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j = read_json(test_data("gemma3/reference.json"));
  return j;
}

#define REQUIRE_MODEL()                         \
  const std::string model_path = gemma3_path(); \
  if (model_path.empty()) GTEST_SKIP() << "models/gemma3 absent: run scripts/get_models.sh"

std::shared_ptr<const Model> model(const std::string& path) {
  static std::shared_ptr<const Model> m = load_model(path);
  return m;
}

const Tokenizer& tokenizer(const std::string& path) {
  static std::unique_ptr<Tokenizer> t = load_tokenizer(path);
  return *t;
}

}  // namespace

TEST(Gemma3, ConfigFromGgufMetadata) {
  REQUIRE_MODEL();
  const ModelConfig c = ModelConfig::from_path(model_path);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.hidden_size, 640);
  EXPECT_EQ(c.num_hidden_layers, 18);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.intermediate_size, 2048);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_local_theta, 1e4);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_TRUE(c.qk_norm && c.tie_word_embeddings);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  // Layers 5, 11 and 17 are global, as Hugging Face's config says.
  const auto& hf = reference()["source"]["config"]["layer_types"];
  EXPECT_EQ(c.layer_types, hf.get<std::vector<std::string>>());
  for (int64_t i = 0; i < 18; ++i)
    EXPECT_EQ(c.layer_types[i], i % 6 == 5 ? "full_attention" : "sliding_attention") << i;
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{reference()["eos_token_id"].get<int64_t>()});
  EXPECT_EQ(c.bos_token_id, reference()["bos_token_id"].get<int64_t>());
}

TEST(Gemma3, TokenizerMatchesHuggingFace) {
  REQUIRE_MODEL();
  const Tokenizer& tok = tokenizer(model_path);
  EXPECT_EQ(tok.size(), 262144);
  for (const auto& c : reference()["tokenizer"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text, false), ids) << text;
    EXPECT_EQ(tok.encode(text, true), c["ids_default"].get<std::vector<int64_t>>()) << text;
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>()) << text;
  }
}

// A "▁" typed in the text is a space to Gemma's pieces of spaces, as it is to SentencePiece itself:
// ids from Hugging Face's tokenizer of this GGUF (transformers 5.24) and from a SentencePiece model
// rebuilt from the GGUF's pieces, which agree.
TEST(Gemma3, TypedWordBoundaryIsASpace) {
  REQUIRE_MODEL();
  const Tokenizer& tok = tokenizer(model_path);
  EXPECT_EQ(tok.encode("\u2581\u2581", false), (std::vector<int64_t>{138}));
  EXPECT_EQ(tok.encode(" \u2581", false), (std::vector<int64_t>{138}));
  EXPECT_EQ(tok.encode("\u2581 ", false), (std::vector<int64_t>{138}));
  EXPECT_EQ(tok.encode("a\u2581\u2581b", false), (std::vector<int64_t>{236746, 138, 236763}));
  EXPECT_EQ(tok.encode("x\u2581\u2581\u2581", false), (std::vector<int64_t>{236781, 139}));
}

// A run of spaces takes the longest space pieces (ids 138-167: 2 to 31 spaces), as SentencePiece
// does: 300 = 9 x 31 + 21. (transformers' GGUF converter derives merges that stop at 16 spaces and
// gives 16-space pieces instead.)
TEST(Gemma3, LongRunOfSpacesTakesTheLongestPieces) {
  REQUIRE_MODEL();
  std::vector<int64_t> expected(9, 167);
  expected.push_back(157);
  EXPECT_EQ(tokenizer(model_path).encode(std::string(300, ' '), false), expected);
}

TEST(Gemma3, LogitsMatchHuggingFace) {
  REQUIRE_MODEL();
  c10::InferenceMode guard;
  const auto m = model(model_path);
  ASSERT_EQ(reference()["logits"].size(), 3u);
  for (const auto& c : reference()["logits"]) {
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    KVCache cache = m->make_cache(static_cast<int64_t>(ids.size()));
    const at::Tensor logits = m->forward(at::tensor(ids).unsqueeze(0), cache)[0];  // [T, V]
    const auto& top_ids = c["top_ids"];
    const auto& top_values = c["top_values"];
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const auto row = logits[static_cast<int64_t>(t)].contiguous();
      for (size_t k = 0; k < top_ids[t].size(); ++k) {
        const double ref = top_values[t][k],
                     ours = row[top_ids[t][k].get<int64_t>()].item<double>();
        worst = std::max(worst, std::fabs(ours - ref) / std::max(1.0, std::fabs(ref)));
      }
      EXPECT_EQ(row.argmax().item<int64_t>(), top_ids[t][0].get<int64_t>())
          << c["text"] << " position " << t;
    }
    EXPECT_LT(worst, 1e-4) << c["text"] << " (" << ids.size() << " tokens)";
  }
}

// 12 text continuations, 64 new tokens each (generation does not stop at EOS, as in the
// reference): target-only greedy equals Hugging Face's greedy tokens, and prompt lookup (on four)
// and a 4-layer early-exit draft made from the model itself (on one: its float32 copy of the
// 262k-row embeddings makes it slow) give the same tokens.
TEST(Gemma3, GreedyContinuationsMatchHuggingFaceAndAssistedIsIdentical) {
  REQUIRE_MODEL();
  const auto m = model(model_path);
  const std::string draft_dir = temp_dir("gemma3_draft");
  make_draft_of(model_path, draft_dir, 4);
  const auto draft = load_model(draft_dir);
  Generator plain(m), lookup(m), assisted(m, draft);
  GenerationConfig g;
  g.max_new_tokens = 64;
  g.eos_token_ids = {0};  // <pad>: never generated; the reference ran all 64 steps
  GenerationConfig pl = g;
  pl.prompt_lookup_num_tokens = 10;
  GenerationConfig dr = g;
  dr.num_assistant_tokens_schedule = "constant";  // goodput, the greedy default, may not draft
  int64_t accepted = 0, n = 0;
  ASSERT_EQ(reference()["greedy"].size(), 12u);
  for (const auto& c : reference()["greedy"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int64_t>>();
    const auto r = plain.generate(prompt, g);
    EXPECT_EQ(r.tokens, c["greedy"].get<std::vector<int64_t>>()) << c["text"];
    if (++n > 4) continue;
    const auto a = lookup.generate(prompt, pl);
    EXPECT_EQ(a.tokens, r.tokens) << "prompt lookup: " << c["text"];
    accepted += a.stats.accepted_tokens;
    if (n == 1) {
      const auto d = assisted.generate(prompt, dr);
      EXPECT_EQ(d.tokens, r.tokens) << "4-layer draft: " << c["text"];
      accepted += d.stats.accepted_tokens;
    }
  }
  EXPECT_GT(accepted, 0);  // speculation was exercised, not only the bonus tokens
}
