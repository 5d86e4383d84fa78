#include "kernels.hpp"

#include "ggml_blocks.hpp"

#include "specdec/error.hpp"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#if (defined(__x86_64__) || defined(__i386__)) && !defined(SPECDEC_NO_X86_KERNELS)
#include <cpuid.h>
#include <immintrin.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define SPECDEC_X86 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors (_mm512_undefined_*),
// which its own uninitialized-value warnings then report at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

// The tiles' loops are unrolled for speed, which never changes the order of the operations. Builds
// under AddressSanitizer or ThreadSanitizer leave them rolled: the same operations in the same order,
// and kernels.cpp compiles in a quarter of the time there (11 minutes unrolled, with clang's ASan).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPECDEC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SPECDEC_SANITIZED 1
#endif
#endif
#define SPECDEC_PRAGMA(text) _Pragma(#text)
#ifdef SPECDEC_SANITIZED
#define SPECDEC_UNROLL(n) SPECDEC_PRAGMA(GCC unroll 1)
#else
#define SPECDEC_UNROLL(n) SPECDEC_PRAGMA(GCC unroll n)
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#include <cstdlib>
#include <string>
#include <limits>

namespace specdec::kernels {
namespace {

// Sum of a[i] * b[i] (or a[i] * a[i]) with eight partial sums in a fixed lane pattern, combined in
// a fixed tree, then the tail in order: the same arithmetic for every row.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n8 = n - n % 8;
  for (int64_t i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float sum(const float* a, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n8 = n - n % 8;
  for (int64_t i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t i = n8; i < n; ++i) s += a[i];
  return s;
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// --- 8-bit activations (LinearKernel::int8_activations): weight rows interleaved 16 at a time ---
// The activation rows are quantized like ggml's Q8_1 (ActRows): per block of 32, q_x = round(x /
// d_x), s_x = d_x * sum(q_x). One output element (weight row . activation row t), in every family,
// tile and thread split: per block of 32 weights (K-quants: sub-block) b, the exact integer isum =
// sum of q_w * q_x, then in block order from acc = 0:
//   Q8_0: q_w signed;       acc = fma(isum, d_w * d_x, acc)
//   Q4_0: q_w = nibble - 8; acc = fma(isum, d_w * d_x, acc)
//   Q4_1: q_w = nibble;     acc = fma(isum, d_w * d_x, acc); acc = fma(m_w, s_x, acc)
//   Q5_0: q_w = 5 bits - 16; as Q4_0
//   Q5_1: q_w = 5 bits;     as Q4_1
//   Q4_K: q_w = nibble;     acc = fma(isum, (d * scale_b) * d_x, acc);
//                           acc = fma(-(dmin * min_b), s_x, acc)
//   Q5_K: q_w = 5 bits;     as Q4_K
//   Q6_K: q_w = 6 bits - 32, halves a, b of 16 with int8 scales: isum = scale_a * isum_a +
//         scale_b * isum_b (exact);   acc = fma(isum, d * d_x, acc)
// (isum as float: exact, below 2^24.) In a whole group of 16 rows (prepare_weights) row r is lane
// r of a vector, so no sum crosses lanes; the rows after the last whole group keep their layout and
// go through Interleaved<T>::block, which is this arithmetic in plain C++. The values are those of
// llama.cpp's approach (integer dot products per block), not the float32 kernel's.

// Where byte j of block b of row r lies in its group of 16 rows: a block's 2-byte fields (its
// float16 scales: kFields bytes from kFieldsAt) first, each for the 16 rows one after the other,
// then every 4 bytes of the rest of the block (in block order) for the 16 rows.
template <class I>
constexpr bool in_fields(int64_t j) {
  return j >= I::kFieldsAt && j < I::kFieldsAt + I::kFields;
}
template <class I>
constexpr int64_t interleaved_offset(int64_t b, int64_t r, int64_t j) {
  const int64_t base = b * kInterleave * I::kBytes;
  if (in_fields<I>(j))
    return base + (j - I::kFieldsAt) / 2 * 2 * kInterleave + 2 * r + (j - I::kFieldsAt) % 2;
  const int64_t rest = j < I::kFieldsAt ? j : j - I::kFields;  // position among the other bytes
  return base + I::kFields * kInterleave + rest / 4 * 4 * kInterleave + 4 * r + rest % 4;
}

// The bytes of a block that move together from byte j: a 2-byte field, or 4 other bytes.
template <class I>
constexpr int64_t piece(int64_t j) {
  return in_fields<I>(j) ? 2 : 4;
}

// Each format's block layout and one row's block b (plain bytes) against activation row t.
template <GgmlType T>
struct Interleaved;

template <>
struct Interleaved<GgmlType::kQ8_0> {
  static constexpr int64_t kValues = 32, kBytes = 34, kFieldsAt = 0, kFields = 2;  // d, 32 values
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t b,
                    float& acc) {
    const int64_t e = t * (k / 32) + b;
    const int8_t* q = x.q + t * k + b * 32;
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += static_cast<int8_t>(blk[2 + j]) * q[j];
    acc = std::fma(static_cast<float>(isum), half_at(blk) * x.d[e], acc);
  }
};

// Q4_0 (d, 16 bytes of nibbles) and Q4_1 (d, m, the same): value j < 16 is the low nibble of byte
// j, value j + 16 its high nibble.
template <GgmlType T>
struct Nibbles32 {
  static constexpr int64_t kValues = 32, kFieldsAt = 0, kFields = T == GgmlType::kQ4_1 ? 4 : 2;
  static constexpr int64_t kBytes = kFields + 16;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t b,
                    float& acc) {
    const int64_t e = t * (k / 32) + b;
    const int8_t* q = x.q + t * k + b * 32;
    int32_t isum = T == GgmlType::kQ4_0 ? -8 * x.sum[e] : 0;
    for (int j = 0; j < 16; ++j)
      isum += (blk[kFields + j] & 0x0F) * q[j] + (blk[kFields + j] >> 4) * q[j + 16];
    acc = std::fma(static_cast<float>(isum), half_at(blk) * x.d[e], acc);
    if (T == GgmlType::kQ4_1) acc = std::fma(half_at(blk + 2), x.s[e], acc);
  }
};
template <>
struct Interleaved<GgmlType::kQ4_0> : Nibbles32<GgmlType::kQ4_0> {};
template <>
struct Interleaved<GgmlType::kQ4_1> : Nibbles32<GgmlType::kQ4_1> {};

// Q5_0 (d, qh[4], qs[16]) and Q5_1 (d, m, qh, qs): the values of ggml_q5_values (Q5_0: minus 16).
template <GgmlType T>
struct Fives32 {
  static constexpr bool kQ5_1 = T == GgmlType::kQ5_1;
  static constexpr int64_t kValues = 32, kFieldsAt = 0, kFields = kQ5_1 ? 4 : 2, kBytes = kFields + 20;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t b,
                    float& acc) {
    const int64_t e = t * (k / 32) + b;
    const int8_t* q = x.q + t * k + b * 32;
    int v[32];
    ggml_q5_values(blk + kFields, blk + kFields + 4, v);
    int32_t isum = kQ5_1 ? 0 : -16 * x.sum[e];
    for (int j = 0; j < 32; ++j) isum += v[j] * q[j];
    acc = std::fma(static_cast<float>(isum), half_at(blk) * x.d[e], acc);
    if (kQ5_1) acc = std::fma(half_at(blk + 2), x.s[e], acc);
  }
};
template <>
struct Interleaved<GgmlType::kQ5_0> : Fives32<GgmlType::kQ5_0> {};
template <>
struct Interleaved<GgmlType::kQ5_1> : Fives32<GgmlType::kQ5_1> {};

// Q4_K (d, dmin, 12 bytes of scales, 128 of nibbles) and Q5_K (d, dmin, scales, 32 bytes of high
// bits, 128 of nibbles): sub-block s is the low (even s) or high nibbles of qs[32 (s / 2)..], with
// bit s of qh[j] as the fifth bit of its value j in Q5_K.
template <GgmlType T>
struct KNibbles {
  static constexpr bool kQ5 = T == GgmlType::kQ5_K;
  static constexpr int64_t kValues = 256, kBytes = kQ5 ? 176 : 144, kFieldsAt = 0, kFields = 4;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t sb,
                    float& acc) {
    const uint8_t* qs = blk + (kQ5 ? 48 : 16);
    for (int s = 0; s < 8; ++s) {
      int sc, mn;
      ggml_scale_min_k4(s, blk + 4, &sc, &mn);
      const int64_t e = t * (k / 32) + sb * 8 + s;
      const int8_t* q = x.q + t * k + sb * 256 + 32 * s;
      int32_t isum = 0;
      for (int j = 0; j < 32; ++j) {
        int v = (qs[32 * (s / 2) + j] >> (4 * (s % 2))) & 0x0F;
        if (kQ5) v |= ((blk[16 + j] >> s) & 1) << 4;
        isum += v * q[j];
      }
      acc = std::fma(static_cast<float>(isum), half_at(blk) * static_cast<float>(sc) * x.d[e], acc);
      acc = std::fma(-(half_at(blk + 2) * static_cast<float>(mn)), x.s[e], acc);
    }
  }
};
template <>
struct Interleaved<GgmlType::kQ4_K> : KNibbles<GgmlType::kQ4_K> {};
template <>
struct Interleaved<GgmlType::kQ5_K> : KNibbles<GgmlType::kQ5_K> {};

template <>
struct Interleaved<GgmlType::kQ6_K> {  // ql[128], qh[64], 16 int8 scales, d
  static constexpr int64_t kValues = 256, kBytes = 210, kFieldsAt = 208, kFields = 2;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t sb,
                    float& acc) {
    // Sub-block s of half h = s / 4 (r = s % 4): the low (r < 2) or high nibbles of ql[64 h +
    // 32 (r % 2)..], bits 2r, 2r + 1 of qh[32 h..] as bits 4-5, minus 32; its halves of 16 have the
    // scales 8 h + 2 r and 8 h + 2 r + 1.
    for (int s = 0; s < 8; ++s) {
      const int h = s / 4, r = s % 4;
      const int64_t e = t * (k / 32) + sb * 8 + s;
      const int8_t* q = x.q + t * k + sb * 256 + 32 * s;
      int32_t half[2] = {0, 0};
      for (int j = 0; j < 32; ++j) {
        const int lo = (blk[64 * h + 32 * (r % 2) + j] >> (r >= 2 ? 4 : 0)) & 0x0F;
        const int hi = (blk[128 + 32 * h + j] >> (2 * r)) & 3;
        half[j / 16] += ((lo | hi << 4) - 32) * q[j];
      }
      const int32_t isum = static_cast<int8_t>(blk[192 + 8 * h + 2 * r]) * half[0] +
                           static_cast<int8_t>(blk[192 + 8 * h + 2 * r + 1]) * half[1];
      acc = std::fma(static_cast<float>(isum), half_at(blk + 208) * x.d[e], acc);
    }
  }
};

// Block b of row r as stored: from its group at `w` (interleaved), or the plain row at `w`.
template <GgmlType T>
const uint8_t* plain_block(const uint8_t* w, int64_t r, int64_t b, bool interleaved, uint8_t* buf) {
  using I = Interleaved<T>;
  if (!interleaved) return w + b * I::kBytes;
  for (int64_t j = 0; j < I::kBytes; j += piece<I>(j))
    std::memcpy(buf + j, w + interleaved_offset<I>(b, r, j), piece<I>(j));
  return buf;
}

// One output: row r of the group at `w` (interleaved) or the plain row at `w`, against activation
// row t.
template <GgmlType T>
float interleaved_dot(const uint8_t* w, int64_t r, bool interleaved, const ActView& x, int64_t t,
                      int64_t k) {
  using I = Interleaved<T>;
  uint8_t buf[I::kBytes];
  float acc = 0.0f;
  for (int64_t b = 0; b < k / I::kValues; ++b)
    I::block(plain_block<T>(w, r, b, interleaved, buf), x, t, k, b, acc);
  return acc;
}

// A last tile of `rest` < Group::kMaxRows activation rows.
template <class Group, int R>
inline void group_rest(int64_t rest, const ActView& x, int64_t k, const uint8_t* gw, int64_t t,
                       int64_t n, int64_t n_total, float* y) {
  if constexpr (R > 0) {
    if (rest == R)
      Group::template tile<R>(x, k, gw, t, n, n_total, y);
    else
      group_rest<Group, R - 1>(rest, x, k, gw, t, n, n_total, y);
  }
}

// The rows [n0, n1) (n0 a multiple of 16 below the last whole group): whole groups by
// Group::tile, the rest one output at a time.
template <class Group>
void rows_interleaved(const void* xv, int64_t t_rows, int64_t k, const uint8_t* w,
                      int64_t row_bytes, int64_t n0, int64_t n1, int64_t n_total, float* y) {
  const ActView& x = *static_cast<const ActView*>(xv);
  const int64_t whole = n_total / kInterleave * kInterleave;
  SPECDEC_CHECK(n0 % kInterleave == 0 || n0 >= whole, "interleaved rows from ", n0);
  int64_t n = n0;
  for (; n + kInterleave <= std::min(n1, whole); n += kInterleave) {
    int64_t t = 0;
    for (; t + Group::kMaxRows <= t_rows; t += Group::kMaxRows)
      Group::template tile<Group::kMaxRows>(x, k, w + n * row_bytes, t, n, n_total, y);
    group_rest<Group, Group::kMaxRows - 1>(t_rows - t, x, k, w + n * row_bytes, t, n, n_total, y);
  }
  for (; n < n1; ++n)
    for (int64_t t = 0; t < t_rows; ++t)
      y[t * n_total + n] = interleaved_dot<Group::kType>(w + n * row_bytes, 0, false, x, t, k);
}

// Groups of rows in plain C++ (the portable family).
template <GgmlType T>
struct GroupPortable {
  static constexpr GgmlType kType = T;
  static constexpr int kMaxRows = 1;
  template <int TB>
  static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t, int64_t n,
                   int64_t n_total, float* y) {
    for (int64_t r = 0; r < kInterleave; ++r)
      y[t * n_total + n + r] = interleaved_dot<T>(gw, r, true, x, t, k);
  }
};

#ifdef SPECDEC_X86
// --- x86 linear kernels: AVX2 and AVX-512, one per weight format, the same arithmetic ---
// The reduction order of one output element (weight row n . input row t), whatever the ISA, tile,
// number of rows or threads: 16 partial sums, lane = k mod 16, each fed by fused multiply-adds in
// k order over whole chunks of 8 (a K that is 8 mod 16 feeds its last chunk to lanes 0-7 only);
// then lanes l and l + 8 added, the 8 results summed in a fixed tree; then the last K mod 8
// products by fused multiply-add in order. AVX-512 holds the 16 lanes in one register, AVX2 in two
// (even and odd chunks of 8), so both give the same bits; two chains per output element instead of
// one halve the latency a one-token decode waits on.
// A decoder turns one block of a weight row into vectors with exactly the values of
// ggml_dequantize, so a packed format gives bitwise the results of the float32 kernel on the
// dequantized matrix. (q * d is exact in float32 for the 4- and 8-bit formats: at most 8 + 11
// significant bits. So Q4_1's q * d + m rounds once, and a fused multiply-add equals it.)
#define SPECDEC_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

constexpr int64_t kQ8_0Bytes = 34, kQ4_0Bytes = 18, kQ4_1Bytes = 20;  // ggml's block sizes

SPECDEC_AVX2 inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// AVX2 decoders: kVecs vectors of 8 floats per block of kElems (an even number of vectors). The
// float formats also give any 8 columns (vec8, the chunk after the last 16) and one (scalar).
struct F32Dec {
  static constexpr int kElems = 16, kVecs = 2;
  const float* p;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) { p = reinterpret_cast<const float*>(row) + b * 16; }
  SPECDEC_AVX2 __m256 vec(int v) const { return _mm256_loadu_ps(p + 8 * v); }
  SPECDEC_AVX2 static __m256 vec8(const uint8_t* row, int64_t c) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
  static float scalar(const uint8_t* row, int64_t c) { return reinterpret_cast<const float*>(row)[c]; }
};

struct BF16Dec {
  static constexpr int kElems = 16, kVecs = 2;
  const uint8_t* p;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) { p = row + b * 32; }
  SPECDEC_AVX2 __m256 vec(int v) const { return vec8(p, 8 * v); }
  SPECDEC_AVX2 static __m256 vec8(const uint8_t* row, int64_t c) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float scalar(const uint8_t* row, int64_t c) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * c, 2);
    const uint32_t f = static_cast<uint32_t>(bits) << 16;
    float out;
    std::memcpy(&out, &f, 4);
    return out;
  }
};

struct F16Dec {
  static constexpr int kElems = 16, kVecs = 2;
  const uint8_t* p;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) { p = row + b * 32; }
  SPECDEC_AVX2 __m256 vec(int v) const { return vec8(p, 8 * v); }
  SPECDEC_AVX2 static __m256 vec8(const uint8_t* row, int64_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  }
  SPECDEC_AVX2 static float scalar(const uint8_t* row, int64_t c) { return half_to_float(row + 2 * c); }
};

struct Q8_0Dec {  // d (f16), qs[32] int8: x = q * d
  static constexpr int kElems = 32, kVecs = 4;
  __m256 d;
  const uint8_t* q;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kQ8_0Bytes;
    d = _mm256_set1_ps(half_to_float(blk));
    q = blk + 2;
  }
  SPECDEC_AVX2 __m256 vec(int v) const {
    const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * v));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8)), d);
  }
};

// Q4_0 / Q4_1: element j of a block is the low nibble of qs[j] (j < 16) or the high nibble of
// qs[j - 16]. The nibbles of vector v: v = 0, 1 low nibbles of bytes 0-7, 8-15; v = 2, 3 high ones.
struct Nibbles {
  __m128i lo, hi;
  SPECDEC_AVX2 void load(const uint8_t* qs) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i m = _mm_set1_epi8(0x0F);
    lo = _mm_and_si128(b, m);
    hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  }
  SPECDEC_AVX2 __m256i get(int v) const {
    const __m128i src = v < 2 ? lo : hi;
    return _mm256_cvtepu8_epi32((v & 1) ? _mm_srli_si128(src, 8) : src);
  }
};

struct Q4_0Dec {  // d (f16), qs[16]: x = (q - 8) * d
  static constexpr int kElems = 32, kVecs = 4;
  __m256 d;
  Nibbles n;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kQ4_0Bytes;
    d = _mm256_set1_ps(half_to_float(blk));
    n.load(blk + 2);
  }
  SPECDEC_AVX2 __m256 vec(int v) const {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(n.get(v), _mm256_set1_epi32(8))), d);
  }
};

struct Q4_1Dec {  // d (f16), m (f16), qs[16]: x = q * d + m
  static constexpr int kElems = 32, kVecs = 4;
  __m256 d, m;
  Nibbles n;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kQ4_1Bytes;
    d = _mm256_set1_ps(half_to_float(blk));
    m = _mm256_set1_ps(half_to_float(blk + 2));
    n.load(blk + 4);
  }
  SPECDEC_AVX2 __m256 vec(int v) const { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(n.get(v)), d, m); }
};

// Q4_K: d, dmin (f16), 8 packed 6-bit scale/min pairs, qs[128]. Element e is in sub-block
// s = e / 32 with x = (d * sc_s) * q - dmin * mn_s; chunk e / 64 of 32 bytes gives its low nibbles
// to sub-block 2 * chunk and its high nibbles to the next. (d * sc_s) * q is exact, so a fused
// multiply-subtract rounds as ggml's multiply then subtract.
struct Q4_KScales {
  static constexpr int64_t kBytes = 144;
  float d[8], m[8];
  const uint8_t* qs;
  // ggml_scale_min_k4 for the 8 sub-blocks at once, on 32-bit words of the 12 bytes u0, u1, u2:
  // sub-blocks 0-3 take the low 6 bits of u0 (scales) and u1 (mins); 4-7 take their low 4 bits
  // from u2's low and high nibbles and their top 2 from the top 2 bits of u0 and u1.
  SPECDEC_AVX2 void load(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kBytes;
    uint32_t u[3];
    std::memcpy(u, blk + 4, 12);
    const uint32_t lo6 = 0x3F3F3F3F, lo4 = 0x0F0F0F0F, lo2 = 0x03030303;
    const uint32_t sc47 = (u[2] & lo4) | ((u[0] >> 6) & lo2) << 4;
    const uint32_t mn47 = ((u[2] >> 4) & lo4) | ((u[1] >> 6) & lo2) << 4;
    const uint64_t sc = (u[0] & lo6) | uint64_t(sc47) << 32, mn = (u[1] & lo6) | uint64_t(mn47) << 32;
    const __m256 scf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    const __m256 mnf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(mn))));
    _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_set1_ps(half_to_float(blk)), scf));
    _mm256_storeu_ps(m, _mm256_mul_ps(_mm256_set1_ps(half_to_float(blk + 2)), mnf));
    qs = blk + 16;
  }
};

struct Q4_KDec {
  static constexpr int kElems = 256, kVecs = 32;
  Q4_KScales k;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) { k.load(row, b); }
  SPECDEC_AVX2 __m256 vec(int v) const {  // sub-block v / 4; bytes 8 * (v % 4) of its chunk
    const int s = v / 4;
    const __m128i b8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k.qs + 32 * (s / 2) + 8 * (v % 4)));
    __m256i q = _mm256_cvtepu8_epi32(b8);
    if (s % 2) q = _mm256_srli_epi32(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi32(0x0F));
    return _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(k.d[s]), _mm256_set1_ps(k.m[s]));
  }
};

// The other block formats (Q5_0, Q5_1, Q5_K, Q6_K): a block is dequantized into a buffer
// with ggml_dequantize's operations in its order, eight values at a time, so the values are its
// own. (Every product is exact in float32: the scales hold at most 11 + 8 significant bits and the
// quants at most 5, so d * sc * q is exact in any order and the one addition rounds once.)
enum class Then { kNothing, kAdd, kSub };

// y[0..15] = float(q[0..15]) * s, then + or - m; the bytes are signed.
template <Then op>
SPECDEC_AVX2 inline void put16(__m128i q, float s, float m, float* y) {
  const __m256 sv = _mm256_set1_ps(s), mv = _mm256_set1_ps(m);
  for (int h = 0; h < 2; ++h) {
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(q, 8) : q)), sv);
    if constexpr (op == Then::kAdd) v = _mm256_add_ps(v, mv);
    if constexpr (op == Then::kSub) v = _mm256_sub_ps(v, mv);
    _mm256_storeu_ps(y + 8 * h, v);
  }
}
// 32 values: the first 16 with (s0, m0), the next 16 with (s1, m1).
template <Then op>
SPECDEC_AVX2 inline void put32(__m256i q, float s0, float m0, float s1, float m1, float* y) {
  put16<op>(_mm256_castsi256_si128(q), s0, m0, y);
  put16<op>(_mm256_extracti128_si256(q, 1), s1, m1, y + 16);
}
SPECDEC_AVX2 inline __m256i low_nibbles(__m256i q) { return _mm256_and_si256(q, _mm256_set1_epi8(0x0F)); }
SPECDEC_AVX2 inline __m256i high_nibbles(__m256i q) { return low_nibbles(_mm256_srli_epi16(q, 4)); }
SPECDEC_AVX2 inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// Bytes that are 0x10 where `q & bit` equals `bit`, else 0.
SPECDEC_AVX2 inline __m256i bit16(__m256i q, __m256i bit) {
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(q, bit), bit), _mm256_set1_epi8(0x10));
}

template <GgmlType T>
SPECDEC_AVX2 void dequantize_block(const uint8_t* b, float* y) {
  if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
    // d, [m], qh (bit j: the fifth bit of element j), qs[16]: element j < 16 the low nibble of qs[j]
    constexpr bool q5_1 = T == GgmlType::kQ5_1;
    const float d = half_to_float(b), m = q5_1 ? half_to_float(b + 2) : 0.0f;
    const uint8_t* qh = b + (q5_1 ? 4 : 2);
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    // byte j of `h` holds byte j / 8 of qh, tested against bit j mod 8
    const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                          _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    Nibbles nib;
    nib.load(qh + 4);
    __m256i q = _mm256_or_si256(_mm256_set_m128i(nib.hi, nib.lo), bit16(h, _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201))));
    if constexpr (!q5_1) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    put32<Then::kAdd>(q, d, m, d, m, y);
  } else if constexpr (T == GgmlType::kQ5_K) {
    // d, dmin, scales[12], qh[32], qs[128]: 4 chunks of 64 = 32 low nibbles, then 32 high ones,
    // each with its fifth bit from qh (bits 2 * chunk and 2 * chunk + 1)
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t* scales = b + 4;
    const __m256i qh = load32(b + 16);
    const uint8_t* qs = b + 48;
    for (int chunk = 0; chunk < 4; ++chunk, qs += 32, y += 64) {
      const __m256i q = load32(qs);
      const __m256i lo = _mm256_or_si256(low_nibbles(q), bit16(qh, _mm256_set1_epi8(static_cast<char>(1 << (2 * chunk)))));
      const __m256i hi = _mm256_or_si256(high_nibbles(q), bit16(qh, _mm256_set1_epi8(static_cast<char>(2 << (2 * chunk)))));
      int sc, mn;
      ggml_scale_min_k4(2 * chunk, scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      ggml_scale_min_k4(2 * chunk + 1, scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      put32<Then::kSub>(lo, d1, m1, d1, m1, y);
      put32<Then::kSub>(hi, d2, m2, d2, m2, y + 32);
    }
  } else {
    static_assert(T == GgmlType::kQ6_K);
    // ql[128], qh[64], scales[16] (int8), d; two halves of 128, each 4 runs of 32 with two scales
    const float d = half_to_float(b + 208);
    for (int n = 0; n < 2; ++n, y += 128) {
      const __m256i ql0 = load32(b + 64 * n), ql1 = load32(b + 64 * n + 32), qh = load32(b + 128 + 32 * n);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
      const __m256i three = _mm256_set1_epi8(3), offset = _mm256_set1_epi8(32);
      const __m256i lows[4] = {low_nibbles(ql0), low_nibbles(ql1), high_nibbles(ql0), high_nibbles(ql1)};
      for (int r = 0; r < 4; ++r) {
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), three);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lows[r], _mm256_slli_epi16(h, 4)), offset);
        put32<Then::kNothing>(q, d * sc[2 * r], 0.0f, d * sc[2 * r + 1], 0.0f, y + 32 * r);
      }
    }
  }
}

template <GgmlType T, int E>
struct BufferDec {
  static constexpr int kElems = E, kVecs = E / 8;
  float buf[E];
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    static const int64_t bytes = ggml_block_bytes(T);
    dequantize_block<T>(row + b * bytes, buf);
  }
  SPECDEC_AVX2 __m256 vec(int v) const { return _mm256_loadu_ps(buf + 8 * v); }
};

// The float16 fields at p and p + 2 converted in every even and odd lane: a 32-bit broadcast load
// (a load, no shuffle) and one conversion. half_to_float's insert, convert and broadcast took three
// shuffle-port operations per field; on a Skylake-SP Xeon, where that port also does the table
// lookups, Q4_1's two fields made its one-row decode twice Q4_0's time.
SPECDEC_AVX512 inline __m512 fields2(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_cvtph_ps(_mm256_set1_epi32(v));
}
// The float16 field at p in every lane (a 16-bit broadcast and one conversion).
SPECDEC_AVX512 inline __m512 field1(const uint8_t* p) {
  int16_t v;
  std::memcpy(&v, p, 2);
  return _mm512_cvtph_ps(_mm256_set1_epi16(v));
}
SPECDEC_AVX512 inline __m512 even_lanes(__m512 v) { return _mm512_permute_ps(v, 0x00); }
SPECDEC_AVX512 inline __m512 odd_lanes(__m512 v) { return _mm512_permute_ps(v, 0x55); }

// AVX-512 decoders: kVecs vectors of 16 floats per block, the same values; Ymm is the AVX2 decoder
// of the format (the float formats' last chunk of 8 and tail).
struct F32DecZ {
  using Ymm = F32Dec;
  static constexpr int kElems = 16, kVecs = 1, kBlockBytes = 64;
  const float* p;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { p = reinterpret_cast<const float*>(row) + b * 16; }
  SPECDEC_AVX512 __m512 vec(int) const { return _mm512_loadu_ps(p); }
};

struct BF16DecZ {
  using Ymm = BF16Dec;
  static constexpr int kElems = 16, kVecs = 1, kBlockBytes = 32;
  const uint8_t* p;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { p = row + b * 32; }
  SPECDEC_AVX512 __m512 vec(int) const {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

struct F16DecZ {
  using Ymm = F16Dec;
  static constexpr int kElems = 16, kVecs = 1, kBlockBytes = 32;
  const uint8_t* p;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { p = row + b * 32; }
  SPECDEC_AVX512 __m512 vec(int) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

struct Q8_0DecZ {
  static constexpr int kElems = 32, kVecs = 2;
  __m512 d;
  const uint8_t* q;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kQ8_0Bytes;
    d = field1(blk);
    q = blk + 2;
  }
  SPECDEC_AVX512 __m512 vec(int v) const {
    const __m128i b16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * v));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b16)), d);
  }
};

// Q4_0 and Q4_1 through a table: the 16 values a nibble can stand for in this block, computed as
// the AVX2 decoders compute each value ((q - 8) * d, q * d + m: the same bits), then looked up with
// one permute per 16 weights, whose index is a nibble's 4 bits (a byte zero-extended to 32 bits
// holds the low nibble in bits 0-3; shifted right by 4, the high one). A block costs one multiply
// or FMA instead of one per 16 weights, and no int-to-float conversion.
SPECDEC_AVX512 inline __m512 nibble_values() {  // 0, 1, ..., 15
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

template <GgmlType T>
struct Nibble4TableZ {
  static constexpr int kElems = 32, kVecs = 2;
  __m512 table;
  __m512i bytes;  // the 16 bytes of nibbles, one per 32-bit lane
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    constexpr bool q4_0 = T == GgmlType::kQ4_0;  // [d, nibbles] or [d, m, nibbles]
    const uint8_t* blk = row + b * (q4_0 ? kQ4_0Bytes : kQ4_1Bytes);
    const __m512 iota = nibble_values();
    if constexpr (q4_0) {
      table = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8)), field1(blk));
    } else {
      const __m512 dm = fields2(blk);
      table = _mm512_fmadd_ps(iota, even_lanes(dm), odd_lanes(dm));
    }
    bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q4_0 ? 2 : 4))));
  }
  // v = 0: the low nibbles (elements 0-15), v = 1: the high ones (16-31)
  SPECDEC_AVX512 __m512 vec(int v) const {
    return _mm512_permutexvar_ps(v ? _mm512_srli_epi32(bytes, 4) : bytes, table);
  }
};
using Q4_0DecZ = Nibble4TableZ<GgmlType::kQ4_0>;
using Q4_1DecZ = Nibble4TableZ<GgmlType::kQ4_1>;

struct Q4_KDecZ {
  static constexpr int kElems = 256, kVecs = 16;
  Q4_KScales k;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { k.load(row, b); }
  // Sub-block v / 2, bytes 16 * (v % 2) of its chunk; through a table of its 16 values as
  // Nibble4TableZ (q * d - m, the bits Q4_KDec computes), shared by the sub-block's two vectors.
  SPECDEC_AVX512 __m512 vec(int v) const {
    const int s = v / 2;
    const __m128i b16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.qs + 32 * (s / 2) + 16 * (v % 2)));
    __m512i q = _mm512_cvtepu8_epi32(b16);
    if (s % 2) q = _mm512_srli_epi32(q, 4);
    return _mm512_permutexvar_ps(q, _mm512_fmsub_ps(nibble_values(), _mm512_set1_ps(k.d[s]), _mm512_set1_ps(k.m[s])));
  }
};

// Q6_K without the buffer: vector v (16 values) of half h = v / 8 is run r = (v / 2) % 4, bytes
// 16 (v % 2) of it: the low (r < 2) or high nibbles of ql[64 h + 32 (r % 2) + ...], bits 2r, 2r + 1
// of qh[32 h + ...] as bits 4-5, minus 32, times d * sc[8 h + 2 r + v % 2]: the values, and the
// operations, of dequantize_block (one scale per 16 values, so one vector).
struct Q6_KDecZ {
  static constexpr int kElems = 256, kVecs = 16;
  const uint8_t* blk;
  float d;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    blk = row + b * Interleaved<GgmlType::kQ6_K>::kBytes;
    d = half_to_float(blk + 208);
  }
  SPECDEC_AVX512 __m512 vec(int v) const {
    const int h = v / 8, r = (v / 2) % 4, part = 16 * (v % 2);
    __m128i ql = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 * h + 32 * (r % 2) + part));
    if (r >= 2) ql = _mm_srli_epi16(ql, 4);
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 128 + 32 * h + part));
    const __m128i hi = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 2 * r), _mm_set1_epi8(3)), 4);
    const __m128i q = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(ql, _mm_set1_epi8(0x0F)), hi), _mm_set1_epi8(32));
    const auto sc = static_cast<int8_t>(blk[192 + 8 * h + 2 * r + v % 2]);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d * sc));
  }
};

template <GgmlType T, int E>
struct BufferDecZ : BufferDec<T, E> {  // the same buffer, read 16 at a time
  static constexpr int kVecs = E / 16;
  SPECDEC_AVX512 __m512 vec(int v) const { return _mm512_loadu_ps(this->buf + 16 * v); }
};

SPECDEC_AVX2 inline float hsum(__m256 s) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// hsum of a 16-lane accumulator: lanes l and l + 8 added first.
SPECDEC_AVX512 inline float hsum(__m512 a) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
}

// hsum of 16 accumulators at once, transposing as it adds: lanes l and l + 8 (shuffle_f32x4), then
// l and l + 4, l and l + 2 (shuffle_ps), l and l + 1, the additions of hsum, so the same bits, in 15
// additions and 30 shuffles instead of 64 and 64. Lane 4c + q of the result holds a[c + 4q]'s sum.
SPECDEC_AVX512 inline __m512 hsum16(const __m512 (&a)[16]) {
  __m512 p[8], r[4], t[2];
  for (int i = 0; i < 8; ++i)  // [a8 of a[2i], a8 of a[2i + 1]]
    p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // chunk c: the 4 lanes of a[4i + c]
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // chunk c: the 2 lanes of a[8i + c], then of a[8i + 4 + c]
    t[i] = _mm512_add_ps(_mm512_shuffle_ps(r[2 * i], r[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(r[2 * i], r[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x88), _mm512_shuffle_ps(t[0], t[1], 0xDD));
}

// The sums of the N accumulators a[0..N) into s: 16 at a time (a last group of 8 or more padded with
// zeros), the rest one by one.
template <int N>
SPECDEC_AVX512 inline void hsums(const __m512* a, float* s) {
  int g = 0;
  for (; g + 8 <= N; g += 16) {
    __m512 group[16];
    for (int m = 0; m < 16; ++m) group[m] = g + m < N ? a[g + m] : _mm512_setzero_ps();
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, hsum16(group));
    for (int m = 0; m < 16 && g + m < N; ++m) s[g + m] = lanes[4 * (m % 4) + m / 4];
  }
  for (; g < N; ++g) s[g] = hsum(a[g]);
}

// The float formats take any K: a last chunk of 8 into lanes 0-7, then the tail; the block formats
// take whole blocks only.
template <class Dec>
constexpr bool kAnyK = Dec::kElems == 16;

// The last K mod 8 products, in order, after the horizontal sum.
template <class Dec>
SPECDEC_AVX2 inline float tail(float s, const uint8_t* w, const float* x, int64_t c, int64_t k) {
  for (; c < k; ++c) s = std::fma(Dec::scalar(w, c), x[c], s);
  return s;
}

// Register tiles: NB weight rows x TB input rows, every output element with its own accumulators
// (one block of a weight row decoded at a time, serving all TB input rows).
template <class Dec>
struct FloatTiles {  // AVX2: two 8-lane halves per output (even and odd chunks of 8)
  static constexpr int kMaxRows = 6, kWideRows = 2, kWideMaxRows = 6;
  static int64_t wide_long_from() { return INT64_MAX; }  // not measured without AVX-512 (see rows_x86)
  static constexpr bool kPacks = !kAnyK<Dec>;  // see FloatTilesZ::pack
  using Packed = FloatTiles<F32Dec>;
  template <int NB>
  SPECDEC_AVX2 static void pack(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, float* buf) {
    for (int i = 0; i < NB; ++i)
      for (int64_t b = 0; b < k / Dec::kElems; ++b) {
        Dec dec;
        dec.start(w + (n + i) * row_bytes, b);
        for (int v = 0; v < Dec::kVecs; ++v) _mm256_storeu_ps(buf + i * k + b * Dec::kElems + 8 * v, dec.vec(v));
      }
  }
  template <int NB, int TB>
  SPECDEC_AVX2 static void tile(const void* xv, int64_t k, const uint8_t* w, int64_t row_bytes, int64_t n,
                                int64_t t, int64_t n_total, float* y) {
    const float* x = static_cast<const float*>(xv);
    const int64_t blocks = k / Dec::kElems, c_end = blocks * Dec::kElems;
    const bool chunk8 = kAnyK<Dec> && k - c_end >= 8;
    const uint8_t* wr[NB];
    const float* xr[TB];
    for (int i = 0; i < NB; ++i) wr[i] = w + (n + i) * row_bytes;
    for (int j = 0; j < TB; ++j) xr[j] = x + (t + j) * k;
    // Up to 6 outputs: both halves in one sweep (two chains per output: half the latency a decode
    // waits on); more: one half per sweep over the block, so that the accumulators fit 16 registers.
    constexpr int kHalves = NB * TB <= 6 ? 2 : 1;
    __m256 sums[NB][TB][2];
SPECDEC_UNROLL(2)
    for (int sweep = 0; sweep < 2 / kHalves; ++sweep) {
      __m256 acc[NB][TB][kHalves];
      for (int i = 0; i < NB; ++i)
        for (int j = 0; j < TB; ++j)
          for (int h = 0; h < kHalves; ++h) acc[i][j][h] = _mm256_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b)
        for (int i = 0; i < NB; ++i) {  // one weight row's block at a time: one decoder state live
          Dec dec;
          dec.start(wr[i], b);
SPECDEC_UNROLL(32)
          for (int v = 0; v < Dec::kVecs; ++v) {
            if (kHalves == 1 && (v & 1) != sweep) continue;
            const int h = kHalves == 2 ? (v & 1) : 0;
            const __m256 wv = dec.vec(v);
            const int64_t c = b * Dec::kElems + 8 * v;
SPECDEC_UNROLL(16)
            for (int j = 0; j < TB; ++j) acc[i][j][h] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[j] + c), acc[i][j][h]);
          }
        }
      if constexpr (kAnyK<Dec>)
        if (chunk8 && sweep == 0)
          for (int i = 0; i < NB; ++i) {
            const __m256 wv = Dec::vec8(wr[i], c_end);
            for (int j = 0; j < TB; ++j) acc[i][j][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[j] + c_end), acc[i][j][0]);
          }
      for (int i = 0; i < NB; ++i)
        for (int j = 0; j < TB; ++j)
          for (int h = 0; h < kHalves; ++h) sums[i][j][sweep + h] = acc[i][j][h];
    }
    const int64_t c = c_end + (chunk8 ? 8 : 0);
    for (int i = 0; i < NB; ++i)
      for (int j = 0; j < TB; ++j) {
        float s = hsum(_mm256_add_ps(sums[i][j][0], sums[i][j][1]));
        if constexpr (kAnyK<Dec>) s = tail<Dec>(s, wr[i], xr[j], c, k);
        y[(t + j) * n_total + n + i] = s;
      }
  }
};

// Prefetch of the `bytes` bytes 8 KiB past p: with the hardware prefetcher alone a one-token
// decode runs 15% slower. 8 KiB rather than the 4 KiB of before 2026-11-29: on Zen 5 (`specdec
// generate --int8-activations`, 32 tokens, three alternating rounds) a one-token pass at 1 thread
// took 66-68 ms instead of 71-78 on the 1.1B F16 target and 2.57-2.76 instead of 2.79-2.85 on
// SmolLM2 Q4_1, Q4_K_M the same within 3%; 12 and 16 KiB helped F16 a little more and Q4_K less.
// On an earlier VM 7-10 KB ahead had made the Q4_K/Q6_K 8-bit kernels 1.1-1.3x slower at 1-2
// tokens (docs/kernels.md); on Zen 5 they are 6-16% faster at 8 KiB.
SPECDEC_AVX2 inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + 8192 + i), _MM_HINT_T0);
}

// True on AMD family 26 (Zen 5), whose tile choices were measured apart (FloatTilesZ).
bool amd_family_26() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541 || d != 0x69746e65 || c != 0x444d4163)
      return false;  // not "AuthenticAMD"
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return ((a >> 8) & 0xF) == 0xF && ((a >> 20) & 0xFF) + 0xF == 26;
  }();
  return yes;
}

// AVX-512: one 16-lane accumulator per output: 1 x 8, or 6 weight rows x 4 input rows in
// prefill (4 x 6, the other way round, was 13-14% slower on an 8192 x 2048 F16 and F32 projection
// over 128 rows: fewer input rows per tile keep more of x in L1 while the 6 weight rows stream).
//
// kPrefetch: one weight row streamed (decode, verification) prefetches its next bytes (wider tiles
// read rows side by side, where prefetching made a prefill of the 1.1B F16 target 2x slower). On
// for every format but float32, and for float32 on Zen 5 (x86_rows): there the hardware prefetcher
// alone streamed 64 bytes per 16 weights slower (a one-token SmolLM2 F32 pass at 1 thread 10-25%
// faster without it on Zen 4; on Zen 5, 2026-11-29, `specdec generate`, alternating builds, 1
// thread: SmolLM2 F32 decode 14.1-16.7 ms with it against 19.0-23.1, a 6-row verification pass
// 17.8-18.4 against 25.3-25.8, the 1.1B F32 decode 108-122 against 113-137; 2 threads alike or
// faster). It replaced ab6b97c's tile of 4 float32 rows side by side for one-token passes on long
// rows (Zen 5, 1.1B F32, 1 thread, the same minutes: 134-137 ms, 155-166 with each of the 4 rows
// prefetched, against 121 for the one prefetched row).
template <class Dec, bool kPrefetch = !std::is_same_v<Dec, F32DecZ>>
struct FloatTilesZ {
  static constexpr int kMaxRows = 8, kWideRows = 6, kWideMaxRows = 4;
  // Passes of at least this many input rows take the wide tiles on long weight rows (see
  // rows_x86), measured on a 1.1B Llama (k = 2048 and 5632) with `specdec generate`, 1 thread, the
  // wide tiles against the narrow ones. The CPUs disagree, so each keeps its own choice:
  // - Zen 4 (and every CPU not measured apart): F32 from 4 (a 4-row pass 1.5x faster), Q8_0 and
  //   Q4_0 from 6, Q4_K from 8, F16 from 1 (its six independent FMA chains made even a one-token
  //   pass 1.1-1.25x faster); the others never.
  // - Zen 5 (AMD family 26, 2026-11-29), where six weight streams side by side are slow: F16
  //   from 3 (1 token: 69 against 79 ms, 2: 74 against 80, 3: 88 against 98), F32 from 3 (2
  //   tokens alike, 133 ms; 3: 146 against 190), Q8_0 and Q4_0 from 8 (Q8_0 at 6 tokens 109-113
  //   against 147-151, at 7 135 against 148, at 8 139-140 against 163; Q4_0 at 7 107 against 125,
  //   at 8 125-128 against 128-132), Q4_K never (8 tokens of Q4_K_M 142 against 147).
  static int64_t wide_long_from() {
    constexpr bool f16 = std::is_same_v<Dec, F16DecZ>, f32 = std::is_same_v<Dec, F32DecZ>,
                   q8_q4 = std::is_same_v<Dec, Q8_0DecZ> || std::is_same_v<Dec, Q4_0DecZ>,
                   q4_k = std::is_same_v<Dec, Q4_KDecZ>;
    if (amd_family_26()) return f16 || f32 ? 3 : q8_q4 ? 8 : INT64_MAX;
    return f16 ? 1 : f32 ? 4 : q8_q4 ? 6 : q4_k ? 8 : INT64_MAX;
  }
  // Prefill (more than kStreamRows input rows): the NB weight rows decoded once into float32 rows
  // (buf, NB x k), which the tiles of FloatTilesZ<F32DecZ> then read for every input row of the
  // pass, instead of each tile of kWideMaxRows input rows decoding them again: the same values in
  // the same FMAs, so the same bits. The block formats only: on an Intel Xeon Skylake-SP a SmolLM2
  // pass over 128 tokens at 1 thread ran 1.3-2.9x faster in Q4_1, Q8_0 and Q4_K_M (AVX2 kernels
  // 1.0-1.9x), but F16 1.05x slower (twice the bytes of its weights re-read, a conversion saved).
  static constexpr bool kPacks = !kAnyK<Dec>;  // so K is whole blocks
  using Packed = FloatTilesZ<F32DecZ>;
  template <int NB>
  SPECDEC_AVX512 static void pack(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, float* buf) {
    for (int i = 0; i < NB; ++i)
      for (int64_t b = 0; b < k / Dec::kElems; ++b) {
        Dec dec;
        dec.start(w + (n + i) * row_bytes, b);
        for (int v = 0; v < Dec::kVecs; ++v) _mm512_storeu_ps(buf + i * k + b * Dec::kElems + 16 * v, dec.vec(v));
      }
  }
  template <int NB, int TB>
  SPECDEC_AVX512 static void tile(const void* xv, int64_t k, const uint8_t* w, int64_t row_bytes, int64_t n,
                                  int64_t t, int64_t n_total, float* y) {
    const float* x = static_cast<const float*>(xv);
    const int64_t blocks = k / Dec::kElems;
    __m512 acc[NB][TB];
    for (int i = 0; i < NB; ++i)
      for (int j = 0; j < TB; ++j) acc[i][j] = _mm512_setzero_ps();
    const uint8_t* wr[NB];
    const float* xr[TB];
    for (int i = 0; i < NB; ++i) wr[i] = w + (n + i) * row_bytes;
    for (int j = 0; j < TB; ++j) xr[j] = x + (t + j) * k;
    const int64_t block_bytes = blocks ? row_bytes / blocks : 0;
    constexpr bool prefetched = NB == 1 && kPrefetch;
    if constexpr (NB == 1 && TB == 1 && kAnyK<Dec>) {
      // One weight row of a float format against one input row (a one-token pass): the loads and
      // FMAs of the loop below in its order, with pointers that step a block at a time instead of
      // offsets from the row's start. On Zen 5 (2026-11-29, `specdec generate`, 1.1B target,
      // alternating builds) an F16 pass took 54-56 ms instead of 60-61 at 1 thread, 31 instead of
      // 35 at 2; F32 107-109 instead of 115-120 in a first round, alike in later ones (this VM's
      // float32 rate drifts by 10% from one minute to the next). Not for the block formats (their
      // decoding, not the addressing, bounds them: SmolLM2 Q4_1 and Q8_0, 1.1B Q4_K_M the same)
      // nor for more input rows (a 2- or 3-token F32 pass no faster), nor in the AVX2 tiles (F32
      // no faster).
      const uint8_t* wp = wr[0];
      const float* xp = xr[0];
      const float* end = xp + blocks * 16;
      for (; xp != end; xp += 16, wp += Dec::kBlockBytes) {
        if constexpr (prefetched) prefetch_ahead(wp, Dec::kBlockBytes);
        Dec dec;
        dec.start(wp, 0);
        acc[0][0] = _mm512_fmadd_ps(dec.vec(0), _mm512_loadu_ps(xp), acc[0][0]);
      }
    } else {
      for (int64_t b = 0; b < blocks; ++b) {
        Dec dec[NB];
        for (int i = 0; i < NB; ++i) {
          if constexpr (prefetched) prefetch_ahead(wr[i] + b * block_bytes, block_bytes);
          dec[i].start(wr[i], b);
        }
SPECDEC_UNROLL(16)
        for (int v = 0; v < Dec::kVecs; ++v) {
          __m512 wv[NB];
          for (int i = 0; i < NB; ++i) wv[i] = dec[i].vec(v);
          const int64_t c = b * Dec::kElems + 16 * v;
SPECDEC_UNROLL(16)
          for (int j = 0; j < TB; ++j) {  // each load of x serves the NB weight rows
            const __m512 xv = _mm512_loadu_ps(xr[j] + c);
            for (int i = 0; i < NB; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
          }
        }
      }
    }
    int64_t c = blocks * Dec::kElems;
    if constexpr (kAnyK<Dec>)
      if (k - c >= 8) {  // lanes 0-7 only (the mask keeps lanes 8-15 as they are)
        for (int i = 0; i < NB; ++i) {
          const __m512 wv = _mm512_castps256_ps512(Dec::Ymm::vec8(wr[i], c));
          for (int j = 0; j < TB; ++j)
            acc[i][j] = _mm512_mask3_fmadd_ps(wv, _mm512_castps256_ps512(_mm256_loadu_ps(xr[j] + c)), acc[i][j], 0x00FF);
        }
        c += 8;
      }
    float sums[NB * TB];  // output i * TB + j
    hsums<NB * TB>(&acc[0][0], sums);
    for (int i = 0; i < NB; ++i)
      for (int j = 0; j < TB; ++j) {
        float s = sums[i * TB + j];
        if constexpr (kAnyK<Dec>) s = tail<typename Dec::Ymm>(s, wr[i], xr[j], c, k);
        y[(t + j) * n_total + n + i] = s;
      }
  }
};

#define SPECDEC_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

// --- The interleaved 8-bit kernels (rows_interleaved): row r of a group of 16 in lane r ---
// Lanes16 (AVX-512 VNNI) holds the 16 rows in one register per activation row, Lanes8x2 (AVX2)
// rows 0-7 and then rows 8-15 in 8-lane registers; both compute the integers exactly and then the
// documented float operations lane by lane, so they give the bits of Interleaved<T>::block. A
// format's Lanes struct does one block (K-quants: super-block) of the group for TB activation
// rows: block512 in 16 lanes, block256 in the 8 lanes of half h. Its weights come as chunks of 4
// bytes of each row (64 bytes per chunk, 32 per half), each chunk against one 4-byte broadcast of
// the activations.

inline int32_t bytes4(const int8_t* p) {  // 4 activations as one 32-bit word
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Chunk c (4 bytes of each row, after the fields) of a block of format T, for the 16 lanes or for
// half h.
template <GgmlType T>
SPECDEC_AVX512_VNNI inline __m512i chunk512(const uint8_t* blk, int c) {
  return _mm512_loadu_si512(blk + Interleaved<T>::kFields * kInterleave + 64 * c);
}
template <GgmlType T>
SPECDEC_AVX2 inline __m256i chunk256(const uint8_t* blk, int c, int h) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
      blk + Interleaved<T>::kFields * kInterleave + 64 * c + 32 * h));
}
// 2-byte field f (a float16 scale) of the 16 rows, or of half h.
SPECDEC_AVX512_VNNI inline __m512 field512(const uint8_t* blk, int f) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * f)));
}
SPECDEC_AVX2 inline __m256 field256(const uint8_t* blk, int f, int h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 * f + 16 * h)));
}

struct Q8_0Lanes {  // d; 8 chunks of signed values
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  template <int TB>
  SPECDEC_AVX512_VNNI static void block512(const uint8_t* blk, const ActView& x, int64_t k,
                                           int64_t b, int64_t t, __m512 (&acc)[TB]) {
    const __m512 dw = field512(blk, 0);
    __m512i u[8];  // q + 128, unsigned
    for (int c = 0; c < 8; ++c)
      u[c] = _mm512_xor_si512(chunk512<kType>(blk, c), _mm512_set1_epi8(-128));
    for (int j = 0; j < TB; ++j) {
      const int64_t e = (t + j) * (k / 32) + b;
      const int8_t* q = x.q + (t + j) * k + b * 32;
      __m512i i0 = _mm512_set1_epi32(-128 * x.sum[e]), i1 = _mm512_setzero_si512();
      for (int c = 0; c < 8; c += 2) {
        i0 = _mm512_dpbusd_epi32(i0, u[c], _mm512_set1_epi32(bytes4(q + 4 * c)));
        i1 = _mm512_dpbusd_epi32(i1, u[c + 1], _mm512_set1_epi32(bytes4(q + 4 * c + 4)));
      }
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)),
                               _mm512_mul_ps(dw, _mm512_set1_ps(x.d[e])), acc[j]);
    }
  }
  template <int TB>
  SPECDEC_AVX2 static void block256(const uint8_t* blk, int h, const ActView& x, int64_t k,
                                    int64_t b, int64_t t, __m256 (&acc)[TB]) {
    const __m256 dw = field256(blk, 0, h);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i w[8];
    for (int c = 0; c < 8; ++c) w[c] = chunk256<kType>(blk, c, h);
    for (int j = 0; j < TB; ++j) {
      const int64_t e = (t + j) * (k / 32) + b;
      const int8_t* q = x.q + (t + j) * k + b * 32;
      __m256i isum = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {  // |w| * (x with w's sign): pairs of at most 2 x 128 x 127
        const __m256i xb = _mm256_set1_epi32(bytes4(q + 4 * c));
        isum = _mm256_add_epi32(
            isum,
            _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_abs_epi8(w[c]), _mm256_sign_epi8(xb, w[c])), ones));
      }
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[e])),
                               acc[j]);
    }
  }
};

// Q4_0 (d; 4 chunks of nibbles), Q4_1 (d, m; the same), Q5_0 (d; chunk 0: qh; chunks 1-4: nibbles)
// and Q5_1 (d, m; the same as Q5_0). The low nibbles of nibble chunk c are values 4c..4c+3 (byte i
// of a lane: value 4c + i), the high ones 16+4c..16+4c+3; a Q5 value's fifth bit is bit 4c + i
// (low) or 16 + 4c + i (high) of the lane's qh word. Those 4 bits lie in one byte of qh (byte c / 2
// or 2 + c / 2, nibble c % 2): a shuffle copies it to the 4 bytes of the lane, and byte i tests bit
// i + 4 (c % 2). The values come out unsigned (0..15, 0..31); Q4_0/Q5_0 subtract their offset (8,
// 16) as offset x the block's activation sum, Q4_1/Q5_1 add m x s.
template <GgmlType T>
struct NibbleLanes {
  static constexpr GgmlType kType = T;
  static constexpr bool kFive = T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1;
  static constexpr bool kMin = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
  static constexpr int32_t kOffset = kMin ? 0 : kFive ? 16 : 8;
  static constexpr int kNibbles = kFive ? 1 : 0;  // the first nibble chunk
  // Shuffle indices: byte `at` of each 32-bit lane into all 4 of its bytes; the bit byte i tests.
  static constexpr int32_t spread(int at) { return at * 0x01010101; }
  static constexpr int32_t bits(int c) { return static_cast<int32_t>(0x08040201u << (4 * (c % 2))); }
  // The 16-lane mask of the bytes whose value has its fifth bit (byte `at` of the lane's qh word,
  // bit i + 4 (c % 2) in byte i), and the 8-lane vector of 0x10 in those bytes.
  SPECDEC_AVX512_VNNI static __mmask64 fifth512(__m512i qh, int at, int c) {
    const __m512i lanes = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0);
    return _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, _mm512_add_epi8(lanes, _mm512_set1_epi32(spread(at)))),
                                 _mm512_set1_epi32(bits(c)));
  }
  SPECDEC_AVX2 static __m256i fifth256(__m256i qh, int at, int c) {
    const __m256i lanes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404,
                                            0x08080808, 0x0C0C0C0C);
    const __m256i bit = _mm256_set1_epi32(bits(c));
    const __m256i v = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lanes, _mm256_set1_epi32(spread(at))));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
  }
  // The block's values: 4c..4c+3 in v[c], 16+4c.. in v[4 + c], for the 16 lanes or for half h.
  SPECDEC_AVX512_VNNI static void values512(const uint8_t* blk, __m512i (&v)[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = chunk512<kType>(blk, kNibbles + c);
      v[c] = _mm512_and_si512(raw, m4);
      v[4 + c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        const __m512i qh = chunk512<kType>(blk, 0), fifth = _mm512_set1_epi8(0x10);
        v[c] = _mm512_mask_add_epi8(v[c], fifth512(qh, c / 2, c), v[c], fifth);
        v[4 + c] = _mm512_mask_add_epi8(v[4 + c], fifth512(qh, 2 + c / 2, c), v[4 + c], fifth);
      }
    }
  }
  SPECDEC_AVX2 static void values256(const uint8_t* blk, int h, __m256i (&v)[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = chunk256<kType>(blk, kNibbles + c, h);
      v[c] = _mm256_and_si256(raw, m4);
      v[4 + c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        const __m256i qh = chunk256<kType>(blk, 0, h);
        v[c] = _mm256_or_si256(v[c], fifth256(qh, c / 2, c));
        v[4 + c] = _mm256_or_si256(v[4 + c], fifth256(qh, 2 + c / 2, c));
      }
    }
  }
  template <int TB>
  SPECDEC_AVX512_VNNI static void block512(const uint8_t* blk, const ActView& x, int64_t k,
                                           int64_t b, int64_t t, __m512 (&acc)[TB]) {
    const __m512 dw = field512(blk, 0);
    __m512i v[8];
    values512(blk, v);
    for (int j = 0; j < TB; ++j) {
      const int64_t e = (t + j) * (k / 32) + b;
      const int8_t* q = x.q + (t + j) * k + b * 32;
      __m512i i0 = _mm512_set1_epi32(-kOffset * x.sum[e]), i1 = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        i0 = _mm512_dpbusd_epi32(i0, v[c], _mm512_set1_epi32(bytes4(q + 4 * c)));
        i1 = _mm512_dpbusd_epi32(i1, v[4 + c], _mm512_set1_epi32(bytes4(q + 16 + 4 * c)));
      }
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)),
                               _mm512_mul_ps(dw, _mm512_set1_ps(x.d[e])), acc[j]);
      if constexpr (kMin) acc[j] = _mm512_fmadd_ps(field512(blk, 1), _mm512_set1_ps(x.s[e]), acc[j]);
    }
  }
  template <int TB>
  SPECDEC_AVX2 static void block256(const uint8_t* blk, int h, const ActView& x, int64_t k,
                                    int64_t b, int64_t t, __m256 (&acc)[TB]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 dw = field256(blk, 0, h);
    __m256i v[8];
    values256(blk, h, v);
    // 16-bit sums of pairs of products: 8 x 2 of at most 15 x 127 fit one; 5-bit values (31 x 127)
    // need the low and the high halves apart.
    constexpr int kHigh = kFive ? 1 : 0;
    for (int j = 0; j < TB; ++j) {
      const int64_t e = (t + j) * (k / 32) + b;
      const int8_t* q = x.q + (t + j) * k + b * 32;
      __m256i s16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int c = 0; c < 4; ++c) {
        s16[0] = _mm256_add_epi16(s16[0], _mm256_maddubs_epi16(v[c], _mm256_set1_epi32(bytes4(q + 4 * c))));
        s16[kHigh] = _mm256_add_epi16(
            s16[kHigh], _mm256_maddubs_epi16(v[4 + c], _mm256_set1_epi32(bytes4(q + 16 + 4 * c))));
      }
      __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_set1_epi32(-kOffset * x.sum[e]));
      if constexpr (kFive) isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16[1], ones));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[e])),
                               acc[j]);
      if constexpr (kMin) acc[j] = _mm256_fmadd_ps(field256(blk, 1, h), _mm256_set1_ps(x.s[e]), acc[j]);
    }
  }
};

// Q4_K (d, dmin; 3 chunks of scale bytes; 32 chunks of nibbles): sub-block s is the low (even s)
// or high nibbles of chunks 3 + 8 (s / 2) .. 3 + 8 (s / 2) + 7. Q5_K has 8 chunks of high bits
// (qh) before its nibbles (which start at chunk 11): bit s of each byte is the fifth bit of the
// value in sub-block s. Scale and minimum of sub-block s in each 32-bit lane come from the scale
// chunks (ggml's get_scale_min_k4 in every lane): w[0] = bytes 0-3, w[1] = 4-7, w[2] = 8-11.
// Q4_K's scale and minimum of sub-block s, Q6_K's int8 scale i (from its 4 chunks of scales) and
// its values, in each lane: for 8 lanes (AVX2) and 16 (AVX-512), written once.
#define SPECDEC_LANE_SCALES(ATTR, V, P, S)                                                      \
  ATTR inline void q4_k_scale_min(const V(&w)[3], int s, V* scale, V* min) {                    \
    const V m6 = P##_set1_epi32(63), m4 = P##_set1_epi32(15), m2 = P##_set1_epi32(3);           \
    if (s < 4) {                                                                                \
      *scale = P##_and_##S(P##_srli_epi32(w[0], 8 * s), m6);                                    \
      *min = P##_and_##S(P##_srli_epi32(w[1], 8 * s), m6);                                      \
    } else {                                                                                    \
      const int j = s - 4;                                                                      \
      *scale = P##_or_##S(P##_and_##S(P##_srli_epi32(w[2], 8 * j), m4),                         \
                          P##_slli_epi32(P##_and_##S(P##_srli_epi32(w[0], 8 * j + 6), m2), 4)); \
      *min = P##_or_##S(P##_and_##S(P##_srli_epi32(w[2], 8 * j + 4), m4),                       \
                        P##_slli_epi32(P##_and_##S(P##_srli_epi32(w[1], 8 * j + 6), m2), 4));   \
    }                                                                                           \
  }                                                                                             \
  ATTR inline V q6_k_scale(const V(&sc)[4], int i) {                                            \
    return P##_srai_epi32(P##_slli_epi32(sc[i / 4], 24 - 8 * (i % 4)), 24);                     \
  }                                                                                             \
  /* Q6_K's q + 32 of a sub-block r % 4 = r, from a chunk of ql and one of qh */                \
  ATTR inline V q6_k_values(V ql, V qh, int r) {                                                \
    if (r >= 2) ql = P##_srli_epi16(ql, 4);                                                     \
    if (r) qh = P##_srli_epi16(qh, 2 * r);                                                      \
    return P##_or_##S(P##_and_##S(ql, P##_set1_epi8(0x0F)),                                     \
                      P##_slli_epi16(P##_and_##S(qh, P##_set1_epi8(3)), 4));                    \
  }
SPECDEC_LANE_SCALES(SPECDEC_AVX2, __m256i, _mm256, si256)
SPECDEC_LANE_SCALES(SPECDEC_AVX512_VNNI, __m512i, _mm512, si512)
#undef SPECDEC_LANE_SCALES

template <GgmlType T>
struct KLanes {  // Q4_K, Q5_K
  static constexpr GgmlType kType = T;
  static constexpr bool kQ5 = T == GgmlType::kQ5_K;
  static constexpr int kNibbles = kQ5 ? 11 : 3;  // the first chunk of nibbles
  template <int TB>
  SPECDEC_AVX512_VNNI static void block512(const uint8_t* blk, const ActView& x, int64_t k,
                                           int64_t sb, int64_t t, __m512 (&acc)[TB]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512 d = field512(blk, 0), dmin = field512(blk, 1);
    __m512i words[3];
    for (int i = 0; i < 3; ++i) words[i] = chunk512<kType>(blk, i);
SPECDEC_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      __m512i scale, min;
      q4_k_scale_min(words, s, &scale, &min);
      const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(scale));
      const __m512 neg_dmin =  // -(dmin * min)
          _mm512_xor_ps(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(min)), _mm512_set1_ps(-0.0f));
      __m512i wq[8];
      for (int i = 0; i < 8; ++i) {
        const __m512i raw = chunk512<kType>(blk, kNibbles + 8 * (s / 2) + i);
        wq[i] = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(raw, 4) : raw, m4);
        if constexpr (kQ5)
          wq[i] = _mm512_or_si512(
              wq[i],
              _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(chunk512<kType>(blk, 3 + i), s),
                                                 _mm512_set1_epi8(1)),
                                4));
      }
      for (int j = 0; j < TB; ++j) {
        const int64_t e = (t + j) * (k / 32) + sb * 8 + s;
        const int8_t* q = x.q + (t + j) * k + sb * 256 + 32 * s;
        __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
        for (int i = 0; i < 8; i += 2) {
          i0 = _mm512_dpbusd_epi32(i0, wq[i], _mm512_set1_epi32(bytes4(q + 4 * i)));
          i1 = _mm512_dpbusd_epi32(i1, wq[i + 1], _mm512_set1_epi32(bytes4(q + 4 * i + 4)));
        }
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)),
                                 _mm512_mul_ps(dsc, _mm512_set1_ps(x.d[e])), acc[j]);
        acc[j] = _mm512_fmadd_ps(neg_dmin, _mm512_set1_ps(x.s[e]), acc[j]);
      }
    }
  }
  template <int TB>
  SPECDEC_AVX2 static void block256(const uint8_t* blk, int h, const ActView& x, int64_t k,
                                    int64_t sb, int64_t t, __m256 (&acc)[TB]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256 d = field256(blk, 0, h), dmin = field256(blk, 1, h);
    __m256i words[3];
    for (int i = 0; i < 3; ++i) words[i] = chunk256<kType>(blk, i, h);
SPECDEC_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      __m256i scale, min;
      q4_k_scale_min(words, s, &scale, &min);
      const __m256 dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(scale));
      const __m256 neg_dmin =
          _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(min)), _mm256_set1_ps(-0.0f));
      __m256i wq[8];
      for (int i = 0; i < 8; ++i) {
        const __m256i raw = chunk256<kType>(blk, kNibbles + 8 * (s / 2) + i, h);
        wq[i] = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(raw, 4) : raw, m4);
        if constexpr (kQ5)
          wq[i] = _mm256_or_si256(
              wq[i], _mm256_slli_epi16(
                         _mm256_and_si256(_mm256_srli_epi16(chunk256<kType>(blk, 3 + i, h), s),
                                          _mm256_set1_epi8(1)),
                         4));
      }
      for (int j = 0; j < TB; ++j) {
        const int64_t e = (t + j) * (k / 32) + sb * 8 + s;
        const int8_t* q = x.q + (t + j) * k + sb * 256 + 32 * s;
        __m256i isum = _mm256_setzero_si256();
        for (int i = 0; i < 8; i += 4) {  // 16-bit sums of 4 x 2 products of 31 x 127 at most
          __m256i s16 = _mm256_setzero_si256();
          for (int c = i; c < i + 4; ++c)
            s16 = _mm256_add_epi16(
                s16, _mm256_maddubs_epi16(wq[c], _mm256_set1_epi32(bytes4(q + 4 * c))));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, ones));
        }
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum),
                                 _mm256_mul_ps(dsc, _mm256_set1_ps(x.d[e])), acc[j]);
        acc[j] = _mm256_fmadd_ps(neg_dmin, _mm256_set1_ps(x.s[e]), acc[j]);
      }
    }
  }
};

// Q6_K (d; chunks 0-31: ql, 32-47: qh, 48-51: the int8 scales). Sub-block s of half h = s / 4
// (r = s % 4) takes chunks 16 h + 8 (r % 2) + i of ql (the high nibbles where r >= 2) and bits
// 2r, 2r + 1 of qh chunks 32 + 8 h + i as bits 4-5, i = 0..7 (values 4i..4i+3); its halves of 16
// have the scales 8 h + 2 r and 8 h + 2 r + 1.
struct Q6_KLanes {
  static constexpr GgmlType kType = GgmlType::kQ6_K;
  // Each half's 32 value chunks are decoded once, 4 at a time from one chunk of qh and the two
  // chunks of ql they share (sub-blocks r and r + 2 take the low and high nibbles of one ql chunk),
  // each value as one ternary-logic merge of its 4 low bits and its 2 high bits. Decoding a
  // sub-block's 8 chunks at a time read every ql chunk twice and every qh chunk four times. For
  // one or two activation rows each decoded chunk goes straight into the integer sums of its
  // sub-block (8 per row); for more, the half's 32 chunks are kept and the sub-blocks run one after
  // the other. The float operations run per sub-block in order either way.
  SPECDEC_AVX512_VNNI static void decode4(const uint8_t* blk, int h, int i, __m512i (&u)[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i qa = chunk512<kType>(blk, 16 * h + i), qb = chunk512<kType>(blk, 16 * h + 8 + i);
    const __m512i qh = chunk512<kType>(blk, 32 + 8 * h + i);
    // low | (high & 0x30): 0xF8 is A | (B & C)
    u[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(qa, m4), _mm512_slli_epi16(qh, 4), m30, 0xF8);
    u[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(qb, m4), _mm512_slli_epi16(qh, 2), m30, 0xF8);
    u[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(qa, 4), m4), qh, m30, 0xF8);
    u[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(qb, 4), m4), _mm512_srli_epi16(qh, 2),
                                     m30, 0xF8);
  }
  // acc += sub-block 4 h + r of activation row `row`, from its integer sums ia (values 0-15) and
  // ib (16-31) of q + 32; d: the block's d in every lane.
  SPECDEC_AVX512_VNNI static void finish(__m512 d, const __m512i (&sc)[4], const ActView& x, int64_t k,
                                         int64_t sb, int64_t row, int h, int r, __m512i ia, __m512i ib,
                                         __m512& acc) {
    const int64_t e = row * (k / 32) + sb * 8 + 4 * h + r;
    ia = _mm512_sub_epi32(ia, _mm512_set1_epi32(32 * x.sum16[2 * e]));
    ib = _mm512_sub_epi32(ib, _mm512_set1_epi32(32 * x.sum16[2 * e + 1]));
    const __m512i sa = q6_k_scale(sc, 8 * h + 2 * r), sb2 = q6_k_scale(sc, 8 * h + 2 * r + 1);
    const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(sa, ia), _mm512_mullo_epi32(sb2, ib));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(x.d[e])), acc);
  }
  template <int TB>
  SPECDEC_AVX512_VNNI static void block512(const uint8_t* blk, const ActView& x, int64_t k,
                                           int64_t sb, int64_t t, __m512 (&acc)[TB]) {
    const __m512 d = field512(blk, 0);
    __m512i sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = chunk512<kType>(blk, 48 + i);
    const int8_t* q = x.q + t * k + sb * 256;
    // the 4 activations of row t + j against chunk i of sub-block 4 h + r (a macro: a lambda would
    // not carry the function's target attributes)
#define SPECDEC_Q6_ACT(j, h, r, i) _mm512_set1_epi32(bytes4(q + (j) * k + 32 * (4 * (h) + (r)) + 4 * (i)))
    for (int h = 0; h < 2; ++h) {
      if constexpr (TB <= 2) {
        __m512i is[TB][4][2];
        for (int j = 0; j < TB; ++j)
          for (int r = 0; r < 4; ++r) is[j][r][0] = is[j][r][1] = _mm512_setzero_si512();
SPECDEC_UNROLL(8)
        for (int i = 0; i < 8; ++i) {
          __m512i u[4];
          decode4(blk, h, i, u);
          for (int j = 0; j < TB; ++j)
            for (int r = 0; r < 4; ++r) is[j][r][i / 4] = _mm512_dpbusd_epi32(is[j][r][i / 4], u[r], SPECDEC_Q6_ACT(j, h, r, i));
        }
        for (int r = 0; r < 4; ++r)
          for (int j = 0; j < TB; ++j) finish(d, sc, x, k, sb, t + j, h, r, is[j][r][0], is[j][r][1], acc[j]);
      } else {
        __m512i u[8][4];  // chunk i of sub-block 4 h + r
        for (int i = 0; i < 8; ++i) decode4(blk, h, i, u[i]);
SPECDEC_UNROLL(4)
        for (int r = 0; r < 4; ++r)
          for (int j = 0; j < TB; ++j) {
            __m512i ia = _mm512_setzero_si512(), ib = _mm512_setzero_si512();
            for (int i = 0; i < 4; ++i) {
              ia = _mm512_dpbusd_epi32(ia, u[i][r], SPECDEC_Q6_ACT(j, h, r, i));
              ib = _mm512_dpbusd_epi32(ib, u[4 + i][r], SPECDEC_Q6_ACT(j, h, r, 4 + i));
            }
            finish(d, sc, x, k, sb, t + j, h, r, ia, ib, acc[j]);
          }
      }
    }
#undef SPECDEC_Q6_ACT
  }
  template <int TB>
  SPECDEC_AVX2 static void block256(const uint8_t* blk, int hh, const ActView& x, int64_t k,
                                    int64_t sb, int64_t t, __m256 (&acc)[TB]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 d = field256(blk, 0, hh);
    __m256i sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = chunk256<kType>(blk, 48 + i, hh);
SPECDEC_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      const int h = s / 4, r = s % 4;
      __m256i u[8];  // q + 32
      for (int i = 0; i < 8; ++i)
        u[i] = q6_k_values(chunk256<kType>(blk, 16 * h + 8 * (r % 2) + i, hh),
                           chunk256<kType>(blk, 32 + 8 * h + i, hh), r);
      const __m256i sa = q6_k_scale(sc, 8 * h + 2 * r), sb2 = q6_k_scale(sc, 8 * h + 2 * r + 1);
      for (int j = 0; j < TB; ++j) {
        const int64_t e = (t + j) * (k / 32) + sb * 8 + s;
        const int8_t* q = x.q + (t + j) * k + sb * 256 + 32 * s;
        __m256i half[2];  // 16-bit sums of 2 x 2 products of 63 x 127 at most, then 32-bit
        for (int a = 0; a < 2; ++a) {
          half[a] = _mm256_set1_epi32(-32 * x.sum16[2 * e + a]);
          for (int i = 4 * a; i < 4 * a + 4; i += 2) {
            const __m256i p = _mm256_add_epi16(
                _mm256_maddubs_epi16(u[i], _mm256_set1_epi32(bytes4(q + 4 * i))),
                _mm256_maddubs_epi16(u[i + 1], _mm256_set1_epi32(bytes4(q + 4 * i + 4))));
            half[a] = _mm256_add_epi32(half[a], _mm256_madd_epi16(p, ones));
          }
        }
        const __m256i isum =
            _mm256_add_epi32(_mm256_mullo_epi32(sa, half[0]), _mm256_mullo_epi32(sb2, half[1]));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(x.d[e])),
                                 acc[j]);
      }
    }
  }
};

template <class F>
struct Lanes16 {  // AVX-512 VNNI
  static constexpr GgmlType kType = F::kType;
  static constexpr int kMaxRows = 8;
  template <int TB>
  SPECDEC_AVX512_VNNI static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t,
                                       int64_t n, int64_t n_total, float* y) {
    constexpr int64_t bytes = kInterleave * Interleaved<kType>::kBytes;
    __m512 acc[TB];
    for (int j = 0; j < TB; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / Interleaved<kType>::kValues; ++b) {
      prefetch_ahead(gw + b * bytes, bytes);
      F::template block512<TB>(gw + b * bytes, x, k, b, t, acc);
    }
    for (int j = 0; j < TB; ++j) _mm512_storeu_ps(y + (t + j) * n_total + n, acc[j]);
  }
};

template <class F>
struct Lanes8x2 {  // AVX2: rows 0-7, then rows 8-15
  static constexpr GgmlType kType = F::kType;
  static constexpr int kMaxRows = 4;
  template <int TB>
  SPECDEC_AVX2 static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t,
                                int64_t n, int64_t n_total, float* y) {
    constexpr int64_t bytes = kInterleave * Interleaved<kType>::kBytes;
    for (int h = 0; h < 2; ++h) {
      __m256 acc[TB];
      for (int j = 0; j < TB; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t b = 0; b < k / Interleaved<kType>::kValues; ++b) {
        if (h == 0) prefetch_ahead(gw + b * bytes, bytes);
        F::template block256<TB>(gw + b * bytes, h, x, k, b, t, acc);
      }
      for (int j = 0; j < TB; ++j) _mm256_storeu_ps(y + (t + j) * n_total + n + 8 * h, acc[j]);
    }
  }
};

// AMX (Intel's tile unit; AMX-INT8) for Q8_0: the same integers, the same float operations, so the
// bits of Lanes16. For a tile of TB >= kAmxFrom activation rows, per block of a group of 16 weight
// rows: tile A = the TB rows' 32 quantized activations, tile B = the block's 8 value chunks as
// stored (exactly the layout TDPBSSD reads: 4 values of each of 16 columns per row), so one tile
// multiply gives the TB x 16 exact integer sums; they go through memory into the lanes, where the
// documented float operations run as in Lanes16. Fewer rows take Lanes16 (one tile multiply costs
// about what 4 rows' vpdpbusd do). The nibble formats are not sent here: unpacking their values
// into memory for the tile load, once per block and tile of rows, made a 128-token prefill no
// faster than the VNNI kernel, often slower, on an Intel Xeon (Emerald Rapids).
#define SPECDEC_AMX \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
constexpr int kAmxFrom = 4;

struct alignas(64) TileConfig {  // the 64-byte operand of LDTILECFG, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux gives a process the tile data state (XFEATURE_XTILEDATA, 18) only when it asks
// (ARCH_REQ_XCOMP_PERM), and then every signal frame of the process carries 8 KB more, which can
// overflow a host application's small alternate signal stacks. So amx_supported() only looks (the
// CPU's AMX-TILE and AMX-INT8, the kernel's support: ARCH_GET_XCOMP_SUPP), and the permission is
// asked once, by amx_permitted(), when a kernel of the AMX family is made.
constexpr int kXtileData = 18;
bool amx_supported() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
#ifdef __linux__
  uint64_t features = 0;
  return syscall(SYS_arch_prctl, 0x1021, &features) == 0 && (features >> kXtileData & 1);
#else
  return false;
#endif
}
bool amx_permitted() {
#ifdef __linux__
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, kXtileData) == 0;
  return permitted;
#else
  return false;
#endif
}

struct Q8_0Amx {
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  static constexpr int kMaxRows = 16;
  template <int TB>
  SPECDEC_AMX static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t, int64_t n,
                               int64_t n_total, float* y) {
    if constexpr (TB < kAmxFrom) {
      Lanes16<Q8_0Lanes>::template tile<TB>(x, k, gw, t, n, n_total, y);
    } else {
      constexpr int64_t bytes = kInterleave * Interleaved<kType>::kBytes;
      TileConfig cfg;
      cfg.rows[0] = TB, cfg.colsb[0] = 32;  // A: TB rows of 32 int8 activations
      cfg.rows[1] = 8, cfg.colsb[1] = 64;   // B: 8 chunks of 16 x 4 values
      cfg.rows[2] = TB, cfg.colsb[2] = 64;  // C: TB x 16 int32 sums
      _tile_loadconfig(&cfg);
      alignas(64) int32_t isum[kMaxRows][16];
      __m512 acc[TB];
      for (int j = 0; j < TB; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* blk = gw + b * bytes;
        prefetch_ahead(blk, bytes);
        _tile_zero(2);
        _tile_loadd(0, x.q + t * k + b * 32, k);
        _tile_loadd(1, blk + 2 * kInterleave, 64);  // after the 16 rows' d
        _tile_dpbssd(2, 0, 1);
        _tile_stored(2, isum, 64);
        const __m512 dw = field512(blk, 0);
        for (int j = 0; j < TB; ++j) {
          const __m512 dx = _mm512_set1_ps(x.d[(t + j) * (k / 32) + b]);
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(isum[j])), _mm512_mul_ps(dw, dx), acc[j]);
        }
      }
      _tile_release();
      for (int j = 0; j < TB; ++j) _mm512_storeu_ps(y + (t + j) * n_total + n, acc[j]);
    }
  }
};

// Tiles of Tiles::kMaxRows input rows for one weight row (Tiles::kWideMaxRows for more), then
// one tile of exactly the rows that remain.
template <class Tiles, int NB, int R>
__attribute__((always_inline)) inline void rest_tile(int64_t rest, const void* x, int64_t k, const uint8_t* w,
                                                     int64_t row_bytes, int64_t n, int64_t t, int64_t n_total,
                                                     float* y) {
  if constexpr (R > 0) {
    if (rest == R) Tiles::template tile<NB, R>(x, k, w, row_bytes, n, t, n_total, y);
    else rest_tile<Tiles, NB, R - 1>(rest, x, k, w, row_bytes, n, t, n_total, y);
  }
}

template <class Tiles, int NB>
__attribute__((always_inline)) inline void row_block(const void* x, int64_t t_rows, int64_t k, const uint8_t* w,
                                                     int64_t row_bytes, int64_t n, int64_t n_total, float* y) {
  constexpr int TB = NB == 1 ? Tiles::kMaxRows : Tiles::kWideMaxRows;
  int64_t t = 0;
  for (; t + TB <= t_rows; t += TB) Tiles::template tile<NB, TB>(x, k, w, row_bytes, n, t, n_total, y);
  rest_tile<Tiles, NB, TB - 1>(t_rows - t, x, k, w, row_bytes, n, t, n_total, y);
}

// Up to kStreamRows input rows (decode, verification): one weight row at a time, in memory order,
// so that the hardware prefetcher sees one sequential stream (2 or 4 rows side by side made these
// passes up to 2.5x slower on SmolLM2, whose rows are short: 576 and 1536 columns; on a Skylake-SP
// Xeon a one-token Q4_1 pass with 2 rows side by side 1.5x slower, with 3 no faster). More rows
// (prefill): Tiles::kWideRows weight rows per tile, so each load of x serves them all, block
// formats decoded once into float32 for all the pass's rows (FloatTilesZ::pack). Long rows
// (k >= kLongRow) take the wide tiles from Tiles::wide_long_from() input rows: there the narrow
// tile's input rows (k floats each) no longer fit L1 beside the weights and are read again from
// L2 for every weight row. Tiling never changes an output's reduction order, only which outputs
// are computed side by side.
constexpr int64_t kStreamRows = 8, kLongRow = 2048;

template <class Tiles>
__attribute__((always_inline)) inline void rows_x86(const void* x, int64_t t_rows, int64_t k, const uint8_t* w,
                                                    int64_t row_bytes, int64_t n0, int64_t n1, int64_t n_total,
                                                    float* y) {
  int64_t n = n0;
  if (t_rows > kStreamRows || (k >= kLongRow && t_rows >= Tiles::wide_long_from())) {
    constexpr int NB = Tiles::kWideRows;
    if constexpr (Tiles::kPacks)
      if (t_rows > kStreamRows) {
        thread_local std::vector<float> buf;
        buf.resize(NB * k);
        for (; n + NB <= n1; n += NB) {
          Tiles::template pack<NB>(w, row_bytes, n, k, buf.data());
          row_block<typename Tiles::Packed, NB>(x, t_rows, k, reinterpret_cast<const uint8_t*>(buf.data()),
                                                k * 4, 0, n_total, y + n);
        }
      }
    for (; n + NB <= n1; n += NB) row_block<Tiles, NB>(x, t_rows, k, w, row_bytes, n, n_total, y);
  }
  for (; n < n1; ++n) row_block<Tiles, 1>(x, t_rows, k, w, row_bytes, n, n_total, y);
}

template <class Tiles>
SPECDEC_AVX2 void rows_avx2(const void* x, int64_t t_rows, int64_t k, const uint8_t* w, int64_t row_bytes,
                            int64_t n0, int64_t n1, int64_t n_total, float* y) {
  rows_x86<Tiles>(x, t_rows, k, w, row_bytes, n0, n1, n_total, y);
}

template <class Tiles>
SPECDEC_AVX512 void rows_avx512(const void* x, int64_t t_rows, int64_t k, const uint8_t* w, int64_t row_bytes,
                                int64_t n0, int64_t n1, int64_t n_total, float* y) {
  rows_x86<Tiles>(x, t_rows, k, w, row_bytes, n0, n1, n_total, y);
}

RowsFn x86_rows(GgmlType type, bool int8_activations, bool avx512, bool amx) {
  if (amx) return rows_interleaved<Q8_0Amx>;  // the Q8_0 kernel with 8-bit activations
  if (int8_activations && avx512 && __builtin_cpu_supports("avx512vnni")) {
    switch (type) {
      case GgmlType::kQ8_0:
        return rows_interleaved<Lanes16<Q8_0Lanes>>;
      case GgmlType::kQ4_0:
        return rows_interleaved<Lanes16<NibbleLanes<GgmlType::kQ4_0>>>;
      case GgmlType::kQ4_1:
        return rows_interleaved<Lanes16<NibbleLanes<GgmlType::kQ4_1>>>;
      case GgmlType::kQ5_0:
        return rows_interleaved<Lanes16<NibbleLanes<GgmlType::kQ5_0>>>;
      case GgmlType::kQ5_1:
        return rows_interleaved<Lanes16<NibbleLanes<GgmlType::kQ5_1>>>;
      case GgmlType::kQ4_K:
        return rows_interleaved<Lanes16<KLanes<GgmlType::kQ4_K>>>;
      case GgmlType::kQ5_K:
        return rows_interleaved<Lanes16<KLanes<GgmlType::kQ5_K>>>;
      case GgmlType::kQ6_K:
        return rows_interleaved<Lanes16<Q6_KLanes>>;
      default:
        break;
    }
  }
  if (int8_activations) {  // AVX2, also for AVX-512 without VNNI (the same bits)
    switch (type) {
      case GgmlType::kQ8_0:
        return rows_interleaved<Lanes8x2<Q8_0Lanes>>;
      case GgmlType::kQ4_0:
        return rows_interleaved<Lanes8x2<NibbleLanes<GgmlType::kQ4_0>>>;
      case GgmlType::kQ4_1:
        return rows_interleaved<Lanes8x2<NibbleLanes<GgmlType::kQ4_1>>>;
      case GgmlType::kQ5_0:
        return rows_interleaved<Lanes8x2<NibbleLanes<GgmlType::kQ5_0>>>;
      case GgmlType::kQ5_1:
        return rows_interleaved<Lanes8x2<NibbleLanes<GgmlType::kQ5_1>>>;
      case GgmlType::kQ4_K:
        return rows_interleaved<Lanes8x2<KLanes<GgmlType::kQ4_K>>>;
      case GgmlType::kQ5_K:
        return rows_interleaved<Lanes8x2<KLanes<GgmlType::kQ5_K>>>;
      case GgmlType::kQ6_K:
        return rows_interleaved<Lanes8x2<Q6_KLanes>>;
      default: break;
    }
  }
  if (avx512) {
    switch (type) {
      case GgmlType::kF32:
        return amd_family_26() ? rows_avx512<FloatTilesZ<F32DecZ, true>> : rows_avx512<FloatTilesZ<F32DecZ>>;
      case GgmlType::kBF16: return rows_avx512<FloatTilesZ<BF16DecZ>>;
      case GgmlType::kF16: return rows_avx512<FloatTilesZ<F16DecZ>>;
      case GgmlType::kQ8_0: return rows_avx512<FloatTilesZ<Q8_0DecZ>>;
      case GgmlType::kQ4_0: return rows_avx512<FloatTilesZ<Q4_0DecZ>>;
      case GgmlType::kQ4_1: return rows_avx512<FloatTilesZ<Q4_1DecZ>>;
      case GgmlType::kQ5_0: return rows_avx512<FloatTilesZ<BufferDecZ<GgmlType::kQ5_0, 32>>>;
      case GgmlType::kQ5_1: return rows_avx512<FloatTilesZ<BufferDecZ<GgmlType::kQ5_1, 32>>>;
      case GgmlType::kQ4_K: return rows_avx512<FloatTilesZ<Q4_KDecZ>>;
      case GgmlType::kQ5_K: return rows_avx512<FloatTilesZ<BufferDecZ<GgmlType::kQ5_K, 256>>>;
      case GgmlType::kQ6_K: return rows_avx512<FloatTilesZ<Q6_KDecZ>>;
    }
    return nullptr;
  }
  switch (type) {
    case GgmlType::kF32: return rows_avx2<FloatTiles<F32Dec>>;
    case GgmlType::kBF16: return rows_avx2<FloatTiles<BF16Dec>>;
    case GgmlType::kF16: return rows_avx2<FloatTiles<F16Dec>>;
    case GgmlType::kQ8_0: return rows_avx2<FloatTiles<Q8_0Dec>>;
    case GgmlType::kQ4_0: return rows_avx2<FloatTiles<Q4_0Dec>>;
    case GgmlType::kQ4_1: return rows_avx2<FloatTiles<Q4_1Dec>>;
    case GgmlType::kQ5_0: return rows_avx2<FloatTiles<BufferDec<GgmlType::kQ5_0, 32>>>;
    case GgmlType::kQ5_1: return rows_avx2<FloatTiles<BufferDec<GgmlType::kQ5_1, 32>>>;
    case GgmlType::kQ4_K: return rows_avx2<FloatTiles<Q4_KDec>>;
    case GgmlType::kQ5_K: return rows_avx2<FloatTiles<BufferDec<GgmlType::kQ5_K, 256>>>;
    case GgmlType::kQ6_K: return rows_avx2<FloatTiles<BufferDec<GgmlType::kQ6_K, 256>>>;
  }
  return nullptr;
}

#endif  // SPECDEC_X86

// The portable kernel (any CPU, any format): each weight row dequantized by ggml_dequantize into a
// buffer, each output element a fixed-order dot(): also independent of the number of rows in the
// pass (its results differ from the AVX2 kernel's in the last bits).
template <GgmlType T>
void rows_portable(const void* xv, int64_t t_rows, int64_t k, const uint8_t* w, int64_t row_bytes, int64_t n0,
                   int64_t n1, int64_t n_total, float* y) {
  const float* x = static_cast<const float*>(xv);
  thread_local std::vector<float> buf;
  if (T != GgmlType::kF32) buf.resize(k);
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = reinterpret_cast<const float*>(w + n * row_bytes);
    if (T != GgmlType::kF32) {
      ggml_dequantize(T, w + n * row_bytes, buf.data(), k);
      wr = buf.data();
    }
    for (int64_t t = 0; t < t_rows; ++t) y[t * n_total + n] = dot(wr, x + t * k, k);
  }
}

RowsFn portable_rows(GgmlType type, bool int8_activations) {
  if (int8_activations) {
    switch (type) {
      case GgmlType::kQ8_0:
        return rows_interleaved<GroupPortable<GgmlType::kQ8_0>>;
      case GgmlType::kQ4_0:
        return rows_interleaved<GroupPortable<GgmlType::kQ4_0>>;
      case GgmlType::kQ4_1:
        return rows_interleaved<GroupPortable<GgmlType::kQ4_1>>;
      case GgmlType::kQ5_0:
        return rows_interleaved<GroupPortable<GgmlType::kQ5_0>>;
      case GgmlType::kQ5_1:
        return rows_interleaved<GroupPortable<GgmlType::kQ5_1>>;
      case GgmlType::kQ4_K:
        return rows_interleaved<GroupPortable<GgmlType::kQ4_K>>;
      case GgmlType::kQ5_K:
        return rows_interleaved<GroupPortable<GgmlType::kQ5_K>>;
      case GgmlType::kQ6_K:
        return rows_interleaved<GroupPortable<GgmlType::kQ6_K>>;
      default: break;
    }
  }
  switch (type) {
    case GgmlType::kF32: return rows_portable<GgmlType::kF32>;
    case GgmlType::kBF16: return rows_portable<GgmlType::kBF16>;
    case GgmlType::kF16: return rows_portable<GgmlType::kF16>;
    case GgmlType::kQ8_0: return rows_portable<GgmlType::kQ8_0>;
    case GgmlType::kQ4_0: return rows_portable<GgmlType::kQ4_0>;
    case GgmlType::kQ4_1: return rows_portable<GgmlType::kQ4_1>;
    case GgmlType::kQ5_0: return rows_portable<GgmlType::kQ5_0>;
    case GgmlType::kQ5_1: return rows_portable<GgmlType::kQ5_1>;
    case GgmlType::kQ4_K: return rows_portable<GgmlType::kQ4_K>;
    case GgmlType::kQ5_K: return rows_portable<GgmlType::kQ5_K>;
    case GgmlType::kQ6_K: return rows_portable<GgmlType::kQ6_K>;
  }
  return nullptr;
}

constexpr int64_t kRowTile = 64;  // input rows per sweep over the weights (keeps x in L2)

}  // namespace

bool has_int8_kernel(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 ||
         type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1 || type == GgmlType::kQ4_K ||
         type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAmx: return "amx";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: return "portable";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
#ifdef SPECDEC_X86
  // FMA and F16C through cpuid: clang's __builtin_cpu_supports knows no "f16c". libgcc's
  // avx512 flags include the operating system's support for the 512-bit registers.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool avx2 = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_FMA) && (c & bit_F16C) &&
                    __builtin_cpu_supports("avx2");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    out.push_back(Isa::kAvx512);
  // AMX after AVX-512: opt-in (SPECDEC_KERNELS=amx) until it measures faster at every thread count
  if (!out.empty() && __builtin_cpu_supports("avx512vnni") && amx_supported()) out.push_back(Isa::kAmx);
  if (avx2) out.push_back(Isa::kAvx2);
#endif
  out.push_back(Isa::kPortable);
  return out;
}

Isa default_isa() {
  static const Isa isa = [] {
    const std::vector<Isa> have = available_isas();
    const char* env = std::getenv("SPECDEC_KERNELS");
    if (!env || !*env) return have.front();
    for (Isa i : have)
      if (env == std::string(isa_name(i))) return i;
    std::string names;
    for (Isa i : have) names += std::string(names.empty() ? "" : ", ") + isa_name(i);
    throw Error("SPECDEC_KERNELS=" + std::string(env) + ": not a kernel this build and CPU can run (" + names + ")");
  }();
  return isa;
}

LinearKernel linear_kernel(GgmlType type, bool int8_activations, [[maybe_unused]] Isa isa) {
  LinearKernel kernel;
  kernel.int8_activations = int8_activations && has_int8_kernel(type);
  kernel.interleaved = kernel.int8_activations;
#ifdef SPECDEC_X86
  if (isa != Isa::kPortable) {
    const bool amx = isa == Isa::kAmx && kernel.int8_activations && type == GgmlType::kQ8_0;
    SPECDEC_CHECK(!amx || amx_permitted(), "AMX kernels: Linux refused this process the tile state (arch_prctl)");
    kernel.rows = x86_rows(type, kernel.int8_activations, isa == Isa::kAvx512 || isa == Isa::kAmx, amx);
    return kernel;
  }
#endif
  kernel.rows = portable_rows(type, kernel.int8_activations);
  return kernel;
}

void ActRows::resize(int64_t rows, int64_t k_) {
  k = k_;
  q.resize(rows * k), sum16.resize(rows * k / 16);
  d.resize(rows * k / 32), s.resize(rows * k / 32), sum.resize(rows * k / 32);
}

ActView ActRows::view(int64_t r0) const {
  return {q.data() + r0 * k, d.data() + r0 * k / 32, s.data() + r0 * k / 32,
          sum.data() + r0 * k / 32, sum16.data() + r0 * k / 16};
}

namespace {

// One block of 32 activations: qi = round(v / d) (half away from zero, as ggml), returns d = amax /
// 127.
float round_block(const float* v, int32_t* qi) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) {  // std::round (half away from zero) without a libm call:
    const float y = v[j] * id;    // truncate, then step away from zero where y - t >= 0.5
    const int32_t t = static_cast<int32_t>(y);  // (y - t is exact: |y| < 1 or t within y/2..y)
    qi[j] = t + (std::fabs(y - static_cast<float>(t)) >= 0.5f ? (y < 0.0f ? -1 : 1) : 0);
  }
  return d;
}

#ifdef SPECDEC_X86
// The same operations on 8 lanes at a time (a maximum is exact in any order), qi in 4 vectors.
SPECDEC_AVX2 float round_block_avx2(const float* v, __m256i* qi) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float d = _mm_cvtss_f32(m4) / 127.0f;
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  for (int i = 0; i < 4; ++i) {
    const __m256 y = _mm256_mul_ps(x[i], id);
    const __m256i t = _mm256_cvttps_epi32(y);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, _mm256_cvtepi32_ps(t)));
    const __m256i step =
        _mm256_or_si256(_mm256_srai_epi32(_mm256_castps_si256(y), 31), _mm256_set1_epi32(1));
    const __m256i round =
        _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
    qi[i] = _mm256_add_epi32(t, _mm256_and_si256(round, step));
  }
  return d;
}

SPECDEC_AVX2 int32_t sum_lanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// round_block() and the rest of ActRows::quantize's block in registers: the 32 values narrowed
// to int8 into q (|qi| <= 127, so the saturating packs narrow exactly) and the sums of each half.
SPECDEC_AVX2 float quantize_block_avx2(const float* v, int8_t* q, int32_t& lo, int32_t& hi) {
  __m256i qi[4];
  const float d = round_block_avx2(v, qi);
  // packs work within 128-bit lanes: groups of 4 values come out as qi0[0:4] qi1[0:4] qi2[0:4]
  // qi3[0:4] qi0[4:8] ...; the permutation puts them back in order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  lo = sum_lanes(_mm256_add_epi32(qi[0], qi[1]));
  hi = sum_lanes(_mm256_add_epi32(qi[2], qi[3]));
  return d;
}
#endif

}  // namespace

void ActRows::quantize(const float* x, int64_t r0, int64_t r1, [[maybe_unused]] Isa isa) {
  for (int64_t e = r0 * (k / 32); e < r1 * (k / 32); ++e) {  // block e: x[32 e, 32 e + 32)
    int8_t* qe = q.data() + e * 32;
    int32_t lo = 0, hi = 0;  // locals: stores through the arrays would be reloaded every step
#ifdef SPECDEC_X86
    if (isa != Isa::kPortable) {
      d[e] = quantize_block_avx2(x + e * 32, qe, lo, hi);
    } else
#endif
    {
      int32_t qi[32];
      d[e] = round_block(x + e * 32, qi);
      for (int j = 0; j < 16; ++j) lo += qi[j], hi += qi[16 + j];
      for (int j = 0; j < 32; ++j) qe[j] = static_cast<int8_t>(qi[j]);
    }
    sum[e] = lo + hi;
    s[e] = d[e] * static_cast<float>(sum[e]);
    sum16[2 * e] = lo, sum16[2 * e + 1] = hi;
  }
}

namespace {

struct Interleave {  // prepare_weights for format T
  uint8_t* w;
  int64_t n, row_bytes;
  template <GgmlType T>
  void operator()() const {
    using I = Interleaved<T>;
    at::parallel_for(0, n / kInterleave, 1, [&](int64_t g0, int64_t g1) {
      std::vector<uint8_t> rows(kInterleave * row_bytes);
      for (int64_t g = g0; g < g1; ++g) {
        uint8_t* gw = w + g * kInterleave * row_bytes;
        std::memcpy(rows.data(), gw, rows.size());
        for (int64_t r = 0; r < kInterleave; ++r)
          for (int64_t b = 0; b < row_bytes / I::kBytes; ++b) {
            const uint8_t* from = rows.data() + r * row_bytes + b * I::kBytes;
            for (int64_t j = 0; j < I::kBytes; j += piece<I>(j))
              std::memcpy(gw + interleaved_offset<I>(b, r, j), from + j, piece<I>(j));
          }
      }
    });
  }
};

struct StoredRow {  // row r of the group at gw, gathered into out
  const uint8_t* gw;
  int64_t r, row_bytes;
  uint8_t* out;
  template <GgmlType T>
  void operator()() const {
    for (int64_t b = 0; b < row_bytes / Interleaved<T>::kBytes; ++b)
      plain_block<T>(gw, r, b, true, out + b * Interleaved<T>::kBytes);
  }
};

// Calls f.template operator()<T>() for an interleaved format T.
template <class F>
void with_format(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::kQ8_0:
      return f.template operator()<GgmlType::kQ8_0>();
    case GgmlType::kQ4_0:
      return f.template operator()<GgmlType::kQ4_0>();
    case GgmlType::kQ4_1:
      return f.template operator()<GgmlType::kQ4_1>();
    case GgmlType::kQ5_0:
      return f.template operator()<GgmlType::kQ5_0>();
    case GgmlType::kQ5_1:
      return f.template operator()<GgmlType::kQ5_1>();
    case GgmlType::kQ4_K:
      return f.template operator()<GgmlType::kQ4_K>();
    case GgmlType::kQ5_K:
      return f.template operator()<GgmlType::kQ5_K>();
    case GgmlType::kQ6_K:
      return f.template operator()<GgmlType::kQ6_K>();
    default:
      throw Error("no interleaved layout for this format");
  }
}

}  // namespace

void prepare_weights(const LinearKernel& kernel, GgmlType type, uint8_t* w, int64_t n,
                     int64_t row_bytes) {
  if (kernel.interleaved) with_format(type, Interleave{w, n, row_bytes});
}

void stored_row(const LinearKernel& kernel, GgmlType type, const uint8_t* w, int64_t n,
                int64_t row_bytes, int64_t r, uint8_t* out) {
  if (!kernel.interleaved || r >= n / kInterleave * kInterleave)
    std::memcpy(out, w + r * row_bytes, row_bytes);
  else
    with_format(type, StoredRow{w + r / kInterleave * kInterleave * row_bytes, r % kInterleave,
                                row_bytes, out});
}

at::Tensor linear_packed(const at::Tensor& x, const LinearKernel& kernel, const uint8_t* w, int64_t row_bytes,
                         int64_t n, int64_t k, const at::Tensor& b, const at::Tensor& residual) {
  // x [..., K] read as [R, K] and y allocated as [..., N] directly: a decode step runs ~120 of
  // these, and each reshape or view is a libtorch dispatch.
  SPECDEC_CHECK(x.dim() >= 1 && x.size(-1) == k, "linear layer: input of ", x.sizes(), ", expected ", k,
                " features");
  const at::Tensor xc = x.contiguous();
  const int64_t rows = xc.numel() / k;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  at::Tensor y = at::empty(shape, x.options());  // [R, N] in memory
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  SPECDEC_CHECK(!b.defined() || (b.numel() == n && b.scalar_type() == at::kFloat), "linear layer: bias of ",
                b.sizes(), " for ", n, " outputs");
  SPECDEC_CHECK(!residual.defined() || (residual.sizes() == y.sizes() && residual.scalar_type() == at::kFloat),
                "linear layer: residual of ", residual.sizes(), " for an output of ", y.sizes());
  const at::Tensor bc = b.defined() ? b.contiguous() : b, rc = residual.defined() ? residual.contiguous() : residual;
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  const float* resp = rc.defined() ? rc.data_ptr<float>() : nullptr;
  // The 8-bit activations of kRowTile rows, reused by this thread's passes (a name, so that the
  // lambdas below, run by other threads, see this thread's).
  thread_local ActRows reused;
  ActRows& act = reused;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowTile) {
    const int64_t r = std::min(kRowTile, rows - r0);
    if (kernel.int8_activations) {
      act.resize(r, k);
      at::parallel_for(0, r, rows_per_task(k),
                       [&](int64_t a, int64_t b) { act.quantize(xp + r0 * k, a, b); });
    }
    const ActView view = act.view(0);
    const void* xr = kernel.int8_activations ? static_cast<const void*>(&view)
                                             : static_cast<const void*>(xp + r0 * k);
    // whole groups of 16 weight rows per thread (an interleaved kernel needs them)
    at::parallel_for(0, (n + kInterleave - 1) / kInterleave, 1, [&](int64_t g0, int64_t g1) {
      const int64_t c0 = g0 * kInterleave, c1 = std::min(n, g1 * kInterleave);
      kernel.rows(xr, r, k, w, row_bytes, c0, c1, n, yp + r0 * n);
      if (!bp && !resp) return;
      for (int64_t i = r0; i < r0 + r; ++i) {
        float* yr = yp + i * n;
        if (bp)
          for (int64_t c = c0; c < c1; ++c) yr[c] += bp[c];
        if (resp)
          for (int64_t c = c0; c < c1; ++c) yr[c] = resp[i * n + c] + yr[c];
      }
    });
  }
  return y;
}

namespace {

bool cpu_f32(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

}  // namespace

int64_t rows_per_task(int64_t row_floats) {
  return std::max<int64_t>(1, kMinTaskFloats / std::max<int64_t>(1, row_floats));
}

namespace {

// e^t for t in [-87, 88] (t clamped to it, NaN to -87) with multiplies and adds only, so that the
// x86 copy (silu8) gives the same bits: n = round(t log2 e); r = t - n ln2 in two steps (Cody and
// Waite: n * kLn2Hi and the first subtraction are exact); e^r = (P(r) r^2 + r) + 1 with Cephes'
// degree-5 P (Horner); times 2^n through the exponent bits. Within a few ulp of e^t
// (LayerKernels.SiluIsTheSameOnEveryIsaAndCloseToLibtorch); silu and attention's softmax use it.
constexpr float kExpLo = -87.0f, kExpHi = 88.0f, kLog2e = 1.44269504088896341f,
                kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp_clamped(float t) {
  t = t > kExpLo ? t : kExpLo;  // what MAXPS and MINPS do, NaN included
  t = t < kExpHi ? t : kExpHi;
  const float n = std::nearbyint(t * kLog2e);
  float r = t - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kExpP[0];
  for (int i = 1; i < 6; ++i) p = p * r + kExpP[i];
  const float e = (p * (r * r) + r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return e * scale;
}

#ifdef SPECDEC_X86
// exp_clamped() in 8 lanes: the same operations in the same order (AVX2 without FMA).
__attribute__((target("avx2"))) inline __m256 exp8(__m256 t) {
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(t, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kExpP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kExpP[i]));
  const __m256 e = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256 scale = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(e, scale);
}
#endif

// One query row of attention_f32: scores, softmax and the weighted sum of the values. Plain C++ for
// any x86-64 (SSE2) and other CPUs; on x86, an AVX2 copy without FMA: the scores of 8 keys at once
// (scores_avx2), their exponentials 8 at a time (exps_avx2) and the weighted sum with its
// accumulators in registers (weigh_avx2; on AVX-512 CPUs in 16 lanes, weigh_avx512). Each lane
// does what the scalar code does (a multiply, then an add, in the same order), so all give the
// same bits (LayerKernels.AttentionIsTheSameOnEveryIsa).
struct AttentionRow {
  const float* q;           // [D]
  const float* k;           // key j at k + j * k_stride, [D]
  const float* v;           // value j at v + j * v_stride, [D]
  const float* mask;        // additive, entry j at mask + j * mask_stride; null: none
  int64_t k_stride, v_stride, mask_stride, len, d;
  float scale;
  float* p;                 // [len] scratch
  float* out;               // [D]
};

// Key j's score: q . k_j * scale, plus the mask (-inf stays -inf).
inline float masked(const AttentionRow& a, int64_t j, float x) {
  if (a.mask) {
    const float add = a.mask[j * a.mask_stride];
    x = add == -std::numeric_limits<float>::infinity() ? add : x + add;
  }
  return x;
}

// Whether the mask hides key j (its score is -inf whatever q . k_j is, so it is not computed: a
// prefill's query skips the keys after its own).
inline bool hidden(const AttentionRow& a, int64_t j) {
  return a.mask && a.mask[j * a.mask_stride] == -std::numeric_limits<float>::infinity();
}

// The scores of keys [from, len) into a.p, one at a time; returns the largest of them and `mx`.
inline float scores_plain(const AttentionRow& a, int64_t from = 0,
                          float mx = -std::numeric_limits<float>::infinity()) {
  for (int64_t j = from; j < a.len; ++j) {
    if (hidden(a, j)) {
      a.p[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    a.p[j] = masked(a, j, dot(a.q, a.k + j * a.k_stride, a.d) * a.scale);
    mx = std::max(mx, a.p[j]);
  }
  return mx;
}

// The scores of keys [from, len) in a.p become e^(score - mx) (exp_clamped), a masked key's 0.
inline void exps_plain(const AttentionRow& a, float mx, int64_t from = 0) {
  for (int64_t j = from; j < a.len; ++j)
    a.p[j] = a.p[j] == -std::numeric_limits<float>::infinity() ? 0.0f : exp_clamped(a.p[j] - mx);
}

// out[c] for c in [from, D): the sum over the keys, in order, of p[j] * v_j[c] (a multiply, then an
// add), skipping keys of weight 0.
inline void weigh_plain(const AttentionRow& a, int64_t from = 0) {
  if (from >= a.d) return;
  for (int64_t c = from; c < a.d; ++c) a.out[c] = 0;
  for (int64_t j = 0; j < a.len; ++j) {
    if (a.p[j] == 0.0f) continue;
    const float* v = a.v + j * a.v_stride;
    for (int64_t c = from; c < a.d; ++c) a.out[c] += a.p[j] * v[c];
  }
}

// The sum of the exponentials: key j's into partial sum j mod 8 (the last len mod 8 keys too), the 8
// combined in a fixed tree. A masked key's 0 changes no partial sum, so a query row gets the same
// total whether the keys after its own (a later query's in a pass of several, or the padding of a
// shorter row in a batch) are in the pass or not; any vector width gives the same bits.
inline float exps_total(const float* p, int64_t len) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n8 = len - len % 8;
  for (int64_t j = 0; j < n8; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += p[j + l];
  for (int64_t j = n8; j < len; ++j) acc[j - n8] += p[j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Scores, their exponentials, the weights e_j / exps_total (each division rounds once, so any
// vector width gives the same bits), the weighted sum of the values.
template <class Scores, class Exps, class Weigh>
__attribute__((always_inline)) inline void attend(const AttentionRow& a, Scores scores, Exps exps, Weigh weigh) {
  const float mx = scores(a);
  exps(a, mx);
  const float total = exps_total(a.p, a.len);
  for (int64_t j = 0; j < a.len; ++j) a.p[j] /= total;
  weigh(a);
}

void attend_default(const AttentionRow& a) {
  attend(a, [](const AttentionRow& r) { return scores_plain(r); },
         [](const AttentionRow& r, float mx) { exps_plain(r, mx); },
         [](const AttentionRow& r) { weigh_plain(r); });
}

#ifdef SPECDEC_X86
// The scores of 8 keys at a time, each exactly as dot() computes it: 8 lanes of multiply-then-add
// over the head dimension, then dot()'s tree over the lanes, done for the 8 keys at once on the
// transposed lanes; then the last D mod 8 products in order.
__attribute__((target("avx2"))) inline float scores_avx2(const AttentionRow& a) {
  float mx = -std::numeric_limits<float>::infinity();
  const int64_t d8 = a.d - a.d % 8;
  int64_t j = 0;
  for (; j + 8 <= a.len; j += 8) {
    bool all_hidden = true;
    for (int i = 0; i < 8; ++i) all_hidden = all_hidden && hidden(a, j + i);
    if (all_hidden) {
      for (int i = 0; i < 8; ++i) a.p[j + i] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float* kr[8];
    __m256 r[8];
    for (int i = 0; i < 8; ++i) kr[i] = a.k + (j + i) * a.k_stride, r[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d8; c += 8) {
      const __m256 qv = _mm256_loadu_ps(a.q + c);
      for (int i = 0; i < 8; ++i) r[i] = _mm256_add_ps(r[i], _mm256_mul_ps(qv, _mm256_loadu_ps(kr[i] + c)));
    }
    // Transpose: lane l of every key into one vector, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);  // lanes 0|4, 1|5
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);  // lanes 2|6, 3|7
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    const __m256 l0 = _mm256_permute2f128_ps(u0, u4, 0x20), l4 = _mm256_permute2f128_ps(u0, u4, 0x31);
    const __m256 l1 = _mm256_permute2f128_ps(u1, u5, 0x20), l5 = _mm256_permute2f128_ps(u1, u5, 0x31);
    const __m256 l2 = _mm256_permute2f128_ps(u2, u6, 0x20), l6 = _mm256_permute2f128_ps(u2, u6, 0x31);
    const __m256 l3 = _mm256_permute2f128_ps(u3, u7, 0x20), l7 = _mm256_permute2f128_ps(u3, u7, 0x31);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l0, l1), _mm256_add_ps(l2, l3)),
                                     _mm256_add_ps(_mm256_add_ps(l4, l5), _mm256_add_ps(l6, l7)));
    float sv[8];
    _mm256_storeu_ps(sv, sum);
    for (int i = 0; i < 8; ++i) {
      float x = sv[i];
      for (int64_t c = d8; c < a.d; ++c) x += a.q[c] * kr[i][c];
      a.p[j + i] = masked(a, j + i, x * a.scale);
      mx = std::max(mx, a.p[j + i]);
    }
  }
  return scores_plain(a, j, mx);  // the last len mod 8 keys
}

// exps_plain() 8 keys at a time (exp8), then the last len mod 8.
__attribute__((target("avx2"))) inline void exps_avx2(const AttentionRow& a, float mx) {
  const __m256 m = _mm256_set1_ps(mx), masked = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= a.len; j += 8) {
    const __m256 s = _mm256_loadu_ps(a.p + j);
    const __m256 off = _mm256_cmp_ps(s, masked, _CMP_EQ_OQ);  // the masked keys' lanes
    if (_mm256_movemask_ps(off) == 0xFF) {  // all 8 masked (a prefill's later keys): no exponentials
      _mm256_storeu_ps(a.p + j, _mm256_setzero_ps());
      continue;
    }
    _mm256_storeu_ps(a.p + j, _mm256_andnot_ps(off, exp8(_mm256_sub_ps(s, m))));
  }
  exps_plain(a, mx, j);
}

// weigh_plain() for out[c0, c0 + 8 NV), the NV accumulators of 8 lanes in registers across the keys
// (the plain loop keeps them in memory: a load and a store per key).
template <int NV>
__attribute__((target("avx2"))) inline void weigh_lanes(const AttentionRow& a, int64_t c0) {
  __m256 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < a.len; ++j) {
    if (a.p[j] == 0.0f) continue;
    const __m256 w = _mm256_set1_ps(a.p[j]);
    const float* v = a.v + j * a.v_stride + c0;
    for (int i = 0; i < NV; ++i) acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(w, _mm256_loadu_ps(v + 8 * i)));
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(a.out + c0 + 8 * i, acc[i]);
}

__attribute__((target("avx2"))) inline void weigh_avx2(const AttentionRow& a) {
  int64_t c = 0;
  for (; c + 64 <= a.d; c += 64) weigh_lanes<8>(a, c);
  for (; c + 8 <= a.d; c += 8) weigh_lanes<1>(a, c);
  weigh_plain(a, c);
}

__attribute__((target("avx2"))) void attend_avx2(const AttentionRow& a) {
  attend(a, scores_avx2, exps_avx2, weigh_avx2);
}

// weigh_lanes() in 16 lanes: each output feature still gets its multiply, then add, key by key, so
// the width changes no bit; half the instructions per key.
template <int NV>
SPECDEC_AVX512 inline void weigh_lanes16(const AttentionRow& a, int64_t c0) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < a.len; ++j) {
    if (a.p[j] == 0.0f) continue;
    const __m512 w = _mm512_set1_ps(a.p[j]);
    const float* v = a.v + j * a.v_stride + c0;
    for (int i = 0; i < NV; ++i) acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(w, _mm512_loadu_ps(v + 16 * i)));
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(a.out + c0 + 16 * i, acc[i]);
}

SPECDEC_AVX512 inline void weigh_avx512(const AttentionRow& a) {
  int64_t c = 0;
  for (; c + 128 <= a.d; c += 128) weigh_lanes16<8>(a, c);
  if (c + 64 <= a.d) weigh_lanes16<4>(a, c), c += 64;
  for (; c + 16 <= a.d; c += 16) weigh_lanes16<1>(a, c);
  if (c + 8 <= a.d) weigh_lanes<1>(a, c), c += 8;
  weigh_plain(a, c);
}

// attend_avx2 with the weighted sum in 16 lanes (the same bits).
SPECDEC_AVX512 void attend_avx512(const AttentionRow& a) {
  attend(a, scores_avx2, exps_avx2, weigh_avx512);
}
#endif

}  // namespace

namespace {

// Where attend_rows finds a pass's operands: q [B, Hq, T, D] contiguous; keys and values of batch
// row b and key/value head h at k + b * k_b + h * k_h, key j j * k_j further on (contiguous D);
// the mask (null: none) of (b, key/value head, query head in its group, query t) at
// mask + b * m_b + h * m_h + g * m_g + t * m_t, key j j * m_j further on; out [B, T, Hq * D].
struct AttentionPass {
  const float *q, *k, *v;
  float* out;
  int64_t b, hq, hkv, t, d, len;
  float scale;
  int64_t k_b, k_h, k_j, v_b, v_h, v_j;
  const float* mask = nullptr;
  int64_t m_b = 0, m_h = 0, m_g = 0, m_t = 0, m_j = 0;
};

// One AttentionRow per (row, query head, query) over the threads.
void attend_rows(const AttentionPass& a, Isa isa) {
  void (*row_fn)(const AttentionRow&) = attend_default;
#ifdef SPECDEC_X86
  if (isa == Isa::kAvx512 || isa == Isa::kAmx) row_fn = attend_avx512;
  else if (isa != Isa::kPortable) row_fn = attend_avx2;
#else
  (void)isa;
#endif
  const int64_t groups = a.hq / a.hkv;
  at::parallel_for(0, a.b * a.hq * a.t, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(a.len);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / (a.hq * a.t), h = (r / a.t) % a.hq, ti = r % a.t, kh = h / groups;
      AttentionRow row;
      row.q = a.q + r * a.d;
      row.k = a.k + bi * a.k_b + kh * a.k_h;
      row.v = a.v + bi * a.v_b + kh * a.v_h;
      row.mask = a.mask ? a.mask + bi * a.m_b + kh * a.m_h + (h % groups) * a.m_g + ti * a.m_t : nullptr;
      row.k_stride = a.k_j, row.v_stride = a.v_j, row.mask_stride = a.m_j;
      row.len = a.len, row.d = a.d, row.scale = a.scale;
      row.p = p.data();
      row.out = a.out + (bi * a.t + ti) * a.hq * a.d + h * a.d;
      row_fn(row);
    }
  });
}

// The first `rot` features of a head's row x rotated (x * cos + rotate_half(x) * sin), the rest
// copied, into o.
inline void rotate_row(const float* x, const float* c, const float* s, int64_t rot, int64_t d, float* o) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) o[i] = x[i] * c[i] + (-x[i + half]) * s[i];
  for (int64_t i = half; i < rot; ++i) o[i] = x[i] * c[i] + x[i - half] * s[i];
  for (int64_t i = rot; i < d; ++i) o[i] = x[i];
}

}  // namespace

at::Tensor attention_f32(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& mask, double scale, Isa isa) {
  if (!cpu_f32(q) || !cpu_f32(keys) || !cpu_f32(values) || (mask.defined() && !cpu_f32(mask)) ||
      q.dim() != 4 || keys.dim() != 4 || keys.stride(3) != 1 || values.stride(3) != 1)
    return {};
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), len = keys.size(2), groups = hq / hkv;
  const at::Tensor qc = q.contiguous();                                       // [B, Hq, T, D]
  at::Tensor out = at::empty({b, t, hq * d}, q.options());                    // [B, T, Hq * D]
  AttentionPass a{qc.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), out.data_ptr<float>(),
                  b, hq, hkv, t, d, len, static_cast<float>(scale),
                  keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2)};
  if (mask.defined()) {
    const at::Tensor m = mask.expand({b, hkv, groups, t, len});               // [B, Hkv, g, T, L] view
    a.mask = m.data_ptr<float>();
    a.m_b = m.stride(0), a.m_h = m.stride(1), a.m_g = m.stride(2), a.m_t = m.stride(3), a.m_j = m.stride(4);
  }
  attend_rows(a, isa);
  return out;
}

at::Tensor cached_attention_f32(const at::Tensor& qkv, int64_t hq, int64_t hkv, int64_t d,
                                const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& keys,
                                const at::Tensor& values, const std::vector<int64_t>& past, const at::Tensor& mask,
                                double scale, Isa isa) {
  if (!cpu_f32(qkv) || !cpu_f32(keys) || !cpu_f32(values) || qkv.dim() != 3 || !qkv.is_contiguous() ||
      qkv.size(2) != (hq + 2 * hkv) * d || !keys.is_contiguous() || !values.is_contiguous() ||
      keys.dim() != 4 || keys.sizes() != values.sizes() || keys.size(0) < qkv.size(0) || keys.size(1) != hkv ||
      keys.size(3) != d || hq % hkv != 0 || past.empty() || static_cast<int64_t>(past.size()) != qkv.size(0))
    return {};
  const int64_t b = qkv.size(0), t = qkv.size(1), cap = keys.size(2);
  const int64_t longest = *std::max_element(past.begin(), past.end());
  if (*std::min_element(past.begin(), past.end()) < 0 || longest >= cap) return {};
  // The keys attended over: as KVCache::append's views, up to the longest row's end.
  const int64_t len = std::min(cap, longest + t);
  const auto shaped = [](const at::Tensor& m, std::initializer_list<int64_t> one, std::initializer_list<int64_t> per_row) {
    return cpu_f32(m) && m.is_contiguous() && (m.sizes() == at::IntArrayRef(one) || m.sizes() == at::IntArrayRef(per_row));
  };
  if (mask.defined() && !shaped(mask, {t, len}, {b, 1, 1, t, len})) return {};
  const bool rotary = cos.defined();
  const int64_t rot = rotary ? cos.size(-1) : 0;
  if (rotary && (rot > d || !shaped(cos, {t, rot}, {b, 1, t, rot}) || !sin.defined() || sin.sizes() != cos.sizes() ||
                 !shaped(sin, {t, rot}, {b, 1, t, rot})))
    return {};
  const int64_t width = (hq + 2 * hkv) * d, heads = hq + 2 * hkv;
  const int64_t table_row = rotary && cos.dim() == 4 ? t : 0;  // batch row b's tables start b * t rows on
  at::Tensor q = at::empty({b, hq, t, d}, qkv.options());  // rotated queries
  at::Tensor out = at::empty({b, t, hq * d}, qkv.options());
  const float* x = qkv.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = keys.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  const float* cp = rotary ? cos.data_ptr<float>() : nullptr;
  const float* sp = rotary ? sin.data_ptr<float>() : nullptr;
  // Each head row of each token (queries, keys, values) as Attention's split, rotary_f32 and
  // KVCache::append leave it: queries rotated into q; keys rotated and values copied into the
  // cache at the row's next positions, those past the capacity dropped (only padding is there).
  at::parallel_for(0, b * t * heads, rows_per_task(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / (t * heads), ti = (r / heads) % t, h = r % heads;
      const float* xr = x + (bi * t + ti) * width + h * d;
      const float* c = rotary ? cp + (bi * table_row + ti) * rot : nullptr;
      const float* s = rotary ? sp + (bi * table_row + ti) * rot : nullptr;
      const int64_t pos = past[static_cast<size_t>(bi)] + ti;
      if (h < hq) {
        rotate_row(xr, c, s, rot, d, qp + ((bi * hq + h) * t + ti) * d);
      } else if (pos >= cap) {
        continue;
      } else if (h < hq + hkv) {
        rotate_row(xr, c, s, rot, d, kp + ((bi * hkv + h - hq) * cap + pos) * d);
      } else {
        std::memcpy(vp + ((bi * hkv + h - hq - hkv) * cap + pos) * d, xr, d * sizeof(float));
      }
    }
  });
  const int64_t row = hkv * cap * d;  // the buffers' strides: row, head, position
  AttentionPass a{qp, kp, vp, out.data_ptr<float>(), b, hq, hkv, t, d, len, static_cast<float>(scale),
                  row, cap * d, d, row, cap * d, d};
  if (mask.defined()) {
    a.mask = mask.data_ptr<float>(), a.m_t = len, a.m_j = 1;
    if (mask.dim() == 5) a.m_b = t * len;
  }
  attend_rows(a, isa);
  return out;
}

at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!cpu_f32(x) || !cpu_f32(w)) return {};
  const int64_t h = x.size(-1);
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  at::Tensor y = at::empty(xc.sizes(), xc.options());  // (empty_like: two dispatches)
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, xc.numel() / h, rows_per_task(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * h;
      const float inv = 1.0f / std::sqrt(dot(xr, xr, h) / static_cast<float>(h) + static_cast<float>(eps));
      for (int64_t i = 0; i < h; ++i) yp[r * h + i] = wp[i] * (xr[i] * inv);
    }
  });
  return y;
}

at::Tensor layer_norm_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  if (!cpu_f32(x) || !cpu_f32(w) || (b.defined() && !cpu_f32(b))) return {};
  const int64_t h = x.size(-1);
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  const at::Tensor bc = b.defined() ? b.contiguous() : at::Tensor();
  at::Tensor y = at::empty(xc.sizes(), xc.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, xc.numel() / h, rows_per_task(h), [&](int64_t r0, int64_t r1) {
    std::vector<float> c(h);
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * h;
      const float mean = sum(xr, h) / static_cast<float>(h);
      for (int64_t i = 0; i < h; ++i) c[i] = xr[i] - mean;
      const float inv = 1.0f / std::sqrt(dot(c.data(), c.data(), h) / static_cast<float>(h) + static_cast<float>(eps));
      for (int64_t i = 0; i < h; ++i) yp[r * h + i] = c[i] * inv * wp[i] + (bp ? bp[i] : 0.0f);
    }
  });
  return y;
}

at::Tensor rotary_f32(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!cpu_f32(x) || !cpu_f32(cos) || !cpu_f32(sin) || x.dim() != 4 || x.stride(3) != 1) return {};
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3), rot = cos.size(-1);
  const bool per_row = cos.dim() == 4;
  if (per_row && (cos.size(0) != b || cos.size(2) != t)) return {};
  const at::Tensor cc = cos.contiguous(), sc = sin.contiguous();  // [T, rot] or [B, 1, T, rot]
  at::Tensor out = at::empty({b, h, t, d}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = cc.data_ptr<float>();
  const float* sp = sc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, b * h * t, rows_per_task(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / (h * t), hi = (r / t) % h, ti = r % t;
      const float* xr = xp + bi * x.stride(0) + hi * x.stride(1) + ti * x.stride(2);
      const int64_t row = per_row ? bi * t + ti : ti;  // cos/sin [B, 1, T, rot] or [T, rot]
      const float* c = cp + row * rot;
      const float* s = sp + row * rot;
      rotate_row(xr, c, s, rot, d, op + r * d);
    }
  });
  return out;
}

namespace {

inline float silu(float v) { return v / (1.0f + exp_clamped(-v)); }

#ifdef SPECDEC_X86
// silu() in 8 lanes: the same operations in the same order (AVX2 without FMA).
__attribute__((target("avx2"))) inline __m256 silu8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_xor_ps(v, _mm256_set1_ps(-0.0f)))));
}

// silu (times up, when given) of a row's first n - n mod 8 values; returns how many.
__attribute__((target("avx2"))) int64_t silu_row_avx2(const float* x, const float* up, float* y,
                                                      int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = silu8(_mm256_loadu_ps(x + i));
    if (up) a = _mm256_mul_ps(a, _mm256_loadu_ps(up + i));
    _mm256_storeu_ps(y + i, a);
  }
  return i;
}
#endif

}  // namespace

at::Tensor activation_f32(const at::Tensor& x, const std::string& name, bool gated, Isa isa) {
  if (!cpu_f32(x) || x.dim() == 0) return {};
  float (*f)(float) = nullptr;
  if (name == "silu")
    f = silu;
  else if (name == "gelu") f = [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); };
  else if (name == "gelu_tanh")
    f = [](float v) { return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v))); };
  else if (name == "relu") f = [](float v) { return v > 0.0f ? v : 0.0f; };
  else return {};
  const at::Tensor xc = x.contiguous();
  const int64_t in_width = xc.size(-1), width = gated ? in_width / 2 : in_width;
  SPECDEC_CHECK(!gated || in_width % 2 == 0, "gated activation: odd last dimension ", in_width);
  std::vector<int64_t> shape = xc.sizes().vec();
  shape.back() = width;
  at::Tensor y = at::empty(shape, xc.options());
  if (y.numel() == 0) return y;
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const bool vector_silu = f == silu && isa != Isa::kPortable;
  at::parallel_for(0, y.numel() / width, rows_per_task(in_width), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = xp + r * in_width;
      const float* up = gated ? in + width : nullptr;
      float* out = yp + r * width;
      int64_t i = 0;
#ifdef SPECDEC_X86
      if (vector_silu) i = silu_row_avx2(in, up, out, width);
#else
      (void)vector_silu;
#endif
      for (; i < width; ++i) out[i] = up ? f(in[i]) * up[i] : f(in[i]);
    }
  });
  return y;
}

}  // namespace specdec::kernels
