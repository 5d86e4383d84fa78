// The AVX2 decoders of the float32-activation kernels: one block of a weight row into vectors of 8
// floats with exactly ggml_dequantize's values. The AVX-512 kernels use them too, for the float
// formats' last columns and for the formats they decode through a buffer.
#pragma once

#include "kernels/x86.hpp"

#ifdef SPECDEC_X86
namespace specdec::kernels::avx2 {

// AVX2 decoders: kVecs vectors of 8 floats per block of kElems (an even number of vectors). The
// float formats also give any 8 columns (vec8, the chunk after the last 16) and one (scalar).
struct F32Dec {
  static constexpr int kElems = 16, kVecs = 2;
  const float* p;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    p = reinterpret_cast<const float*>(row) + b * 16;
  }
  SPECDEC_AVX2 __m256 vec(int v) const { return _mm256_loadu_ps(p + 8 * v); }
  SPECDEC_AVX2 static __m256 vec8(const uint8_t* row, int64_t c) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
  static float scalar(const uint8_t* row, int64_t c) {
    return reinterpret_cast<const float*>(row)[c];
  }
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
  SPECDEC_AVX2 static float scalar(const uint8_t* row, int64_t c) {
    return half_to_float(row + 2 * c);
  }
};

struct Q8_0Dec {  // d (f16), qs[32] int8: x = q * d
  static constexpr int kElems = 32, kVecs = 4;
  __m256 d;
  const uint8_t* q;
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kBlockBytes<GgmlType::kQ8_0>;
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
    const uint8_t* blk = row + b * kBlockBytes<GgmlType::kQ4_0>;
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
    const uint8_t* blk = row + b * kBlockBytes<GgmlType::kQ4_1>;
    d = _mm256_set1_ps(half_to_float(blk));
    m = _mm256_set1_ps(half_to_float(blk + 2));
    n.load(blk + 4);
  }
  SPECDEC_AVX2 __m256 vec(int v) const {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(n.get(v)), d, m);
  }
};

// Q4_K: d, dmin (f16), 8 packed 6-bit scale/min pairs, qs[128]. Element e is in sub-block
// s = e / 32 with x = (d * sc_s) * q - dmin * mn_s; chunk e / 64 of 32 bytes gives its low nibbles
// to sub-block 2 * chunk and its high nibbles to the next. (d * sc_s) * q is exact, so a fused
// multiply-subtract rounds as ggml's multiply then subtract.
struct Q4_KScales {
  float d[8], m[8];
  const uint8_t* qs;
  // ggml_scale_min_k4 for the 8 sub-blocks at once, on 32-bit words of the 12 bytes u0, u1, u2:
  // sub-blocks 0-3 take the low 6 bits of u0 (scales) and u1 (mins); 4-7 take their low 4 bits
  // from u2's low and high nibbles and their top 2 from the top 2 bits of u0 and u1.
  SPECDEC_AVX2 void load(const uint8_t* row, int64_t b) {
    const uint8_t* blk = row + b * kBlockBytes<GgmlType::kQ4_K>;
    uint32_t u[3];
    std::memcpy(u, blk + 4, 12);
    const uint32_t lo6 = 0x3F3F3F3F, lo4 = 0x0F0F0F0F, lo2 = 0x03030303;
    const uint32_t sc47 = (u[2] & lo4) | ((u[0] >> 6) & lo2) << 4;
    const uint32_t mn47 = ((u[2] >> 4) & lo4) | ((u[1] >> 6) & lo2) << 4;
    const uint64_t sc = (u[0] & lo6) | uint64_t(sc47) << 32, mn = (u[1] & lo6) | uint64_t(mn47)
                                                                                     << 32;
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
    const __m128i b8 =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k.qs + 32 * (s / 2) + 8 * (v % 4)));
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
    __m256 v =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(q, 8) : q)), sv);
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
SPECDEC_AVX2 inline __m256i low_nibbles(__m256i q) {
  return _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
}
SPECDEC_AVX2 inline __m256i high_nibbles(__m256i q) { return low_nibbles(_mm256_srli_epi16(q, 4)); }
SPECDEC_AVX2 inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// Bytes that are 0x10 where `q & bit` equals `bit`, else 0.
SPECDEC_AVX2 inline __m256i bit16(__m256i q, __m256i bit) {
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(q, bit), bit), _mm256_set1_epi8(0x10));
}

template <GgmlType T>
SPECDEC_AVX2 void dequantize_block(const uint8_t* b, float* y) {
  if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {
    // d, [m], qh (bit j: the fifth bit of element j), qs[16]: element j < 16 the low nibble of
    // qs[j]
    constexpr bool q5_1 = T == GgmlType::kQ5_1;
    const float d = half_to_float(b), m = q5_1 ? half_to_float(b + 2) : 0.0f;
    const uint8_t* qh = b + (q5_1 ? 4 : 2);
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    // byte j of `h` holds byte j / 8 of qh, tested against bit j mod 8
    const __m256i h = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    Nibbles nib;
    nib.load(qh + 4);
    __m256i q =
        _mm256_or_si256(_mm256_set_m128i(nib.hi, nib.lo),
                        bit16(h, _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201))));
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
      const __m256i lo = _mm256_or_si256(
          low_nibbles(q), bit16(qh, _mm256_set1_epi8(static_cast<char>(1 << (2 * chunk)))));
      const __m256i hi = _mm256_or_si256(
          high_nibbles(q), bit16(qh, _mm256_set1_epi8(static_cast<char>(2 << (2 * chunk)))));
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
      const __m256i ql0 = load32(b + 64 * n), ql1 = load32(b + 64 * n + 32),
                    qh = load32(b + 128 + 32 * n);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
      const __m256i three = _mm256_set1_epi8(3), offset = _mm256_set1_epi8(32);
      const __m256i lows[4] = {low_nibbles(ql0), low_nibbles(ql1), high_nibbles(ql0),
                               high_nibbles(ql1)};
      for (int r = 0; r < 4; ++r) {
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), three);
        const __m256i q =
            _mm256_sub_epi8(_mm256_or_si256(lows[r], _mm256_slli_epi16(h, 4)), offset);
        put32<Then::kNothing>(q, d * sc[2 * r], 0.0f, d * sc[2 * r + 1], 0.0f, y + 32 * r);
      }
    }
  }
}

template <GgmlType T>
struct BufferDec {
  static constexpr int kElems = static_cast<int>(kBlockValues<T>), kVecs = kElems / 8;
  float buf[kElems];
  SPECDEC_AVX2 void start(const uint8_t* row, int64_t b) {
    dequantize_block<T>(row + b * kBlockBytes<T>, buf);
  }
  SPECDEC_AVX2 __m256 vec(int v) const { return _mm256_loadu_ps(buf + 8 * v); }
};

}  // namespace specdec::kernels::avx2
#endif  // SPECDEC_X86
