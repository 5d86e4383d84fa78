// Norms, rotary embedding, activations and argmax: each row on one thread, in a fixed order.
#include <algorithm>
#include <limits>
#include <string>

#include "kernels/exp.hpp"

namespace specdec::kernels {

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
      const float inv =
          1.0f / std::sqrt(dot(xr, xr, h) / static_cast<float>(h) + static_cast<float>(eps));
      for (int64_t i = 0; i < h; ++i) yp[r * h + i] = wp[i] * (xr[i] * inv);
    }
  });
  return y;
}

at::Tensor layer_norm_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                          double eps) {
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
      const float inv = 1.0f / std::sqrt(dot(c.data(), c.data(), h) / static_cast<float>(h) +
                                         static_cast<float>(eps));
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
// Hugging Face's tanh GELU, 0.5 v (1 + tanh(u)) with u = sqrt(2 / pi) (v + 0.044715 v^3), as
// v / (1 + e^(-2u)) (the same value: 1 + tanh(u) = 2 / (1 + e^(-2u))) on the shared exp.
constexpr float kGeluCubic = 0.044715f, kGeluMinus2Sqrt2OverPi = -1.5957691216057308f;
inline float gelu_tanh(float v) {
  return v / (1.0f + exp_clamped(kGeluMinus2Sqrt2OverPi * (v + kGeluCubic * v * v * v)));
}

#ifdef SPECDEC_X86
// silu() and gelu_tanh() in 8 lanes: the same operations in the same order (AVX2 without FMA).
__attribute__((target("avx2"))) inline __m256 silu8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_xor_ps(v, _mm256_set1_ps(-0.0f)))));
}
__attribute__((target("avx2"))) inline __m256 gelu_tanh8(__m256 v) {
  const __m256 cubic = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(kGeluCubic), v), v),
                                     v);  // ((c v) v) v
  const __m256 t = _mm256_mul_ps(_mm256_set1_ps(kGeluMinus2Sqrt2OverPi), _mm256_add_ps(v, cubic));
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(t)));
}

// act (times up, when given) of a row's first n - n mod 8 values; returns how many.
template <__m256 (*Act)(__m256)>
__attribute__((target("avx2"))) int64_t act_row_avx2(const float* x, const float* up, float* y,
                                                     int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 a = Act(_mm256_loadu_ps(x + i));
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
  else if (name == "gelu")
    f = [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); };
  else if (name == "gelu_tanh")
    f = gelu_tanh;
  else if (name == "relu")
    f = [](float v) { return v > 0.0f ? v : 0.0f; };
  else
    return {};
  const at::Tensor xc = x.contiguous();
  const int64_t in_width = xc.size(-1), width = gated ? in_width / 2 : in_width;
  SPECDEC_CHECK(!gated || in_width % 2 == 0, "gated activation: odd last dimension ", in_width);
  std::vector<int64_t> shape = xc.sizes().vec();
  shape.back() = width;
  at::Tensor y = at::empty(shape, xc.options());
  if (y.numel() == 0) return y;
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // The 8-lane copies where there is one (the same bits).
  int64_t (*vector)(const float*, const float*, float*, int64_t) = nullptr;
#ifdef SPECDEC_X86
  if (isa != Isa::kPortable)
    vector = f == silu ? act_row_avx2<silu8> : f == gelu_tanh ? act_row_avx2<gelu_tanh8> : nullptr;
#else
  (void)isa;
#endif
  at::parallel_for(0, y.numel() / width, rows_per_task(in_width), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = xp + r * in_width;
      const float* up = gated ? in + width : nullptr;
      float* out = yp + r * width;
      const int64_t i0 = vector ? vector(in, up, out, width) : 0;
      for (int64_t i = i0; i < width; ++i) out[i] = up ? f(in[i]) * up[i] : f(in[i]);
    }
  });
  return y;
}

namespace {

bool is_nan(float v) { return v != v; }

// The first index of the largest value of p[0, n) (or of the first NaN), one value at a time.
int64_t argmax_row(const float* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n && !is_nan(p[best]); ++i)
    if (p[i] > p[best] || is_nan(p[i])) best = i;
  return best;
}

#ifdef SPECDEC_X86
// argmax_row in 8 lanes: the maximum (four chains of vmaxps) and whether any value is NaN in one
// sweep, then the first position equal to the maximum (-0.0 == 0.0, as libtorch compares).
__attribute__((target("avx2"))) int64_t argmax_row_avx2(const float* p, int64_t n) {
  if (n < 32) return argmax_row(p, n);
  __m256 m[4], nan = _mm256_setzero_ps();
  for (__m256& v : m) v = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int c = 0; c < 4; ++c) {
      const __m256 v = _mm256_loadu_ps(p + i + 8 * c);
      m[c] = _mm256_max_ps(m[c], v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  __m256 all = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  float lanes[8];
  _mm256_storeu_ps(lanes, all);
  float top = lanes[0];
  for (const float v : lanes) top = v > top ? v : top;
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (; i < n; ++i) {
    top = p[i] > top ? p[i] : top;
    any_nan |= is_nan(p[i]);
  }
  if (any_nan) return std::find_if(p, p + n, is_nan) - p;
  const __m256 want = _mm256_set1_ps(top);
  for (i = 0; i + 8 <= n; i += 8)
    if (const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + i), want, _CMP_EQ_OQ)))
      return i + __builtin_ctz(static_cast<unsigned>(hit));
  for (; i < n; ++i)
    if (p[i] == top) return i;
  return 0;  // (unreachable: top is one of the values)
}
#endif

}  // namespace

at::Tensor argmax(const at::Tensor& x, Isa isa) {
  if (!cpu_f32(x) || x.dim() == 0 || x.size(-1) == 0) return x.argmax(-1);
  int64_t (*row)(const float*, int64_t) = argmax_row;
#ifdef SPECDEC_X86
  if (isa != Isa::kPortable) row = argmax_row_avx2;
#else
  (void)isa;
#endif
  const at::Tensor xc = x.contiguous();
  const int64_t v = xc.size(-1), rows = xc.numel() / v;
  at::Tensor out = at::empty(xc.sizes().slice(0, xc.dim() - 1), xc.options().dtype(at::kLong));
  const float* xp = xc.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, rows_per_task(v), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = row(xp + r * v, v);
  });
  return out;
}

}  // namespace specdec::kernels
