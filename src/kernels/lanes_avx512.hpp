// The AVX-512 VNNI 8-bit-activation kernels: a group of 16 interleaved weight rows in the 16 lanes
// of one register per activation row (used by the AVX-512 family and, for its small tiles, AMX).
#pragma once

#include "kernels/x86.hpp"

#ifdef SPECDEC_X86
namespace specdec::kernels::avx512 {

// Chunk c (4 bytes of each row, after the fields) of a block of format T, for the 16 rows.
template <GgmlType T>
SPECDEC_AVX512_VNNI inline __m512i chunk(const uint8_t* blk, int c) {
  return _mm512_loadu_si512(blk + Interleaved<T>::kFields * kInterleave + 64 * c);
}
// 2-byte field f (a float16 scale) of the 16 rows.
SPECDEC_AVX512_VNNI inline __m512 field(const uint8_t* blk, int f) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * f)));
}

SPECDEC_LANE_SCALES(SPECDEC_AVX512_VNNI, __m512i, _mm512, si512)

struct Q8_0Lanes {  // d; 8 chunks of signed values
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  template <int TB>
  SPECDEC_AVX512_VNNI static void block(const uint8_t* blk, const ActView& x, int64_t k, int64_t b,
                                        int64_t t, __m512 (&acc)[TB]) {
    const __m512 dw = field(blk, 0);
    __m512i u[8];  // q + 128, unsigned
    for (int c = 0; c < 8; ++c)
      u[c] = _mm512_xor_si512(chunk<kType>(blk, c), _mm512_set1_epi8(-128));
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
};

template <GgmlType T>
struct NibbleLanes : NibbleLayout<T> {
  using L = NibbleLayout<T>;
  using L::bits, L::kFive, L::kMin, L::kNibbles, L::kOffset, L::spread;
  static constexpr GgmlType kType = T;
  // The 16-lane mask of the bytes whose value has its fifth bit (byte `at` of the lane's qh word,
  // bit i + 4 (c % 2) in byte i), and the 8-lane vector of 0x10 in those bytes.
  SPECDEC_AVX512_VNNI static __mmask64 fifth(__m512i qh, int at, int c) {
    const __m512i lanes = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0);
    return _mm512_test_epi8_mask(
        _mm512_shuffle_epi8(qh, _mm512_add_epi8(lanes, _mm512_set1_epi32(spread(at)))),
        _mm512_set1_epi32(bits(c)));
  }
  // The block's values: 4c..4c+3 in v[c], 16+4c.. in v[4 + c], for the 16 lanes or for half h.
  SPECDEC_AVX512_VNNI static void values(const uint8_t* blk, __m512i (&v)[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = chunk<kType>(blk, kNibbles + c);
      v[c] = _mm512_and_si512(raw, m4);
      v[4 + c] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        const __m512i qh = chunk<kType>(blk, 0), bit4 = _mm512_set1_epi8(0x10);
        v[c] = _mm512_mask_add_epi8(v[c], fifth(qh, c / 2, c), v[c], bit4);
        v[4 + c] = _mm512_mask_add_epi8(v[4 + c], fifth(qh, 2 + c / 2, c), v[4 + c], bit4);
      }
    }
  }
  template <int TB>
  SPECDEC_AVX512_VNNI static void block(const uint8_t* blk, const ActView& x, int64_t k, int64_t b,
                                        int64_t t, __m512 (&acc)[TB]) {
    const __m512 dw = field(blk, 0);
    __m512i v[8];
    values(blk, v);
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
      if constexpr (kMin) acc[j] = _mm512_fmadd_ps(field(blk, 1), _mm512_set1_ps(x.s[e]), acc[j]);
    }
  }
};

template <GgmlType T>
struct KLanes : KLayout<T> {  // Q4_K, Q5_K
  using KLayout<T>::kQ5, KLayout<T>::kNibbles;
  static constexpr GgmlType kType = T;
  template <int TB>
  SPECDEC_AVX512_VNNI static void block(const uint8_t* blk, const ActView& x, int64_t k, int64_t sb,
                                        int64_t t, __m512 (&acc)[TB]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512 d = field(blk, 0), dmin = field(blk, 1);
    __m512i words[3];
    for (int i = 0; i < 3; ++i) words[i] = chunk<kType>(blk, i);
    SPECDEC_UNROLL(8)
    for (int s = 0; s < 8; ++s) {
      __m512i scale, min;
      q4_k_scale_min(words, s, &scale, &min);
      const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(scale));
      const __m512 neg_dmin =  // -(dmin * min)
          _mm512_xor_ps(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(min)), _mm512_set1_ps(-0.0f));
      __m512i wq[8];
      for (int i = 0; i < 8; ++i) {
        const __m512i raw = chunk<kType>(blk, kNibbles + 8 * (s / 2) + i);
        wq[i] = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(raw, 4) : raw, m4);
        if constexpr (kQ5)
          wq[i] = _mm512_or_si512(
              wq[i],
              _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(chunk<kType>(blk, 3 + i), s),
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
    const __m512i qa = chunk<kType>(blk, 16 * h + i), qb = chunk<kType>(blk, 16 * h + 8 + i);
    const __m512i qh = chunk<kType>(blk, 32 + 8 * h + i);
    // low | (high & 0x30): 0xF8 is A | (B & C)
    u[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(qa, m4), _mm512_slli_epi16(qh, 4), m30, 0xF8);
    u[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(qb, m4), _mm512_slli_epi16(qh, 2), m30, 0xF8);
    u[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(qa, 4), m4), qh, m30, 0xF8);
    u[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(qb, 4), m4),
                                     _mm512_srli_epi16(qh, 2), m30, 0xF8);
  }
  // acc += sub-block 4 h + r of activation row `row`, from its integer sums ia (values 0-15) and
  // ib (16-31) of q + 32; d: the block's d in every lane.
  SPECDEC_AVX512_VNNI static void finish(__m512 d, const __m512i (&sc)[4], const ActView& x,
                                         int64_t k, int64_t sb, int64_t row, int h, int r,
                                         __m512i ia, __m512i ib, __m512& acc) {
    const int64_t e = row * (k / 32) + sb * 8 + 4 * h + r;
    ia = _mm512_sub_epi32(ia, _mm512_set1_epi32(32 * x.sum16[2 * e]));
    ib = _mm512_sub_epi32(ib, _mm512_set1_epi32(32 * x.sum16[2 * e + 1]));
    const __m512i sa = q6_k_scale(sc, 8 * h + 2 * r), sb2 = q6_k_scale(sc, 8 * h + 2 * r + 1);
    const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(sa, ia), _mm512_mullo_epi32(sb2, ib));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(x.d[e])), acc);
  }
  template <int TB>
  SPECDEC_AVX512_VNNI static void block(const uint8_t* blk, const ActView& x, int64_t k, int64_t sb,
                                        int64_t t, __m512 (&acc)[TB]) {
    const __m512 d = field(blk, 0);
    __m512i sc[4];
    for (int i = 0; i < 4; ++i) sc[i] = chunk<kType>(blk, 48 + i);
    const int8_t* q = x.q + t * k + sb * 256;
    // the 4 activations of row t + j against chunk i of sub-block 4 h + r (a macro: a lambda would
    // not carry the function's target attributes)
#define SPECDEC_Q6_ACT(j, h, r, i) \
  _mm512_set1_epi32(bytes4(q + (j)*k + 32 * (4 * (h) + (r)) + 4 * (i)))
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
            for (int r = 0; r < 4; ++r)
              is[j][r][i / 4] =
                  _mm512_dpbusd_epi32(is[j][r][i / 4], u[r], SPECDEC_Q6_ACT(j, h, r, i));
        }
        for (int r = 0; r < 4; ++r)
          for (int j = 0; j < TB; ++j)
            finish(d, sc, x, k, sb, t + j, h, r, is[j][r][0], is[j][r][1], acc[j]);
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
};

template <class F, int64_t Ahead = tuning::kPrefetchAhead>
struct Lanes16 {  // AVX-512 VNNI; Ahead: the prefetch distance
  static constexpr GgmlType kType = F::kType;
  static constexpr int kMaxRows = 8;
  template <int TB>
  SPECDEC_AVX512_VNNI static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t,
                                       int64_t n, int64_t n_total, float* y) {
    constexpr int64_t bytes = kInterleave * Interleaved<kType>::kBytes;
    __m512 acc[TB];
    for (int j = 0; j < TB; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / Interleaved<kType>::kValues; ++b) {
      prefetch_ahead<Ahead>(gw + b * bytes, bytes);
      F::template block<TB>(gw + b * bytes, x, k, b, t, acc);
    }
    for (int j = 0; j < TB; ++j) _mm512_storeu_ps(y + (t + j) * n_total + n, acc[j]);
  }
};

// The Lanes struct of each block format, among this family's.
template <GgmlType T>
using LanesOf = Tagged<decltype(lanes_of<T, Q8_0Lanes, NibbleLanes, KLanes, Q6_KLanes>())>;

}  // namespace specdec::kernels::avx512
#endif  // SPECDEC_X86
