// libspecdec_spm: the only code that calls SentencePiece (see spm_shim.h for why).
#include "spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#define SHIM_API extern "C" __attribute__((visibility("default")))

// Exported by libsentencepiece, not declared in its public headers.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

struct specdec_spm {
  sentencepiece::SentencePieceProcessor proc;
};

namespace {

// SentencePiece logs to std::cerr. Under RTLD_DEEPBIND it binds std::cerr to libstdc++'s own copy,
// which is not the initialised one when the program has a copy relocation of std::cerr: writing to
// it crashes. So the shim keeps SentencePiece quiet (errors still come back as statuses).
struct Quiet {
  Quiet() { sentencepiece::logging::SetMinLogLevel(4); }
} const quiet;

void set_error(char** err, const std::string& msg) {
  if (!err) return;
  *err = static_cast<char*>(std::malloc(msg.size() + 1));
  if (*err) std::memcpy(*err, msg.c_str(), msg.size() + 1);
}

// Copies `n` elements into a malloc'd buffer (one spare element, so it is never empty and a string
// gets its terminating 0): 0, or -1 with *err set.
template <typename T>
int copy_out(const T* data, size_t n, T** out, char** err) {
  *out = static_cast<T*>(std::calloc(n + 1, sizeof(T)));
  if (!*out) {
    set_error(err, "out of memory");
    return -1;
  }
  if (n) std::memcpy(*out, data, sizeof(T) * n);
  return 0;
}

// Minimal protobuf wire-format reader: enough to find ModelProto.normalizer_spec (field 3) and
// set its add_dummy_prefix (field 3, bool) without the generated protobuf classes, which Debian
// does not ship.
bool read_varint(const std::string& b, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= b.size()) return false;
    const uint8_t c = static_cast<uint8_t>(b[pos++]);
    v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

void write_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Returns false when `b` is not a well-formed protobuf message.
bool set_add_dummy_prefix(const std::string& b, bool value, std::string& out) {
  const std::string extra{static_cast<char>(0x18), static_cast<char>(value ? 1 : 0)};
  size_t pos = 0;
  bool done = false;
  out.clear();
  while (pos < b.size()) {
    const size_t field_start = pos;
    uint64_t tag = 0;
    if (!read_varint(b, pos, tag)) return false;
    const uint64_t field = tag >> 3, type = tag & 7;
    uint64_t len = 0;
    switch (type) {
      case 0:
        if (!read_varint(b, pos, len)) return false;
        break;
      case 1: pos += 8; break;
      case 5: pos += 4; break;
      case 2: {
        if (!read_varint(b, pos, len) || len > b.size() - pos) return false;
        if (field == 3 && !done) {
          // Protobuf keeps the last value of a repeated scalar field: appending wins.
          write_varint(out, tag);
          write_varint(out, len + extra.size());
          out.append(b, pos, len);
          out += extra;
          pos += len;
          done = true;
          continue;
        }
        pos += len;
        break;
      }
      default: return false;
    }
    if (pos > b.size()) return false;
    out.append(b, field_start, pos - field_start);
  }
  if (!done) {
    out.push_back(0x1a);
    write_varint(out, extra.size());
    out += extra;
  }
  return true;
}

// Runs `body`; an exception (SentencePiece's darts_clone throws on some malformed models) becomes
// *err and `failure`: no exception may cross the C interface.
template <typename R, typename F>
R guarded(char** err, R failure, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    set_error(err, std::string("SentencePiece failed: ") + e.what());
  } catch (...) {
    set_error(err, "SentencePiece failed (unknown exception)");
  }
  return failure;
}

}  // namespace

SHIM_API specdec_spm* specdec_spm_load(const char* data, size_t size, int add_dummy_prefix,
                                       char** err) {
  return guarded<specdec_spm*>(err, nullptr, [&]() -> specdec_spm* {
    std::string bytes(data, size);
    if (add_dummy_prefix >= 0) {
      std::string patched;
      if (!set_add_dummy_prefix(bytes, add_dummy_prefix != 0, patched)) {
        set_error(err, "not a SentencePiece model (malformed or truncated protobuf)");
        return nullptr;
      }
      bytes.swap(patched);
    }
    auto sp = std::make_unique<specdec_spm>();
    const auto status = sp->proc.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      set_error(err, "not a SentencePiece model (" + status.ToString() + ")");
      return nullptr;
    }
    if (sp->proc.GetPieceSize() <= 0) {
      set_error(err, "SentencePiece model has no pieces");
      return nullptr;
    }
    return sp.release();
  });
}

SHIM_API void specdec_spm_free(specdec_spm* sp) { delete sp; }

SHIM_API int specdec_spm_size(const specdec_spm* sp) { return sp->proc.GetPieceSize(); }

SHIM_API const char* specdec_spm_id_to_piece(const specdec_spm* sp, int id, size_t* len) {
  if (id < 0 || id >= sp->proc.GetPieceSize()) return nullptr;
  const std::string& p = sp->proc.IdToPiece(id);
  *len = p.size();
  return p.data();
}

SHIM_API int specdec_spm_piece_to_id(const specdec_spm* sp, const char* piece, size_t len) {
  return sp->proc.PieceToId(std::string(piece, len));
}

SHIM_API int specdec_spm_piece_type(const specdec_spm* sp, int id) {
  if (id < 0 || id >= sp->proc.GetPieceSize()) return -1;
  if (sp->proc.IsUnknown(id)) return 1;
  if (sp->proc.IsControl(id)) return 2;
  if (sp->proc.IsByte(id)) return 3;
  if (sp->proc.IsUnused(id)) return 4;
  return 0;
}

SHIM_API void specdec_spm_special_ids(const specdec_spm* sp, int out[4]) {
  out[0] = sp->proc.unk_id();
  out[1] = sp->proc.bos_id();
  out[2] = sp->proc.eos_id();
  out[3] = sp->proc.pad_id();
}

SHIM_API int specdec_spm_encode(const specdec_spm* sp, const char* text, size_t len, int** ids,
                                size_t* n, char** err) {
  return guarded<int>(err, -1, [&]() -> int {
    std::vector<int> out;
    const auto status = sp->proc.Encode(std::string(text, len), &out);
    if (!status.ok()) {
      set_error(err, status.ToString());
      return -1;
    }
    *n = out.size();
    return copy_out(out.data(), out.size(), ids, err);
  });
}

SHIM_API int specdec_spm_decode_pieces(const specdec_spm* sp, const char* const* pieces,
                                       const size_t* lens, size_t n, char** out, size_t* out_len,
                                       char** err) {
  return guarded<int>(err, -1, [&]() -> int {
    std::vector<std::string> ps;
    ps.reserve(n);
    for (size_t i = 0; i < n; ++i) ps.emplace_back(pieces[i], lens[i]);
    std::string text;
    const auto status = sp->proc.Decode(ps, &text);
    if (!status.ok()) {
      set_error(err, status.ToString());
      return -1;
    }
    *out_len = text.size();
    return copy_out(text.data(), text.size(), out, err);
  });
}

SHIM_API int specdec_spm_train(const char* args, char** err) {
  return guarded<int>(err, -1, [&]() -> int {
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    if (!status.ok()) {
      set_error(err, status.ToString());
      return -1;
    }
    return 0;
  });
}

SHIM_API void specdec_spm_free_buffer(void* p) { std::free(p); }
