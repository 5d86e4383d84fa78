#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "specdec/stats.hpp"
#include "test_util.hpp"
#include "util.hpp"

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
  expect_error("{not json", "cfg.json: invalid JSON: parse error at line 1, column 3");  // (no tag)
  expect_error(
      R"({"model_type":"bert"})",
      "unsupported model_type 'bert' (supported: llama, mistral, qwen2, qwen3, gemma3_text, "
      "gpt_neox, gpt2, opt, t5)");
  expect_error(R"({"vocab_size":3})", "missing field 'model_type'");
  std::string t = kGood;
  expect_error(t.replace(t.find("\"hidden_size\":16"), 16, "\"hidden_size\":\"x\""),
               "'hidden_size' has the wrong type");
  t = kGood;
  expect_error(t.replace(t.find("\"num_key_value_heads\":2"), 23, "\"num_key_value_heads\":3"),
               "multiple of num_key_value_heads");
  t = kGood;
  expect_error(t.replace(t.find("[2,3]"), 5, "[2,99]"),
               "eos_token_id 99 is outside the vocabulary");
  t = kGood;
  expect_error(t.replace(t.find("llama3"), 6, "yarn"), "unsupported rope_scaling type 'yarn'");
}

// A Gemma 3 config as transformers 5 writes it (the fields that matter).
const char* kGemma3 = R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,
 "intermediate_size":64,"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,
 "head_dim":16,"query_pre_attn_scalar":24,"sliding_window":8,"hidden_activation":"gelu_pytorch_tanh",
 "layer_types":["sliding_attention","sliding_attention","full_attention"],
 "rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0},
 "sliding_attention":{"rope_type":"default","rope_theta":10000.0}},
 "final_logit_softcapping":null,"attn_logit_softcapping":null,"_sliding_window_pattern":6})";

TEST(ModelConfig, Gemma3AndQwen3Fields) {
  const ModelConfig c = ModelConfig::from_json_text(kGemma3, "cfg.json");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma3TextConfig's default
  EXPECT_EQ(c.layer_types[2], "full_attention");
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_local_theta, 1e4);
  EXPECT_EQ(c.rope_local_scaling.type, "");
  EXPECT_EQ(c.query_pre_attn_scalar, 24);
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  // transformers 4.5x: sliding_window_pattern P makes layer i global when (i + 1) % P == 0.
  const ModelConfig old = ModelConfig::from_json_text(
      R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,"intermediate_size":64,
      "num_hidden_layers":5,"num_attention_heads":4,"head_dim":16,"sliding_window_pattern":2,
      "rope_theta":500000.0,"rope_local_base_freq":20000.0})",
      "cfg.json");
  EXPECT_EQ(old.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention",
                                      "full_attention", "sliding_attention"}));
  EXPECT_EQ(old.rope_theta, 5e5);
  EXPECT_EQ(old.rope_local_theta, 2e4);
  EXPECT_EQ(old.query_pre_attn_scalar, 256);  // Gemma3TextConfig's default
  // transformers 5 writes rope_theta inside rope_parameters for every family.
  std::string t = kGood;
  t.replace(t.find("\"llama\""), 7, "\"qwen3\"");
  t.replace(t.find("\"rope_scaling\""), 14, "\"rope_parameters\"");
  t.replace(t.find("\"factor\""), 0, "\"rope_theta\":1000000.0,");
  const ModelConfig q = ModelConfig::from_json_text(t, "cfg.json");
  EXPECT_TRUE(q.qk_norm);
  EXPECT_FALSE(q.attention_bias);
  EXPECT_EQ(q.rope_theta, 1e6);
  EXPECT_EQ(q.rope_scaling.type, "llama3");

  t = kGemma3;
  expect_error(t.replace(t.find("\"full_attention\"]"), 17, "\"full_attention\",\"x\"]"),
               "layer_types has 4 entries for 3 layers");
  t = kGemma3;
  expect_error(t.replace(t.find("\"full_attention\"]"), 17, "\"global\"]"),
               "layer_types entry 'global'");
  t = kGemma3;
  expect_error(
      t.replace(t.find("\"final_logit_softcapping\":null"), 30, "\"final_logit_softcapping\":30.0"),
      "'final_logit_softcapping' is set");
  t = kGemma3;
  expect_error(t.replace(t.find("\"linear\""), 8, "\"yarn\""),
               "unsupported rope_parameters.full_attention type 'yarn'");
  expect_error(R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"head_dim":16,
      "sliding_window_pattern":0})",
               "sliding_window_pattern must be >= 1");
  // A pattern past the layer count makes every layer sliding, as Hugging Face reads it (a
  // draft cut to its first layers keeps its target's pattern).
  const ModelConfig few = ModelConfig::from_json_text(
      R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"head_dim":16})",
      "cfg.json");
  EXPECT_EQ(few.layer_types, (std::vector<std::string>{"sliding_attention", "sliding_attention"}));
  t = kGemma3;
  expect_error(t.replace(t.find("[\"sliding_attention\",\"sliding_attention\",\"full_attention\"]"),
                         58, "[\"sliding_attention\",2,\"full_attention\"]"),
               "field 'layer_types' entry 1 has the wrong type (number)");
  t = kGemma3;
  expect_error(
      t.replace(t.find("\"sliding_window\":8"), 18, "\"use_bidirectional_attention\":true"),
      "use_bidirectional_attention");
}

// Gemma3TextConfig's defaults where its config.json says nothing (not the llama family's): the
// full layers' rope_theta 1e6, head_dim 256, 131072 positions.
TEST(ModelConfig, Gemma3DefaultsAreGemma3TextConfigs) {
  const ModelConfig c = ModelConfig::from_json_text(
      R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,"intermediate_size":64,
      "num_hidden_layers":2,"num_attention_heads":4,"sliding_window_pattern":2})",
      "cfg.json");
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_local_theta, 1e4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  // transformers 5: a per-type rope_parameters without rope_theta keeps the default too.
  const ModelConfig t5 = ModelConfig::from_json_text(
      R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,"intermediate_size":64,
      "num_hidden_layers":2,"num_attention_heads":4,"layer_types":["sliding_attention","full_attention"],
      "rope_parameters":{"full_attention":{"rope_type":"default"},"sliding_attention":{"rope_type":"default"}}})",
      "cfg.json");
  EXPECT_EQ(t5.rope_theta, 1e6);
}

// Numbers the kernels use as float32 must be finite there; rope scaling types need their keys (as
// Hugging Face's rope validation says); layers and head sizes are bounded before anything is built.
TEST(ModelConfig, RopeNormAndSizeFieldsAreChecked) {
  const auto with = [](const std::string& from, const std::string& to) {
    std::string t = kGood;
    return t.replace(t.find(from), from.size(), to);
  };
  expect_error(with("\"num_key_value_heads\"", "\"rope_theta\":1e39,\"num_key_value_heads\""),
               "rope_theta must be a number > 0 that float32 holds (at most 3.4e38), got 1e+39");
  expect_error(with("\"num_key_value_heads\"", "\"rms_norm_eps\":1e39,\"num_key_value_heads\""),
               "rms_norm_eps must be a number > 0 that float32 holds");
  expect_error(with("\"factor\":8.0", "\"factor\":1e300"),
               "the rope scaling factor must be a number > 0 that float32 holds");
  expect_error(with("\"factor\":8.0,", ""), "rope_scaling of type 'llama3' needs 'factor'");
  expect_error(with("\"low_freq_factor\":1.0,", ""),
               "rope_scaling of type 'llama3' needs 'low_freq_factor'");
  expect_error(with("\"low_freq_factor\":1.0", "\"low_freq_factor\":4.0"),
               "needs high_freq_factor > low_freq_factor");
  expect_error(with("\"rope_type\":\"llama3\",\"factor\":8.0", "\"rope_type\":\"linear\""),
               "rope_scaling of type 'linear' needs 'factor'");
  expect_error(with("\"num_hidden_layers\":1", "\"num_hidden_layers\":400000000"),
               "num_hidden_layers must be from 1 to 4096 (Limits::max_layers), got 400000000");
  expect_error(with("\"num_hidden_layers\":1", "\"num_hidden_layers\":1,\"head_dim\":4000000000"),
               "head_dim 4000000000 exceeds the limit of 4096 (Limits::max_head_dim)");
  // Gemma 3's attention scale, query_pre_attn_scalar^-1/2 in float32, must be finite.
  const std::string gemma = R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":4,"query_pre_attn_scalar":)";
  expect_error(
      gemma + "1e-300}",
      "query_pre_attn_scalar must be > 0 with a finite float32 scale (its -1/2 power), or 0 "
      "for head_dim; got 1e-300");
  expect_error(gemma + "-1}", "query_pre_attn_scalar must be > 0");
  EXPECT_EQ(ModelConfig::from_json_text(gemma + "1e-30}", "cfg.json").query_pre_attn_scalar, 1e-30);
  // Gemma 3's layer list is not built for a count past the limit.
  expect_error(R"({"model_type":"gemma3_text","vocab_size":64,"hidden_size":32,
      "intermediate_size":64,"num_hidden_layers":4000000000,"num_attention_heads":4})",
               "num_hidden_layers must be from 1 to 4096");
}

// Found by a review of bad configs: each was a crash, a silent divergence from Hugging Face, or a
// message that pointed elsewhere.
TEST(ModelConfig, RotaryFractionNestingAndDefaultsAreChecked) {
  const auto neox = [](const std::string& pct) {
    return R"({"model_type":"gpt_neox","vocab_size":32,"hidden_size":64,"intermediate_size":64,
      "num_hidden_layers":1,"num_attention_heads":4,"rotary_pct":)" +
           pct + "}";
  };
  EXPECT_EQ(ModelConfig::from_json_text(neox("0.25"), "cfg.json").rotary_pct, 0.25);
  // head_dim 16 * 2.0 = 32 rotated dimensions wrote past each head (heap corruption)
  expect_error(neox("2.0"), "rotary_pct (partial_rotary_factor) must be in (0, 1], got 2");
  expect_error(neox("-0.5"), "must be in (0, 1], got -0.5");
  // 16 * 0.3125 = 5: Hugging Face rotates halves of an even count
  expect_error(neox("0.3125"), "rotary_pct 0.3125 rotates 5 of head_dim 16 dimensions");
  std::string t = kGood;
  expect_error(
      t.replace(t.find("\"vocab_size\""), 12, "\"partial_rotary_factor\":0.5,\"vocab_size\""),
      "partial rotary embeddings (partial_rotary_factor 0.5) are supported for gpt_neox "
      "only");
  // A bracket per level costs tens of bytes once parsed; 128 levels at most
  expect_error(
      R"({"model_type":"llama","x":)" + std::string(200, '[') + std::string(200, ']') + "}",
      "JSON nested deeper than 128 levels");
  // Qwen3Config's head_dim is 128 unless given (not hidden / heads)
  const ModelConfig q = ModelConfig::from_json_text(
      R"({"model_type":"qwen3","vocab_size":32,"hidden_size":64,"intermediate_size":64,
      "num_hidden_layers":1,"num_attention_heads":4})",
      "cfg.json");
  EXPECT_EQ(q.head_dim, 128);
  t = kGood;
  expect_error(t.replace(t.find("\"vocab_size\":32,"), 16, ""), "field 'vocab_size' is missing");
  // transformers 5's per-type rope_parameters names Gemma 3's two layer types only
  t = kGemma3;
  expect_error(
      t.replace(t.find("\"sliding_attention\":{\"rope_type\""), 19, "\"chunked_attention\""),
      "rope_parameters names the layer type 'chunked_attention'");
}

// A flan-t5-small style config.json (as T5Config.to_dict() writes it, minus unrelated fields).
const char* kFlanT5 = R"({"model_type":"t5","architectures":["T5ForConditionalGeneration"],
 "vocab_size":32128,"d_model":512,"d_kv":64,"d_ff":1024,"num_layers":8,"num_decoder_layers":6,
 "num_heads":6,"relative_attention_num_buckets":32,"relative_attention_max_distance":128,
 "feed_forward_proj":"gated-gelu","layer_norm_epsilon":1e-06,"tie_word_embeddings":false,
 "decoder_start_token_id":0,"eos_token_id":1,"pad_token_id":0,"is_encoder_decoder":true})";

TEST(ModelConfig, T5FieldsMapOntoTheDecoderView) {
  const ModelConfig c = ModelConfig::from_json_text(kFlanT5, "cfg.json");
  EXPECT_TRUE(c.is_encoder_decoder);
  EXPECT_EQ(c.hidden_size, 512);
  EXPECT_EQ(c.head_dim, 64);  // d_kv, not d_model / num_heads
  EXPECT_EQ(c.num_attention_heads, 6);
  EXPECT_EQ(c.num_key_value_heads, 6);
  EXPECT_EQ(c.intermediate_size, 1024);
  EXPECT_EQ(c.num_encoder_layers, 8);
  EXPECT_EQ(c.num_hidden_layers, 6);  // the decoder's
  EXPECT_TRUE(c.is_gated_act);
  EXPECT_EQ(c.hidden_act, "gelu_new");  // "gated-gelu" is the tanh approximation
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.decoder_start_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  // t5-small: ReLU, tied head (the default), decoder layers = encoder layers.
  std::string t =
      R"({"model_type":"t5","vocab_size":32128,"num_layers":6,"decoder_start_token_id":0})";
  const ModelConfig small = ModelConfig::from_json_text(t, "cfg.json");
  EXPECT_EQ(small.num_hidden_layers, 6);
  EXPECT_EQ(small.hidden_size, 512);  // T5Config's defaults
  EXPECT_FALSE(small.is_gated_act);
  EXPECT_EQ(small.hidden_act, "relu");
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(
      ModelConfig::from_json_text(R"({"model_type":"t5","vocab_size":9,"decoder_start_token_id":0,
    "feed_forward_proj":"gated-silu"})",
                                  "cfg.json")
          .hidden_act,
      "silu");
  t = kFlanT5;
  expect_error(t.replace(t.find("gated-gelu"), 10, "gated-gelu-x"),
               "feed_forward_proj 'gated-gelu-x' is not of the form");
  t = kFlanT5;
  expect_error(t.replace(t.find("\"decoder_start_token_id\":0,"), 27, ""),
               "without decoder_start_token_id");
  t = kFlanT5;
  expect_error(
      t.replace(t.find("\"decoder_start_token_id\":0"), 26, "\"decoder_start_token_id\":40000"),
      "decoder_start_token_id 40000 is outside the vocabulary");
}

TEST(ModelConfig, MissingFolderNamesTheFile) {
  try {
    ModelConfig::from_dir("/nonexistent/model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model/config.json"), std::string::npos);
  }
  try {  // a .gguf name is a file: no folder, no config.json in the message
    load_model("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/model.gguf: no such file");
  }
}

TEST(GenerationConfig, ValidatesEveryKnob) {
  GenerationConfig ok;
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(ok.schedule(), Schedule::kGoodput);  // greedy: goodput by default
  EXPECT_EQ(ok.resolved_num_assistant_tokens(), 12);
  GenerationConfig sampled;
  sampled.do_sample = true;
  EXPECT_EQ(sampled.schedule(), Schedule::kConstant);  // sampling: constant by default
  EXPECT_EQ(sampled.resolved_num_assistant_tokens(), 5);
  sampled.temperature = 0;  // do_sample at temperature 0 is greedy: goodput
  EXPECT_EQ(sampled.schedule(), Schedule::kGoodput);
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
  bad([](GenerationConfig& c) { c.top_p = -0.1; });
  bad([](GenerationConfig& c) { c.top_p = 1.5; });
  bad([](GenerationConfig& c) { c.min_p = 1; });
  bad([](GenerationConfig& c) { c.repetition_penalty = 0; });
  bad([](GenerationConfig& c) { c.repetition_penalty = 1e-38; });  // a logit / it overflows
  sampled.temperature = 1e-38;  // dividing float32 logits by it overflows them: greedy, its limit
  EXPECT_FALSE(sampled.sampling());
  EXPECT_EQ(sampled.schedule(), Schedule::kGoodput);
  sampled.temperature = GenerationConfig::kGreedyBelow;
  EXPECT_TRUE(sampled.sampling());
  bad([](GenerationConfig& c) { c.max_matching_ngram_size = 0; });
}

TEST(ModelConfig, IntegerFieldsWrittenAsFloats) {
  std::string t = kGood;
  t.insert(1, R"("max_position_embeddings": 4096.0, )");
  EXPECT_EQ(ModelConfig::from_json_text(t, "cfg.json").max_position_embeddings, 4096);
  std::string huge = kGood;  // a float that no integer holds: an error, not undefined behaviour
  huge.insert(1, R"("max_position_embeddings": 1.5e43, )");
  expect_error(huge, "must be an integer");
}

TEST(ModelConfig, ReviewGapsAreClearErrors) {
  // head_dim derived from a hidden size that does not divide.
  std::string t = kGood;
  t.replace(t.find("\"hidden_size\":16"), 16, "\"hidden_size\":18");
  expect_error(t, "not a multiple of num_attention_heads");
  // Token ids of generation_config.json are checked against the vocabulary too.
  const std::string dir = temp_dir("gen_config");
  write_file(dir + "/config.json", kGood);
  write_file(dir + "/generation_config.json", R"({"bos_token_id": 40})");
  try {
    ModelConfig::from_dir(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: bos_token_id 40 is outside"),
              std::string::npos)
        << e.what();
  }
  // Mistral's sliding_window and Llama's mlp_bias are read; Qwen2's use_sliding_window is refused.
  std::string m = kGood;
  m.replace(m.find("\"llama\""), 7, "\"mistral\"");
  m.insert(1, R"("sliding_window": 4096, "mlp_bias": true, )");
  const ModelConfig mc = ModelConfig::from_json_text(m, "cfg.json");
  EXPECT_EQ(mc.sliding_window, 4096);
  EXPECT_TRUE(mc.mlp_bias);
  std::string q = kGood;
  q.replace(q.find("\"llama\""), 7, "\"qwen2\"");
  q.insert(1, R"("use_sliding_window": true, )");
  expect_error(q, "use_sliding_window is not supported");
  // transformers 5's layer_types, outside Gemma 3: a window the layers would have and these
  // families do not apply is refused, not ignored; the list is checked as Gemma 3's.
  std::string q3 = kGood;
  q3.replace(q3.find("\"llama\""), 7, "\"qwen3\"");
  EXPECT_NO_THROW(ModelConfig::from_json_text(
      std::string(q3).insert(1, R"("layer_types": ["full_attention"], )"), "cfg.json"));
  expect_error(
      std::string(q3).insert(1, R"("layer_types": ["sliding_attention"], "sliding_window": 4, )"),
      "layer_types has a 'sliding_attention' layer, but qwen3 applies no sliding window");
  expect_error(
      std::string(q3).insert(1, R"("layer_types": ["full_attention", "full_attention"], )"),
      "layer_types has 2 entries for 1 layers");
  expect_error(std::string(q3).insert(1, R"("layer_types": ["foo"], )"), "layer_types entry 'foo'");
  EXPECT_NO_THROW(ModelConfig::from_json_text(
      std::string(m).insert(1, R"("layer_types": ["sliding_attention"], )"), "cfg.json"));
  expect_error(std::string(m).insert(1, R"("layer_types": ["full_attention"], )"),
               "but mistral applies its sliding_window to every layer");
  // head_dim 0 is no head size (a missing head_dim is derived, as in Hugging Face).
  expect_error(std::string(q3).insert(1, R"("head_dim": 0, )"),
               "field 'head_dim' must be a positive integer, got 0");
}

TEST(LoadModel, BadOptionsAndLibtorchFailuresAreSpecdecErrors) {
  FixtureOptions o;
  o.hidden = 32, o.heads = 2, o.layers = 1, o.vocab = 64;
  const std::string dir = cached_fixture("load_options", o);
  LoadOptions bad;
  bad.dtype = at::kInt;
  EXPECT_THROW(load_model(dir, bad), Error);
  // libtorch's c10::Error comes out of the library's entry points as a specdec::Error naming the
  // call.
  try {
    torch_errors_as_specdec("load_model(x)", [] { return at::empty({-1}); });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("load_model(x): "), std::string::npos) << e.what();
  }
}

// Nothing is sized by max_position_embeddings at load (the rotary tables are computed per pass): a
// configuration claiming 2^42 positions loads and generates.
TEST(LoadModel, HugeMaxPositionEmbeddingsAllocatesNothing) {
  FixtureOptions o;
  o.hidden = 32, o.heads = 2, o.layers = 1, o.vocab = 64;
  const std::string dir = cached_fixture("load_options", o);
  Limits l;
  l.max_sequence_length = int64_t{1} << 42;
  const ScopedLimits scoped(l);
  const std::string huge = temp_dir("huge_positions");
  nlohmann::json c = read_json(dir + "/config.json");
  c["max_position_embeddings"] = int64_t{1} << 42;
  write_file(huge + "/config.json", c.dump());
  write_file(huge + "/model.safetensors", read_file(dir + "/model.safetensors"));
  const auto target = load_model(huge), reference = load_model(dir);
  GenerationConfig g;
  g.max_new_tokens = 8;
  EXPECT_EQ(Generator(target).generate({1, 2, 3}, g).tokens,
            Generator(reference).generate({1, 2, 3}, g).tokens);
}

// Leviathan et al.'s prediction from measured statistics, computed by hand: alpha = 4 accepted /
// (4 + 1 rejection) = 0.8, gamma = 6 drafted / 2 passes = 3, c = (0.3 s / 6 draft tokens) /
// (1.8 s / 9 decode passes) = 0.25; (1 - 0.8^4) / (0.2 x 1.75) = 1.686857...
TEST(Stats, EstimateSpeedupByHand) {
  GenerationStats plain, assisted;
  plain.total_seconds = 2.0;
  plain.verification_seconds = 1.8;
  plain.target_passes = 10;
  assisted.total_seconds = 1.0;
  assisted.trace = {{3, 1}, {3, 3}};
  assisted.accepted_tokens = 4;
  assisted.drafted_tokens = 6;
  assisted.target_passes = 2;
  assisted.drafting_seconds = 0.3;
  assisted.draft_passes = 7;  // one of them the draft's prefill
  assisted.prefill_draft_passes = 1;
  const SpeedupEstimate e = estimate_speedup(plain, assisted);
  EXPECT_DOUBLE_EQ(e.measured, 2.0);
  EXPECT_DOUBLE_EQ(e.alpha, 0.8);
  EXPECT_DOUBLE_EQ(e.gamma, 3.0);
  EXPECT_DOUBLE_EQ(e.cost_ratio, 0.25);
  EXPECT_NEAR(e.predicted, 0.5904 / 0.35, 1e-12);
  EXPECT_EQ(e.pass_ratio, 0.0) << "no verification pass after the first was timed";
  EXPECT_EQ(e.predicted_with_passes, 0.0);
  // With the verification passes' cost: 0.4 s for the pass after the first, 2x target-only's 0.2 s
  // per decode pass: (1 - 0.8^4) / (0.2 x (3 x 0.25 + 2)).
  GenerationStats timed = assisted;
  timed.verification_seconds = 0.4;
  const SpeedupEstimate t = estimate_speedup(plain, timed);
  EXPECT_DOUBLE_EQ(t.pass_ratio, 2.0);
  EXPECT_NEAR(t.predicted_with_passes, 0.5904 / 0.55, 1e-12);
  EXPECT_NEAR(t.predicted, e.predicted, 1e-15) << "Leviathan's own prediction is unchanged";
  GenerationStats tree = assisted;
  tree.tree_passes = 1;
  EXPECT_EQ(estimate_speedup(plain, tree).predicted, 0.0);  // the formula is a chain's
  GenerationStats none;  // nothing drafted: no prediction (not 1)
  none.total_seconds = 1.5;
  none.trace = {{0, 0}, {0, 0}};
  none.target_passes = 2;
  EXPECT_EQ(estimate_speedup(plain, none).predicted, 0.0);
  // A draft that drafted in the first iteration only (its passes timed as the prefill): its cost
  // is unknown, not 0.
  GenerationStats first_only = assisted;
  first_only.draft_passes = first_only.prefill_draft_passes = 3;
  first_only.drafting_seconds = 0;
  const SpeedupEstimate unknown = estimate_speedup(plain, first_only);
  EXPECT_FALSE(unknown.cost_measured);
  EXPECT_EQ(unknown.predicted, 0.0);
  EXPECT_TRUE(estimate_speedup(plain, assisted).cost_measured);
  GenerationStats lookup = assisted;  // no draft model: nothing to measure, a free proposal
  lookup.draft_passes = lookup.prefill_draft_passes = 0;
  lookup.drafting_seconds = 0;
  EXPECT_TRUE(estimate_speedup(plain, lookup).cost_measured);
  EXPECT_NEAR(estimate_speedup(plain, lookup).predicted, 0.5904 / 0.2, 1e-12);
  lookup.verification_seconds = 0.4;  // a free proposal still pays for its longer pass
  EXPECT_NEAR(estimate_speedup(plain, lookup).predicted_with_passes, 0.5904 / 0.4, 1e-12);
}

}  // namespace
}  // namespace specdec::test
