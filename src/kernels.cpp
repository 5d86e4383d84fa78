#include "kernels.hpp"

#include <ATen/Parallel.h>
#include <immintrin.h>

namespace specdec::kernels {
namespace {

// Register tile: NB weight rows x TB input rows. Every output element (n, t) owns one 8-lane
// accumulator fed in k order (lane = k mod 8), then a fixed horizontal sum, then the tail in order:
// the same arithmetic whatever the tile, so results do not depend on how many rows share a pass.
__attribute__((target("avx2,fma"))) inline float hsum(__m256 s) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

template <int NB, int TB>
__attribute__((target("avx2,fma"))) inline void tile(const float* x, int64_t k, const float* w,
                                                     int64_t n, int64_t t, int64_t n_total, float* y) {
  const int64_t k8 = k - k % 8;
  __m256 acc[NB][TB];
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < TB; ++j) acc[i][j] = _mm256_setzero_ps();
  const float* wr[NB];
  const float* xr[TB];
  for (int i = 0; i < NB; ++i) wr[i] = w + (n + i) * k;
  for (int j = 0; j < TB; ++j) xr[j] = x + (t + j) * k;
  for (int64_t c = 0; c < k8; c += 8) {
    __m256 wv[NB];
    for (int i = 0; i < NB; ++i) wv[i] = _mm256_loadu_ps(wr[i] + c);
    for (int j = 0; j < TB; ++j) {
      const __m256 xv = _mm256_loadu_ps(xr[j] + c);
      for (int i = 0; i < NB; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < TB; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t c = k8; c < k; ++c) s += wr[i][c] * xr[j][c];
      y[(t + j) * n_total + n + i] = s;
    }
}

template <int NB>
__attribute__((target("avx2,fma"))) inline void row_block(const float* x, int64_t t_rows,
                                                          int64_t k, const float* w, int64_t n,
                                                          int64_t n_total, float* y) {
  int64_t t = 0;
  for (; t + 6 <= t_rows; t += 6) tile<NB, 6>(x, k, w, n, t, n_total, y);
  switch (t_rows - t) {
    case 5: tile<NB, 5>(x, k, w, n, t, n_total, y); break;
    case 4: tile<NB, 4>(x, k, w, n, t, n_total, y); break;
    case 3: tile<NB, 3>(x, k, w, n, t, n_total, y); break;
    case 2: tile<NB, 2>(x, k, w, n, t, n_total, y); break;
    case 1: tile<NB, 1>(x, k, w, n, t, n_total, y); break;
    default: break;
  }
}

__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, int64_t t_rows, int64_t k,
                                                   const float* w, int64_t n0, int64_t n1,
                                                   int64_t n_total, float* y) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) row_block<2>(x, t_rows, k, w, n, n_total, y);
  if (n < n1) row_block<1>(x, t_rows, k, w, n, n_total, y);
}

bool has_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

constexpr int64_t kRowTile = 64;  // input rows per sweep over the weights (keeps x in L2)

}  // namespace

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!has_avx2_fma() || !x.device().is_cpu() || x.scalar_type() != at::kFloat ||
      w.scalar_type() != at::kFloat || !w.is_contiguous() || w.dim() != 2)
    return {};
  const int64_t k = w.size(1), n = w.size(0);
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();  // [R, K]
  const int64_t rows = x2.size(0);
  at::Tensor y = at::empty({rows, n}, x.options());       // [R, N]
  const float* xp = x2.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t r0 = 0; r0 < rows; r0 += kRowTile) {
    const int64_t r = std::min(kRowTile, rows - r0);
    at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
      rows_avx2(xp + r0 * k, r, k, wp, n0, n1, n, yp + r0 * n);
    });
  }
  if (b.defined()) y.add_(b);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  return y.view(shape);
}

}  // namespace specdec::kernels
