#include <gtest/gtest.h>

#include "test_util.hpp"

namespace specdec::test {
namespace {

const char* kGood = R"({"model_type":"llama","architectures":["LlamaForCausalLM"],"vocab_size":32,
 "hidden_size":16,"intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":4,
 "num_key_value_heads":2,"eos_token_id":[2,3],"bos_token_id":1,
 "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
 "original_max_position_embeddings":8192}})";

void expect_error(const std::string& text, const std::string& needle) {
  try {
    ModelConfig::from_json_text(text, "cfg.json");
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, ParsesFieldsDefaultsAndEosList) {
  const ModelConfig c = ModelConfig::from_json_text(kGood, "cfg.json");
  EXPECT_EQ(c.head_dim, 4);  // hidden / heads when head_dim is absent
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_TRUE(c.is_eos(3));
  ModelConfig g = c;
  g.apply_generation_config_text(R"({"eos_token_id": 5})", "gen.json");
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{5}));
}

TEST(ModelConfig, Qwen2AlwaysHasAttentionBias) {
  std::string t = kGood;
  t.replace(t.find("\"llama\""), 7, "\"qwen2\"");
  EXPECT_TRUE(ModelConfig::from_json_text(t, "cfg.json").attention_bias);
}

TEST(ModelConfig, RejectsBadInput) {
  expect_error("{not json", "invalid JSON");
  expect_error(R"({"model_type":"bert"})",
               "unsupported model_type 'bert' (supported: llama, mistral, qwen2, gpt_neox, gpt2, opt)");
  expect_error(R"({"model_type":"t5"})", "unsupported model_type 't5'");
  expect_error(R"({"vocab_size":3})", "missing field 'model_type'");
  std::string t = kGood;
  expect_error(t.replace(t.find("\"hidden_size\":16"), 16, "\"hidden_size\":\"x\""), "'hidden_size' has the wrong type");
  t = kGood;
  expect_error(t.replace(t.find("\"num_key_value_heads\":2"), 23, "\"num_key_value_heads\":3"), "multiple of num_key_value_heads");
  t = kGood;
  expect_error(t.replace(t.find("[2,3]"), 5, "[2,99]"), "eos_token_id 99 is outside the vocabulary");
  t = kGood;
  expect_error(t.replace(t.find("llama3"), 6, "yarn"), "unsupported rope_scaling type 'yarn'");
}

TEST(ModelConfig, MissingFolderNamesTheFile) {
  try {
    ModelConfig::from_dir("/nonexistent/model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model/config.json"), std::string::npos);
  }
}

TEST(GenerationConfig, ValidatesEveryKnob) {
  GenerationConfig ok;
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(ok.resolved_num_assistant_tokens(), 5);
  ok.num_assistant_tokens_schedule = "dynamic";
  EXPECT_EQ(ok.resolved_num_assistant_tokens(), 20);
  auto bad = [](auto mutate) {
    GenerationConfig c;
    mutate(c);
    EXPECT_THROW(c.validate(), Error);
  };
  bad([](GenerationConfig& c) { c.max_new_tokens = 0; });
  bad([](GenerationConfig& c) { c.num_assistant_tokens = -1; });
  bad([](GenerationConfig& c) { c.num_assistant_tokens_schedule = "sometimes"; });
  bad([](GenerationConfig& c) { c.assistant_confidence_threshold = 1.5; });
  bad([](GenerationConfig& c) { c.temperature = -1; });
  bad([](GenerationConfig& c) { c.top_p = 0; });
  bad([](GenerationConfig& c) { c.min_p = 1; });
  bad([](GenerationConfig& c) { c.repetition_penalty = 0; });
  bad([](GenerationConfig& c) { c.max_matching_ngram_size = 0; });
}

}  // namespace
}  // namespace specdec::test
