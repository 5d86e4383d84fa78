// What every kernel file shares: the x86 switch, the unroll pragma, the fixed-order sums.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ggml_blocks.hpp"
#include "kernels/kernels.hpp"
#include "specdec/error.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(SPECDEC_NO_X86_KERNELS)
#define SPECDEC_X86 1
#endif

// The tiles' loops are unrolled for speed, which never changes the order of the operations. Builds
// under AddressSanitizer or ThreadSanitizer leave them rolled: the same operations in the same
// order, in a quarter of the compile time (the unrolled kernels took 11 minutes under clang's
// ASan).
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

namespace specdec::kernels {

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

inline bool cpu_f32(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat;
}

// The first `rot` features of a head's row x rotated (x * cos + rotate_half(x) * sin), the rest
// copied, into o.
inline void rotate_row(const float* x, const float* c, const float* s, int64_t rot, int64_t d,
                       float* o) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) o[i] = x[i] * c[i] + (-x[i + half]) * s[i];
  for (int64_t i = half; i < rot; ++i) o[i] = x[i] * c[i] + x[i - half] * s[i];
  for (int64_t i = rot; i < d; ++i) o[i] = x[i];
}

}  // namespace specdec::kernels
