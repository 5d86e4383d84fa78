// libspecdec_spm: the only code that calls SentencePiece (see spm_shim.h for why).
#include "spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
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

// Minimal protobuf wire-format reader, enough for what the shim checks and patches in a
// ModelProto without the generated protobuf classes (Debian does not ship them).
bool read_varint(std::string_view b, size_t& pos, uint64_t& v) {
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

struct Field {
  uint64_t number = 0, wire_type = 0;
  std::string_view bytes;    // the whole field: tag, length and payload
  std::string_view payload;  // a length-delimited field's payload (wire type 2), else empty
};

// Calls f(field) for every field of the message `b`, in order; false when `b` is not a
// well-formed protobuf message (groups, wire types 3 and 4, count as malformed).
template <typename F>
bool for_each_field(std::string_view b, F&& f) {
  size_t pos = 0;
  while (pos < b.size()) {
    const size_t start = pos;
    Field field;
    uint64_t tag = 0, len = 0;
    if (!read_varint(b, pos, tag)) return false;
    field.number = tag >> 3;
    field.wire_type = tag & 7;
    switch (field.wire_type) {
      case 0:
        if (!read_varint(b, pos, len)) return false;
        break;
      case 1:
        len = 8;
        break;
      case 5:
        len = 4;
        break;
      case 2:
        if (!read_varint(b, pos, len)) return false;
        break;
      default:
        return false;
    }
    if (field.wire_type != 0) {
      if (len > b.size() - pos) return false;
      if (field.wire_type == 2) field.payload = b.substr(pos, len);
      pos += len;
    }
    field.bytes = b.substr(start, pos - start);
    f(field);
  }
  return true;
}

// ModelProto fields holding a NormalizerSpec: normalizer_spec (3) and denormalizer_spec (5).
constexpr uint64_t kNormalizerSpec = 3, kDenormalizerSpec = 5;
// NormalizerSpec fields.
constexpr uint64_t kPrecompiledCharsmap = 2, kAddDummyPrefix = 3;

// Returns false when `b` is not a well-formed protobuf message. Protobuf merges repeated
// occurrences of a message field and keeps the last value of a scalar: an occurrence appended
// to the first normalizer_spec overrides its add_dummy_prefix.
bool set_add_dummy_prefix(std::string_view b, bool value, std::string& out) {
  const std::string extra{static_cast<char>(kAddDummyPrefix << 3),
                          static_cast<char>(value ? 1 : 0)};
  bool done = false;
  out.clear();
  const bool ok = for_each_field(b, [&](const Field& f) {
    if (f.number == kNormalizerSpec && f.wire_type == 2 && !done) {
      write_varint(out, (kNormalizerSpec << 3) | 2);
      write_varint(out, f.payload.size() + extra.size());
      out.append(f.payload);
      out += extra;
      done = true;
    } else {
      out.append(f.bytes);
    }
  });
  if (!ok) return false;
  if (!done) {
    out.push_back(static_cast<char>((kNormalizerSpec << 3) | 2));
    write_varint(out, extra.size());
    out += extra;
  }
  return true;
}

// A precompiled charsmap is <trie size: uint32 LE><darts-clone double array><NUL-separated
// replacements>. SentencePiece hands the array to its normalizer unchecked and walks it on every
// encode (normalizer_spec) and decode (denormalizer_spec): a malformed one reads out of bounds
// (found by tests/fuzz/fuzz_sentencepiece.cpp). This walks every state the normalizer can reach
// on any input, as darts-clone's commonPrefixSearch does, and says whether every read stays in
// the array, every value points into the replacements, no path matches more than the 32 rules
// the normalizer keeps on its stack, and the rules form no cycle (a built trie is a tree).
// A blob of 4 bytes or less is left to SentencePiece, which refuses it.
bool charsmap_is_safe(std::string_view blob) {
  if (blob.size() <= 4) return true;
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian, as the x86 and aarch64 hosts are
  if (trie_bytes > blob.size() - 4) return false;
  const size_t n = trie_bytes / 4;
  if (n == 0) return false;
  std::vector<uint32_t> unit(n);
  std::memcpy(unit.data(), blob.data() + 4, n * 4);
  const size_t replacements = blob.size() - 4 - trie_bytes;
  const auto offset = [](uint32_t u) -> size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  const auto label = [](uint32_t u) { return u & ((1u << 31) | 0xFF); };
  const auto has_leaf = [](uint32_t u) { return ((u >> 8) & 1) == 1; };

  // Depth-first over states (array positions after a matched byte), iteratively: a malformed
  // array can chain thousands of states. most[p] = the most rules matched on a path from p.
  constexpr int kMaxRules = 32, kUnseen = -1, kOpen = -2;
  std::vector<int> most(n, kUnseen);
  struct Frame {
    size_t state;
    int next_byte;
    int best;
  };
  std::vector<Frame> stack;
  const auto enter = [&](size_t p) {
    if (p >= n) return false;  // byte 0 reads unit[p]
    most[p] = kOpen;
    stack.push_back({p, 0, 0});
    return true;
  };
  if (!enter(offset(unit[0]))) return false;
  int returned = 0;        // what the last finished state found
  bool returning = false;  // a child just finished: add its result to the top frame
  while (!stack.empty()) {
    Frame& top = stack.back();
    if (returning) {
      const uint32_t u = unit[top.state ^ static_cast<size_t>(top.next_byte - 1)];
      top.best = std::max(top.best, returned + (has_leaf(u) ? 1 : 0));
      returning = false;
    }
    if (top.next_byte == 256) {
      if (top.best > kMaxRules) return false;
      most[top.state] = returned = top.best;
      stack.pop_back();
      returning = true;
      continue;
    }
    const uint32_t c = static_cast<uint32_t>(top.next_byte++);
    const size_t q = top.state ^ c;
    if (q >= n) return false;
    const uint32_t u = unit[q];
    if (label(u) != c) continue;
    const size_t child = q ^ offset(u);
    if (child >= n) return false;  // its leaf, or the next byte (0 reads unit[child])
    if (has_leaf(u) && (unit[child] & ((1u << 31) - 1)) >= replacements) return false;
    if (most[child] == kOpen) return false;  // a cycle
    if (most[child] >= 0) {
      top.best = std::max(top.best, most[child] + (has_leaf(u) ? 1 : 0));
      continue;
    }
    if (!enter(child)) return false;
  }
  return true;
}

// Why the model must not reach SentencePiece, or nullptr: a message this reader cannot walk
// (malformed, truncated, or holding a group: no SentencePiece model has one, but protobuf skips
// groups and reads on, past where this check would stop; found by fuzz_sentencepiece), or a
// NormalizerSpec whose charsmap is not safe to use.
const char* model_problem(std::string_view model) {
  static constexpr const char* kMalformed = "malformed or truncated protobuf";
  const char* problem = nullptr;
  const bool walked = for_each_field(model, [&](const Field& f) {
    if ((f.number != kNormalizerSpec && f.number != kDenormalizerSpec) || f.wire_type != 2) return;
    const bool spec_walked = for_each_field(f.payload, [&](const Field& g) {
      if (g.number == kPrecompiledCharsmap && g.wire_type == 2 && !charsmap_is_safe(g.payload))
        problem = "a precompiled charsmap is malformed";
    });
    if (!spec_walked) problem = kMalformed;
  });
  return walked ? problem : kMalformed;
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
    if (const char* problem = model_problem(bytes)) {
      set_error(err, std::string("not a SentencePiece model (") + problem + ")");
      return nullptr;
    }
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

SHIM_API int specdec_spm_interface(void) { return SPECDEC_SPM_INTERFACE; }

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
