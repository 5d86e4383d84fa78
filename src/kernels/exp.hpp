// specdec's own e^t (multiplies and adds only), shared by attention's softmax and SiLU, with an
// 8-lane AVX2 copy of the same bits.
#pragma once

#include "kernels/common.hpp"

#ifdef SPECDEC_X86
#include <immintrin.h>
#endif

namespace specdec::kernels {

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
  const __m256 e =
      _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256 scale = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(e, scale);
}
#endif

}  // namespace specdec::kernels
