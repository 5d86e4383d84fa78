// SentencePiece tokenizers (Llama and T5 style), with Hugging Face's slow LlamaTokenizer /
// T5Tokenizer semantics: `legacy`, `add_prefix_space`, special tokens, BOS/EOS. Every call into
// SentencePiece goes through libspecdec_spm, opened with dlopen (see spm_shim.h).
#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <memory>
#include <mutex>
#include <string>

#include "specdec/error.hpp"
#include "specdec/gguf.hpp"
#include "specdec/limits.hpp"
#include "tokenizers/spm_shim.h"
#include "tokenizers/tokenizer_base.hpp"
#include "util.hpp"

#ifndef SPECDEC_SPM_INSTALL_PATH
#define SPECDEC_SPM_INSTALL_PATH ""
#endif
#ifndef SPECDEC_SPM_BUILD_PATH
#define SPECDEC_SPM_BUILD_PATH ""
#endif

namespace specdec {
namespace tok {
namespace {

const char* const kShimName = "libspecdec_spm.so";
const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary

struct Shim {
  decltype(&specdec_spm_load) load;
  decltype(&specdec_spm_free) free_model;
  decltype(&specdec_spm_size) size;
  decltype(&specdec_spm_id_to_piece) id_to_piece;
  decltype(&specdec_spm_piece_to_id) piece_to_id;
  decltype(&specdec_spm_piece_type) piece_type;
  decltype(&specdec_spm_special_ids) special_ids;
  decltype(&specdec_spm_encode) encode;
  decltype(&specdec_spm_decode_pieces) decode_pieces;
  decltype(&specdec_spm_train) train;
  decltype(&specdec_spm_free_buffer) free_buffer;
};

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string p(buf, n);
  return p.substr(0, p.find_last_of('/'));
}

// Where the shim may be: $SPECDEC_SPM_LIBRARY, beside the program or in ../lib (relocated
// installs), the loader's own search path (LD_LIBRARY_PATH, then the program's run path, which
// find_package(specdec) points at the install it found), the configured install prefix, and last
// the build tree (its programs have no run path to it).
const Shim& shim() {
  static std::once_flag once;
  static Shim s;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("SPECDEC_SPM_LIBRARY"); env && *env)
      candidates.push_back(env);
    const std::string exe = exe_dir();
    if (!exe.empty()) {
      candidates.push_back(exe + "/" + kShimName);
      candidates.push_back(exe + "/../lib/" + kShimName);
    }
    candidates.push_back(kShimName);
    for (const char* p : {SPECDEC_SPM_INSTALL_PATH, SPECDEC_SPM_BUILD_PATH})
      if (*p) candidates.push_back(p);
    void* h = nullptr;
    std::string errors;
    for (const std::string& c : candidates) {
      if (c.find('/') != std::string::npos && !file_exists(c)) continue;
      h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h) {
        const auto version = reinterpret_cast<int (*)()>(dlsym(h, "specdec_spm_interface"));
        if (version && version() == SPECDEC_SPM_INTERFACE) break;
        errors += "\n  " + c + ": built for another version of specdec";
        dlclose(h);
        h = nullptr;
        continue;
      }
      const char* e = dlerror();
      errors += "\n  " + c + ": " + (e ? e : "?");
    }
    if (!h) {
      failure = std::string("cannot load ") + kShimName +
                " (the SentencePiece adapter; set SPECDEC_SPM_LIBRARY to its path)" + errors;
      return;
    }
    const auto sym = [&](const char* name) {
      void* f = dlsym(h, name);
      if (!f) failure = std::string(kShimName) + ": missing symbol " + name;
      return f;
    };
#define SPECDEC_SYM(field, name) s.field = reinterpret_cast<decltype(s.field)>(sym(#name))
    SPECDEC_SYM(load, specdec_spm_load);
    SPECDEC_SYM(free_model, specdec_spm_free);
    SPECDEC_SYM(size, specdec_spm_size);
    SPECDEC_SYM(id_to_piece, specdec_spm_id_to_piece);
    SPECDEC_SYM(piece_to_id, specdec_spm_piece_to_id);
    SPECDEC_SYM(piece_type, specdec_spm_piece_type);
    SPECDEC_SYM(special_ids, specdec_spm_special_ids);
    SPECDEC_SYM(encode, specdec_spm_encode);
    SPECDEC_SYM(decode_pieces, specdec_spm_decode_pieces);
    SPECDEC_SYM(train, specdec_spm_train);
    SPECDEC_SYM(free_buffer, specdec_spm_free_buffer);
#undef SPECDEC_SYM
  });
  if (!failure.empty()) throw Error(failure);
  return s;
}

[[noreturn]] void shim_error(const Shim& s, const std::string& what, char* err) {
  std::string msg = what + ": " + (err ? err : "unknown error");
  s.free_buffer(err);
  throw Error(msg);
}

class SentencePieceTokenizer final : public TokenizerBase {
 public:
  // `bytes`: the serialized model (the file's content); `path` names it in errors.
  SentencePieceTokenizer(const std::string& path, std::string bytes, const TokenizerConfig& cfg,
                         const TokenizerOptions& o) {
    source_ = path;
    const std::string file = path.substr(path.find_last_of('/') + 1);
    t5_ = cfg.tokenizer_class.rfind("T5", 0) == 0 ||
          (cfg.tokenizer_class.empty() && file == "spiece.model");
    legacy_ = o.legacy.value_or(cfg.get_bool("legacy").value_or(true));
    add_prefix_space_ =
        o.add_prefix_space.value_or(cfg.get_bool("add_prefix_space").value_or(true));
    add_bos_ = o.add_bos_token.value_or(cfg.get_bool("add_bos_token").value_or(!t5_));
    add_eos_ = o.add_eos_token.value_or(cfg.get_bool("add_eos_token").value_or(t5_));

    const Shim& s = shim();
    bytes_ = std::move(bytes);
    char* err = nullptr;
    // Non-legacy mode loads the model with its dummy prefix turned off, as Hugging Face does.
    sp_ = s.load(bytes_.data(), bytes_.size(), legacy_ ? -1 : 0, &err);
    if (!sp_) shim_error(s, path, err);
    base_size_ = size_ = s.size(sp_);
    int ids[4];
    s.special_ids(sp_, ids);
    // The model's control/unknown pieces are the default special tokens (<unk>, <s>, </s>, <pad>).
    const auto set = [&](std::optional<int64_t>& slot, int id) {
      if (id >= 0 && id < base_size_) {
        slot = id;
        add_token({base_token(id), id, true});
      }
    };
    set(unk_, ids[0]);
    if (!t5_) set(bos_, ids[1]);
    set(eos_, ids[2]);
    if (t5_) set(pad_, ids[3]);
    if (t5_) {
      // T5Tokenizer's sentinels: <extra_id_0> is the last id.
      const auto it = cfg.json.find("extra_ids");
      const int64_t extra = it == cfg.json.end()      ? 100
                            : it->is_number_integer() ? it->get<int64_t>()
                                                      : -1;
      const int64_t max_extra = limits().max_extra_ids;
      SPECDEC_CHECK(extra >= 0 && extra <= max_extra, path,
                    ": tokenizer_config.json: extra_ids must be an integer in [0, ", max_extra,
                    "] (Limits::max_extra_ids)");
      for (int64_t i = 0; i < extra; ++i) {
        AddedToken t{"<extra_id_" + std::to_string(i) + ">", base_size_ + extra - 1 - i, true, true,
                     true};
        add_token(t);
        additional_special_.insert(t.id);
      }
    }
    apply_config(cfg);
    unk_text_ = unk_ ? base_token(*unk_) : "<unk>";
    std::vector<int64_t> unk_ids;
    sp_encode(unk_text_, unk_ids);
    unk_len_ = unk_ids.size();
    space_id_ = s.piece_to_id(sp_, kSpace.data(), kSpace.size());
  }
  // GGUF pieces typed control (3) become special added tokens and those typed user-defined (4)
  // plain ones: split out of the text before SentencePiece sees it (so Gemma's pieces of raw
  // spaces and newlines match), decoded as written; as Hugging Face's converted GGUF tokenizers
  // and llama.cpp do.
  // SentencePiece matches user-defined pieces after its normalizer made every space a "▁", so a
  // "▁" typed in the text is a space to them too ("▁▁" is Gemma's two-space piece, as
  // SentencePiece and Hugging Face's converted tokenizer give): the text's "▁" become spaces
  // before the split.
  // `joined`: decode as GemmaTokenizer does (tokens joined as they are: no space around special
  // tokens), not as LlamaTokenizer.
  void add_typed_pieces(const std::vector<int64_t>& types, bool joined) {
    spaces_between_special_ = !joined;
    for (size_t i = 0; i < types.size(); ++i) {
      const auto id = static_cast<int64_t>(i);
      if ((types[i] == 3 || types[i] == 4) && !added(id))
        add_token({base_token(id), id, types[i] == 3});
      typed_spaces_ = typed_spaces_ || types[i] == 4;
    }
  }
  ~SentencePieceTokenizer() override {
    if (sp_) shim().free_model(sp_);
  }

  std::string kind() const override { return "sentencepiece"; }

 protected:
  void tokenize(const std::string& text, std::vector<int64_t>& out) const override {
    if (legacy_ || text.empty())
      return split_and_tokenize(typed_spaces_ ? replace_all(text, kSpace, " ") : text, out);
    std::string t = replace_all(text, kSpace, " ");
    if (add_prefix_space_) t = kSpace + t;
    // Drop a lone leading "▁" before a special token ("<s>..." must not become "▁", "<s>").
    const std::vector<Segment> segs = split_added(t);
    for (size_t k = 0; k < segs.size(); ++k) {
      if (segs[k].added_id >= 0) {
        out.push_back(segs[k].added_id);
        continue;
      }
      const size_t first = out.size();
      tokenize_segment(segs[k].text, out);
      if (k == 0 && segs.size() > 1 && out.size() == first + 1 && out[first] == space_id_ &&
          is_special(segs[1].added_id))
        out.pop_back();
    }
  }

  void tokenize_segment(const std::string& text, std::vector<int64_t>& out) const override {
    if (legacy_ || !(starts_with(text, kSpace) || starts_with(text, " ")))
      return sp_encode(text, out);
    // Non-legacy: encode "<unk>" + text and drop the <unk> pieces, so that SentencePiece does not
    // treat the leading space as the start of the text.
    std::vector<int64_t> ids;
    sp_encode(unk_text_ + text, ids);
    out.insert(out.end(), ids.size() >= unk_len_ ? ids.begin() + unk_len_ : ids.begin(), ids.end());
  }

  std::string tokens_to_string(const std::vector<int64_t>& ids) const override {
    // LlamaTokenizer / T5Tokenizer.convert_tokens_to_string.
    std::vector<std::string> tokens;
    for (int64_t id : ids) tokens.push_back(token(id));
    if (!tokens.empty() && starts_with(tokens[0], kSpace) && add_prefix_space_)
      tokens[0].erase(0, kSpace.size());
    std::string out;
    std::vector<std::string> run;
    bool prev_special = false;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (is_special(ids[i])) {
        // (LlamaTokenizer's space before a special token; not GemmaTokenizer's.)
        if (!prev_special && (t5_ || (i != 0 && legacy_ && spaces_between_special_))) out += " ";
        out += sp_decode(run) + tokens[i];
        prev_special = true;
        run.clear();
      } else {
        if (!t5_ && prev_special && i == 1 && add_prefix_space_ && !starts_with(tokens[i], kSpace))
          out += " ";
        run.push_back(tokens[i]);
        prev_special = false;
      }
    }
    out += sp_decode(run);
    return t5_ ? strip(out) : out;
  }

  std::string base_token(int64_t id) const override {
    size_t len = 0;
    const char* p = shim().id_to_piece(sp_, static_cast<int>(id), &len);
    SPECDEC_CHECK(p, source_, ": no piece with id ", id);
    return std::string(p, len);
  }

  std::string base_token_bytes(int64_t id) const override {
    const std::string p = base_token(id);
    // Byte fallback's pieces <0x00> ... <0xFF>
    if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(p[3])) &&
        std::isxdigit(static_cast<unsigned char>(p[4])))
      return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
    return replace_all(p, kSpace, " ");
  }

  std::vector<int64_t> add_special(std::vector<int64_t> ids) const override {
    if (!t5_) return TokenizerBase::add_special(std::move(ids));
    // T5Tokenizer: EOS unless the ids already end with it; no BOS.
    if (add_bos_ && bos_) ids.insert(ids.begin(), *bos_);
    if (add_eos_ && eos_ && (ids.empty() || ids.back() != *eos_)) ids.push_back(*eos_);
    return ids;
  }

  std::string model_fingerprint() const override {
    return fnv1a_hex(bytes_) + (t5_ ? "t5" : "llama") + std::to_string(legacy_) +
           std::to_string(add_prefix_space_);
  }

 private:
  static std::string strip(const std::string& s) { return lstrip_ws(rstrip_ws(s)); }

  void sp_encode(const std::string& text, std::vector<int64_t>& out) const {
    const Shim& s = shim();
    int* ids = nullptr;
    size_t n = 0;
    char* err = nullptr;
    if (s.encode(sp_, text.data(), text.size(), &ids, &n, &err) != 0) shim_error(s, source_, err);
    out.insert(out.end(), ids, ids + n);
    s.free_buffer(ids);
  }

  std::string sp_decode(const std::vector<std::string>& pieces) const {
    if (pieces.empty()) return "";
    const Shim& s = shim();
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& p : pieces) ptrs.push_back(p.data()), lens.push_back(p.size());
    char* out = nullptr;
    size_t len = 0;
    char* err = nullptr;
    if (s.decode_pieces(sp_, ptrs.data(), lens.data(), pieces.size(), &out, &len, &err) != 0)
      shim_error(s, source_, err);
    std::string text(out, len);
    s.free_buffer(out);
    return text;
  }

  specdec_spm* sp_ = nullptr;
  std::string bytes_;
  bool t5_ = false, legacy_ = true, add_prefix_space_ = true;
  bool typed_spaces_ = false;  // user-defined pieces were split out of the text (add_typed_pieces)
  std::string unk_text_;
  size_t unk_len_ = 0;
  int64_t space_id_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path,
                                              const TokenizerConfig& cfg,
                                              const TokenizerOptions& options) {
  return std::make_unique<SentencePieceTokenizer>(model_path, read_text_file(model_path), cfg,
                                                  options);
}

namespace {

// Protocol-buffer wire format, just what a SentencePiece ModelProto needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) out += static_cast<char>((v & 0x7F) | 0x80), v >>= 7;
  out += static_cast<char>(v);
}
void put_key(std::string& out, int field, int wire) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire);
}
void put_int(std::string& out, int field,
             int64_t v) {  // int32 / enum / bool (negatives sign-extended)
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, int field, const std::string& v) {
  put_key(out, field, 2);
  put_varint(out, v.size());
  out += v;
}
void put_float(std::string& out, int field, float v) {
  put_key(out, field, 5);
  out.append(reinterpret_cast<const char*>(&v), 4);
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_gguf(const GgufFile& f,
                                                   const TokenizerOptions& options) {
  // tokenizer.ggml.model "llama": a SentencePiece BPE vocabulary with scores and piece types (the
  // types are SentencePiece's own: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6
  // byte). Rebuilt here as the ModelProto that llama.cpp's converter read it from: identity
  // normalizer, dummy prefix from tokenizer.ggml.add_space_prefix, byte fallback when byte pieces
  // exist.
  const std::string& path = f.path();
  const std::vector<std::string> tokens = f.get_strings("tokenizer.ggml.tokens");
  SPECDEC_CHECK(!tokens.empty(), path, ": tokenizer.ggml.tokens is empty");
  const std::vector<double> scores = f.has("tokenizer.ggml.scores")
                                         ? f.get_floats("tokenizer.ggml.scores")
                                         : std::vector<double>(tokens.size(), 0.0);
  const std::vector<int64_t> types = f.has("tokenizer.ggml.token_type")
                                         ? f.get_ints("tokenizer.ggml.token_type")
                                         : std::vector<int64_t>(tokens.size(), 1);
  SPECDEC_CHECK(scores.size() == tokens.size() && types.size() == tokens.size(), path,
                ": tokenizer.ggml.scores / token_type do not have one entry per token (",
                tokens.size(), ")");
  const auto id = [&](const char* key, int64_t fallback) {
    const int64_t v = f.find_int(key).value_or(fallback);
    SPECDEC_CHECK(v >= -1 && v < static_cast<int64_t>(tokens.size()), path, ": ", key, " ", v,
                  " is outside the vocabulary");
    return v;
  };
  // SentencePiece needs its unknown piece typed as such; Gemma's GGUF files type <unk> as a
  // control token (and none as unknown).
  const int64_t unk = id("tokenizer.ggml.unknown_token_id", 0);
  const bool typed_unk = std::find(types.begin(), types.end(), 2) != types.end();
  std::string proto;
  bool has_bytes = false;
  for (size_t i = 0; i < tokens.size(); ++i) {
    SPECDEC_CHECK(types[i] >= 1 && types[i] <= 6, path, ": tokenizer.ggml.token_type[", i, "] is ",
                  types[i], " (expected 1 to 6)");
    has_bytes |= types[i] == 6;
    std::string piece;
    put_bytes(piece, 1, tokens[i]);
    put_float(piece, 2, static_cast<float>(scores[i]));
    put_int(piece, 3, !typed_unk && static_cast<int64_t>(i) == unk ? 2 : types[i]);
    put_bytes(proto, 1, piece);
  }
  std::string trainer;
  put_int(trainer, 3, 2);  // model_type BPE
  put_int(trainer, 4, static_cast<int64_t>(tokens.size()));
  put_int(trainer, 35, has_bytes);  // byte_fallback
  // The special ids, and their pieces' text: SentencePiece finds BOS, EOS and PAD by the piece
  // names (default <s>, </s>, <pad>; Gemma's are <bos>, <eos>, <pad>).
  const int64_t special[] = {unk, id("tokenizer.ggml.bos_token_id", 1),
                             id("tokenizer.ggml.eos_token_id", 2),
                             id("tokenizer.ggml.padding_token_id", -1)};
  for (int k = 0; k < 4; ++k) {
    put_int(trainer, 40 + k, special[k]);
    if (special[k] >= 0) put_bytes(trainer, 45 + k, tokens[static_cast<size_t>(special[k])]);
  }
  put_bytes(proto, 2, trainer);
  std::string normalizer;
  put_bytes(normalizer, 1, "identity");
  put_int(normalizer, 3, f.find_bool("tokenizer.ggml.add_space_prefix").value_or(true));
  put_int(normalizer, 4, 0);  // remove_extra_whitespaces
  put_int(normalizer, 5, 1);  // escape_whitespaces
  put_bytes(proto, 3, normalizer);
  TokenizerConfig cfg;
  TokenizerOptions o = options;
  // Decoding drops the first piece's "▁" only where encoding added one.
  if (!o.add_prefix_space)
    o.add_prefix_space = f.find_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  if (!o.add_bos_token)
    o.add_bos_token = f.find_bool("tokenizer.ggml.add_bos_token").value_or(true);
  if (!o.add_eos_token)
    o.add_eos_token = f.find_bool("tokenizer.ggml.add_eos_token").value_or(false);
  auto t = std::make_unique<SentencePieceTokenizer>(path, std::move(proto), cfg, o);
  // GemmaTokenizer joins decoded tokens; LlamaTokenizer does not.
  const std::string arch = f.find_string("general.architecture").value_or("");
  t->add_typed_pieces(types, /*joined=*/arch.rfind("gemma", 0) == 0);
  return t;
}

}  // namespace tok

void train_sentencepiece(const std::string& args) {
  const tok::Shim& s = tok::shim();
  char* err = nullptr;
  if (s.train(args.c_str(), &err) != 0) tok::shim_error(s, "SentencePiece training failed", err);
}

}  // namespace specdec
