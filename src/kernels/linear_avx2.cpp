// The AVX2 family (with FMA and F16C): float32-activation tiles over the decoders of
// decoders_avx2.hpp, and the 8-bit-activation kernels in two halves of 8 lanes.
#include "kernels/decoders_avx2.hpp"
#include "kernels/families.hpp"

#ifdef SPECDEC_X86
namespace specdec::kernels::avx2 {
namespace {

// (one block of a weight row decoded at a time, serving all TB input rows).
template <class Dec>
struct FloatTiles {  // AVX2: two 8-lane halves per output (even and odd chunks of 8)
  static constexpr int kMaxRows = 6, kWideRows = 2, kWideMaxRows = 6;
  static int64_t wide_long_from() { return tuning::kNever; }  // not measured without AVX-512
  static constexpr bool kPacks = !kAnyK<Dec>;                 // see avx512::FloatTiles::pack
  using Packed = FloatTiles<F32Dec>;
  template <int NB>
  SPECDEC_AVX2 static void pack(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                                float* buf) {
    for (int i = 0; i < NB; ++i)
      for (int64_t b = 0; b < k / Dec::kElems; ++b) {
        Dec dec;
        dec.start(w + (n + i) * row_bytes, b);
        for (int v = 0; v < Dec::kVecs; ++v)
          _mm256_storeu_ps(buf + i * k + b * Dec::kElems + 8 * v, dec.vec(v));
      }
  }
  template <int NB, int TB>
  SPECDEC_AVX2 static void tile(const void* xv, int64_t k, const uint8_t* w, int64_t row_bytes,
                                int64_t n, int64_t t, int64_t n_total, float* y) {
    const float* x = static_cast<const float*>(xv);
    const int64_t blocks = k / Dec::kElems, c_end = blocks * Dec::kElems;
    const bool chunk8 = kAnyK<Dec> && k - c_end >= 8;
    const uint8_t* wr[NB];
    const float* xr[TB];
    for (int i = 0; i < NB; ++i) wr[i] = w + (n + i) * row_bytes;
    for (int j = 0; j < TB; ++j) xr[j] = x + (t + j) * k;
    // Up to 6 outputs: both halves in one sweep (two chains per output: half the latency a decode
    // waits on); more: one half per sweep over the block, so that the accumulators fit 16
    // registers.
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
            for (int j = 0; j < TB; ++j)
              acc[i][j][h] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[j] + c), acc[i][j][h]);
          }
        }
      if constexpr (kAnyK<Dec>)
        if (chunk8 && sweep == 0)
          for (int i = 0; i < NB; ++i) {
            const __m256 wv = Dec::vec8(wr[i], c_end);
            for (int j = 0; j < TB; ++j)
              acc[i][j][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[j] + c_end), acc[i][j][0]);
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

// Chunk c (4 bytes of each row, after the fields) of a block of format T, for half h of the rows.
template <GgmlType T>
SPECDEC_AVX2 inline __m256i chunk(const uint8_t* blk, int c, int h) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
      blk + Interleaved<T>::kFields * kInterleave + 64 * c + 32 * h));
}
// 2-byte field f (a float16 scale) of half h of the rows.
SPECDEC_AVX2 inline __m256 field(const uint8_t* blk, int f, int h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 * f + 16 * h)));
}

SPECDEC_LANE_SCALES(SPECDEC_AVX2, __m256i, _mm256, si256)

struct Q8_0Lanes {  // d; 8 chunks of signed values
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  template <int TB>
  SPECDEC_AVX2 static void block(const uint8_t* blk, int h, const ActView& x, int64_t k, int64_t b,
                                 int64_t t, __m256 (&acc)[TB]) {
    const __m256 dw = field(blk, 0, h);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i w[8];
    for (int c = 0; c < 8; ++c) w[c] = chunk<kType>(blk, c, h);
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

template <GgmlType T>
struct NibbleLanes : NibbleLayout<T> {
  using L = NibbleLayout<T>;
  using L::bits, L::kFive, L::kMin, L::kNibbles, L::kOffset, L::spread;
  static constexpr GgmlType kType = T;
  SPECDEC_AVX2 static __m256i fifth(__m256i qh, int at, int c) {
    const __m256i lanes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404,
                                            0x08080808, 0x0C0C0C0C);
    const __m256i bit = _mm256_set1_epi32(bits(c));
    const __m256i v =
        _mm256_shuffle_epi8(qh, _mm256_add_epi8(lanes, _mm256_set1_epi32(spread(at))));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit),
                            _mm256_set1_epi8(0x10));
  }
  // The block's values: 4c..4c+3 in v[c], 16+4c.. in v[4 + c], for the 16 lanes or for half h.
  SPECDEC_AVX2 static void values(const uint8_t* blk, int h, __m256i (&v)[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = chunk<kType>(blk, kNibbles + c, h);
      v[c] = _mm256_and_si256(raw, m4);
      v[4 + c] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        const __m256i qh = chunk<kType>(blk, 0, h);
        v[c] = _mm256_or_si256(v[c], fifth(qh, c / 2, c));
        v[4 + c] = _mm256_or_si256(v[4 + c], fifth(qh, 2 + c / 2, c));
      }
    }
  }
  template <int TB>
  SPECDEC_AVX2 static void block(const uint8_t* blk, int h, const ActView& x, int64_t k, int64_t b,
                                 int64_t t, __m256 (&acc)[TB]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 dw = field(blk, 0, h);
    __m256i v[8];
    values(blk, h, v);
    // 16-bit sums of pairs of products: 8 x 2 of at most 15 x 127 fit one; 5-bit values (31 x 127)
    // need the low and the high halves apart.
    constexpr int kHigh = kFive ? 1 : 0;
    for (int j = 0; j < TB; ++j) {
      const int64_t e = (t + j) * (k / 32) + b;
      const int8_t* q = x.q + (t + j) * k + b * 32;
      __m256i s16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int c = 0; c < 4; ++c) {
        s16[0] = _mm256_add_epi16(s16[0],
                                  _mm256_maddubs_epi16(v[c], _mm256_set1_epi32(bytes4(q + 4 * c))));
        s16[kHigh] = _mm256_add_epi16(
            s16[kHigh], _mm256_maddubs_epi16(v[4 + c], _mm256_set1_epi32(bytes4(q + 16 + 4 * c))));
      }
      __m256i isum =
          _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_set1_epi32(-kOffset * x.sum[e]));
      if constexpr (kFive) isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16[1], ones));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[e])),
                               acc[j]);
      if constexpr (kMin)
        acc[j] = _mm256_fmadd_ps(field(blk, 1, h), _mm256_set1_ps(x.s[e]), acc[j]);
    }
  }
};

template <GgmlType T>
struct KLanes : KLayout<T> {  // Q4_K, Q5_K
  using KLayout<T>::kQ5, KLayout<T>::kNibbles;
  static constexpr GgmlType kType = T;
  template <int TB>
  SPECDEC_AVX2 static void block(const uint8_t* blk, int h, const ActView& x, int64_t k, int64_t sb,
                                 int64_t t, __m256 (&acc)[TB]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256 d = field(blk, 0, h), dmin = field(blk, 1, h);
    __m256i words[3];
    for (int i = 0; i < 3; ++i) words[i] = chunk<kType>(blk, i, h);
    SPECDEC_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      __m256i scale, min;
      q4_k_scale_min(words, s, &scale, &min);
      const __m256 dsc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(scale));
      const __m256 neg_dmin =
          _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(min)), _mm256_set1_ps(-0.0f));
      __m256i wq[8];
      for (int i = 0; i < 8; ++i) {
        const __m256i raw = chunk<kType>(blk, kNibbles + 8 * (s / 2) + i, h);
        wq[i] = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(raw, 4) : raw, m4);
        if constexpr (kQ5)
          wq[i] = _mm256_or_si256(
              wq[i],
              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(chunk<kType>(blk, 3 + i, h), s),
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
  template <int TB>
  SPECDEC_AVX2 static void block(const uint8_t* blk, int hh, const ActView& x, int64_t k,
                                 int64_t sb, int64_t t, __m256 (&acc)[TB]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 d = field(blk, 0, hh);
    __m256i sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = chunk<kType>(blk, 48 + i, hh);
    SPECDEC_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      const int h = s / 4, r = s % 4;
      __m256i u[8];  // q + 32
      for (int i = 0; i < 8; ++i)
        u[i] = q6_k_values(chunk<kType>(blk, 16 * h + 8 * (r % 2) + i, hh),
                           chunk<kType>(blk, 32 + 8 * h + i, hh), r);
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
        F::template block<TB>(gw + b * bytes, h, x, k, b, t, acc);
      }
      for (int j = 0; j < TB; ++j) _mm256_storeu_ps(y + (t + j) * n_total + n + 8 * h, acc[j]);
    }
  }
};

// The Lanes struct of each block format, among this family's.
template <GgmlType T>
using LanesOf = Tagged<decltype(lanes_of<T, Q8_0Lanes, NibbleLanes, KLanes, Q6_KLanes>())>;

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
  else
    return Tag<BufferDec<T>>{};  // Q5_0, Q5_1, Q5_K, Q6_K
}

template <class Tiles>
SPECDEC_AVX2 void rows_avx2(const void* x, int64_t t_rows, int64_t k, const uint8_t* w,
                            int64_t row_bytes, int64_t n0, int64_t n1, int64_t n_total, float* y) {
  rows_x86<Tiles>(x, t_rows, k, w, row_bytes, n0, n1, n_total, y);
}

}  // namespace

RowsFn rows(GgmlType type, bool int8_activations) {
  return with_format(type, [&](auto format) -> RowsFn {
    constexpr GgmlType T = decltype(format)::value;
    if constexpr (kHasInt8<T>)
      if (int8_activations) return rows_interleaved<Lanes8x2<LanesOf<T>>>;
    return rows_avx2<FloatTiles<Tagged<decltype(decoder_of<T>())>>>;
  });
}

}  // namespace specdec::kernels::avx2
#endif  // SPECDEC_X86
