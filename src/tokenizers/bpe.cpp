// Byte-level BPE: tokenizer.json (GPT-2, GPT-NeoX/Pythia, Llama 3, Qwen2 layouts) with Hugging
// Face's fast-tokenizer semantics, and vocab.json + merges.txt folders with the slow GPT2Tokenizer
// / Qwen2Tokenizer semantics. Regexes run on PCRE2 (Unicode classes), normalization on ICU.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <mutex>
#include <queue>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "specdec/error.hpp"
#include "specdec/gguf.hpp"
#include "specdec/limits.hpp"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

namespace specdec::tok {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer regex (also the ByteLevel pre-tokenizer's) and Qwen2's.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's (llama.cpp's "llama-bpe" pre-tokenizer).
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: every byte gets a printable code point.
struct ByteMap {
  std::array<std::string, 256> to_text;
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = direct[b] ? b : next++;
      append_utf8(to_text[b], cp);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      throw Error(where + ": cannot compile the pre-tokenizer regex at offset " +
                  std::to_string(off) + ": " + reinterpret_cast<char*>(buf));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when unavailable
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty, non-overlapping matches, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        throw Error("pre-tokenizer regex failed (PCRE2 error " + std::to_string(rc) + ")");
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] > ov[0]) {
        out.emplace_back(ov[0], ov[1]);
        start = ov[1];
      } else {  // empty match: step over one code point
        if (ov[0] >= s.size()) break;
        size_t i = ov[0];
        next_code_point(s, i);
        start = i;
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

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

std::vector<std::string> split(const std::string& s, const PreStep& step) {
  std::vector<std::pair<std::string, bool>> spans;  // (text, is delimiter)
  size_t pos = 0;
  for (const auto& [b, e] : step.regex->find_all(s)) {
    if (b > pos) spans.emplace_back(s.substr(pos, b - pos), step.invert);
    spans.emplace_back(s.substr(b, e - b), !step.invert);
    pos = e;
  }
  if (pos < s.size()) spans.emplace_back(s.substr(pos), step.invert);
  std::vector<std::string> out;
  bool prev_delim = false;
  for (size_t k = 0; k < spans.size(); ++k) {
    auto& [text, delim] = spans[k];
    switch (step.behavior) {
      case Behavior::Isolated:
        out.push_back(text);
        break;
      case Behavior::Removed:
        if (!delim) out.push_back(text);
        break;
      case Behavior::MergedWithPrevious:
        if (delim && !out.empty() && !prev_delim)
          out.back() += text;
        else
          out.push_back(text);
        break;
      case Behavior::MergedWithNext:
        if (delim && k + 1 < spans.size())
          spans[k + 1].first = text + spans[k + 1].first;
        else
          out.push_back(text);
        break;
      case Behavior::Contiguous:
        if (delim && prev_delim && !out.empty())
          out.back() += text;
        else
          out.push_back(text);
        break;
    }
    prev_delim = delim;
  }
  return out;
}

// A token id from JSON: an integer in [0, Limits::max_vocab_size) (a float would be converted with
// undefined behaviour; a huge id would size the id table).
int64_t json_id(const json& v, const std::string& where) {
  const int64_t max = limits().max_vocab_size;
  SPECDEC_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < max, where,
                ": token id ", v.dump(), " is not an integer in [0, ", max,
                ") (Limits::max_vocab_size)");
  return v.get<int64_t>();
}

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

class ByteLevelBpe final : public TokenizerBase {
 public:
  explicit ByteLevelBpe(std::string source) { source_ = std::move(source); }

  std::string kind() const override { return "bpe"; }

  void set_vocab(const json& vocab) {
    SPECDEC_CHECK(vocab.is_object() && !vocab.empty(), source_,
                  ": the vocabulary must be a non-empty object");
    for (const auto& [tok, id] : vocab.items())
      vocab_.add(tok, json_id(id, source_ + ": vocabulary entry '" + tok + "'"), source_);
    base_size_ = size_ = vocab_.ids();
  }

  void set_vocab(const std::vector<std::string>& tokens) {
    for (size_t i = 0; i < tokens.size(); ++i)
      vocab_.add(tokens[i], static_cast<int64_t>(i), source_);
    base_size_ = size_ = vocab_.ids();
  }

  // Merges in rank order. A merge whose parts are both tokens is kept by their ids; any other
  // (rare: a part outside the vocabulary) by its text.
  void add_merge(const std::string& a, const std::string& b) {
    SPECDEC_CHECK(!a.empty() && !b.empty(), source_, ": empty merge part (merge ", merges_ + 1,
                  ")");
    const int32_t ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia >= 0 && ib >= 0)
      pair_ranks_.add(ia, ib, merges_);
    else
      text_ranks_.emplace(a + ' ' + b, merges_);
    ++merges_;
    merges_digest_ = fnv1a(a + ' ' + b + '\n', merges_digest_);
  }

  void finish(const TokenizerConfig& cfg) {
    apply_config(cfg);
    bool has_byte_level = false;
    for (const PreStep& s : pre_) has_byte_level |= s.byte_level;
    SPECDEC_CHECK(has_byte_level, source_,
                  ": no ByteLevel pre-tokenizer; only byte-level BPE is supported");
  }

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
  std::vector<int64_t> template_;  // post-processor: -1 marks the sequence
  bool has_template_ = false;
  std::string config_digest_;

 protected:
  void tokenize(const std::string& text, std::vector<int64_t>& out) const override {
    std::string t = text;
    for (const std::string& form : normalizers_) t = normalize_unicode(t, form);
    if (prefix_space_whole_text_) t = " " + t;
    split_and_tokenize(t, out);
  }

  void tokenize_segment(const std::string& text, std::vector<int64_t>& out) const override {
    std::vector<std::string> pieces{text};
    for (const PreStep& step : pre_) {
      std::vector<std::string> next;
      for (std::string& p : pieces) {
        if (step.byte_level && step.add_prefix_space && p.compare(0, 1, " ") != 0) p = " " + p;
        std::vector<std::string> parts = step.regex ? split(p, step) : std::vector<std::string>{p};
        if (step.byte_level)
          for (std::string& q : parts) q = to_byte_text(q);
        for (std::string& q : parts)
          if (!q.empty()) next.push_back(std::move(q));
      }
      pieces.swap(next);
    }
    for (const std::string& p : pieces) bpe(p, out);
  }

  std::string tokens_to_string(const std::vector<int64_t>& ids) const override {
    const ByteMap& m = byte_map();
    std::string bytes;
    for (int64_t id : ids) {
      const std::string t = token(id);
      std::string b;
      bool mapped = true;
      for (size_t i = 0; i < t.size() && mapped;) {
        const auto it = m.to_byte.find(next_code_point(t, i));
        if (it == m.to_byte.end())
          mapped = false;
        else
          b += static_cast<char>(it->second);
      }
      bytes += mapped ? b : t;  // e.g. added tokens: their text as it is
    }
    return utf8_lossy(bytes);
  }

  std::string base_token(int64_t id) const override {
    const std::string_view t = vocab_.text(id);
    SPECDEC_CHECK(!t.empty(), source_, ": no token with id ", id);
    return std::string(t);
  }

  std::vector<int64_t> add_special(std::vector<int64_t> ids) const override {
    if (!has_template_) return TokenizerBase::add_special(std::move(ids));
    std::vector<int64_t> out;
    for (int64_t t : template_) {
      if (t >= 0)
        out.push_back(t);
      else
        out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
  }

  std::string model_fingerprint() const override {
    std::string s;
    for (int64_t i = 0; i < vocab_.ids(); ++i) s.append(vocab_.text(i)) += '\x1f';
    s += '|' + std::to_string(merges_digest_) + '|' + config_digest_ +
         std::to_string(prefix_space_whole_text_) + std::to_string(ignore_merges_) +
         std::to_string(model_unk_.value_or(-1));
    for (const std::string& n : normalizers_) s += "|n" + n;
    for (const PreStep& p : pre_) s += "|p" + p.description;
    for (int64_t t : template_) s += "|t" + std::to_string(t);
    return fnv1a_hex(s);
  }

 private:
  static std::string to_byte_text(const std::string& s) {
    const ByteMap& m = byte_map();
    std::string out;
    for (unsigned char c : s) out += m.to_text[c];
    return out;
  }

  void bpe(const std::string& word, std::vector<int64_t>& out) const {
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      const auto it = cache_.find(word);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int64_t> ids;
    const int32_t whole = ignore_merges_ ? vocab_.find(word) : -1;
    if (whole >= 0) {
      ids.push_back(whole);
    } else {
      for (const auto& [text, id] : merge(word)) {
        if (id >= 0)
          ids.push_back(id);
        else if (model_unk_)
          ids.push_back(*model_unk_);
        else
          throw Error(source_ + ": token '" + text +
                      "' is not in the vocabulary and there is no unk_token");
      }
    }
    out.insert(out.end(), ids.begin(), ids.end());
    // The cache holds short words only: its memory stays bounded (100 000 x 256 bytes) whatever
    // the input.
    if (word.size() > 256) return;
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < 100000) cache_.emplace(word, std::move(ids));
  }

  // GPT-2's bpe(): repeatedly merge the pair of lowest rank, every occurrence left to right. Done
  // with a heap of adjacent pairs over a linked list of symbols, O(n log n) in the word's length
  // (the textbook loop rescans the word per merge: quadratic, minutes for a 1 MB word). Pairs a
  // merge creates always rank after it (a merge only uses symbols made by earlier merges), so
  // popping (rank, position) in order is exactly GPT-2's order.
  // Returns the final symbols: (text, id), id -1 when the text is not a token.
  std::vector<std::pair<std::string, int32_t>> merge(const std::string& word) const {
    struct Sym {
      std::string text;
      int32_t id;  // vocab_'s id of text, or -1
      int64_t prev, next;
    };
    std::vector<Sym> sym;
    for (size_t i = 0; i < word.size();) {
      const size_t b = i;
      next_code_point(word, i);
      const auto n = static_cast<int64_t>(sym.size());
      std::string text = word.substr(b, i - b);
      const int32_t id = vocab_.find(text);
      sym.push_back({std::move(text), id, n - 1, n + 1});
    }
    if (sym.empty()) return {};
    sym.back().next = -1;
    using Entry = std::tuple<int, int64_t, int64_t>;  // rank, left symbol, right symbol
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    const auto rank_of = [&](const Sym& a, const Sym& b) {
      if (a.id >= 0 && b.id >= 0) return pair_ranks_.find(a.id, b.id);
      if (text_ranks_.empty()) return -1;
      const auto it = text_ranks_.find(a.text + ' ' + b.text);
      return it == text_ranks_.end() ? -1 : it->second;
    };
    const auto push = [&](int64_t l, int64_t r) {
      if (l < 0 || r < 0) return;
      if (const int rank = rank_of(sym[l], sym[r]); rank >= 0) heap.emplace(rank, l, r);
    };
    for (int64_t i = 0; i + 1 < static_cast<int64_t>(sym.size()); ++i) push(i, i + 1);
    std::vector<bool> dead(sym.size(), false);
    while (!heap.empty()) {
      const auto [rank, l, r] = heap.top();
      heap.pop();
      // Stale entries: a side was merged away, or the left symbol grew since this pair was seen.
      if (dead[l] || dead[r] || sym[l].next != r) continue;
      if (rank_of(sym[l], sym[r]) != rank) continue;
      sym[l].text += sym[r].text;
      sym[l].id = vocab_.find(sym[l].text);
      dead[r] = true;
      sym[l].next = sym[r].next;
      if (sym[r].next >= 0) sym[sym[r].next].prev = l;
      push(sym[l].prev, l);
      push(l, sym[l].next);
    }
    std::vector<std::pair<std::string, int32_t>> out;
    for (int64_t i = 0; i >= 0; i = sym[i].next)
      out.emplace_back(std::move(sym[i].text), sym[i].id);
    return out;
  }

  VocabIndex vocab_;
  PairRanks pair_ranks_;
  std::unordered_map<std::string, int> text_ranks_;  // merges with a part outside the vocabulary
  int merges_ = 0;
  uint64_t merges_digest_ = fnv1a("");
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

PreStep byte_level_step(bool add_prefix_space, bool use_regex, const std::string& where) {
  PreStep s;
  s.byte_level = true;
  s.add_prefix_space = add_prefix_space;
  if (use_regex) s.regex = std::make_shared<Regex>(kGpt2Pattern, false, where);
  s.description = "ByteLevel" + std::to_string(add_prefix_space) + std::to_string(use_regex);
  return s;
}

void parse_normalizer(const json& n, const std::string& where, std::vector<std::string>& out) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const json& x : n.at("normalizers")) parse_normalizer(x, where, out);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    out.push_back(type);
  } else {
    throw Error(where + ": unsupported normalizer '" + type + "'");
  }
}

void parse_pre_tokenizer(const json& p, const std::string& where, std::vector<PreStep>& out) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& x : p.at("pretokenizers")) parse_pre_tokenizer(x, where, out);
  } else if (type == "ByteLevel") {
    out.push_back(
        byte_level_step(p.value("add_prefix_space", false), p.value("use_regex", true), where));
  } else if (type == "Split") {
    PreStep s;
    const json& pat = p.at("pattern");
    const bool literal = pat.contains("String");
    const std::string text =
        literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>();
    s.regex = std::make_shared<Regex>(text, literal, where);
    const std::string b = p.value("behavior", "Isolated");
    static const std::pair<const char*, Behavior> kBehaviors[] = {
        {"Removed", Behavior::Removed},
        {"Isolated", Behavior::Isolated},
        {"MergedWithPrevious", Behavior::MergedWithPrevious},
        {"MergedWithNext", Behavior::MergedWithNext},
        {"Contiguous", Behavior::Contiguous}};
    bool known = false;
    for (const auto& [name, value] : kBehaviors)
      if (b == name) s.behavior = value, known = true;
    SPECDEC_CHECK(known, where, ": unsupported Split behavior '", b, "'");
    s.invert = p.value("invert", false);
    s.description = "Split" + text + b + std::to_string(s.invert) + std::to_string(literal);
    out.push_back(std::move(s));
  } else {
    throw Error(where + ": unsupported pre-tokenizer '" + type + "'");
  }
}

void check_decoder(const json& d, const std::string& where) {
  const std::string type = d.is_null() ? "none" : d.value("type", "");
  if (type == "Sequence") {
    for (const json& x : d.at("decoders")) check_decoder(x, where);
    return;
  }
  SPECDEC_CHECK(type == "ByteLevel", where, ": unsupported decoder '", type, "' (only ByteLevel)");
}

void parse_post_processor(const json& p, const std::string& where, ByteLevelBpe& t) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const json& x : p.at("processors")) parse_post_processor(x, where, t);
  } else if (type == "TemplateProcessing") {
    t.has_template_ = true;
    t.template_.clear();
    for (const json& item : p.at("single")) {
      if (item.contains("Sequence")) {
        t.template_.push_back(-1);
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& ids = p.at("special_tokens").at(name).at("ids");
      for (const json& id : ids) t.template_.push_back(json_id(id, where));
    }
  } else if (type != "ByteLevel") {
    throw Error(where + ": unsupported post-processor '" + type + "'");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_json(const std::string& path, const TokenizerConfig& cfg,
                                         const TokenizerOptions& options) {
  const json j = parse_json_file(path);
  SPECDEC_CHECK(j.is_object(), path, ": not a tokenizer.json (expected an object)");
  SPECDEC_CHECK(j.contains("model") && j["model"].is_object(), path, ": no 'model' section");
  const json& m = j["model"];
  const std::string type = m.value("type", "");
  SPECDEC_CHECK(type == "BPE", path, ": unsupported model type '", type, "' (only BPE)");
  SPECDEC_CHECK(m.contains("vocab") && m.contains("merges"), path,
                ": the BPE model has no vocab or merges");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    SPECDEC_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", path,
                  ": unsupported BPE option ", key);
  SPECDEC_CHECK(!m.value("byte_fallback", false), path, ": unsupported BPE option byte_fallback");
  SPECDEC_CHECK(!m.contains("dropout") || m["dropout"].is_null(), path,
                ": BPE dropout is not supported");

  auto t = std::make_unique<ByteLevelBpe>(path);
  try {
    t->set_vocab(m["vocab"]);
    for (const json& merge : m["merges"]) {
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t cut = s.find(' ');
        SPECDEC_CHECK(cut != std::string::npos, path, ": merge '", s, "' is not 'a b'");
        t->add_merge(s.substr(0, cut), s.substr(cut + 1));
      } else {
        SPECDEC_CHECK(merge.is_array() && merge.size() == 2, path,
                      ": a merge must be 'a b' or [a, b]");
        t->add_merge(merge[0].get<std::string>(), merge[1].get<std::string>());
      }
    }
    t->ignore_merges_ = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      const auto it = m["vocab"].find(m["unk_token"].get<std::string>());
      if (it != m["vocab"].end()) t->model_unk_ = it->get<int64_t>();
    }
    parse_normalizer(j.value("normalizer", json()), path, t->normalizers_);
    parse_pre_tokenizer(j.value("pre_tokenizer", json()), path, t->pre_);
    if (options.add_prefix_space)
      for (PreStep& s : t->pre_)
        if (s.byte_level) s.add_prefix_space = *options.add_prefix_space;
    check_decoder(j.value("decoder", json()), path);
    parse_post_processor(j.value("post_processor", json()), path, *t);
    for (const json& a : j.value("added_tokens", json::array()))
      t->add_token({a.at("content").get<std::string>(), json_id(a.at("id"), path),
                    a.value("special", false), a.value("lstrip", false), a.value("rstrip", false),
                    a.value("single_word", false)});
  } catch (const json::exception& e) {
    throw Error(path + ": malformed tokenizer.json: " + e.what());
  }
  t->spaces_between_special_ = false;  // the fast decoders join tokens as they are
  // Explicit add_bos_token / add_eos_token (options, else tokenizer_config.json) replace the
  // post-processor's template, as the fast tokenizers' setters do.
  const auto bos = options.add_bos_token ? options.add_bos_token : cfg.get_bool("add_bos_token");
  const auto eos = options.add_eos_token ? options.add_eos_token : cfg.get_bool("add_eos_token");
  if (bos || eos) {
    t->has_template_ = false;
    t->add_bos_ = bos.value_or(false);
    t->add_eos_ = eos.value_or(false);
  }
  t->finish(cfg);
  return t;
}

std::unique_ptr<Tokenizer> load_bpe_vocab_merges(const std::string& dir, const TokenizerConfig& cfg,
                                                 const TokenizerOptions& options) {
  const std::string vocab_path = dir + "/vocab.json", merges_path = dir + "/merges.txt";
  auto t = std::make_unique<ByteLevelBpe>(vocab_path);
  t->set_vocab(parse_json_file(vocab_path));
  const std::string merges = read_text_file(merges_path);
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges.size();) {
    size_t end = merges.find('\n', pos);
    if (end == std::string::npos) end = merges.size();
    std::string line = merges.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t cut = line.find(' ');
    SPECDEC_CHECK(cut != std::string::npos && line.find(' ', cut + 1) == std::string::npos,
                  merges_path, ":", line_no, ": expected two tokens separated by one space");
    t->add_merge(line.substr(0, cut), line.substr(cut + 1));
  }
  // Qwen2Tokenizer: NFC, its own regex, no spaces around added tokens in decode; GPT2Tokenizer
  // otherwise (GPTNeoXTokenizer files normalize to NFC like the fast tokenizer).
  const std::string& cls = cfg.tokenizer_class;
  const bool qwen2 = cls.rfind("Qwen2", 0) == 0;
  if (qwen2 || cls.rfind("GPTNeoX", 0) == 0) t->normalizers_.push_back("NFC");
  auto step = byte_level_step(false, !qwen2, vocab_path);
  if (qwen2) step.regex = std::make_shared<Regex>(kQwen2Pattern, false, vocab_path);
  step.description += qwen2 ? "qwen2" : "gpt2";
  t->pre_.push_back(std::move(step));
  t->prefix_space_whole_text_ =
      options.add_prefix_space.value_or(cfg.get_bool("add_prefix_space").value_or(false));
  t->add_bos_ = options.add_bos_token.value_or(cfg.get_bool("add_bos_token").value_or(false));
  t->add_eos_ = options.add_eos_token.value_or(cfg.get_bool("add_eos_token").value_or(false));
  t->spaces_between_special_ = !qwen2;
  t->config_digest_ = cls;
  TokenizerConfig c = cfg;
  // GPT2Tokenizer's defaults: <|endoftext|> is unk, bos and eos (Qwen2Tokenizer: eos only).
  if (!c.json.contains("eos_token")) c.json["eos_token"] = "<|endoftext|>";
  if (!qwen2)
    for (const char* key : {"bos_token", "unk_token"})
      if (!c.json.contains(key)) c.json[key] = "<|endoftext|>";
  // Drop defaults the vocabulary cannot honour (e.g. a GPT-2-style folder without <|endoftext|>).
  for (const char* key : {"bos_token", "eos_token", "unk_token"})
    if (!cfg.json.contains(key) && c.json.contains(key) &&
        !t->has_token(c.json[key].get<std::string>()))
      c.json.erase(key);
  t->finish(c);
  t->model_unk_ = t->unk_id();  // GPT2Tokenizer maps unknown symbols to unk_token
  return t;
}

}  // namespace specdec::tok

namespace specdec::tok {

std::unique_ptr<Tokenizer> load_bpe_gguf(const GgufFile& f, const TokenizerOptions& options) {
  const std::string& path = f.path();
  auto t = std::make_unique<ByteLevelBpe>(path);
  const std::vector<std::string> tokens = f.get_strings("tokenizer.ggml.tokens");
  SPECDEC_CHECK(!tokens.empty(), path, ": tokenizer.ggml.tokens is empty");
  t->set_vocab(tokens);
  for (const std::string& m : f.get_strings("tokenizer.ggml.merges")) {
    const size_t cut = m.find(' ');
    SPECDEC_CHECK(cut != std::string::npos, path, ": tokenizer.ggml.merges entry '", m,
                  "' is not 'a b'");
    t->add_merge(m.substr(0, cut), m.substr(cut + 1));
  }
  // llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the pre-tokenizers of the original
  // tokenizer.json: "smollm" splits digits one by one before GPT-2's byte-level regex, as
  // SmolLM's Digits(individual_digits) does.
  const std::string pre = f.find_string("tokenizer.ggml.pre").value_or("default");
  auto split_step = [&](const char* pattern, const std::string& name) {
    PreStep s;
    s.regex = std::make_shared<Regex>(pattern, false, path);
    s.description = "gguf-" + name;
    return s;
  };
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
    t->pre_.push_back(byte_level_step(false, true, path));
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    t->pre_.push_back(split_step(R"(\p{N})", pre));
    t->pre_.push_back(byte_level_step(false, true, path));
  } else if (pre == "llama-bpe" || pre == "llama3") {
    t->pre_.push_back(split_step(kLlama3Pattern, pre));
    t->pre_.push_back(byte_level_step(false, false, path));
  } else if (pre == "qwen2") {
    t->normalizers_.push_back("NFC");
    t->pre_.push_back(split_step(kQwen2Pattern, pre));
    t->pre_.push_back(byte_level_step(false, false, path));
  } else {
    throw Error(path + ": unsupported tokenizer.ggml.pre '" + pre +
                "' (supported: default, gpt-2, smollm, starcoder, refact, llama-bpe, qwen2)");
  }
  // Token types (llama.cpp): 3 = control (special added token), 4 = user-defined (added token).
  if (f.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> types = f.get_ints("tokenizer.ggml.token_type");
    SPECDEC_CHECK(types.size() == tokens.size(), path, ": tokenizer.ggml.token_type has ",
                  types.size(), " entries for ", tokens.size(), " tokens");
    for (size_t i = 0; i < types.size(); ++i)
      if (types[i] == 3 || types[i] == 4)
        t->add_token({tokens[i], static_cast<int64_t>(i), types[i] == 3});
  }
  TokenizerConfig cfg;
  const std::pair<const char*, const char*> kNamed[] = {
      {"tokenizer.ggml.bos_token_id", "bos_token"},
      {"tokenizer.ggml.eos_token_id", "eos_token"},
      {"tokenizer.ggml.unknown_token_id", "unk_token"},
      {"tokenizer.ggml.padding_token_id", "pad_token"}};
  for (const auto& [key, name] : kNamed) {
    if (auto id = f.find_int(key)) {
      SPECDEC_CHECK(*id >= 0 && *id < static_cast<int64_t>(tokens.size()), path, ": ", key, " ",
                    *id, " is outside the vocabulary of ", tokens.size());
      cfg.json[name] = tokens[static_cast<size_t>(*id)];
    }
  }
  t->spaces_between_special_ = false;  // as the fast tokenizers join tokens
  t->add_bos_ =
      options.add_bos_token.value_or(f.find_bool("tokenizer.ggml.add_bos_token").value_or(false));
  t->add_eos_ =
      options.add_eos_token.value_or(f.find_bool("tokenizer.ggml.add_eos_token").value_or(false));
  if (options.add_prefix_space)
    for (PreStep& s : t->pre_)
      if (s.byte_level) s.add_prefix_space = *options.add_prefix_space;
  t->config_digest_ = "gguf:" + pre;
  t->finish(cfg);
  return t;
}

}  // namespace specdec::tok
