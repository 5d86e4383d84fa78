// Byte-level BPE's loaders: tokenizer.json, vocab.json + merges.txt, and GGUF metadata.
#include <memory>

#include "json.hpp"
#include "specdec/error.hpp"
#include "specdec/gguf.hpp"
#include "tokenizers/bpe.hpp"
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

json parse_json_file(const std::string& path) {
  try {
    return detail::parse_json_bounded(read_text_file(path), path);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON: " + detail::json_message(e));
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
    t->fuse_unk_ =
        m.contains("fuse_unk") && m["fuse_unk"].is_boolean() && m["fuse_unk"].get<bool>();
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
    throw Error(path + ": malformed tokenizer.json: " + detail::json_message(e));
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
  // transformers' GGUF converter: a byte outside the vocabulary is unk_token, a run of them one.
  if (auto unk = f.find_int("tokenizer.ggml.unknown_token_id")) {
    t->model_unk_ = *unk;
    t->fuse_unk_ = true;
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
