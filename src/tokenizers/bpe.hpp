// Byte-level BPE's classes, shared by its encoder (bpe.cpp) and loaders (bpe_load.cpp). Private.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/error.hpp"
#include "tokenizers/tokenizer_base.hpp"

namespace specdec::tok {

// A pre-tokenizer regex (or, `literal`, a plain string), on PCRE2 with Unicode classes; `where`
// names the file in a compile error.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty, non-overlapping matches, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& s) const;

 private:
  pcre2_code* code_ = nullptr;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreStep {
  bool byte_level = false;
  bool add_prefix_space = false;  // ByteLevel, per piece (fast tokenizers)
  std::shared_ptr<Regex> regex;   // Split, or ByteLevel's own when use_regex
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  std::string description;  // for the fingerprint
};

// A token id from JSON: an integer in [0, Limits::max_vocab_size) (a float would be converted with
// undefined behaviour; a huge id would size the id table).
int64_t json_id(const nlohmann::json& v, const std::string& where);

// A vocabulary's token texts and ids, compact: every text in one pool, an open-addressing index
// text -> id, and each id's span in the pool. A 49k-token vocabulary takes about 2 MB where
// node-based maps of std::string took about 5 MB (issue 13's peak memory beside the weights).
class VocabIndex {
 public:
  // Registers `text` as token `id`: a text given twice maps to its later id, an id given twice
  // names its later text.
  void add(std::string_view text, int64_t id, const std::string& where) {
    SPECDEC_CHECK(pool_.size() + text.size() <= UINT32_MAX && id <= INT32_MAX, where,
                  ": the vocabulary exceeds 4 GB of text or 2^31 ids");
    if (2 * (entries_.size() + 1) > slots_.size())
      rehash(std::max<size_t>(1024, 2 * slots_.size()));
    size_t slot = probe(text);
    if (slots_[slot] < 0) {
      slots_[slot] = static_cast<int32_t>(entries_.size());
      entries_.push_back(
          {static_cast<uint32_t>(pool_.size()), static_cast<uint32_t>(text.size()), -1});
      pool_.append(text);
    }
    Entry& e = entries_[static_cast<size_t>(slots_[slot])];
    e.id = static_cast<int32_t>(id);
    if (static_cast<int64_t>(spans_.size()) <= id)
      spans_.resize(static_cast<size_t>(id) + 1, {0, 0});
    spans_[static_cast<size_t>(id)] = {e.begin, e.size};
  }
  // The id of `text`, or -1.
  int32_t find(std::string_view text) const {
    if (slots_.empty()) return -1;
    const int32_t e = slots_[probe(text)];
    return e < 0 ? -1 : entries_[static_cast<size_t>(e)].id;
  }
  // The text of `id` (empty when no token has it).
  std::string_view text(int64_t id) const {
    if (id < 0 || id >= static_cast<int64_t>(spans_.size())) return {};
    const auto [begin, size] = spans_[static_cast<size_t>(id)];
    return view(begin, size);
  }
  int64_t ids() const { return static_cast<int64_t>(spans_.size()); }

 private:
  struct Entry {
    uint32_t begin, size;
    int32_t id;
  };
  std::string_view view(uint32_t begin, uint32_t size) const {
    return {pool_.data() + begin, size};
  }
  // The slot holding `text`, or the empty slot where it would go.
  size_t probe(std::string_view text) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = std::hash<std::string_view>{}(text)&mask;; i = (i + 1) & mask) {
      const int32_t e = slots_[i];
      if (e < 0) return i;
      const Entry& x = entries_[static_cast<size_t>(e)];
      if (view(x.begin, x.size) == text) return i;
    }
  }
  void rehash(size_t n) {
    slots_.assign(n, -1);
    const size_t mask = n - 1;
    for (size_t k = 0; k < entries_.size(); ++k) {
      const Entry& x = entries_[k];
      size_t i = std::hash<std::string_view>{}(view(x.begin, x.size)) & mask;
      while (slots_[i] >= 0) i = (i + 1) & mask;
      slots_[i] = static_cast<int32_t>(k);
    }
  }

  std::string pool_;
  std::vector<Entry> entries_;
  std::vector<std::pair<uint32_t, uint32_t>> spans_;  // by id: (begin, size) in pool_
  std::vector<int32_t> slots_;  // index into entries_, -1 empty; a power of two
};

// Merge ranks keyed by the ids of the two parts: open addressing over (left << 32 | right).
class PairRanks {
 public:
  // A pair given twice keeps its first rank (real merges lists have no duplicates).
  void add(int32_t a, int32_t b, int rank) {
    if (2 * (count_ + 1) > keys_.size()) rehash(std::max<size_t>(1024, 2 * keys_.size()));
    const size_t i = probe(key(a, b));
    if (ranks_[i] >= 0) return;
    keys_[i] = key(a, b);
    ranks_[i] = rank;
    ++count_;
  }
  // The rank of the merge (a, b), or -1.
  int find(int32_t a, int32_t b) const { return keys_.empty() ? -1 : ranks_[probe(key(a, b))]; }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }
  size_t probe(uint64_t k) const {
    const size_t mask = keys_.size() - 1;
    for (size_t i = (k * 0x9E3779B97F4A7C15ull) >> 20 & mask;; i = (i + 1) & mask)
      if (ranks_[i] < 0 || keys_[i] == k) return i;
  }
  void rehash(size_t n) {
    std::vector<uint64_t> keys(n);
    std::vector<int32_t> ranks(n, -1);
    keys.swap(keys_);
    ranks.swap(ranks_);
    for (size_t j = 0; j < keys.size(); ++j)
      if (ranks[j] >= 0) {
        const size_t i = probe(keys[j]);
        keys_[i] = keys[j];
        ranks_[i] = ranks[j];
      }
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> ranks_;  // -1: empty slot
  size_t count_ = 0;
};

// Hugging Face's byte-level BPE (fast tokenizers from tokenizer.json and GGUF, the slow GPT-2 and
// Qwen2 ones from vocab.json + merges.txt): the loaders fill its configuration, then finish().
class ByteLevelBpe final : public TokenizerBase {
 public:
  explicit ByteLevelBpe(std::string source) { source_ = std::move(source); }

  std::string kind() const override { return "bpe"; }

  void set_vocab(const nlohmann::json& vocab);
  void set_vocab(const std::vector<std::string>& tokens);

  // Merges in rank order. A merge whose parts are both tokens is kept by their ids; any other
  // (rare: a part outside the vocabulary) by its text.
  void add_merge(const std::string& a, const std::string& b);

  void finish(const TokenizerConfig& cfg);

  bool has_token(const std::string& text) const {
    return vocab_.find(text) >= 0 || find_added(text);
  }
  std::optional<int64_t> unk_id() const { return unk_; }

  friend std::unique_ptr<Tokenizer> tok::load_bpe_json(const std::string&, const TokenizerConfig&,
                                                       const TokenizerOptions&);
  friend std::unique_ptr<Tokenizer> tok::load_bpe_gguf(const GgufFile&, const TokenizerOptions&);
  friend std::unique_ptr<Tokenizer> tok::load_bpe_vocab_merges(const std::string&,
                                                               const TokenizerConfig&,
                                                               const TokenizerOptions&);

  // Configuration, filled by the loaders.
  std::vector<std::string> normalizers_;  // Unicode forms applied in order
  std::vector<PreStep> pre_;
  bool prefix_space_whole_text_ = false;  // slow GPT2Tokenizer(add_prefix_space=True)
  bool ignore_merges_ = false;
  std::optional<int64_t> model_unk_;
  bool fuse_unk_ = false;          // a run of symbols outside the vocabulary is one unk_token
  std::vector<int64_t> template_;  // post-processor: -1 marks the sequence
  bool has_template_ = false;
  std::string config_digest_;

 protected:
  void tokenize(const std::string& text, std::vector<int64_t>& out) const override;
  void tokenize_segment(const std::string& text, std::vector<int64_t>& out) const override;
  std::string tokens_to_string(const std::vector<int64_t>& ids) const override;
  std::string base_token(int64_t id) const override;
  std::string base_token_bytes(int64_t id) const override;
  std::vector<int64_t> add_special(std::vector<int64_t> ids) const override;
  std::string model_fingerprint() const override;

 private:
  static std::string to_byte_text(const std::string& s);
  void bpe(const std::string& word, std::vector<int64_t>& out) const;

  // GPT-2's bpe(): repeatedly merge the pair of lowest rank, every occurrence left to right. Done
  // with a heap of adjacent pairs over a linked list of symbols, O(n log n) in the word's length
  // (the textbook loop rescans the word per merge: quadratic, minutes for a 1 MB word). Pairs a
  // merge creates always rank after it (a merge only uses symbols made by earlier merges), so
  // popping (rank, position) in order is exactly GPT-2's order.
  // Returns the final symbols: (text, id), id -1 when the text is not a token.
  std::vector<std::pair<std::string, int32_t>> merge(const std::string& word) const;

  VocabIndex vocab_;
  PairRanks pair_ranks_;
  std::unordered_map<std::string, int> text_ranks_;  // merges with a part outside the vocabulary
  int merges_ = 0;
  uint64_t merges_digest_ = fnv1a("");
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace specdec::tok
