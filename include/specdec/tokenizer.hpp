// Tokenizers of Hugging Face checkpoints: SentencePiece (tokenizer.model, spiece.model) and
// byte-level BPE (tokenizer.json, or vocab.json + merges.txt), with the ids and text of Hugging
// Face's own tokenizer classes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace specdec {

// Settings that change ids. Unset fields come from tokenizer_config.json, else the defaults of the
// Hugging Face class the folder names (LlamaTokenizer, T5Tokenizer, GPT2Tokenizer, ...).
struct TokenizerOptions {
  std::optional<bool> legacy;            // SentencePiece: Hugging Face's `legacy` (default true)
  std::optional<bool> add_prefix_space;  // SentencePiece: default true; byte-level: default false
  std::optional<bool> add_bos_token;     // prepend BOS when add_special_tokens
  std::optional<bool> add_eos_token;     // append EOS when add_special_tokens
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text (UTF-8; invalid UTF-8 is an error) to ids. Special-token text such as "</s>" is
  // recognised either way; add_special_tokens adds BOS/EOS as the tokenizer is configured to.
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  // Ids to text. Bytes that do not form valid UTF-8 become U+FFFD. An id that names no token (a
  // model's vocabulary is often padded past its tokenizer's) is no text, as in Hugging Face's fast
  // tokenizers; a negative id is an error.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;

  // len(tokenizer): the base vocabulary plus added tokens.
  virtual int64_t size() const = 0;
  // Whether `id` names a token (ids below size() may not: a gap before an added token).
  virtual bool contains(int64_t id) const { return id >= 0 && id < size(); }
  // The token string of `id` (convert_ids_to_tokens); empty for an id that names no token.
  virtual std::string token(int64_t id) const = 0;
  // The bytes `id` stands for in a decoded text, as stored: a byte token's one byte (which decode
  // shows as U+FFFD when it is part of a character), SentencePiece's word boundary as a space, an
  // added token's text (empty for an id that names no token). OpenAI's logprobs "bytes".
  virtual std::string token_bytes(int64_t id) const = 0;
  virtual bool is_special(int64_t id) const = 0;
  virtual std::optional<int64_t> bos_token_id() const = 0;
  virtual std::optional<int64_t> eos_token_id() const = 0;
  // "sentencepiece" or "bpe".
  virtual std::string kind() const = 0;
  // Two tokenizers with the same fingerprint give the same ids and text for every input: it covers
  // the vocabulary, merges or model, added tokens and every setting that changes ids.
  virtual std::string fingerprint() const = 0;
};

// Picks the kind from the files in `dir`: tokenizer.model or spiece.model (SentencePiece), else
// tokenizer.json, else vocab.json + merges.txt, else a GGUF file's metadata (`dir` may also be the
// `.gguf` file itself; tokenizer.ggml.model "gpt2" or "llama"). Reads tokenizer_config.json (and
// special_tokens_map.json, added_tokens.json) when present. Throws specdec::Error naming the file
// on anything missing, malformed or unsupported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir,
                                          const TokenizerOptions& options = {});
// One specific file: *.model (SentencePiece) or *.json (tokenizer.json layout); settings still come
// from tokenizer_config.json beside it.
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path,
                                               const TokenizerOptions& options = {});
// True when `dir` holds tokenizer files load_tokenizer can pick from (or is, or holds, a GGUF
// file).
bool has_tokenizer(const std::string& dir);

// Throws specdec::Error unless draft and target tokenize identically (same fingerprint); the
// message says how they differ.
void require_same_tokenizer(const Tokenizer& target, const Tokenizer& draft);

// Incremental decoding for streaming: push ids as they are generated, print what comes back. The
// pieces concatenate to decode(all ids) once finish() is called, and no piece ends inside a UTF-8
// sequence: text that a later token could still change is held back (an incomplete character,
// trailing spaces, the start of a clean-up pattern such as " '"). Each push decodes only the
// tokens since the last point where everything was shown (plus one token of context), so a
// generation costs O(n) decoding in all. Should a decoder still change text already shown, the
// stream goes on after the part both versions share: nothing is lost.
class StreamDecoder {
 public:
  // Keeps a reference to `tokenizer`, which must outlive it.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(const std::vector<int64_t>& ids);
  std::string finish();
  // The text of the ids pushed so far that push() has held back (what a later token may still
  // change): what the text would go on with if generation ended now, e.g. for stop strings.
  const std::string& pending() const { return pending_; }

 private:
  std::string window_text() const;             // the text of ids_[settled_:]
  std::string emit(const std::string& ready);  // the part of `ready` not shown yet

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int64_t> ids_;
  size_t settled_ = 0;   // ids_[:settled_] are shown in full
  std::string emitted_;  // what has been shown of ids_[settled_:]
  std::string pending_;  // the rest of the window's text
};

// Trains a SentencePiece model with SentencePiece's own trainer (`args` as its command line, e.g.
// "--input=a.txt --model_prefix=/tmp/m --vocab_size=1000"). For tests and demo checkpoints.
void train_sentencepiece(const std::string& args);

}  // namespace specdec
