// Tokenizer plumbing shared by every kind: loading, added tokens, Hugging Face's decode assembly,
// UTF-8 and Unicode helpers, streaming decode.
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "json.hpp"
#include "specdec/error.hpp"
#include "specdec/gguf.hpp"
#include "specdec/limits.hpp"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

namespace specdec {
namespace tok {

using nlohmann::json;

namespace {

// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 when invalid; `consumed` is the length of
// its maximal valid prefix (at least 1), which is what one U+FFFD replaces.
int utf8_sequence(const std::string& s, size_t i, uint32_t& cp, size_t& consumed) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  consumed = 1;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF)
    len = 3, cp = c & 0x0F, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4, cp = c & 0x07, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 0;
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const uint8_t d = b(i + k);
    if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) return 0;
    cp = (cp << 6) | (d & 0x3F);
    consumed = k + 1;
  }
  return len;
}

bool is_space_cp(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace

uint32_t next_code_point(const std::string& s, size_t& i) {
  uint32_t cp = 0;
  size_t consumed = 0;
  const int len = utf8_sequence(s, i, cp, consumed);
  i += len ? len : consumed;
  return len ? cp : 0xFFFD;
}

namespace {
// Code points of UTF-8 text with their byte offsets.
std::vector<std::pair<size_t, uint32_t>> code_points(const std::string& s) {
  std::vector<std::pair<size_t, uint32_t>> out;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    out.emplace_back(at, next_code_point(s, i));
  }
  return out;
}
}  // namespace

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void require_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    size_t consumed = 0;
    const int len = utf8_sequence(text, i, cp, consumed);
    if (!len) throw Error("text is not valid UTF-8 (byte " + std::to_string(i) + ")");
    i += len;
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    size_t consumed = 0;
    const int len = utf8_sequence(bytes, i, cp, consumed);
    if (len) {
      out.append(bytes, i, len);
      i += len;
    } else {
      append_utf8(out, 0xFFFD);
      i += consumed;
    }
  }
  return out;
}

std::string normalize_unicode(const std::string& text, const std::string& form) {
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return text;  // ASCII is invariant under every form
  UErrorCode st = U_ZERO_ERROR;
  const UNormalizer2* n = form == "NFC"    ? unorm2_getNFCInstance(&st)
                          : form == "NFD"  ? unorm2_getNFDInstance(&st)
                          : form == "NFKC" ? unorm2_getNFKCInstance(&st)
                          : form == "NFKD" ? unorm2_getNFKDInstance(&st)
                                           : nullptr;
  SPECDEC_CHECK(n, "unsupported Unicode normalization form '", form, "'");
  SPECDEC_CHECK(U_SUCCESS(st), "ICU: cannot load the ", form, " normalizer: ", u_errorName(st));
  int32_t len16 = 0;
  u_strFromUTF8(nullptr, 0, &len16, text.data(), static_cast<int32_t>(text.size()), &st);
  st = U_ZERO_ERROR;
  std::vector<UChar> src(len16 + 1), dst;
  u_strFromUTF8(src.data(), len16 + 1, nullptr, text.data(), static_cast<int32_t>(text.size()),
                &st);
  SPECDEC_CHECK(U_SUCCESS(st), "ICU: invalid UTF-8 text: ", u_errorName(st));
  dst.resize(2 * len16 + 16);
  int32_t out16 =
      unorm2_normalize(n, src.data(), len16, dst.data(), static_cast<int32_t>(dst.size()), &st);
  if (st == U_BUFFER_OVERFLOW_ERROR) {
    st = U_ZERO_ERROR;
    dst.resize(out16 + 1);
    out16 =
        unorm2_normalize(n, src.data(), len16, dst.data(), static_cast<int32_t>(dst.size()), &st);
  }
  SPECDEC_CHECK(U_SUCCESS(st), "ICU: normalization failed: ", u_errorName(st));
  int32_t len8 = 0;
  u_strToUTF8(nullptr, 0, &len8, dst.data(), out16, &st);
  st = U_ZERO_ERROR;
  std::string out(len8, '\0');
  u_strToUTF8(out.data(), len8, nullptr, dst.data(), out16, &st);
  if (st == U_STRING_NOT_TERMINATED_WARNING) st = U_ZERO_ERROR;
  SPECDEC_CHECK(U_SUCCESS(st), "ICU: cannot encode UTF-8: ", u_errorName(st));
  return out;
}

std::string lstrip_ws(const std::string& s) {
  for (const auto& [off, cp] : code_points(s))
    if (!is_space_cp(cp)) return s.substr(off);
  return "";
}

std::string rstrip_ws(const std::string& s) {
  size_t end = 0;
  const auto cps = code_points(s);
  for (size_t k = 0; k < cps.size(); ++k)
    if (!is_space_cp(cps[k].second)) end = k + 1 < cps.size() ? cps[k + 1].first : s.size();
  return s.substr(0, end);
}

std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) s = replace_all(std::move(s), from, to);
  return s;
}

uint64_t fnv1a(std::string_view data, uint64_t h) {
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string fnv1a_hex(std::string_view data) {
  const uint64_t h = fnv1a(data);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ---- tokenizer_config.json ----

std::optional<bool> TokenizerConfig::get_bool(const char* key) const {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  SPECDEC_CHECK(it->is_boolean(), where(key), ": '", key, "' must be true or false");
  return it->get<bool>();
}

std::optional<std::string> TokenizerConfig::token_text(const char* key) const {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  throw Error(where(key) + ": '" + key + "' must be a string or {\"content\": ...}");
}

const std::string& TokenizerConfig::where(const std::string& key) const {
  const auto it = origin.find(key);
  return it == origin.end() ? source : it->second;
}

std::vector<AddedToken> TokenizerConfig::added_tokens() const {
  std::vector<AddedToken> out;
  const auto it = json.find("added_tokens_decoder");
  if (it == json.end()) return out;
  SPECDEC_CHECK(it->is_object(), source, ": added_tokens_decoder must be an object");
  for (const auto& [key, v] : it->items()) {
    AddedToken t;
    size_t used = 0;
    try {
      t.id = std::stoll(key, &used);
    } catch (const std::exception&) {
    }
    SPECDEC_CHECK(used == key.size() && !key.empty(), source, ": added_tokens_decoder key '", key,
                  "' is not a token id");
    try {
      t.content = v.at("content").get<std::string>();
      t.special = v.value("special", false);
      t.lstrip = v.value("lstrip", false);
      t.rstrip = v.value("rstrip", false);
      t.single_word = v.value("single_word", false);
    } catch (const std::exception& e) {
      throw Error(source + ": bad added_tokens_decoder entry '" + key +
                  "': " + detail::json_message(e));
    }
    out.push_back(t);
  }
  return out;
}

std::vector<std::string> TokenizerConfig::additional_special_tokens() const {
  std::vector<std::string> out;
  const auto it = json.find("additional_special_tokens");
  if (it == json.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_string())
      out.push_back(v.get<std::string>());
    else if (v.is_object() && v.contains("content"))
      out.push_back(v["content"].get<std::string>());
  }
  return out;
}

TokenizerConfig read_tokenizer_config(const std::string& dir) {
  TokenizerConfig cfg;
  cfg.source = dir + "/tokenizer_config.json";
  const auto read = [&](const std::string& name) -> json {
    const std::string path = dir + "/" + name;
    if (!file_exists(path)) return json::object();
    try {
      json j = detail::parse_json_bounded(read_text_file(path), "");
      SPECDEC_CHECK(j.is_object(), "not a JSON object");
      return j;
    } catch (const std::exception& e) {
      throw Error(path + ": " + detail::json_message(e));
    }
  };
  // special_tokens_map.json first, tokenizer_config.json over it (as from_pretrained does).
  const json special_map = read("special_tokens_map.json"), config = read("tokenizer_config.json");
  for (const auto& [k, v] : special_map.items())
    cfg.json[k] = v, cfg.origin[k] = dir + "/special_tokens_map.json";
  for (const auto& [k, v] : config.items()) cfg.json[k] = v, cfg.origin.erase(k);
  // added_tokens.json: {content: id}, older checkpoints.
  const json extra = read("added_tokens.json");
  if (!extra.empty()) {
    json& dec = cfg.json["added_tokens_decoder"];
    if (!dec.is_object()) dec = json::object();
    for (const auto& [content, id] : extra.items()) {
      SPECDEC_CHECK(id.is_number_integer(), dir, "/added_tokens.json: id of '", content,
                    "' is not an integer");
      const std::string key = std::to_string(id.get<int64_t>());
      if (!dec.contains(key)) dec[key] = {{"content", content}, {"special", false}};
    }
  }
  cfg.tokenizer_class = cfg.json.value("tokenizer_class", "");
  return cfg;
}

// ---- TokenizerBase ----

void TokenizerBase::add_token(const AddedToken& t) {
  SPECDEC_CHECK(t.id >= 0 && t.id < limits().max_vocab_size, source_, ": added token '", t.content,
                "' has id ", t.id, ", outside [0, ", limits().max_vocab_size,
                ") (Limits::max_vocab_size)");
  SPECDEC_CHECK(!t.content.empty(), source_, ": added token ", t.id, " is empty");
  if (const AddedToken* old = added(t.id)) {
    auto& ids = added_by_first_byte_[static_cast<unsigned char>(old->content[0])];
    ids.erase(std::find(ids.begin(), ids.end(), t.id));
  }
  added_[t.id] = t;
  auto& ids = added_by_first_byte_[static_cast<unsigned char>(t.content[0])];
  ids.insert(std::lower_bound(ids.begin(), ids.end(), t.id), t.id);  // by id: ties go to the lower
  if (t.special) special_ids_.insert(t.id);
  size_ = std::max(size_, t.id + 1);
}

const AddedToken* TokenizerBase::added(int64_t id) const {
  const auto it = added_.find(id);
  return it == added_.end() ? nullptr : &it->second;
}

std::optional<int64_t> TokenizerBase::find_added(const std::string& content) const {
  for (const auto& [id, t] : added_)
    if (t.content == content) return id;
  return std::nullopt;
}

bool TokenizerBase::unknown(int64_t id) const {
  SPECDEC_CHECK(id >= 0, "token id ", id, " is negative");
  return id >= size_ || (id >= base_size_ && !added(id));
}

std::string TokenizerBase::token(int64_t id) const {
  if (unknown(id)) return "";
  if (const AddedToken* t = added(id)) return t->content;
  return base_token(id);
}

std::string TokenizerBase::token_bytes(int64_t id) const {
  if (unknown(id)) return "";
  if (const AddedToken* t = added(id)) return t->content;
  return base_token_bytes(id);
}

void TokenizerBase::apply_config(const TokenizerConfig& cfg) {
  for (const AddedToken& t : cfg.added_tokens()) add_token(t);
  // Named special tokens are added tokens too (split out of the text before tokenization).
  const auto named = [&](const char* key) -> std::optional<int64_t> {
    const auto text = cfg.token_text(key);
    if (!text) return std::nullopt;
    std::optional<int64_t> id = find_added(*text);
    if (!id) {
      const std::string piece = *text;
      for (int64_t i = 0; i < base_size_ && !id; ++i)
        if (base_token(i) == piece) id = i;
    }
    SPECDEC_CHECK(id, source_, ": ", key, " '", *text, "' is not in the vocabulary");
    if (!added(*id)) add_token({*text, *id, true});
    special_ids_.insert(*id);
    return id;
  };
  if (auto v = named("bos_token")) bos_ = v;
  if (auto v = named("eos_token")) eos_ = v;
  if (auto v = named("unk_token")) unk_ = v;
  if (auto v = named("pad_token")) pad_ = v;
  for (const std::string& s : cfg.additional_special_tokens()) {
    const auto id = find_added(s);
    SPECDEC_CHECK(id, source_, ": additional special token '", s, "' is not an added token");
    special_ids_.insert(*id);
    additional_special_.insert(*id);
  }
  if (auto v = cfg.get_bool("clean_up_tokenization_spaces")) clean_up_spaces_ = *v;
  if (auto v = cfg.get_bool("spaces_between_special_tokens")) spaces_between_special_ = *v;
}

std::vector<Segment> TokenizerBase::split_added(const std::string& text) const {
  // Leftmost-longest match of added tokens (Hugging Face's Trie.split).
  std::vector<Segment> segs;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* best = nullptr;
    for (int64_t id : added_by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = added_.at(id);
      if (t.content.size() > (best ? best->content.size() : 0) &&
          text.compare(i, t.content.size(), t.content) == 0)
        best = &t;
    }
    if (!best) {
      ++i;
      continue;
    }
    segs.push_back({text.substr(start, i - start)});
    segs.push_back({best->content, best->id});
    i += best->content.size();
    start = i;
  }
  segs.push_back({text.substr(start)});
  // lstrip / rstrip / single_word, as PreTrainedTokenizer.tokenize applies them.
  for (size_t k = 0; k < segs.size(); ++k) {
    if (segs[k].added_id < 0) continue;
    const AddedToken& t = *added(segs[k].added_id);
    Segment* left = k > 0 ? &segs[k - 1] : nullptr;
    Segment* right = k + 1 < segs.size() ? &segs[k + 1] : nullptr;
    if (t.rstrip && right && !right->text.empty()) right->text = lstrip_ws(right->text);
    if (t.lstrip && left && !left->text.empty()) left->text = rstrip_ws(left->text);
    if (t.single_word && left && !left->text.empty() && left->text.back() != ' ') {
      left->text += segs[k].text;
      segs[k] = {""};
    } else if (t.single_word && right && !right->text.empty() && right->text.front() != ' ') {
      segs[k] = {segs[k].text + right->text};
      right->text.clear();
    }
  }
  std::vector<Segment> out;
  for (Segment& s : segs)
    if (s.added_id >= 0 || !s.text.empty()) out.push_back(std::move(s));
  return out;
}

void TokenizerBase::split_and_tokenize(const std::string& text, std::vector<int64_t>& out) const {
  for (const Segment& s : split_added(text)) {
    if (s.added_id >= 0)
      out.push_back(s.added_id);
    else
      tokenize_segment(s.text, out);
  }
}

void TokenizerBase::tokenize(const std::string& text, std::vector<int64_t>& out) const {
  split_and_tokenize(text, out);
}

std::vector<int64_t> TokenizerBase::add_special(std::vector<int64_t> ids) const {
  if (add_bos_ && bos_) ids.insert(ids.begin(), *bos_);
  if (add_eos_ && eos_) ids.push_back(*eos_);
  return ids;
}

std::vector<int64_t> TokenizerBase::encode(const std::string& text, bool add_special_tokens) const {
  require_utf8(text);
  std::vector<int64_t> ids;
  tokenize(text, ids);
  return add_special_tokens ? add_special(std::move(ids)) : ids;
}

std::string TokenizerBase::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // PreTrainedTokenizer._decode: tokens added beyond the model's own vocabulary (and non-special
  // added tokens) are emitted as they are; the runs between them go through the model's decoder.
  std::vector<std::string> parts;
  std::vector<int64_t> run;
  for (int64_t id : ids) {
    if (unknown(id) || (skip_special_tokens && is_special(id))) continue;
    const AddedToken* t = added(id);
    const bool verbatim =
        t && (!is_special(id) || (id >= base_size_ && additional_special_.count(id)));
    if (!verbatim) {
      run.push_back(id);
      continue;
    }
    if (!run.empty()) {
      std::string s = tokens_to_string(run);
      if (!s.empty()) parts.push_back(std::move(s));
      run.clear();
    }
    parts.push_back(t->content);
  }
  if (!run.empty()) parts.push_back(tokens_to_string(run));
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i)
    text += (i && spaces_between_special_ ? " " : "") + parts[i];
  return clean_up_spaces_ ? clean_up_tokenization(std::move(text)) : text;
}

std::string TokenizerBase::fingerprint() const {
  std::string s = kind() + "|" + model_fingerprint() + "|" + std::to_string(size_);
  for (const auto& [id, t] : added_)
    s += "|" + std::to_string(id) + ":" + t.content + ":" + std::to_string(t.special) +
         std::to_string(t.lstrip) + std::to_string(t.rstrip) + std::to_string(t.single_word);
  for (int64_t id : special_ids_) s += "|s" + std::to_string(id);
  for (int64_t id : additional_special_) s += "|a" + std::to_string(id);
  s += "|" + std::to_string(add_bos_) + std::to_string(add_eos_) +
       std::to_string(spaces_between_special_) + std::to_string(clean_up_spaces_) + "|" +
       std::to_string(bos_.value_or(-1)) + "," + std::to_string(eos_.value_or(-1));
  return fnv1a_hex(s);
}

}  // namespace tok

// ---- public entry points ----

namespace {
const char* const kSentencePieceFiles[] = {"tokenizer.model", "spiece.model"};

using tok::ends_with;

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

namespace {
bool has_tokenizer_files(const std::string& dir) {
  for (const char* f : kSentencePieceFiles)
    if (file_exists(dir + "/" + f)) return true;
  return file_exists(dir + "/tokenizer.json") ||
         (file_exists(dir + "/vocab.json") && file_exists(dir + "/merges.txt"));
}
}  // namespace

bool has_tokenizer(const std::string& dir) { return has_tokenizer_files(dir) || find_gguf(dir); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir, const TokenizerOptions& options) {
  std::string gguf;
  if (!has_tokenizer_files(dir) && find_gguf(dir, &gguf)) {
    const GgufFile f(gguf);
    const std::string model = f.get_string("tokenizer.ggml.model");
    if (model == "llama") return tok::load_sentencepiece_gguf(f, options);
    SPECDEC_CHECK(model == "gpt2", gguf, ": tokenizer.ggml.model '", model,
                  "' is not supported (supported: gpt2 = byte-level BPE, llama = SentencePiece)");
    return tok::load_bpe_gguf(f, options);
  }
  for (const char* f : kSentencePieceFiles)
    if (file_exists(dir + "/" + f)) return load_tokenizer_file(dir + "/" + f, options);
  if (file_exists(dir + "/tokenizer.json"))
    return load_tokenizer_file(dir + "/tokenizer.json", options);
  if (file_exists(dir + "/vocab.json") && file_exists(dir + "/merges.txt"))
    return load_tokenizer_file(dir + "/vocab.json", options);
  SPECDEC_CHECK(path_exists(dir), dir, ": no such file or folder");
  throw Error(dir +
              ": no tokenizer (a GGUF file, or a folder with a GGUF, tokenizer.model, "
              "spiece.model, tokenizer.json, or vocab.json + merges.txt)");
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path,
                                               const TokenizerOptions& options) {
  SPECDEC_CHECK(file_exists(path), path, ": no such file");
  try {
    const tok::TokenizerConfig cfg = tok::read_tokenizer_config(parent_dir(path));
    if (ends_with(path, ".model")) return tok::load_sentencepiece(path, cfg, options);
    if (ends_with(path, "/vocab.json") || ends_with(path, "/merges.txt") || path == "vocab.json" ||
        path == "merges.txt")
      return tok::load_bpe_vocab_merges(parent_dir(path), cfg, options);
    if (ends_with(path, ".json")) return tok::load_bpe_json(path, cfg, options);
  } catch (const nlohmann::json::exception& e) {  // a configuration value of the wrong JSON type
    throw Error(path + ": " + detail::json_message(e));
  }
  throw Error(path +
              ": unknown tokenizer file (expected a SentencePiece .model or a tokenizer.json)");
}

void require_same_tokenizer(const Tokenizer& target, const Tokenizer& draft) {
  if (target.fingerprint() == draft.fingerprint()) return;
  std::string why;
  if (target.kind() != draft.kind()) {
    why = "the target's is " + target.kind() + ", the draft's " + draft.kind();
  } else if (target.size() != draft.size()) {
    why = "the target's has " + std::to_string(target.size()) + " tokens, the draft's " +
          std::to_string(draft.size());
  } else {
    for (int64_t id = 0; id < target.size() && why.empty(); ++id) {
      std::string a, b;
      try {
        a = target.token(id);
      } catch (const Error&) {
      }
      try {
        b = draft.token(id);
      } catch (const Error&) {
      }
      if (a != b)
        why = "token " + std::to_string(id) + " is '" + a + "' in the target, '" + b +
              "' in the draft";
    }
    if (why.empty()) why = "same vocabulary, but different merges, special tokens or settings";
  }
  throw Error("draft and target tokenizers differ: " + why +
              "; assisted generation needs the draft to share the target's tokenizer");
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(tokenizer), skip_special_(skip_special_tokens) {}

namespace {

// What a later token can still change at the end of decoded text: an incomplete UTF-8 sequence
// (decoded as U+FFFD), trailing spaces (a later token merges one: clean_up_tokenization_spaces
// turns " ." into ".", and SentencePiece's lone "▁" is no text until a token follows it), and the
// start of one of Hugging Face's clean-up patterns (" '" + " b" becomes "'b"). A line break is
// final: a client that prints lines sees each one end when it does.
size_t settled_length(const std::string& text) {
  std::string t = text;
  for (bool changed = true; changed;) {
    changed = false;
    if (ends_with(t, "\xEF\xBF\xBD")) t.resize(t.size() - 3), changed = true;
    const size_t spaces = t.size() - (t.find_last_not_of(' ') + 1);
    if (spaces > 0) t.resize(t.size() - spaces), changed = true;
    for (const char* tail : {" '", " n", " n'", " 'v", " 'r"})
      if (ends_with(t, tail)) t.resize(t.size() - std::strlen(tail)), changed = true;
  }
  return t.size();
}

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

std::string StreamDecoder::window_text() const {
  // The text of ids_[settled_:], decoded with the token before it (not a skipped special token) as
  // context so that a leading space is kept, and that context's own text cut off.
  size_t anchor = settled_;
  while (anchor > 0) {
    --anchor;
    if (!(skip_special_ && tok_.is_special(ids_[anchor]))) break;
  }
  const std::vector<int64_t> head(ids_.begin() + anchor, ids_.begin() + settled_);
  const std::vector<int64_t> all(ids_.begin() + anchor, ids_.end());
  const std::string head_text = tok_.decode(head, skip_special_),
                    text = tok_.decode(all, skip_special_);
  if (text.compare(0, head_text.size(), head_text) == 0) return text.substr(head_text.size());
  // The context decodes differently inside the longer text: fall back to the whole decode.
  const std::vector<int64_t> before(ids_.begin(), ids_.begin() + settled_);
  const std::string full = tok_.decode(ids_, skip_special_),
                    prior = tok_.decode(before, skip_special_);
  return full.substr(std::min(full.size(), common_prefix(full, prior)));
}

std::string StreamDecoder::emit(const std::string& ready) {
  // `ready` extends what this window has shown (the usual case), or, when a decoder changed text
  // already shown, goes on after the part both agree on: nothing is lost, though a changed
  // character may show twice.
  const size_t keep = common_prefix(ready, emitted_);
  if (ready.size() <= keep) return "";  // nothing new (or less than shown: held back again)
  emitted_ = ready;
  return ready.substr(keep);
}

std::string StreamDecoder::push(const std::vector<int64_t>& ids) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  const std::string text = window_text();
  const size_t n = settled_length(text);
  std::string out = emit(text.substr(0, n));
  pending_ = text.compare(0, emitted_.size(), emitted_) == 0 ? text.substr(emitted_.size()) : "";
  // Everything shown (and shown at all: a token whose text is still empty, like T5's lone "▁",
  // may yet turn into a space): start the next window here.
  if (!text.empty() && n == text.size() && emitted_ == text) {
    settled_ = ids_.size();
    emitted_.clear();
  }
  return out;
}

std::string StreamDecoder::finish() {
  const std::string out = emit(window_text());
  ids_.clear();
  emitted_.clear();
  pending_.clear();
  settled_ = 0;
  return out;
}

}  // namespace specdec
