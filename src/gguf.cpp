// GGUF reading: a bounds-checked parser over a read-only mapping, and ggml's block dequantizers.
// Block layouts follow ggml's definitions (ggml-common.h); each dequantizer is tested on hand-built
// blocks and against the `gguf` Python package on every tensor of a real file.
#include "specdec/gguf.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

#include "ggml_blocks.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "util.hpp"

namespace specdec {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 4;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Limits::max_metadata_values bounds the metadata values of all arrays together, so that a file
// packing a billion one-byte values is refused rather than walked (and, read, turned into 100 GB).

constexpr auto f16 = ggml_half;

// --- dequantizers: one block of `src` into `dst` ---
void deq_q4_0(const uint8_t* b, float* y) {  // d, qs[16]: 32 x 4-bit, offset 8
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}
void deq_q4_1(const uint8_t* b, float* y) {  // d, m, qs[16]: x = q * d + m
  const float d = f16(b), m = f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}
// Q5_x: the fifth bit of element j is bit j of qh (32 bits, little-endian).
void deq_q5(const uint8_t* qh_bytes, const uint8_t* qs, float d, float m, int offset, float* y) {
  int q[32];
  ggml_q5_values(qh_bytes, qs, q);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j] - offset) * d + m;
}
void deq_q5_0(const uint8_t* b, float* y) { deq_q5(b + 2, b + 6, f16(b), 0.0f, 16, y); }
void deq_q5_1(const uint8_t* b, float* y) { deq_q5(b + 4, b + 8, f16(b), f16(b + 2), 0, y); }
void deq_q8_0(const uint8_t* b, float* y) {  // d, qs[32] int8
  const float d = f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}
// K-quants: 256 elements in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min.
void deq_q4_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qs[128]
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int chunk = 0, is = 0; chunk < 4; ++chunk, q += 32, is += 2) {
    int sc, mn;
    ggml_scale_min_k4(is, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ggml_scale_min_k4(is + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}
void deq_q5_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qh[32], qs[128]
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int chunk = 0, is = 0; chunk < 4; ++chunk, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
    int sc, mn;
    ggml_scale_min_k4(is, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    ggml_scale_min_k4(is + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l)
      *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
  }
}
void deq_q6_k(const uint8_t* b, float* y) {  // ql[128], qh[64], scales[16] int8, d
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int n = 0; n < 2; ++n, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
  }
}
void deq_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 4); }
void deq_f16(const uint8_t* b, float* y) { *y = f16(b); }
void deq_bf16(const uint8_t* b, float* y) {
  uint16_t bits;
  std::memcpy(&bits, b, 2);
  *y = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}

struct TypeEntry {
  GgmlType type;
  const char* name;
  int64_t block_elements, block_bytes;
  void (*dequantize)(const uint8_t*, float*);
};
// A format's row of kGgmlFormats with its dequantizer.
constexpr TypeEntry entry(GgmlType type, void (*dequantize)(const uint8_t*, float*)) {
  const GgmlFormat* f = find_ggml_format(static_cast<uint32_t>(type));
  return {type, f->name, f->block_values, f->block_bytes, dequantize};
}
const TypeEntry kTypes[] = {
    entry(GgmlType::kF32, deq_f32),   entry(GgmlType::kF16, deq_f16),
    entry(GgmlType::kBF16, deq_bf16), entry(GgmlType::kQ4_0, deq_q4_0),
    entry(GgmlType::kQ4_1, deq_q4_1), entry(GgmlType::kQ5_0, deq_q5_0),
    entry(GgmlType::kQ5_1, deq_q5_1), entry(GgmlType::kQ8_0, deq_q8_0),
    entry(GgmlType::kQ4_K, deq_q4_k), entry(GgmlType::kQ5_K, deq_q5_k),
    entry(GgmlType::kQ6_K, deq_q6_k),
};
static_assert(std::size(kTypes) == std::size(kGgmlFormats), "a dequantizer for every format");
const TypeEntry* find_type(uint32_t id) {
  for (const TypeEntry& e : kTypes)
    if (static_cast<uint32_t>(e.type) == id) return &e;
  return nullptr;
}
const TypeEntry& type_entry(GgmlType type) {
  const TypeEntry* e = find_type(static_cast<uint32_t>(type));
  SPECDEC_CHECK(e != nullptr, "unsupported ggml tensor type ", static_cast<uint32_t>(type));
  return *e;
}

// Bounds-checked little-endian reading over [p, end). Errors name the file and what was being read.
class Cursor {
 public:
  Cursor(const uint8_t* begin, size_t size, const std::string& path, int64_t max_string)
      : begin_(begin), p_(begin), end_(begin + size), path_(path), max_string_(max_string) {}
  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " (string length)");
    SPECDEC_CHECK(n <= static_cast<uint64_t>(max_string_), path_, ": ", what, ": string length ", n,
                  " exceeds the limit of ", max_string_, " bytes (Limits::max_header_bytes)");
    SPECDEC_CHECK(n <= remaining(), path_, ": truncated file or bad length: ", what,
                  ": string length ", n, " runs past the end of the file (", remaining(),
                  " bytes left at offset ", offset(), ")");
    std::string s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  void skip(size_t n, const std::string& what) {
    need(n, what);
    p_ += n;
  }
  void need(size_t n, const std::string& what) const {
    SPECDEC_CHECK(n <= remaining(), path_, ": truncated file: ", what, " needs ", n,
                  " bytes at offset ", offset(), " but only ", remaining(), " remain");
  }

 private:
  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string& path_;
  int64_t max_string_;
};

// Smallest encoded size of one value of `type` (for bounding array counts by the bytes left).
uint64_t min_value_bytes(GgufValue::Type type) {
  switch (type) {
    case GgufValue::Type::kUint8:
    case GgufValue::Type::kInt8:
    case GgufValue::Type::kBool:
      return 1;
    case GgufValue::Type::kUint16:
    case GgufValue::Type::kInt16:
      return 2;
    case GgufValue::Type::kUint32:
    case GgufValue::Type::kInt32:
    case GgufValue::Type::kFloat32:
      return 4;
    case GgufValue::Type::kString:
      return 8;  // the length
    case GgufValue::Type::kArray:
      return 12;  // element type + count
    default:
      return 8;
  }
}

// A name read from the file as its errors quote it: at most 120 bytes (a corrupt length can make a
// key megabytes long, and each message, each array element's included, would copy it).
std::string in_message(const std::string& name) {
  constexpr size_t kShown = 120;
  if (name.size() <= kShown) return name;
  return name.substr(0, kShown) + "... (" + std::to_string(name.size()) + " bytes)";
}

GgufValue read_value(Cursor& c, uint32_t raw_type, const std::string& key, const std::string& path,
                     int depth, int64_t& budget) {
  SPECDEC_CHECK(raw_type <= 12, path, ": metadata '", key, "' has unknown value type ", raw_type);
  GgufValue v;
  v.type = static_cast<GgufValue::Type>(raw_type);
  const std::string what = "metadata '" + key + "'";
  switch (v.type) {
    case GgufValue::Type::kUint8:
      v.i = c.read<uint8_t>(what);
      break;
    case GgufValue::Type::kInt8:
      v.i = c.read<int8_t>(what);
      break;
    case GgufValue::Type::kUint16:
      v.i = c.read<uint16_t>(what);
      break;
    case GgufValue::Type::kInt16:
      v.i = c.read<int16_t>(what);
      break;
    case GgufValue::Type::kUint32:
      v.i = c.read<uint32_t>(what);
      break;
    case GgufValue::Type::kInt32:
      v.i = c.read<int32_t>(what);
      break;
    case GgufValue::Type::kInt64:
      v.i = c.read<int64_t>(what);
      break;
    case GgufValue::Type::kUint64: {
      const uint64_t u = c.read<uint64_t>(what);
      SPECDEC_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), path, ": ",
                    what, ": unsigned value ", u, " is too large");
      v.i = static_cast<int64_t>(u);
      break;
    }
    case GgufValue::Type::kFloat32:
      v.f = c.read<float>(what);
      break;
    case GgufValue::Type::kFloat64:
      v.f = c.read<double>(what);
      break;
    case GgufValue::Type::kBool: {
      const uint8_t b = c.read<uint8_t>(what);
      SPECDEC_CHECK(b <= 1, path, ": ", what, ": bool value ", int(b), " is neither 0 nor 1");
      v.b = b != 0;
      break;
    }
    case GgufValue::Type::kString:
      v.s = c.read_string(what);
      break;
    case GgufValue::Type::kArray: {
      SPECDEC_CHECK(depth < kMaxArrayDepth, path, ": ", what, ": arrays nested deeper than ",
                    kMaxArrayDepth);
      const uint32_t et = c.read<uint32_t>(what + " (array type)");
      SPECDEC_CHECK(et <= 12, path, ": ", what, ": unknown array element type ", et);
      const uint64_t n = c.read<uint64_t>(what + " (array length)");
      v.array_type = static_cast<GgufValue::Type>(et);
      SPECDEC_CHECK(n <= c.remaining() / min_value_bytes(v.array_type), path, ": ", what,
                    ": array length ", n, " cannot fit in the ", c.remaining(), " bytes left");
      SPECDEC_CHECK(static_cast<int64_t>(n) <= budget, path, ": ", what, ": array length ", n,
                    " exceeds the limit of ", limits().max_metadata_values,
                    " metadata values in a file (Limits::max_metadata_values)");
      budget -= static_cast<int64_t>(n);
      v.array_size = n;
      v.array_offset = c.offset();
      // Checked element by element but kept in the file (GgufFile::for_each_element reads them on
      // demand); fixed-size types where every bit pattern is valid are skipped whole.
      const GgufValue::Type t = v.array_type;
      const bool any_bits = t != GgufValue::Type::kString && t != GgufValue::Type::kArray &&
                            t != GgufValue::Type::kBool && t != GgufValue::Type::kUint64;
      if (any_bits)
        c.skip(n * min_value_bytes(t), what);  // fits: n <= remaining() / that size
      else
        for (uint64_t k = 0; k < n; ++k) read_value(c, et, key, path, depth + 1, budget);
      break;
    }
  }
  return v;
}

const char* type_word(GgufValue::Type t) {
  static const char* const kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                       "int32",  "float32", "bool",   "string", "array",
                                       "uint64", "int64",   "float64"};
  return kNames[static_cast<uint32_t>(t)];
}

}  // namespace

bool GgufValue::is_integer() const {
  return type != Type::kFloat32 && type != Type::kFloat64 && type != Type::kBool &&
         type != Type::kString && type != Type::kArray;
}

std::string ggml_type_name(uint32_t type) {
  const TypeEntry* e = find_type(type);
  return e ? e->name : "type " + std::to_string(type);
}
int64_t ggml_block_elements(GgmlType type) { return type_entry(type).block_elements; }
int64_t ggml_block_bytes(GgmlType type) { return type_entry(type).block_bytes; }
at::ScalarType ggml_dtype(GgmlType type) {
  return type == GgmlType::kF16 ? at::kHalf : type == GgmlType::kBF16 ? at::kBFloat16 : at::kFloat;
}

void ggml_dequantize(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  const TypeEntry& e = type_entry(type);
  SPECDEC_CHECK(n % e.block_elements == 0, "ggml_dequantize: ", n,
                " elements is not a whole number of ", e.name, " blocks of ", e.block_elements);
  const int64_t blocks = n / e.block_elements;
  const int64_t grain = std::max<int64_t>(1, 16384 / e.block_elements);
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      e.dequantize(src + k * e.block_bytes, dst + k * e.block_elements);
  });
}

namespace {

// ggml's quantize_row_*_ref, one block of 32 at a time; scales stored as float16 (round to nearest
// even).
void put_f16(uint8_t* p, float v) {
  const uint16_t bits = c10::Half(v).x;
  std::memcpy(p, &bits, 2);
}

void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

void quant_q4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void quant_q4_1(const float* x, uint8_t* b) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  put_f16(b + 2, min);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
    const int hi =
        std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
    b[4 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

void ggml_quantize(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
  void (*quant)(const float*, uint8_t*) = type == GgmlType::kQ8_0   ? quant_q8_0
                                          : type == GgmlType::kQ4_0 ? quant_q4_0
                                          : type == GgmlType::kQ4_1 ? quant_q4_1
                                                                    : nullptr;
  SPECDEC_CHECK(quant, "ggml_quantize: cannot quantize to ",
                ggml_type_name(static_cast<uint32_t>(type)), " (supported: Q8_0, Q4_0, Q4_1)");
  SPECDEC_CHECK(n % 32 == 0, "ggml_quantize: ", n,
                " elements is not a whole number of blocks of 32");
  const int64_t bytes = ggml_block_bytes(type);
  at::parallel_for(0, n / 32, 512, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) quant(src + k * 32, dst + k * bytes);
  });
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  const MappedFile file = map_file(path, "GGUF file", 24, "a GGUF header");
  fd_ = file.fd;
  map_ = file.data;
  map_size_ = file.size;
  try {
    const auto* base = static_cast<const uint8_t*>(map_);
    const Limits lim = limits();
    Cursor c(base, map_size_, path, lim.max_header_bytes);
    const uint32_t magic = c.read<uint32_t>("magic");
    SPECDEC_CHECK(magic == kMagic, path, ": not a GGUF file (magic bytes are not 'GGUF')");
    version_ = c.read<uint32_t>("version");
    SPECDEC_CHECK(version_ == 2 || version_ == 3, path, ": GGUF version ", version_,
                  " is not supported (versions 2 and 3 are)");
    const uint64_t n_tensors = c.read<uint64_t>("tensor_count");
    const uint64_t n_kv = c.read<uint64_t>("metadata_kv_count");
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name length) + 4 (dims) + 4 (type) + 8 (offset).
    SPECDEC_CHECK(n_kv <= c.remaining() / 13, path, ": metadata_kv_count ", n_kv,
                  " cannot fit in a file of ", map_size_, " bytes");
    SPECDEC_CHECK(n_tensors <= c.remaining() / 24, path, ": tensor_count ", n_tensors,
                  " cannot fit in a file of ", map_size_, " bytes");
    // Limits that bound memory whatever the file's size (real files: under 100 keys, a few
    // thousand tensors).
    SPECDEC_CHECK(n_kv <= static_cast<uint64_t>(lim.max_metadata_values), path,
                  ": metadata_kv_count ", n_kv, " exceeds the limit of ", lim.max_metadata_values,
                  " (Limits::max_metadata_values)");
    SPECDEC_CHECK(n_tensors <= static_cast<uint64_t>(lim.max_tensors), path, ": tensor_count ",
                  n_tensors, " exceeds the limit of ", lim.max_tensors, " (Limits::max_tensors)");
    int64_t budget = lim.max_metadata_values;
    for (uint64_t k = 0; k < n_kv; ++k) {
      std::string key = c.read_string("metadata key " + std::to_string(k));
      const std::string name = in_message(key);
      const uint32_t type = c.read<uint32_t>("metadata '" + name + "' type");
      GgufValue v = read_value(c, type, name, path, 0, budget);
      SPECDEC_CHECK(metadata_.count(key) == 0, path, ": duplicate metadata key '", name, "'");
      metadata_.emplace(std::move(key), std::move(v));
    }
    if (auto a = metadata_.find("general.alignment"); a != metadata_.end()) {
      SPECDEC_CHECK(a->second.type == GgufValue::Type::kUint32 && a->second.i > 0 &&
                        (a->second.i & (a->second.i - 1)) == 0,
                    path, ": general.alignment must be a uint32 power of two");
      alignment_ = static_cast<uint64_t>(a->second.i);
    }
    std::vector<GgufTensorInfo> infos;
    infos.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t k = 0; k < n_tensors; ++k) {
      GgufTensorInfo t;
      t.name = c.read_string("tensor name " + std::to_string(k));
      const std::string what = "tensor '" + in_message(t.name) + "'";
      const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
      const int64_t max_dims = std::min<int64_t>(kMaxDims, lim.max_rank);
      SPECDEC_CHECK(n_dims >= 1 && n_dims <= max_dims, path, ": ", what, ": ", n_dims,
                    " dimensions (expected 1 to ", max_dims, ")");
      std::vector<int64_t> ne;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t dim = c.read<uint64_t>(what + " dimension");
        SPECDEC_CHECK(dim >= 1 && dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                      path, ": ", what, ": dimension ", d, " is ", dim);
        SPECDEC_CHECK(static_cast<uint64_t>(t.numel) <=
                          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim,
                      path, ": ", what, ": the product of its dimensions overflows");
        t.numel *= static_cast<int64_t>(dim);
        ne.push_back(static_cast<int64_t>(dim));
      }
      SPECDEC_CHECK(t.numel <= lim.max_tensor_elements, path, ": ", what, ": ", t.numel,
                    " elements, more than the limit of ", lim.max_tensor_elements,
                    " (Limits::max_tensor_elements)");
      t.shape.assign(ne.rbegin(), ne.rend());
      const uint32_t type = c.read<uint32_t>(what + " type");
      const TypeEntry* e = find_type(type);
      SPECDEC_CHECK(e != nullptr, path, ": ", what, " is stored as ", ggml_type_name(type),
                    ", a tensor type this build does not read",
                    " (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
      t.type = e->type;
      SPECDEC_CHECK(ne[0] % e->block_elements == 0, path, ": ", what, ": its rows of ", ne[0],
                    " elements do not divide into ", e->name, " blocks of ", e->block_elements);
      t.bytes = static_cast<uint64_t>(t.numel / e->block_elements) *
                static_cast<uint64_t>(e->block_bytes);
      SPECDEC_CHECK(t.bytes / static_cast<uint64_t>(e->block_bytes) ==
                        static_cast<uint64_t>(t.numel / e->block_elements),
                    path, ": ", what, ": byte size overflows");
      t.offset = c.read<uint64_t>(what + " offset");
      SPECDEC_CHECK(t.offset % alignment_ == 0, path, ": ", what, ": offset ", t.offset,
                    " is not a multiple of the alignment ", alignment_);
      infos.push_back(std::move(t));
    }
    const uint64_t data_start = (c.offset() + alignment_ - 1) / alignment_ * alignment_;
    SPECDEC_CHECK(data_start <= map_size_, path,
                  ": the data section starts past the end of the file");
    const uint64_t data_size = map_size_ - data_start;
    data_ = base + data_start;
    struct Span {
      uint64_t begin, end;
      std::string name;
      bool operator<(const Span& o) const { return begin < o.begin; }
    };
    std::vector<Span> spans;
    for (GgufTensorInfo& t : infos) {
      SPECDEC_CHECK(t.offset <= data_size && t.bytes <= data_size - t.offset, path, ": tensor '",
                    t.name, "': data [", t.offset, ", +", t.bytes,
                    ") runs past the end of the file (data section of ", data_size, " bytes)");
      spans.push_back({t.offset, t.offset + t.bytes, t.name});
      const std::string name = t.name;
      SPECDEC_CHECK(tensors_.emplace(name, std::move(t)).second, path, ": duplicate tensor name '",
                    name, "'");
    }
    std::sort(spans.begin(), spans.end());
    for (size_t k = 1; k < spans.size(); ++k)
      SPECDEC_CHECK(spans[k].begin >= spans[k - 1].end, path, ": the data of tensors '",
                    spans[k - 1].name, "' [", spans[k - 1].begin, ", ", spans[k - 1].end, ") and '",
                    spans[k].name, "' [", spans[k].begin, ", ", spans[k].end, ") overlap");
  } catch (...) {
    unmap_file(file);
    throw;
  }
}

GgufFile::~GgufFile() { unmap_file({fd_, map_, map_size_}); }

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = metadata_.find(key);
  SPECDEC_CHECK(it != metadata_.end(), path_, ": missing metadata key '", key, "'");
  return it->second;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  SPECDEC_CHECK(v.type == GgufValue::Type::kString, path_, ": metadata '", key, "' is ",
                type_word(v.type), ", expected string");
  return v.s;
}
int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  SPECDEC_CHECK(v.is_integer(), path_, ": metadata '", key, "' is ", type_word(v.type),
                ", expected an integer");
  return v.i;
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = value(key);
  SPECDEC_CHECK(v.is_float() || v.is_integer(), path_, ": metadata '", key, "' is ",
                type_word(v.type), ", expected a number");
  return v.is_float() ? v.f : static_cast<double>(v.i);
}
bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = value(key);
  SPECDEC_CHECK(v.type == GgufValue::Type::kBool, path_, ": metadata '", key, "' is ",
                type_word(v.type), ", expected bool");
  return v.b;
}
template <typename F>
void GgufFile::for_each_element(const GgufValue& v, const std::string& key, F&& f) const {
  const auto* base = static_cast<const uint8_t*>(map_);
  Cursor c(base, map_size_, path_, limits().max_header_bytes);
  c.skip(v.array_offset, "metadata '" + key + "'");  // offsets stay from the start of the file
  int64_t budget = static_cast<int64_t>(v.array_size);
  for (uint64_t k = 0; k < v.array_size; ++k)
    f(read_value(c, static_cast<uint32_t>(v.array_type), key, path_, 1, budget));
}

std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  const GgufValue& v = value(key);
  SPECDEC_CHECK(v.type == GgufValue::Type::kArray && v.array_type == GgufValue::Type::kString,
                path_, ": metadata '", key, "' must be an array of strings");
  std::vector<std::string> out;
  out.reserve(v.array_size);
  for_each_element(v, key, [&](GgufValue x) { out.push_back(std::move(x.s)); });
  return out;
}
std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  const GgufValue& v = value(key);
  GgufValue probe;
  probe.type = v.array_type;
  SPECDEC_CHECK(v.type == GgufValue::Type::kArray && probe.is_integer(), path_, ": metadata '", key,
                "' must be an array of integers");
  std::vector<int64_t> out;
  out.reserve(v.array_size);
  for_each_element(v, key, [&](const GgufValue& x) { out.push_back(x.i); });
  return out;
}
std::vector<double> GgufFile::get_floats(const std::string& key) const {
  const GgufValue& v = value(key);
  SPECDEC_CHECK(v.type == GgufValue::Type::kArray && (v.array_type == GgufValue::Type::kFloat32 ||
                                                      v.array_type == GgufValue::Type::kFloat64),
                path_, ": metadata '", key, "' must be an array of floats");
  std::vector<double> out;
  out.reserve(v.array_size);
  for_each_element(v, key, [&](const GgufValue& x) { out.push_back(x.f); });
  return out;
}
std::optional<std::string> GgufFile::find_string(const std::string& key) const {
  return has(key) ? std::optional<std::string>(get_string(key)) : std::nullopt;
}
std::optional<int64_t> GgufFile::find_int(const std::string& key) const {
  return has(key) ? std::optional<int64_t>(get_int(key)) : std::nullopt;
}
std::optional<double> GgufFile::find_float(const std::string& key) const {
  return has(key) ? std::optional<double>(get_float(key)) : std::nullopt;
}
std::optional<bool> GgufFile::find_bool(const std::string& key) const {
  return has(key) ? std::optional<bool>(get_bool(key)) : std::nullopt;
}

at::Tensor GgufFile::load(const std::string& name, at::ScalarType dtype, c10::Device device) const {
  auto it = tensors_.find(name);
  SPECDEC_CHECK(it != tensors_.end(), path_, ": no tensor named '", name, "'");
  const GgufTensorInfo& t = it->second;
  const TypeEntry& e = type_entry(t.type);
  if (e.block_elements == 1 &&
      ggml_dtype(t.type) == dtype) {  // as stored: no float32 copy beside them
    at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(dtype));
    read(t, out.data_ptr());
    return device.is_cpu() ? out : out.to(device);
  }
  at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(at::kFloat));
  const int64_t blocks = std::max<int64_t>(1, (int64_t{1} << 20) / e.block_bytes);
  std::vector<uint8_t> piece(static_cast<size_t>(blocks * e.block_bytes));
  for (int64_t at = 0; at < t.numel; at += blocks * e.block_elements) {
    const int64_t n = std::min(blocks * e.block_elements, t.numel - at);
    const uint64_t offset = static_cast<uint64_t>(at / e.block_elements * e.block_bytes);
    read_at(fd_, file_offset(t) + offset, piece.data(),
            static_cast<size_t>(n / e.block_elements * e.block_bytes), path_);
    ggml_dequantize(t.type, piece.data(), out.data_ptr<float>() + at, n);
  }
  if (dtype == at::kFloat && device.is_cpu()) return out;
  return out.to(device, dtype);
}

uint64_t GgufFile::file_offset(const GgufTensorInfo& info) const {
  return static_cast<uint64_t>(data(info) - static_cast<const uint8_t*>(map_));
}

void GgufFile::read(const GgufTensorInfo& info, void* dst) const {
  read_at(fd_, file_offset(info), dst, info.bytes, path_);
}

bool find_gguf(const std::string& path, std::string* resolved) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  auto is_gguf = [](const std::string& p) {
    return p.size() > 5 && p.compare(p.size() - 5, 5, ".gguf") == 0;
  };
  if (S_ISREG(st.st_mode)) {
    if (!is_gguf(path)) return false;
    if (resolved) *resolved = path;
    return true;
  }
  if (!S_ISDIR(st.st_mode)) return false;
  std::vector<std::string> found;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d))
      if (is_gguf(e->d_name)) found.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) return false;
  if (found.size() > 1) {
    std::string list;
    for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
    throw Error(path + ": several GGUF files (" + list + "); name the one to use");
  }
  if (resolved) *resolved = path + "/" + found[0];
  return true;
}

}  // namespace specdec
