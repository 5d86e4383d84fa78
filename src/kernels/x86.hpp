// What the x86 families share: their target attributes, the float16 field, the horizontal sum and
// the tail of the float kernels' reduction order, the prefetch, the 8-bit kernels' lane layouts,
// and the tiling of a pass into register tiles.
#pragma once

#include "kernels/common.hpp"
#include "kernels/int8.hpp"
#include "kernels/tuning.hpp"

#ifdef SPECDEC_X86
#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from deliberately undefined vectors (_mm512_undefined_*),
// which its own uninitialized-value warnings then report at every use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace specdec::kernels {

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

#define SPECDEC_AVX512_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

SPECDEC_AVX2 inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

SPECDEC_AVX2 inline float hsum(__m256 s) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
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

// A type as a value (the families' format-to-kernel maps return one) and back.
template <class T>
struct Tag {
  using type = T;
};
template <class Tg>
using Tagged = typename Tg::type;

// The Lanes struct of each block format (the interleaved 8-bit kernels below), among a family's
// four: one for Q8_0, one per nibble format (Q4_0, Q4_1, Q5_0, Q5_1), one per K-quant of 4 or 5
// bits, one for Q6_K. Only named in decltype: a map from formats to types, no code.
template <GgmlType T, class Q8_0Lanes, template <GgmlType> class NibbleLanes,
          template <GgmlType> class KLanes, class Q6_KLanes>
auto lanes_of() {  // Tag<the struct>
  if constexpr (T == GgmlType::kQ8_0)
    return Tag<Q8_0Lanes>{};
  else if constexpr (T == GgmlType::kQ4_K || T == GgmlType::kQ5_K)
    return Tag<KLanes<T>>{};
  else if constexpr (T == GgmlType::kQ6_K)
    return Tag<Q6_KLanes>{};
  else
    return Tag<NibbleLanes<T>>{};  // Q4_0, Q4_1, Q5_0, Q5_1
}

// Prefetch of the `bytes` bytes tuning::kPrefetchAhead past p (docs/kernels.md: without it a
// one-token decode ran about 15% slower).
template <int64_t Ahead = tuning::kPrefetchAhead>
SPECDEC_AVX2 inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + Ahead + i), _MM_HINT_T0);
}

// --- The interleaved 8-bit kernels (rows_interleaved): row r of a group of 16 in lane r ---
// avx512::Lanes16 (VNNI) holds the 16 rows in one register per activation row, avx2::Lanes8x2
// rows 0-7 and then rows 8-15 in 8-lane registers; both compute the integers exactly and then the
// documented float operations lane by lane, so they give the bits of Interleaved<T>::block. A
// format's Lanes struct does one block (K-quants: super-block) of the group for TB activation
// rows: in 16 lanes (AVX-512) or in the 8 lanes of half h (AVX2). Its weights come as chunks of 4
// bytes of each row (64 bytes per chunk, 32 per half), each chunk against one 4-byte broadcast of
// the activations.
inline int32_t bytes4(const int8_t* p) {  // 4 activations as one 32-bit word
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_0 (d; 4 chunks of nibbles), Q4_1 (d, m; the same), Q5_0 (d; chunk 0: qh; chunks 1-4: nibbles)
// and Q5_1 (d, m; the same as Q5_0). The low nibbles of nibble chunk c are values 4c..4c+3 (byte i
// of a lane: value 4c + i), the high ones 16+4c..16+4c+3; a Q5 value's fifth bit is bit 4c + i
// (low) or 16 + 4c + i (high) of the lane's qh word. Those 4 bits lie in one byte of qh (byte c / 2
// or 2 + c / 2, nibble c % 2): a shuffle copies it to the 4 bytes of the lane, and byte i tests bit
// i + 4 (c % 2). The values come out unsigned (0..15, 0..31); Q4_0/Q5_0 subtract their offset (8,
// 16) as offset x the block's activation sum, Q4_1/Q5_1 add m x s.
template <GgmlType T>
struct NibbleLayout {
  static constexpr GgmlType kType = T;
  static constexpr bool kFive = T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1;
  static constexpr bool kMin = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
  static constexpr int32_t kOffset = kMin ? 0 : kFive ? 16 : 8;
  static constexpr int kNibbles = kFive ? 1 : 0;  // the first nibble chunk
  // Shuffle indices: byte `at` of each 32-bit lane into all 4 of its bytes; the bit byte i tests.
  static constexpr int32_t spread(int at) { return at * 0x01010101; }
  static constexpr int32_t bits(int c) {
    return static_cast<int32_t>(0x08040201u << (4 * (c % 2)));
  }
};

// Q4_K (d, dmin; 3 chunks of scale bytes; 32 chunks of nibbles): sub-block s is the low (even s)
// or high nibbles of chunks 3 + 8 (s / 2) .. 3 + 8 (s / 2) + 7. Q5_K has 8 chunks of high bits
// (qh) before its nibbles (which start at chunk 11): bit s of each byte is the fifth bit of the
// value in sub-block s. Scale and minimum of sub-block s in each 32-bit lane come from the scale
// chunks (ggml's get_scale_min_k4 in every lane): w[0] = bytes 0-3, w[1] = 4-7, w[2] = 8-11.
template <GgmlType T>
struct KLayout {
  static constexpr GgmlType kType = T;
  static constexpr bool kQ5 = T == GgmlType::kQ5_K;
  static constexpr int kNibbles = kQ5 ? 11 : 3;  // the first chunk of nibbles
};

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

// Tiles of Tiles::kMaxRows input rows for one weight row (Tiles::kWideMaxRows for more), then
// one tile of exactly the rows that remain.
template <class Tiles, int NB, int R>
__attribute__((always_inline)) inline void rest_tile(int64_t rest, const void* x, int64_t k,
                                                     const uint8_t* w, int64_t row_bytes, int64_t n,
                                                     int64_t t, int64_t n_total, float* y) {
  if constexpr (R > 0) {
    if (rest == R)
      Tiles::template tile<NB, R>(x, k, w, row_bytes, n, t, n_total, y);
    else
      rest_tile<Tiles, NB, R - 1>(rest, x, k, w, row_bytes, n, t, n_total, y);
  }
}

template <class Tiles, int NB>
__attribute__((always_inline)) inline void row_block(const void* x, int64_t t_rows, int64_t k,
                                                     const uint8_t* w, int64_t row_bytes, int64_t n,
                                                     int64_t n_total, float* y) {
  constexpr int TB = NB == 1 ? Tiles::kMaxRows : Tiles::kWideMaxRows;
  int64_t t = 0;
  for (; t + TB <= t_rows; t += TB)
    Tiles::template tile<NB, TB>(x, k, w, row_bytes, n, t, n_total, y);
  rest_tile<Tiles, NB, TB - 1>(t_rows - t, x, k, w, row_bytes, n, t, n_total, y);
}

// Up to kStreamRows input rows (decode, verification): one weight row at a time, in memory order,
// so that the hardware prefetcher sees one sequential stream. More rows (prefill): Tiles::kWideRows
// weight rows per tile, so each load of x serves them all, block formats decoded once into float32
// for all the pass's rows (Tiles::pack). Long rows (k >= tuning::kLongRow) take the wide tiles from
// Tiles::wide_long_from() input rows: there the narrow tile's input rows no longer fit L1 beside
// the weights. Tiling never changes an output's reduction order, only which outputs are computed
// side by side.

template <class Tiles>
__attribute__((always_inline)) inline void rows_x86(const void* x, int64_t t_rows, int64_t k,
                                                    const uint8_t* w, int64_t row_bytes, int64_t n0,
                                                    int64_t n1, int64_t n_total, float* y) {
  int64_t n = n0;
  if (t_rows > tuning::kStreamRows ||
      (k >= tuning::kLongRow && t_rows >= Tiles::wide_long_from())) {
    constexpr int NB = Tiles::kWideRows;
    if constexpr (Tiles::kPacks)
      if (t_rows > tuning::kStreamRows) {
        thread_local std::vector<float> buf;
        buf.resize(NB * k);
        for (; n + NB <= n1; n += NB) {
          Tiles::template pack<NB>(w, row_bytes, n, k, buf.data());
          row_block<typename Tiles::Packed, NB>(
              x, t_rows, k, reinterpret_cast<const uint8_t*>(buf.data()), k * 4, 0, n_total, y + n);
        }
      }
    for (; n + NB <= n1; n += NB) row_block<Tiles, NB>(x, t_rows, k, w, row_bytes, n, n_total, y);
  }
  for (; n < n1; ++n) row_block<Tiles, 1>(x, t_rows, k, w, row_bytes, n, n_total, y);
}

}  // namespace specdec::kernels
#endif  // SPECDEC_X86
