// Conformance of the tokenizers with Hugging Face transformers 4.47 (slow classes) on the real
// tokenizer files in ../shared/fixtures/tokenizers: ids with and without special tokens, decoded
// text, and streaming decode. Skips (with a message) when the fixtures are absent.
#include <gtest/gtest.h>

#include <algorithm>

#include "specdec/tokenizer.hpp"
#include "test_util.hpp"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

namespace specdec::test {
namespace {

struct Case {
  std::string name;    // test name
  std::string folder;  // under fixtures/tokenizers
  std::string file;    // a specific file to load, or "" for load_tokenizer(folder)
};

const Case kCases[] = {
    {"gpt2", "gpt2", ""},
    {"gpt_neox", "gpt_neox", ""},  // tokenizer.json
    {"qwen2", "qwen2", ""},        // vocab.json + merges.txt
    {"qwen2_tokenizer_json", "qwen2", "tokenizer.reconstructed.json"},
    {"llama2_legacy", "llama2_legacy", ""},
    {"llama2_nonlegacy", "llama2_nonlegacy", ""},
    {"t5_legacy", "t5_legacy", ""},
    {"t5_nonlegacy", "t5_nonlegacy", ""},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<int64_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }

class TokenizerReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (fixtures_dir().empty())
      GTEST_SKIP() << "../shared/fixtures absent: tokenizer reference tests skipped";
    const Case& c = GetParam();
    dir_ = fixtures_dir() + "/tokenizers/" + c.folder;
    ref_ = read_json(dir_ + "/reference.json");
    tok_ = c.file.empty() ? load_tokenizer(dir_) : load_tokenizer_file(dir_ + "/" + c.file);
  }
  std::string dir_;
  nlohmann::json ref_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(TokenizerReference, EncodeAndDecodeMatchHuggingFace) {
  ASSERT_EQ(ref_["cases"].size(), 48u);
  EXPECT_EQ(tok_->size(), ref_["effective"]["len"].get<int64_t>());
  const auto& eff = ref_["effective"];
  if (eff["eos_token_id"].is_number())
    EXPECT_EQ(tok_->eos_token_id(), eff["eos_token_id"].get<int64_t>());
  if (eff["bos_token_id"].is_number())
    EXPECT_EQ(tok_->bos_token_id(), eff["bos_token_id"].get<int64_t>());
  int failures = 0;
  for (const auto& c : ref_["cases"]) {
    const std::string text = c["text"];
    const auto no_special = ids_of(c["ids_no_special"]);
    EXPECT_EQ(tok_->encode(text, false), no_special) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(tok_->encode(text, true), ids_of(c["ids_default"]))
        << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(tok_->decode(no_special, false), c["decoded"].get<std::string>())
        << "ids of " << nlohmann::json(text).dump();
    if (::testing::Test::HasFailure() && ++failures > 6) break;
  }
}

// Streams ids[:k] one token at a time and checks the pieces against decode(ids[:k]) for every k.
void check_streaming(const Tokenizer& tok, const std::vector<int64_t>& ids, bool skip_special,
                     const std::string& what) {
  for (size_t k = 0; k <= ids.size(); ++k) {
    StreamDecoder stream(tok, skip_special);
    std::string text;
    for (size_t i = 0; i < k; ++i) {
      const std::string piece = stream.push({ids[i]});
      ASSERT_NO_THROW(tok::require_utf8(piece)) << what;  // never a broken UTF-8 sequence
      text += piece;
    }
    text += stream.finish();
    const std::vector<int64_t> prefix(ids.begin(), ids.begin() + k);
    ASSERT_EQ(text, tok.decode(prefix, skip_special)) << what << " prefix " << k;
  }
}

TEST_P(TokenizerReference, StreamingDecodeEqualsFullDecodeForEveryPrefix) {
  for (const auto& c : ref_["cases"]) {
    const auto ids = ids_of(c["ids_default"]);
    check_streaming(*tok_, ids, true, nlohmann::json(c["text"]).dump());
    // Keeping special tokens, the SentencePiece classes' decode is not prefix-stable: a special
    // token inserts a space before the text that precedes it ("<s>Hello" + "</s>" decodes to
    // "<s> Hello</s>"), which no stream can take back. Byte-level decode is prefix-stable.
    if (tok_->kind() == "bpe") check_streaming(*tok_, ids, false, nlohmann::json(c["text"]).dump());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerReference, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// Tokenizer::token_bytes over Hugging Face's ids of each text put the text back together: exactly
// for byte-level BPE (lossless, after its normalizer), and for Llama 2's SentencePiece (byte
// fallback: an emoji is four byte pieces) up to its word boundaries (spaces dropped on both sides,
// a literal U+2581 too).
TEST(TokenizerReferenceBytes, TokenBytesJoinToTheText) {
  if (fixtures_dir().empty()) GTEST_SKIP() << "../shared/fixtures absent";
  const auto strip = [](std::string s) {
    s = replace_all(std::move(s), "\xE2\x96\x81", " ");
    s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
    return s;
  };
  for (const std::string folder :
       {"gpt2", "gpt_neox", "qwen2", "llama2_legacy", "llama2_nonlegacy"}) {
    const std::string dir = fixtures_dir() + "/tokenizers/" + folder;
    const auto tok = load_tokenizer(dir);
    const nlohmann::json ref = read_json(dir + "/reference.json");
    int partial = 0;
    for (const auto& c : ref["cases"]) {
      const std::string text = c["text"];
      std::string joined;
      for (int64_t id : ids_of(c["ids_no_special"])) {
        const std::string b = tok->token_bytes(id);
        partial += tok::utf8_lossy(b) != b;  // not whole characters
        joined += b;
      }
      if (tok->kind() == "bpe")  // (GPT-NeoX's tokenizer.json normalizes the text to NFC first)
        EXPECT_TRUE(joined == text || joined == tok::normalize_unicode(text, "NFC"))
            << folder << ": " << joined << " for " << text;
      else
        EXPECT_EQ(strip(joined), strip(text)) << folder;
    }
    EXPECT_GT(partial, 0) << folder << ": no token stood for part of a character";
  }
}

}  // namespace
}  // namespace specdec::test
