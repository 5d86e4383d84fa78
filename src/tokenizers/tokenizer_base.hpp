// Shared machinery of the tokenizers: added-token splitting, Hugging Face's decode assembly,
// UTF-8 helpers. Private to the library.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/tokenizer.hpp"

namespace specdec {
class GgufFile;
}

namespace specdec::tok {

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
};

// A piece of input text: plain text to tokenize, or an added token found in it.
struct Segment {
  std::string text;
  int64_t added_id = -1;
};

// Throws specdec::Error when `text` is not valid UTF-8.
void require_utf8(const std::string& text);
// Bytes to text; each maximal invalid subsequence becomes U+FFFD (Python's errors="replace").
std::string utf8_lossy(const std::string& bytes);
void append_utf8(std::string& out, uint32_t cp);
// The code point at s[i], advancing i past it; an invalid sequence reads as U+FFFD and i moves
// past its maximal valid prefix.
uint32_t next_code_point(const std::string& s, size_t& i);
bool starts_with(const std::string& s, const std::string& prefix);
bool ends_with(const std::string& s, const std::string& suffix);
// Unicode normalization through ICU: form is "NFC", "NFD", "NFKC" or "NFKD".
std::string normalize_unicode(const std::string& text, const std::string& form);
// Python's str.lstrip() / str.rstrip() (Unicode whitespace).
std::string lstrip_ws(const std::string& s);
std::string rstrip_ws(const std::string& s);
// Hugging Face's clean_up_tokenization.
std::string clean_up_tokenization(std::string s);

// tokenizer_config.json (and special_tokens_map.json, added_tokens.json) of a folder, merged.
struct TokenizerConfig {
  nlohmann::json json = nlohmann::json::object();
  std::string tokenizer_class;
  std::string source = "tokenizer_config.json";  // its path, for messages
  std::map<std::string, std::string> origin;     // the file each key came from, when not `source`
  const std::string& where(const std::string& key) const;  // the file `key` came from
  std::optional<bool> get_bool(const char* key) const;
  // The text of a named special token ("bos_token", ...), which may be a string or {"content":
  // ...}.
  std::optional<std::string> token_text(const char* key) const;
  // added_tokens_decoder entries.
  std::vector<AddedToken> added_tokens() const;
  std::vector<std::string> additional_special_tokens() const;
};
TokenizerConfig read_tokenizer_config(const std::string& dir);

// Hugging Face's slow tokenizer flow, shared by the SentencePiece and byte-level tokenizers.
class TokenizerBase : public Tokenizer {
 public:
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;
  int64_t size() const override { return size_; }
  bool contains(int64_t id) const override { return id >= 0 && !unknown(id); }
  std::string token(int64_t id) const override;
  std::string token_bytes(int64_t id) const override;
  bool is_special(int64_t id) const override { return special_ids_.count(id) > 0; }
  std::optional<int64_t> bos_token_id() const override { return bos_; }
  std::optional<int64_t> eos_token_id() const override { return eos_; }
  std::string fingerprint() const override;

 protected:
  // Text to ids without BOS/EOS (PreTrainedTokenizer.tokenize): by default, split on added tokens
  // and tokenize the plain text between them.
  virtual void tokenize(const std::string& text, std::vector<int64_t>& out) const;
  void split_and_tokenize(const std::string& text, std::vector<int64_t>& out) const;
  virtual void tokenize_segment(const std::string& text, std::vector<int64_t>& out) const = 0;
  // convert_tokens_to_string for a run of ids with no "legacy added" token in it.
  virtual std::string tokens_to_string(const std::vector<int64_t>& ids) const = 0;
  // The token string of an id of the base vocabulary, and the bytes it stands for.
  virtual std::string base_token(int64_t id) const = 0;
  virtual std::string base_token_bytes(int64_t id) const = 0;
  // build_inputs_with_special_tokens.
  virtual std::vector<int64_t> add_special(std::vector<int64_t> ids) const;
  // Everything besides the added tokens and flags that decides the ids (for fingerprint()).
  virtual std::string model_fingerprint() const = 0;

  // Registers an added token (replacing one with the same id), and the set of specials.
  void add_token(const AddedToken& t);
  const AddedToken* added(int64_t id) const;
  std::optional<int64_t> find_added(const std::string& content) const;
  // Whether `id` (>= 0, else an Error) names no token: past size(), or a gap before an added token.
  bool unknown(int64_t id) const;
  // Resolves bos/eos/unk/pad and additional special tokens named in the config.
  void apply_config(const TokenizerConfig& cfg);
  std::vector<Segment> split_added(const std::string& text) const;

  std::string source_;  // the file, for error messages
  int64_t base_size_ = 0, size_ = 0;
  std::map<int64_t, AddedToken> added_;
  std::vector<int64_t> added_by_first_byte_[256];  // ids of added_ (sorted) by content's first byte
  std::set<int64_t> special_ids_;
  std::set<int64_t> additional_special_;
  std::optional<int64_t> bos_, eos_, unk_, pad_;
  bool add_bos_ = false, add_eos_ = false;
  bool spaces_between_special_ = true;
  bool clean_up_spaces_ = false;
};

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path,
                                              const TokenizerConfig& cfg,
                                              const TokenizerOptions& options);
std::unique_ptr<Tokenizer> load_bpe_json(const std::string& json_path, const TokenizerConfig& cfg,
                                         const TokenizerOptions& options);
// tokenizer.ggml.model "llama": a SentencePiece model rebuilt from a GGUF file's metadata.
std::unique_ptr<Tokenizer> load_sentencepiece_gguf(const GgufFile& file,
                                                   const TokenizerOptions& options);
// tokenizer.ggml.model "gpt2": byte-level BPE from a GGUF file's metadata.
std::unique_ptr<Tokenizer> load_bpe_gguf(const GgufFile& file, const TokenizerOptions& options);
std::unique_ptr<Tokenizer> load_bpe_vocab_merges(const std::string& dir, const TokenizerConfig& cfg,
                                                 const TokenizerOptions& options);

// 64-bit FNV-1a of `data`, continuing from the state `h` (the basis when omitted); as hex: for
// fingerprints.
uint64_t fnv1a(std::string_view data, uint64_t h = 1469598103934665603ull);
std::string fnv1a_hex(std::string_view data);

}  // namespace specdec::tok
