// Tokenizers without ../shared: the tiny hand-made BPE in tests/data, SentencePiece models trained
// here with SentencePiece's own trainer, streaming, compatibility checks and bad files.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tokenizers/tokenizer_base.hpp"

namespace specdec::test {
namespace {

const std::string kTinyBpe = test_data("tiny_bpe");

std::string tokens_of(const Tokenizer& t, const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += "[" + t.token(id) + "]";
  return s;
}

TEST(TinyBpe, IdsFollowTheMergesInBothLayouts) {
  for (const std::string& file : {std::string(""), std::string("tokenizer.json")}) {
    SCOPED_TRACE(file.empty() ? "vocab.json + merges.txt" : file);
    auto t = file.empty() ? load_tokenizer_file(kTinyBpe + "/vocab.json") : nullptr;
    if (file.empty()) {
      // load_tokenizer picks tokenizer.json; the GPT-2 layout is loaded from a copy without it.
      const std::string dir = temp_dir("tiny_bpe_vocab");
      for (const char* f :
           {"vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json"})
        write_file(dir + "/" + f, read_file(kTinyBpe + "/" + f));
      t = load_tokenizer(dir);
    } else {
      t = load_tokenizer(kTinyBpe);
    }
    EXPECT_EQ(t->kind(), "bpe");
    EXPECT_EQ(t->size(), 264);
    EXPECT_EQ(t->eos_token_id(), 263);
    // "Hello": l l -> ll, e ll -> ell, H ell -> Hell, Hell o -> Hello; " the": Ġ t, h e, Ġt he.
    EXPECT_EQ(t->encode("Hello the", false), (std::vector<int64_t>{262, 258}));
    // "hello": h e -> he, l l -> ll, then no merge of he+ll; special-token text is recognised.
    EXPECT_EQ(t->encode("hello<|endoftext|>", false), (std::vector<int64_t>{257, 259, 'o', 263}));
    EXPECT_EQ(t->encode("\xC3\xA9", false), (std::vector<int64_t>{0xC3, 0xA9}));  // é as two bytes
    EXPECT_EQ(t->decode({262, 258, 263}, false), "Hello the<|endoftext|>");
    EXPECT_EQ(t->decode({262, 258, 263}, true), "Hello the");
    EXPECT_EQ(t->token(258), "\xC4\xA0the");              // Ġthe
    EXPECT_EQ(t->decode({0xC3}, false), "\xEF\xBF\xBD");  // a lone lead byte is U+FFFD
    EXPECT_EQ(t->decode({264}, false), "");  // past the tokenizer: no text (IdsPastTheTokenizer...)
    EXPECT_THROW(t->encode("bad \xC3", false), Error);
  }
}

TEST(TinyBpe, SymbolsOutsideTheVocabularyAsHuggingFaceTreatsThem) {
  // The tiny tokenizer.json without the bytes x, y and z; ids from Hugging Face's tokenizers
  // (Tokenizer.from_str on the same JSON): dropped without unk_token, each unk_token, or a run of
  // them one unk_token with fuse_unk.
  nlohmann::json j = nlohmann::json::parse(read_file(kTinyBpe + "/tokenizer.json"));
  for (const char* c : {"x", "y", "z"}) j["model"]["vocab"].erase(c);
  const std::string dir = temp_dir("tiny_bpe_unk");
  write_file(dir + "/tokenizer_config.json", read_file(kTinyBpe + "/tokenizer_config.json"));
  const std::pair<nlohmann::json, std::vector<int64_t>> cases[] = {
      {{{"unk_token", nullptr}, {"fuse_unk", false}}, {97, 98, 32, 258}},
      {{{"unk_token", "!"}, {"fuse_unk", false}}, {97, 33, 33, 33, 98, 32, 33, 33, 258}},
      {{{"unk_token", "!"}, {"fuse_unk", true}}, {97, 33, 98, 32, 33, 258}}};
  for (const auto& [model, ids] : cases) {
    SCOPED_TRACE(model.dump());
    j["model"].update(model);
    write_file(dir + "/tokenizer.json", j.dump());
    EXPECT_EQ(load_tokenizer(dir)->encode("axyzb zz the", false), ids);
  }
}

TEST(TinyBpe, NormalizerOfTokenizerJsonAppliesNfc) {
  const std::string decomposed = "e\xCC\x81";  // e + U+0301
  // tokenizer.json says NFC: the same ids as precomposed é.
  EXPECT_EQ(load_tokenizer(kTinyBpe)->encode(decomposed, false),
            (std::vector<int64_t>{0xC3, 0xA9}));
  // GPT2Tokenizer does not normalize.
  EXPECT_EQ(load_tokenizer_file(kTinyBpe + "/vocab.json")->encode(decomposed, false),
            (std::vector<int64_t>{'e', 0xCC, 0x81}));
}

TEST(TinyBpe, StreamingHoldsBackIncompleteUtf8) {
  auto t = load_tokenizer(kTinyBpe);
  StreamDecoder s(*t);
  EXPECT_EQ(s.push({262}), "Hello");
  EXPECT_EQ(s.pending(), "");
  EXPECT_EQ(s.push({' '}), "");   // trailing whitespace waits for what follows
  EXPECT_EQ(s.pending(), " ");    // (what is held back, e.g. for a stop string to match)
  EXPECT_EQ(s.push({0xC3}), "");  // first byte of é
  EXPECT_EQ(s.push({0xA9}), " \xC3\xA9");
  EXPECT_EQ(s.pending(), "");
  EXPECT_EQ(s.push({0xE2, 0x82}), "");  // two bytes of €
  EXPECT_EQ(s.pending(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");  // the stream ended inside a character
  EXPECT_EQ(s.pending(), "");
  // A line break is final (no later token changes it): a client printing lines sees it at once.
  StreamDecoder lines(*t);
  EXPECT_EQ(lines.push({262, '\n'}), "Hello\n");
  EXPECT_EQ(lines.push({'\n'}), "\n");
  EXPECT_EQ(lines.push({262, ' '}), "Hello");
}

// A model's vocabulary is often padded past its tokenizer's (Qwen2.5: 151936 rows, 151665
// tokens): an id that names no token decodes to no text, as in Hugging Face's fast tokenizers,
// instead of ending a generation with an error. A negative id stays an error.
TEST(TinyBpe, IdsPastTheTokenizerAreNoText) {
  auto t = load_tokenizer(kTinyBpe);
  const int64_t past = t->size() + 5;
  EXPECT_EQ(t->decode({262, past, 262}, false), t->decode({262, 262}, false));
  EXPECT_EQ(t->token(past), "");
  EXPECT_EQ(t->token_bytes(past), "");
  StreamDecoder s(*t);
  EXPECT_EQ(s.push({262, past}) + s.finish(), "Hello");
  EXPECT_THROW(t->decode({-1}, false), Error);
  EXPECT_TRUE(t->contains(262));
  EXPECT_FALSE(t->contains(past));
  EXPECT_FALSE(t->contains(-1));
}

// tokenizer_config.json's errors name the file in its folder (not "tokenizer_config.json" alone,
// not a C++ function's name).
TEST(TinyBpe, TokenizerConfigErrorsNameTheFile) {
  const std::string dir = temp_dir("tiny_bpe_bad_config");
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer.json"})
    write_file(dir + "/" + f, read_file(kTinyBpe + "/" + f));
  for (const auto& [config, needle] :
       {std::pair<std::string, std::string>{R"({"bos_token": 5})", "'bos_token' must be a string"},
        {R"({"added_tokens_decoder": {"abc": {"content": "x"}}})",
         "added_tokens_decoder key 'abc' is not a token id"}}) {
    write_file(dir + "/tokenizer_config.json", config);
    try {
      load_tokenizer(dir);
      ADD_FAILURE() << "loaded with " << config;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/tokenizer_config.json: "), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("stoll"), std::string::npos) << e.what();
    }
  }
  // A value from special_tokens_map.json names that file.
  write_file(dir + "/tokenizer_config.json", "{}");
  write_file(dir + "/special_tokens_map.json", R"({"eos_token": 5})");
  try {
    load_tokenizer(dir);
    ADD_FAILURE() << "loaded with a bad special_tokens_map.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/special_tokens_map.json: 'eos_token'"),
              std::string::npos)
        << e.what();
  }
}

TEST(TinyBpe, BadFilesGiveClearErrors) {
  const std::string dir = temp_dir("bad_tokenizers");
  const auto expect_error = [&](const std::string& json_text, const std::string& needle) {
    write_file(dir + "/tokenizer.json", json_text);
    try {
      load_tokenizer(dir);
      ADD_FAILURE() << "no error for " << json_text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{\"version\": \"1.0\"}", "no 'model' section");
  expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
               "unsupported model type 'Unigram'");
  expect_error(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"pre_tokenizer\": {\"type\": \"Metaspace\"}}",
      "unsupported pre-tokenizer 'Metaspace'");
  expect_error(
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
      "\"decoder\": {\"type\": \"ByteLevel\"}}",
      "no ByteLevel");
  expect_error("{\"model\": ", "not valid JSON");
  EXPECT_THROW(load_tokenizer(temp_dir("no_tokenizer")), Error);
}

// ---- SentencePiece, trained here ----

// A corpus with enough distinct words for a few hundred pieces.
std::string corpus() {
  const char* words[] = {"the",     "quick",   "brown",       "fox",      "jumps",  "over",
                         "lazy",    "dog",     "draft",       "target",   "model",  "token",
                         "accepts", "rejects", "speculative", "decoding", "fast",   "slow",
                         "world",   "hello",   "café",        "naïve",    "Привет", "мир"};
  std::string text;
  uint64_t x = 12345;
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 12; ++w) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += std::string(w ? " " : "") + words[(x >> 33) % (sizeof words / sizeof *words)];
    }
    text += ".\n";
  }
  return text;
}

// Trains (once per process) a model and returns the folder holding it as tokenizer.model.
std::string trained_sentencepiece(int vocab_size, const std::string& config_json) {
  const std::string dir = temp_dir("spm_" + std::to_string(vocab_size));
  write_file(dir + "/corpus.txt", corpus());
  train_sentencepiece("--input=" + dir + "/corpus.txt --model_prefix=" + dir +
                      "/tokenizer --vocab_size=" + std::to_string(vocab_size) +
                      " --model_type=bpe --byte_fallback=true --character_coverage=1.0");
  if (!config_json.empty()) write_file(dir + "/tokenizer_config.json", config_json);
  return dir;
}

TEST(SentencePiece, TrainedModelRoundTripsInTheSameProcessAsLibtorch) {
  // libtorch first, then SentencePiece through the shim, then libtorch again: no protobuf clash.
  const at::Tensor before = at::ones({2, 2}).sum();
  const std::string dir = trained_sentencepiece(300, "");
  auto t = load_tokenizer(dir);
  EXPECT_EQ(t->kind(), "sentencepiece");
  EXPECT_EQ(t->size(), 300);
  EXPECT_EQ(t->bos_token_id(), 1);
  EXPECT_EQ(t->eos_token_id(), 2);
  for (const std::string text :
       {"the quick brown fox", "hello world. café Привет", "unseen: Zebra 42 ✓"}) {
    const auto ids = t->encode(text, false);
    EXPECT_EQ(t->decode(ids, false), text);
    const auto with_bos = t->encode(text, true);
    ASSERT_EQ(with_bos.size(), ids.size() + 1);
    EXPECT_EQ(with_bos.front(), 1);  // LlamaTokenizer adds BOS by default
    // Streaming gives the full text, token by token.
    StreamDecoder s(*t, true);
    std::string streamed;
    for (int64_t id : with_bos) streamed += s.push({id});
    EXPECT_EQ(streamed + s.finish(), text);
  }
  EXPECT_EQ((before + at::ones({})).item<float>(), 5.0f);
}

TEST(SentencePiece, LegacyDecidesThePrefixSpaceAfterSpecialTokens) {
  const std::string dir = trained_sentencepiece(300, "");
  auto legacy = load_tokenizer(dir);
  TokenizerOptions o;
  o.legacy = false;
  auto modern = load_tokenizer(dir, o);
  // Legacy: the text after a special token gets SentencePiece's dummy prefix ("▁world").
  const auto a = legacy->encode("hello</s>world", false);
  const auto b = modern->encode("hello</s>world", false);
  const auto after_eos = [](const Tokenizer& t, const std::vector<int64_t>& ids) {
    for (size_t i = 0; i + 1 < ids.size(); ++i)
      if (ids[i] == 2) return t.token(ids[i + 1]);
    return std::string();
  };
  EXPECT_EQ(after_eos(*legacy, a).rfind("\xE2\x96\x81", 0), 0u) << tokens_of(*legacy, a);
  EXPECT_NE(after_eos(*modern, b).rfind("\xE2\x96\x81", 0), 0u) << tokens_of(*modern, b);
  // The setting also comes from tokenizer_config.json.
  write_file(dir + "/tokenizer_config.json", "{\"legacy\": false}");
  EXPECT_EQ(load_tokenizer(dir)->encode("hello</s>world", false), b);
  write_file(dir + "/tokenizer_config.json", "{}");
  // Different settings, different fingerprints: not interchangeable as draft and target.
  EXPECT_THROW(require_same_tokenizer(*legacy, *modern), Error);
  EXPECT_NO_THROW(require_same_tokenizer(*legacy, *load_tokenizer(dir)));
}

TEST(SentencePiece, DifferentVocabulariesAreRefused) {
  auto a = load_tokenizer(trained_sentencepiece(300, ""));
  auto b = load_tokenizer(trained_sentencepiece(320, ""));
  try {
    require_same_tokenizer(*a, *b);
    FAIL() << "tokenizers of different sizes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("300 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(require_same_tokenizer(*a, *load_tokenizer(kTinyBpe)), Error);
}

TEST(SentencePiece, TruncatedModelIsAClearError) {
  const std::string src = trained_sentencepiece(300, "");
  const std::string dir = temp_dir("spm_truncated");
  const std::string bytes = read_file(src + "/tokenizer.model");
  write_file(dir + "/tokenizer.model", bytes.substr(0, bytes.size() / 3));
  try {
    load_tokenizer(dir);
    FAIL() << "truncated model loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a SentencePiece model"), std::string::npos)
        << e.what();
  }
  write_file(dir + "/tokenizer.model", "");
  EXPECT_THROW(load_tokenizer(dir), Error);
}

// A tokenizer_config.json value of the wrong JSON type, or a T5 sentinel count that would add
// billions of tokens, is an error naming the file (not nlohmann's exception, not an allocation).
TEST(SentencePiece, BadTokenizerConfigValuesAreClearErrors) {
  const std::string dir = trained_sentencepiece(300, "");
  const std::string t5 = temp_dir("spm_bad_config");
  write_file(t5 + "/spiece.model", read_file(dir + "/tokenizer.model"));
  for (const std::string config : {R"({"tokenizer_class": "T5Tokenizer", "extra_ids": 4000000000})",
                                   R"({"tokenizer_class": "T5Tokenizer", "extra_ids": "100"})",
                                   R"({"tokenizer_class": "T5Tokenizer", "extra_ids": -1})",
                                   R"({"additional_special_tokens": [{"content": 5}]})"}) {
    write_file(t5 + "/tokenizer_config.json", config);
    try {
      load_tokenizer(t5);
      FAIL() << "loaded with " << config;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("spiece.model"), std::string::npos) << e.what();
    }
  }
  write_file(t5 + "/tokenizer_config.json",
             R"({"tokenizer_class": "T5Tokenizer", "extra_ids": 3})");
  EXPECT_EQ(load_tokenizer(t5)->size(), 303);
}

// Found by tests/fuzz/fuzz_sentencepiece.cpp: SentencePiece's darts_clone throws a C++ exception
// ("zero-length key") from inside the shim's C interface, which terminated the process.
TEST(SentencePiece, ModelThatMakesSentencePieceThrowIsAClearError) {
  const std::string dir = temp_dir("spm_darts");
  write_file(
      dir + "/tokenizer.model",
      read_file(test_data("../fuzz/corpus/sentencepiece/finding-darts-zero-length-key.model")));
  try {
    load_tokenizer(dir);
    FAIL() << "model loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SentencePiece failed"), std::string::npos) << e.what();
  }
}

// A precompiled charsmap, as SentencePiece stores one: <trie bytes: uint32 LE><darts-clone double
// array><NUL-separated replacements>. This one is written by hand: 256 units, one rule "x" ->
// "the". Units: bits 0-7 label, bit 8 has-leaf, bits 10-30 offset; a leaf unit has bit 31 and
// holds the rule's value (an offset into the replacements). The root (unit 0) has offset 1, so
// byte c from the root reads unit 1 ^ c; 'x' reads unit 121, whose offset leads to state
// 121 ^ 123 = 2, where the leaf (unit 2 ^ 0) says "replacement at offset `value`". Unit 1 is the
// root state's own slot: its label (255) must not match byte 0.
std::string charsmap_x_to_the(uint32_t value = 0, bool self_loop = false,
                              uint32_t trie_bytes = 1024) {
  std::vector<uint32_t> unit(256, 0);
  unit[0] = 1u << 10;
  unit[1] = self_loop ? 0u : 0xFFu;  // label 0 at the root's slot: byte 0 loops back to the root
  unit[1 ^ 'x'] = (123u << 10) | (1u << 8) | 'x';
  unit[2] = (1u << 31) | value;
  std::string blob(4, '\0');
  std::memcpy(&blob[0], &trie_bytes, 4);
  blob.append(reinterpret_cast<const char*>(unit.data()), 1024);
  return blob + std::string("the\0", 4);
}

void append_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}

// The model with a NormalizerSpec appended as field `spec` (3: normalizer_spec, 5:
// denormalizer_spec) holding `charsmap`: protobuf merges it into the model's own spec.
std::string with_charsmap(const std::string& model, int spec, const std::string& charsmap) {
  std::string inner(1, static_cast<char>((2 << 3) | 2));  // precompiled_charsmap
  append_varint(inner, charsmap.size());
  inner += charsmap;
  std::string out = model;
  out.push_back(static_cast<char>((spec << 3) | 2));
  append_varint(out, inner.size());
  return out + inner;
}

// SentencePiece walks a precompiled charsmap's double array unchecked; the shim checks it first
// (found by tests/fuzz/fuzz_sentencepiece.cpp: an empty array read out of bounds in decode), and
// refuses a model it cannot walk to the end (found by it too: protobuf skips a group and reads a
// denormalizer behind it that the check never saw).
TEST(SentencePiece, MalformedCharsmapsAreClearErrorsAndAWellFormedOneIsUsed) {
  const std::string plain = trained_sentencepiece(300, "");
  const std::string model = read_file(plain + "/tokenizer.model");
  const std::string dir = temp_dir("spm_charsmap");
  // The hand-written trie is read as SentencePiece reads it: "x" is normalized to "the".
  write_file(dir + "/tokenizer.model", with_charsmap(model, 3, charsmap_x_to_the()));
  auto t = load_tokenizer(dir);
  EXPECT_EQ(t->encode("x", false), t->encode("the", false));
  EXPECT_NE(load_tokenizer(plain)->encode("x", false), t->encode("the", false));

  const auto finding = [](const std::string& name) {
    return read_file(test_data("../fuzz/corpus/sentencepiece/") + name);
  };
  const std::string charsmap = "precompiled charsmap is malformed",
                    protobuf = "malformed or truncated protobuf";
  struct Bad {
    std::string what, bytes, error;
  };
  const std::vector<Bad> bad = {
      {"the fuzzer's finding: an empty array in the denormalizer",
       finding("finding-charsmap-empty-trie.model"), charsmap},
      {"a value past the replacements", with_charsmap(model, 3, charsmap_x_to_the(4)), charsmap},
      {"a cycle", with_charsmap(model, 5, charsmap_x_to_the(0, true)), charsmap},
      {"an empty array", with_charsmap(model, 5, charsmap_x_to_the(0, false, 0)), charsmap},
      {"an array past the blob's end",
       with_charsmap(model, 3, charsmap_x_to_the(0, false, 1024 + 5)), charsmap},
      // Protobuf skips a group (start 6, end 6) and reads on to the denormalizer behind it.
      {"an empty array behind a group",
       with_charsmap(model + "\x33\x34", 5, charsmap_x_to_the(0, false, 0)), protobuf},
      {"the fuzzer's finding: a group among the pieces, then the denormalizer",
       finding("finding-group-hides-denormalizer.model"), protobuf},
  };
  for (const auto& [what, bytes, error] : bad) {
    write_file(dir + "/tokenizer.model", bytes);
    try {
      load_tokenizer(dir);
      ADD_FAILURE() << what << ": loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(error), std::string::npos) << what << ": " << e.what();
    }
  }
}

namespace {
// Forwards to a tokenizer and counts the ids it is asked to decode.
class CountingTokenizer final : public Tokenizer {
 public:
  explicit CountingTokenizer(const Tokenizer& t) : t_(t) {}
  std::vector<int64_t> encode(const std::string& s, bool special) const override {
    return t_.encode(s, special);
  }
  std::string decode(const std::vector<int64_t>& ids, bool skip) const override {
    decoded += static_cast<int64_t>(ids.size());
    return t_.decode(ids, skip);
  }
  int64_t size() const override { return t_.size(); }
  std::string token(int64_t id) const override { return t_.token(id); }
  std::string token_bytes(int64_t id) const override { return t_.token_bytes(id); }
  bool is_special(int64_t id) const override { return t_.is_special(id); }
  std::optional<int64_t> bos_token_id() const override { return t_.bos_token_id(); }
  std::optional<int64_t> eos_token_id() const override { return t_.eos_token_id(); }
  std::string kind() const override { return t_.kind(); }
  std::string fingerprint() const override { return t_.fingerprint(); }
  mutable int64_t decoded = 0;

 private:
  const Tokenizer& t_;
};
}  // namespace

TEST(StreamDecoder, CleanUpSpacesLoseNothing) {
  // clean_up_tokenization_spaces turns "a ' b" into "a'b": text shown after "a '" would be changed
  // by " b". The stream holds " '" back and ends with exactly the full decode.
  const std::string dir = temp_dir("cleanup_bpe");
  for (const char* f : {"vocab.json", "merges.txt"})
    write_file(dir + "/" + f, read_file(kTinyBpe + "/" + f));
  write_file(dir + "/tokenizer_config.json", R"({"clean_up_tokenization_spaces": true})");
  const auto t = load_tokenizer(dir);
  for (const std::string text : {"a ' b", "a ' b . c ,d", "don 't , isn 't"}) {
    const auto ids = t->encode(text, false);
    StreamDecoder s(*t);
    std::string streamed;
    for (int64_t id : ids) streamed += s.push({id});
    streamed += s.finish();
    EXPECT_EQ(streamed, t->decode(ids, false)) << text;
  }
  EXPECT_EQ(t->decode(t->encode("a ' b", false), false), "a'b");
}

TEST(StreamDecoder, DecodingWorkIsLinearInTheLength) {
  const auto t = load_tokenizer(kTinyBpe);
  const CountingTokenizer counting(*t);
  std::vector<int64_t> ids;
  for (int i = 0; i < 300; ++i) {
    const auto w = t->encode(i % 7 ? " Hello" : " é\n", false);
    ids.insert(ids.end(), w.begin(), w.end());
  }
  StreamDecoder s(counting);
  std::string streamed;
  for (int64_t id : ids) streamed += s.push({id});
  streamed += s.finish();
  EXPECT_EQ(streamed, t->decode(ids, false));
  // Re-decoding everything on each push would cost n (n + 1) / 2 ids; the windows cost a few per
  // push.
  EXPECT_LT(counting.decoded, 12 * static_cast<int64_t>(ids.size())) << ids.size() << " ids";
}

TEST(TinyBpe, OneLongWordTokenizesCompletelyAndRoundTrips) {
  // 200 000 letters without a space: one pre-tokenizer piece, merged with the heap (the textbook
  // loop would rescan it per merge). Timings are in benchmarks (Bpe*), not asserted here.
  const auto t = load_tokenizer(kTinyBpe);
  std::string word;
  for (int i = 0; i < 200000; ++i) word += "Hello"[i % 5];
  const auto ids = t->encode(word, false);
  EXPECT_EQ(t->decode(ids, false), word);
  EXPECT_LT(ids.size(), word.size());  // merges happened
  // The same ids as the concatenation of the ids of its 5-letter blocks (each "Hello" is one
  // token in this vocabulary, and no merge crosses "o" + "H").
  const auto block = t->encode("Hello", false);
  ASSERT_EQ(block.size(), 1u);
  EXPECT_EQ(ids, std::vector<int64_t>(word.size() / 5, block[0]));
}

}  // namespace
}  // namespace specdec::test
