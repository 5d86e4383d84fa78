// The AVX-512 family (F, BW, DQ, VL): float32-activation tiles in 16 lanes, and the 8-bit kernels
// of lanes_avx512.hpp where the CPU has VNNI. The same bits as the AVX2 family.
#include "kernels/cpu_features.hpp"
#include "kernels/decoders_avx2.hpp"
#include "kernels/families.hpp"
#include "kernels/lanes_avx512.hpp"

#include <type_traits>

#ifdef SPECDEC_X86
namespace specdec::kernels::avx512 {
namespace {

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

// The decoders: kVecs vectors of 16 floats per block, the values of the AVX2 decoders; Ymm is the
// AVX2 decoder of the format (the float formats' last chunk of 8 and tail).
struct F32Dec {
  using Ymm = avx2::F32Dec;
  static constexpr int kElems = 16, kVecs = 1, kBytes = 64;
  const float* p;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    p = reinterpret_cast<const float*>(row) + b * 16;
  }
  SPECDEC_AVX512 __m512 vec(int) const { return _mm512_loadu_ps(p); }
};

struct BF16Dec {
  using Ymm = avx2::BF16Dec;
  static constexpr int kElems = 16, kVecs = 1, kBytes = 32;
  const uint8_t* p;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { p = row + b * 32; }
  SPECDEC_AVX512 __m512 vec(int) const {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

struct F16Dec {
  using Ymm = avx2::F16Dec;
  static constexpr int kElems = 16, kVecs = 1, kBytes = 32;
  const uint8_t* p;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { p = row + b * 32; }
  SPECDEC_AVX512 __m512 vec(int) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

struct Q8_0Dec {
  static constexpr int kElems = 32, kVecs = 2;
  __m512 d;
  const uint8_t* q;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kBlockBytes<GgmlType::kQ8_0>;
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
struct Nibble4Table {
  static constexpr int kElems = 32, kVecs = 2;
  __m512 table;
  __m512i bytes;  // the 16 bytes of nibbles, one per 32-bit lane
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    constexpr bool q4_0 = T == GgmlType::kQ4_0;  // [d, nibbles] or [d, m, nibbles]
    const uint8_t* blk = row + b * kBlockBytes<T>;
    const __m512 iota = nibble_values();
    if constexpr (q4_0) {
      table = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8)), field1(blk));
    } else {
      const __m512 dm = fields2(blk);
      table = _mm512_fmadd_ps(iota, even_lanes(dm), odd_lanes(dm));
    }
    bytes = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q4_0 ? 2 : 4))));
  }
  // v = 0: the low nibbles (elements 0-15), v = 1: the high ones (16-31)
  SPECDEC_AVX512 __m512 vec(int v) const {
    return _mm512_permutexvar_ps(v ? _mm512_srli_epi32(bytes, 4) : bytes, table);
  }
};
using Q4_0Dec = Nibble4Table<GgmlType::kQ4_0>;
using Q4_1Dec = Nibble4Table<GgmlType::kQ4_1>;

struct Q4_KDec {
  static constexpr int kElems = 256, kVecs = 16;
  avx2::Q4_KScales k;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) { k.load(row, b); }
  // Sub-block v / 2, bytes 16 * (v % 2) of its chunk; through a table of its 16 values as
  // Nibble4Table (q * d - m, the bits avx2::Q4_KDec computes), shared by the sub-block's two
  // vectors.
  SPECDEC_AVX512 __m512 vec(int v) const {
    const int s = v / 2;
    const __m128i b16 =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(k.qs + 32 * (s / 2) + 16 * (v % 2)));
    __m512i q = _mm512_cvtepu8_epi32(b16);
    if (s % 2) q = _mm512_srli_epi32(q, 4);
    return _mm512_permutexvar_ps(
        q, _mm512_fmsub_ps(nibble_values(), _mm512_set1_ps(k.d[s]), _mm512_set1_ps(k.m[s])));
  }
};

// Q6_K without the buffer: vector v (16 values) of half h = v / 8 is run r = (v / 2) % 4, bytes
// 16 (v % 2) of it: the low (r < 2) or high nibbles of ql[64 h + 32 (r % 2) + ...], bits 2r, 2r + 1
// of qh[32 h + ...] as bits 4-5, minus 32, times d * sc[8 h + 2 r + v % 2]: the values, and the
// operations, of dequantize_block (one scale per 16 values, so one vector).
struct Q6_KDec {
  static constexpr int kElems = 256, kVecs = 16;
  const uint8_t* blk;
  float d;
  SPECDEC_AVX512 void start(const uint8_t* row, int64_t b) {
    blk = row + b * kBlockBytes<GgmlType::kQ6_K>;
    d = half_to_float(blk + 208);
  }
  SPECDEC_AVX512 __m512 vec(int v) const {
    const int h = v / 8, r = (v / 2) % 4, part = 16 * (v % 2);
    __m128i ql =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 * h + 32 * (r % 2) + part));
    if (r >= 2) ql = _mm_srli_epi16(ql, 4);
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 128 + 32 * h + part));
    const __m128i hi =
        _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 2 * r), _mm_set1_epi8(3)), 4);
    const __m128i q =
        _mm_sub_epi8(_mm_or_si128(_mm_and_si128(ql, _mm_set1_epi8(0x0F)), hi), _mm_set1_epi8(32));
    const auto sc = static_cast<int8_t>(blk[192 + 8 * h + 2 * r + v % 2]);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d * sc));
  }
};

template <GgmlType T>
struct BufferDec : avx2::BufferDec<T> {  // the same buffer, read 16 at a time
  static constexpr int kVecs = avx2::BufferDec<T>::kElems / 16;
  SPECDEC_AVX512 __m512 vec(int v) const { return _mm512_loadu_ps(this->buf + 16 * v); }
};

// hsum of a 16-lane accumulator: lanes l and l + 8 added first.
SPECDEC_AVX512 inline float hsum(__m512 a) {
  return kernels::hsum(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
}

// hsum of 16 accumulators at once, transposing as it adds: lanes l and l + 8 (shuffle_f32x4), then
// l and l + 4, l and l + 2 (shuffle_ps), l and l + 1, the additions of hsum, so the same bits, in
// 15 additions and 30 shuffles instead of 64 and 64. Lane 4c + q of the result holds a[c + 4q]'s
// sum.
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

// The sums of the N accumulators a[0..N) into s: 16 at a time (a last group of 8 or more padded
// with zeros), the rest one by one.
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

// One 16-lane accumulator per output: 1 x 8 (decode, verification), or 6 weight rows x 4 input
// rows (prefill). kPrefetch: a tile of one weight row prefetches its next bytes (wider tiles read
// rows side by side, where prefetching slowed a prefill down); on for every format but float32, and
// for float32 on Zen 5 (see rows()).
template <class Dec, bool kPrefetch = !std::is_same_v<Dec, F32Dec>>
struct FloatTiles {
  static constexpr int kMaxRows = 8, kWideRows = 6, kWideMaxRows = 4;
  // Passes of at least this many input rows take the wide tiles on long weight rows (rows_x86).
  static int64_t wide_long_from() {
    constexpr bool f16 = std::is_same_v<Dec, F16Dec>, f32 = std::is_same_v<Dec, F32Dec>,
                   q8_q4 = std::is_same_v<Dec, Q8_0Dec> || std::is_same_v<Dec, Q4_0Dec>,
                   q4_k = std::is_same_v<Dec, Q4_KDec>;
    const tuning::WideFrom& from = amd_family_26() ? tuning::kWideFromZen5 : tuning::kWideFrom;
    return f16     ? from.f16
           : f32   ? from.f32
           : q8_q4 ? from.q8_0_q4_0
           : q4_k  ? from.q4_k
                   : from.others;
  }
  // Prefill (more than kStreamRows input rows): the NB weight rows decoded once into float32 rows
  // (buf, NB x k), which the tiles of FloatTiles<F32Dec> then read for every input row of the pass,
  // instead of each tile of kWideMaxRows input rows decoding them again: the same values in the
  // same FMAs, so the same bits. The block formats only (F16 would re-read twice its bytes to save
  // a conversion).
  static constexpr bool kPacks = !kAnyK<Dec>;  // so K is whole blocks
  using Packed = FloatTiles<F32Dec>;
  template <int NB>
  SPECDEC_AVX512 static void pack(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                                  float* buf) {
    for (int i = 0; i < NB; ++i)
      for (int64_t b = 0; b < k / Dec::kElems; ++b) {
        Dec dec;
        dec.start(w + (n + i) * row_bytes, b);
        for (int v = 0; v < Dec::kVecs; ++v)
          _mm512_storeu_ps(buf + i * k + b * Dec::kElems + 16 * v, dec.vec(v));
      }
  }
  template <int NB, int TB>
  SPECDEC_AVX512 static void tile(const void* xv, int64_t k, const uint8_t* w, int64_t row_bytes,
                                  int64_t n, int64_t t, int64_t n_total, float* y) {
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
      // offsets from the row's start (faster on Zen 5; docs/kernels.md).
      const uint8_t* wp = wr[0];
      const float* xp = xr[0];
      const float* end = xp + blocks * 16;
      for (; xp != end; xp += 16, wp += Dec::kBytes) {
        if constexpr (prefetched) prefetch_ahead(wp, Dec::kBytes);
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
            acc[i][j] = _mm512_mask3_fmadd_ps(
                wv, _mm512_castps256_ps512(_mm256_loadu_ps(xr[j] + c)), acc[i][j], 0x00FF);
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

// The float decoder of each format: its own, or the block dequantized into a buffer.
template <GgmlType T>
auto decoder_of() {  // Tag<the decoder>
  if constexpr (T == GgmlType::kF32)
    return Tag<F32Dec>{};
  else if constexpr (T == GgmlType::kBF16)
    return Tag<BF16Dec>{};
  else if constexpr (T == GgmlType::kF16)
    return Tag<F16Dec>{};
  else if constexpr (T == GgmlType::kQ8_0)
    return Tag<Q8_0Dec>{};
  else if constexpr (T == GgmlType::kQ4_0)
    return Tag<Q4_0Dec>{};
  else if constexpr (T == GgmlType::kQ4_1)
    return Tag<Q4_1Dec>{};
  else if constexpr (T == GgmlType::kQ4_K)
    return Tag<Q4_KDec>{};
  else if constexpr (T == GgmlType::kQ6_K)
    return Tag<Q6_KDec>{};
  else
    return Tag<BufferDec<T>>{};  // Q5_0, Q5_1, Q5_K
}

template <class Tiles>
SPECDEC_AVX512 void rows_avx512(const void* x, int64_t t_rows, int64_t k, const uint8_t* w,
                                int64_t row_bytes, int64_t n0, int64_t n1, int64_t n_total,
                                float* y) {
  rows_x86<Tiles>(x, t_rows, k, w, row_bytes, n0, n1, n_total, y);
}

}  // namespace

RowsFn rows(GgmlType type, bool int8_activations) {
  return with_format(type, [&](auto format) -> RowsFn {
    constexpr GgmlType T = decltype(format)::value;
    if constexpr (kHasInt8<T>)
      if (int8_activations) return rows_interleaved<Lanes16<LanesOf<T>>>;
    if constexpr (T == GgmlType::kF32)
      if (amd_family_26()) return rows_avx512<FloatTiles<F32Dec, true>>;
    return rows_avx512<FloatTiles<Tagged<decltype(decoder_of<T>())>>>;
  });
}

RowsFn rows_long(GgmlType type) {
  return with_format(type, [&](auto format) -> RowsFn {
    constexpr GgmlType T = decltype(format)::value;
    if constexpr (kHasInt8<T>)
      return rows_interleaved<Lanes16<LanesOf<T>, tuning::kPrefetchAheadLong>>;
    else
      throw Error("no 8-bit-activation kernel for this format");
  });
}

}  // namespace specdec::kernels::avx512
#endif  // SPECDEC_X86
