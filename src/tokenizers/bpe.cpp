// Byte-level BPE: tokenizer.json (GPT-2, GPT-NeoX/Pythia, Llama 3, Qwen2 layouts) with Hugging
// Face's fast-tokenizer semantics, and vocab.json + merges.txt folders with the slow GPT2Tokenizer
// / Qwen2Tokenizer semantics. Regexes run on PCRE2 (Unicode classes), normalization on ICU.
// This file: the encoder (pre-tokenizer steps, GPT-2's byte map and merge loop) and decoding; the
// loaders are in bpe_load.cpp, the classes both use in bpe.hpp.
#include <array>
#include <mutex>
#include <queue>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "tokenizers/bpe.hpp"
#include "tokenizers/tokenizer_base.hpp"

namespace specdec::tok {
namespace {

using nlohmann::json;

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

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &off, nullptr);
  if (!code_) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw Error(where + ": cannot compile the pre-tokenizer regex at offset " +
                std::to_string(off) + ": " + reinterpret_cast<char*>(buf));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when unavailable
}

Regex::~Regex() { pcre2_code_free(code_); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(const std::string& s) const {
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

int64_t json_id(const json& v, const std::string& where) {
  const int64_t max = limits().max_vocab_size;
  SPECDEC_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < max, where,
                ": token id ", v.dump(), " is not an integer in [0, ", max,
                ") (Limits::max_vocab_size)");
  return v.get<int64_t>();
}

void ByteLevelBpe::set_vocab(const json& vocab) {
  SPECDEC_CHECK(vocab.is_object() && !vocab.empty(), source_,
                ": the vocabulary must be a non-empty object");
  for (const auto& [tok, id] : vocab.items())
    vocab_.add(tok, json_id(id, source_ + ": vocabulary entry '" + tok + "'"), source_);
  base_size_ = size_ = vocab_.ids();
}

void ByteLevelBpe::set_vocab(const std::vector<std::string>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i)
    vocab_.add(tokens[i], static_cast<int64_t>(i), source_);
  base_size_ = size_ = vocab_.ids();
}

void ByteLevelBpe::add_merge(const std::string& a, const std::string& b) {
  SPECDEC_CHECK(!a.empty() && !b.empty(), source_, ": empty merge part (merge ", merges_ + 1, ")");
  const int32_t ia = vocab_.find(a), ib = vocab_.find(b);
  if (ia >= 0 && ib >= 0)
    pair_ranks_.add(ia, ib, merges_);
  else
    text_ranks_.emplace(a + ' ' + b, merges_);
  ++merges_;
  merges_digest_ = fnv1a(a + ' ' + b + '\n', merges_digest_);
}

void ByteLevelBpe::finish(const TokenizerConfig& cfg) {
  apply_config(cfg);
  bool has_byte_level = false;
  for (const PreStep& s : pre_) has_byte_level |= s.byte_level;
  SPECDEC_CHECK(has_byte_level, source_,
                ": no ByteLevel pre-tokenizer; only byte-level BPE is supported");
}

void ByteLevelBpe::tokenize(const std::string& text, std::vector<int64_t>& out) const {
  std::string t = text;
  for (const std::string& form : normalizers_) t = normalize_unicode(t, form);
  if (prefix_space_whole_text_) t = " " + t;
  split_and_tokenize(t, out);
}

void ByteLevelBpe::tokenize_segment(const std::string& text, std::vector<int64_t>& out) const {
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

namespace {
// A token string's bytes through the byte-level map; a string it does not map (e.g. an added
// token's text) as it is.
std::string mapped_bytes(const std::string& t) {
  const ByteMap& m = byte_map();
  std::string b;
  for (size_t i = 0; i < t.size();) {
    const auto it = m.to_byte.find(next_code_point(t, i));
    if (it == m.to_byte.end()) return t;
    b += static_cast<char>(it->second);
  }
  return b;
}
}  // namespace

std::string ByteLevelBpe::tokens_to_string(const std::vector<int64_t>& ids) const {
  std::string bytes;
  for (int64_t id : ids) bytes += mapped_bytes(token(id));
  return utf8_lossy(bytes);
}

std::string ByteLevelBpe::base_token_bytes(int64_t id) const {
  return mapped_bytes(base_token(id));
}

std::string ByteLevelBpe::base_token(int64_t id) const {
  const std::string_view t = vocab_.text(id);
  SPECDEC_CHECK(!t.empty(), source_, ": no token with id ", id);
  return std::string(t);
}

std::vector<int64_t> ByteLevelBpe::add_special(std::vector<int64_t> ids) const {
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

std::string ByteLevelBpe::model_fingerprint() const {
  std::string s;
  for (int64_t i = 0; i < vocab_.ids(); ++i) s.append(vocab_.text(i)) += '\x1f';
  s += '|' + std::to_string(merges_digest_) + '|' + config_digest_ +
       std::to_string(prefix_space_whole_text_) + std::to_string(ignore_merges_) +
       std::to_string(model_unk_.value_or(-1)) + std::to_string(fuse_unk_);
  for (const std::string& n : normalizers_) s += "|n" + n;
  for (const PreStep& p : pre_) s += "|p" + p.description;
  for (int64_t t : template_) s += "|t" + std::to_string(t);
  return fnv1a_hex(s);
}

std::string ByteLevelBpe::to_byte_text(const std::string& s) {
  const ByteMap& m = byte_map();
  std::string out;
  for (unsigned char c : s) out += m.to_text[c];
  return out;
}

void ByteLevelBpe::bpe(const std::string& word, std::vector<int64_t>& out) const {
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
    // A symbol outside the vocabulary becomes unk_token, a run of them one with fuse_unk; with no
    // unk_token it is dropped (Hugging Face's BPE).
    bool after_unk = false;
    for (const auto& symbol : merge(word)) {
      const int32_t id = symbol.second;
      if (id >= 0)
        ids.push_back(id);
      else if (model_unk_ && !(fuse_unk_ && after_unk))
        ids.push_back(*model_unk_);
      after_unk = id < 0;
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  // The cache holds short words only: its memory stays bounded (100 000 x 256 bytes) whatever
  // the input.
  if (word.size() > 256) return;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < 100000) cache_.emplace(word, std::move(ids));
}

std::vector<std::pair<std::string, int32_t>> ByteLevelBpe::merge(const std::string& word) const {
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
  for (int64_t i = 0; i >= 0; i = sym[i].next) out.emplace_back(std::move(sym[i].text), sym[i].id);
  return out;
}

}  // namespace specdec::tok
