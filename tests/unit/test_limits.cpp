// Limits (specdec/limits.hpp): each bound refuses an input that is otherwise fine, with an error
// naming the limit, before anything is sized from the input; raising it admits the input again.
// (GGUF's bounds are tested in test_gguf.cpp.)
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace specdec::test {
namespace {

template <typename F>
void expect_limit_error(F&& f, const std::string& field) {
  try {
    f();
    ADD_FAILURE() << field << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Limits::" + field), std::string::npos) << e.what();
  }
}

FixtureOptions tiny(const std::string& arch = "llama") {
  FixtureOptions o;
  o.arch = arch, o.layers = 1, o.hidden = 32, o.heads = 2, o.vocab = 64, o.max_pos = 256;
  return o;
}

}  // namespace

TEST(Limits, SetLimitsRefusesNonPositiveValues) {
  Limits l;
  l.max_rank = 0;
  EXPECT_THROW(set_limits(l), Error);
  l = {}, l.max_sequence_length = -1;
  EXPECT_THROW(set_limits(l), Error);
  EXPECT_EQ(limits().max_rank, Limits{}.max_rank);  // unchanged
}

TEST(Limits, SafetensorsHeaderTensorsRankAndElements) {
  const std::string dir = cached_fixture("limits_st", tiny());
  const std::string file = dir + "/model.safetensors";
  EXPECT_NO_THROW(SafetensorsFile{file});
  Limits l;
  l.max_header_bytes = 64;
  expect_limit_error(
      [&] {
        ScopedLimits s(l);
        SafetensorsFile f(file);
      },
      "max_header_bytes");
  l = {}, l.max_tensors = 3;
  expect_limit_error(
      [&] {
        ScopedLimits s(l);
        SafetensorsFile f(file);
      },
      "max_tensors");
  l = {}, l.max_rank = 1;  // the matrices have 2 dimensions
  expect_limit_error(
      [&] {
        ScopedLimits s(l);
        SafetensorsFile f(file);
      },
      "max_rank");
  l = {}, l.max_tensor_elements = 64 * 32 - 1;  // the embedding matrix
  expect_limit_error(
      [&] {
        ScopedLimits s(l);
        SafetensorsFile f(file);
      },
      "max_tensor_elements");
}

TEST(Limits, VocabularySizeOfAConfigAndTokenIdsOfATokenizer) {
  const std::string config = R"({"model_type": "llama", "vocab_size": 5000000, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64})";
  expect_limit_error([&] { ModelConfig::from_json_text(config, "config.json"); }, "max_vocab_size");
  Limits l;
  l.max_vocab_size = 5000000;
  {
    ScopedLimits s(l);
    EXPECT_EQ(ModelConfig::from_json_text(config, "config.json").vocab_size, 5000000);
  }
  // tokenizer.json: an added token whose id would size a 5-million-entry table.
  nlohmann::json tok = read_json(test_data("tiny_bpe/tokenizer.json"));
  tok["added_tokens"].push_back({{"id", 4999999},
                                 {"content", "<big>"},
                                 {"special", true},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false}});
  const std::string dir = temp_dir("limits_tok");
  write_file(dir + "/tokenizer.json", tok.dump());
  expect_limit_error([&] { load_tokenizer(dir); }, "max_vocab_size");
  ScopedLimits s(l);
  EXPECT_EQ(load_tokenizer(dir)->size(), 5000000);
}

TEST(Limits, RequestLengthIsBoundedEvenWithoutAPositionLimit) {
  // max_new_tokens past the limit: refused by validation (no overflow of prompt + max_new_tokens).
  GenerationConfig g;
  g.max_new_tokens = std::numeric_limits<int64_t>::max();
  expect_limit_error([&] { g.validate(); }, "max_sequence_length");
  // T5's relative positions have no max_position_embeddings: the request would size a cache of
  // prompt + max_new_tokens positions. Refused before any cache exists.
  const Generator t5(cached_model(cached_fixture("limits_t5", tiny("t5"))));
  Limits l;
  l.max_sequence_length = 100;
  ScopedLimits s(l);
  g.max_new_tokens = 98;
  EXPECT_NO_THROW(t5.generate({5, 6}, g));  // 1 start token + 98 = 99 positions
  g.max_new_tokens = 100;
  expect_limit_error([&] { t5.generate({5, 6}, g); }, "max_sequence_length");
  g.max_new_tokens = 10;
  expect_limit_error([&] { t5.generate(std::vector<int64_t>(101, 5), g); }, "max_sequence_length");
}

TEST(Limits, RotaryTablesStopAtTheSequenceLimit) {
  // A configuration claiming 2^40 positions loads (its rotary tables would need terabytes).
  FixtureOptions o = tiny();
  o.max_pos = int64_t{1} << 40;
  const std::string dir = temp_dir("limits_rope");
  make_fixture(dir, o);
  Limits l;
  l.max_sequence_length = 512;
  ScopedLimits s(l);
  const Generator g(load_model(dir));
  GenerationConfig c;
  c.max_new_tokens = 8;
  EXPECT_EQ(g.generate({3, 4}, c).tokens.size(), 8u);
  c.max_new_tokens = 511;
  expect_limit_error([&] { g.generate({3, 4}, c); }, "max_sequence_length");
}

}  // namespace specdec::test

// A NUL byte in a message (a name read from a file) shows as \0, since what() would end at it;
// the escaping is one pass over the message however many NULs it holds.
TEST(ErrorMessage, NulBytesShowEscaped) {
  EXPECT_STREQ(specdec::Error(std::string("key 'a\0b'", 9)).what(), "key 'a\\0b'");
  EXPECT_STREQ(specdec::Error("plain").what(), "plain");
  const std::string many(1 << 20, '\0');
  EXPECT_EQ(std::string(specdec::Error(many).what()).size(), 2u << 20);
}
