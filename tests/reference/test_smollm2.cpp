// The real SmolLM2-135M-Instruct (Q4_1 GGUF) against Hugging Face transformers 4.47 loading the
// same file (float32), recorded by scripts/hf_reference_smollm2.py in
// tests/data/smollm2/reference.json: tokenizer ids, chat-formatted prompts, logits, and 64-token
// greedy chat answers; plus assisted generation on them. Skipped with a message when the model file
// is absent (scripts/get_models.sh; CI downloads it, so there they run).
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <algorithm>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;

namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j = read_json(test_data("smollm2/reference.json"));
  return j;
}

#define REQUIRE_MODEL()                          \
  const std::string model_path = smollm2_path(); \
  if (model_path.empty()) GTEST_SKIP() << "models/smollm2 absent: run scripts/get_models.sh"

std::shared_ptr<const Model> model(const std::string& path) {
  static std::shared_ptr<const Model> m = load_model(path);
  return m;
}

const Tokenizer& tokenizer(const std::string& path) {
  static std::unique_ptr<Tokenizer> t = load_tokenizer(path);
  return *t;
}

std::vector<int64_t> cut_at_eos(std::vector<int64_t> tokens, int64_t eos) {
  auto it = std::find(tokens.begin(), tokens.end(), eos);
  if (it != tokens.end()) tokens.erase(it + 1, tokens.end());
  return tokens;
}

}  // namespace

TEST(SmolLM2, ConfigFromGgufMetadata) {
  REQUIRE_MODEL();
  const ModelConfig c = ModelConfig::from_path(model_path);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
}

TEST(SmolLM2, TokenizerMatchesHuggingFace) {
  REQUIRE_MODEL();
  const Tokenizer& tok = tokenizer(model_path);
  EXPECT_EQ(tok.size(), 49152);
  EXPECT_TRUE(tok.is_special(2));
  for (const auto& c : reference()["tokenizer"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(tok.encode(text, false), ids) << text;
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>()) << text;
    // GGUF says add_bos_token false: nothing is added.
    EXPECT_EQ(tok.encode(text, true), ids) << text;
  }
}

TEST(SmolLM2, ChatTemplateMatchesHuggingFace) {
  REQUIRE_MODEL();
  const auto text = read_chat_template(model_path);
  ASSERT_TRUE(text);
  const ChatTemplate t = ChatTemplate::recognise(*text, model_path);
  EXPECT_EQ(t.name(), "chatml");
  EXPECT_EQ(t.default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  for (const auto& c : reference()["chat"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    const std::string rendered = t.render(messages, true);
    EXPECT_EQ(rendered, c["text"].get<std::string>());
    EXPECT_EQ(tokenizer(model_path).encode(rendered, false),
              c["prompt_ids"].get<std::vector<int64_t>>());
  }
}

TEST(SmolLM2, LogitsMatchHuggingFace) {
  REQUIRE_MODEL();
  c10::InferenceMode guard;
  const auto m = model(model_path);
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
    EXPECT_LT(worst, 1e-4) << c["text"];
  }
}

// The model as stored (Q4_1 layers, Q8_0 embeddings and tied head, run by the packed kernels) gives
// bitwise the logits of the float32 model dequantized at load: the kernels dequantize in registers
// with the dequantizer's own roundings. (The tests around this one run the as-stored model.)
TEST(SmolLM2, AsStoredWeightsGiveBitwiseTheDequantizedModelsLogits) {
  REQUIRE_MODEL();
  c10::InferenceMode guard;
  LoadOptions o;
  o.weights = WeightFormat::kFloat32;
  const auto f32 = load_model(model_path, o);
  const auto packed = model(model_path);
  const auto ids = reference()["logits"][0]["ids"].get<std::vector<int64_t>>();
  KVCache a = f32->make_cache(static_cast<int64_t>(ids.size())),
          b = packed->make_cache(static_cast<int64_t>(ids.size()));
  const at::Tensor x = at::tensor(ids).unsqueeze(0);
  EXPECT_TRUE(at::equal(f32->forward(x, a), packed->forward(x, b)));
}

// 14 chat prompts, 64 new tokens each: target-only greedy equals Hugging Face's greedy tokens (up
// to and including the first <|im_end|>, where generation stops), and assisted greedy (prompt
// lookup; on all; a 4-layer early-exit draft made from the model itself on three) equals
// target-only greedy.
TEST(SmolLM2, GreedyChatAnswersMatchHuggingFaceAndAssistedIsIdentical) {
  REQUIRE_MODEL();
  const auto m = model(model_path);
  const std::string draft_dir = temp_dir("smollm2_draft");
  make_draft_of(model_path, draft_dir, 4);
  const auto draft = load_model(draft_dir);
  Generator plain(m), lookup(m), assisted(m, draft);
  GenerationConfig g;
  g.max_new_tokens = 64;
  GenerationConfig pl = g;
  pl.prompt_lookup_num_tokens = 10;
  GenerationConfig dyn = g;
  dyn.num_assistant_tokens_schedule = "dynamic";
  int64_t accepted = 0, n = 0;
  for (const auto& c : reference()["chat"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int64_t>>();
    const auto expected =
        cut_at_eos(c["greedy"].get<std::vector<int64_t>>(), reference()["eos_token_id"]);
    const auto r = plain.generate(prompt, g);
    EXPECT_EQ(r.tokens, expected) << c["text"];
    const auto a = lookup.generate(prompt, pl);
    EXPECT_EQ(a.tokens, r.tokens) << "prompt lookup: " << c["text"];
    accepted += a.stats.accepted_tokens;
    if (++n <= 3) {  // the draft costs most: three prompts
      const auto d = assisted.generate(prompt, dyn);
      EXPECT_EQ(d.tokens, r.tokens) << "4-layer draft, dynamic: " << c["text"];
      accepted += d.stats.accepted_tokens;
    }
  }
  EXPECT_GT(accepted, 0);  // speculation was exercised, not only the bonus tokens
}

// A 512-token greedy generation of the trained model (near-ties happen over that many tokens):
// assisted output equals target-only output token for token. EOS is set to <|endoftext|> so that
// generation runs past the end of the first answer.
TEST(SmolLM2, LongGreedyGenerationIsExactUnderSpeculation) {
  REQUIRE_MODEL();
  const auto m = model(model_path);
  const auto prompt = reference()["chat"][3]["prompt_ids"].get<std::vector<int64_t>>();
  GenerationConfig g;
  g.max_new_tokens = 512;
  g.eos_token_ids = {0};
  const auto plain = Generator(m).generate(prompt, g);
  GenerationConfig pl = g;
  pl.prompt_lookup_num_tokens = 10;
  // constant: goodput, the greedy default, may judge drafting not worth it on a loaded machine
  pl.num_assistant_tokens_schedule = "constant";
  const auto lookup = Generator(m).generate(prompt, pl);
  EXPECT_EQ(plain.tokens.size(), 512u);
  EXPECT_EQ(lookup.tokens, plain.tokens);
  EXPECT_GT(lookup.stats.accepted_tokens, 0);
}

// Prompt lookup (10 tokens) on the 8 input-grounded prompts: the same tokens and the same per-pass
// trace [candidates, accepted] as transformers' own assisted generation (leftmost n-gram match,
// proposal cut before EOS), up to the length cap described below.
TEST(SmolLM2, PromptLookupTracesMatchHuggingFace) {
  REQUIRE_MODEL();
  const auto m = model(model_path);
  GenerationConfig g;
  g.max_new_tokens = 64;
  g.prompt_lookup_num_tokens = 10;
  g.num_assistant_tokens_schedule = "constant";  // Hugging Face's default: 10 every iteration
  ASSERT_EQ(reference()["prompt_lookup"].size(), 8u);
  for (const auto& c : reference()["prompt_lookup"]) {
    const auto r = Generator(m).generate(c["prompt_ids"].get<std::vector<int64_t>>(), g);
    EXPECT_EQ(r.tokens, c["tokens"].get<std::vector<int64_t>>()) << c["prompt"];
    std::vector<std::vector<int64_t>> trace, expected;
    for (const auto& t : r.stats.trace) trace.push_back({t[0], t[1]});
    // transformers' prompt lookup proposes up to 10 candidates even when fewer new tokens remain
    // (its draft-model generator caps them at max_length - length - 1, as specdec does for both):
    // near the length limit the expected trace is transformers' with that cap applied.
    int64_t generated = 0;
    for (const auto& t : c["trace"]) {
      const int64_t cap = g.max_new_tokens - generated - 1;
      const int64_t drafted = std::min(t[0].get<int64_t>(), cap),
                    accepted = std::min(t[1].get<int64_t>(), drafted);
      expected.push_back({drafted, accepted});
      generated += accepted + 1;
    }
    EXPECT_EQ(trace, expected) << c["prompt"];
  }
}

// Suffix speculation on the real model, chains and trees (--suffix-tree), on 4 of the 8 prompts
// through one Generator each, every prompt twice (the second time the shared tree holds the first
// answer): Hugging Face's greedy tokens every time, and the repeated answers mostly proposed.
TEST(SmolLM2, SuffixSpeculationChainsAndTreesGiveHuggingFacesGreedyTokens) {
  REQUIRE_MODEL();
  const auto m = model(model_path);
  GenerationConfig g;
  g.max_new_tokens = 64;
  g.suffix_speculation = true;
  g.num_assistant_tokens_schedule = "constant";
  g.num_assistant_tokens = 8;
  for (const bool tree : {false, true}) {
    Generator gen(m);
    SuffixOptions o;
    o.tree = tree;
    gen.set_suffix_options(o);
    int64_t tokens = 0, accepted = 0;
    for (int round = 0; round < 2; ++round)
      for (size_t i = 0; i < 4; ++i) {
        const auto& c = reference()["prompt_lookup"][i];
        const auto r = gen.generate(c["prompt_ids"].get<std::vector<int64_t>>(), g);
        EXPECT_EQ(r.tokens, c["tokens"].get<std::vector<int64_t>>())
            << (tree ? "trees, " : "chains, ") << c["prompt"];
        if (round == 1) tokens += r.stats.new_tokens, accepted += r.stats.accepted_tokens;
      }
    EXPECT_GT(accepted, tokens / 2) << (tree ? "trees" : "chains");
  }
}

// make-draft --int8-activations labels with the target as it serves with --int8-activations.
// Oracle: the top-32 next-token probabilities of each training chunk computed here, one chunk at a
// time, by the target loaded with 8-bit activations; they must equal the labels bitwise, and differ
// from the float32-activation target's (so the option is not ignored). Data labelled one way is
// refused by a run of the other.
TEST(SmolLM2, MakeDraftLabelsWithInt8ActivationsAsTheTargetServes) {
  REQUIRE_MODEL();
  const std::string root = temp_dir("smollm2_make_draft_int8");
  write_file(root + "/text.txt",
             "The water cycle moves water between the oceans, the air and the land. The sun warms "
             "the sea, "
             "water rises as vapour, cools into clouds and falls again as rain or snow.");
  MakeDraftOptions o;
  o.target = model_path;
  o.out = root + "/d";
  o.data_files = {root + "/text.txt"};
  o.vocab_subset = 64;
  o.seq_len = 16;
  o.batch = 3;
  o.steps = 0;
  o.int8_activations = true;
  make_draft(o);

  std::vector<at::Tensor> data;
  torch::load(data, o.out + "/training/data.pt");
  const at::Tensor ids = data.at(0), lengths = data.at(1), top_ids = data.at(2), top_p = data.at(3);
  ASSERT_GE(ids.size(0), 2);
  LoadOptions int8;
  int8.int8_activations = true;
  const auto served = load_model(model_path, int8), float32 = model(model_path);
  c10::InferenceMode guard;
  bool differs_from_float32 = false;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    const int64_t n = lengths[i].item<int64_t>();
    const at::Tensor chunk = ids[i].narrow(0, 0, n).unsqueeze(0);
    KVCache c8 = served->make_cache(n), c32 = float32->make_cache(n);
    const auto [p, id] = at::log_softmax(served->forward(chunk, c8)[0], -1).topk(32, -1);
    EXPECT_TRUE(at::equal(id.to(at::kInt), top_ids[i].narrow(0, 0, n))) << "chunk " << i;
    EXPECT_TRUE(at::equal(p.exp(), top_p[i].narrow(0, 0, n))) << "chunk " << i;
    const at::Tensor p32 =
        std::get<0>(at::log_softmax(float32->forward(chunk, c32)[0], -1).topk(32, -1)).exp();
    differs_from_float32 = differs_from_float32 || !at::equal(p32, top_p[i].narrow(0, 0, n));
  }
  EXPECT_TRUE(differs_from_float32) << "the labels are the float32-activation target's";

  MakeDraftOptions other = o;
  other.out = root + "/other";
  other.data_files.clear();
  other.data_from = o.out;
  other.int8_activations = false;
  expect_error(other, "was labelled with --int8-activations");
}
