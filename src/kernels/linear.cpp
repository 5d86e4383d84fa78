// The linear layers' entry points: the family for a format and CPU, the activations' 8-bit
// quantization, the interleaved weight layout, and the threaded pass over the weight rows.
#include <algorithm>

#include "kernels/cpu_features.hpp"
#include "kernels/families.hpp"
#include "kernels/x86.hpp"

namespace specdec::kernels {

bool has_int8_kernel(GgmlType type) {
  return with_format(type, [](auto format) { return kHasInt8<decltype(format)::value>; });
}

LinearKernel linear_kernel(GgmlType type, bool int8_activations, [[maybe_unused]] Isa isa) {
  LinearKernel kernel;
  kernel.int8_activations = int8_activations && has_int8_kernel(type);
  kernel.interleaved = kernel.int8_activations;
  const bool int8 = kernel.int8_activations;
#ifdef SPECDEC_X86
  if (isa == Isa::kAmx && int8 && type == GgmlType::kQ8_0) {
    SPECDEC_CHECK(amx_permitted(),
                  "AMX kernels: Linux refused this process the tile state (arch_prctl)");
    kernel.rows = amx::rows_q8_0();
    return kernel;
  }
  // AVX-512 without VNNI takes the AVX2 8-bit kernels (the same bits).
  if ((isa == Isa::kAvx512 || isa == Isa::kAmx) && (!int8 || has_avx512_vnni())) {
    kernel.rows = avx512::rows(type, int8);
    if (int8 && intel()) kernel.rows_long = avx512::rows_long(type);
    return kernel;
  }
  if (isa != Isa::kPortable) {
    kernel.rows = avx2::rows(type, int8);
    return kernel;
  }
#endif
  kernel.rows = portable::rows(type, int8);
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
  const __m256i packed =
      _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(q),
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

// f.template operator()<T>() for an interleaved format T.
template <class F>
void with_interleaved(GgmlType type, F&& f) {
  with_format(type, [&](auto format) {
    constexpr GgmlType T = decltype(format)::value;
    if constexpr (kHasInt8<T>)
      f.template operator()<T>();
    else
      throw Error("no interleaved layout for this format");
  });
}

}  // namespace

void prepare_weights(const LinearKernel& kernel, GgmlType type, uint8_t* w, int64_t n,
                     int64_t row_bytes) {
  if (kernel.interleaved) with_interleaved(type, Interleave{w, n, row_bytes});
}

void stored_row(const LinearKernel& kernel, GgmlType type, const uint8_t* w, int64_t n,
                int64_t row_bytes, int64_t r, uint8_t* out) {
  if (!kernel.interleaved || r >= n / kInterleave * kInterleave)
    std::memcpy(out, w + r * row_bytes, row_bytes);
  else
    with_interleaved(type, StoredRow{w + r / kInterleave * kInterleave * row_bytes, r % kInterleave,
                                     row_bytes, out});
}

at::Tensor linear_packed(const at::Tensor& x, const LinearKernel& kernel, const uint8_t* w,
                         int64_t row_bytes, int64_t n, int64_t k, const at::Tensor& b,
                         const at::Tensor& residual) {
  // x [..., K] read as [R, K] and y allocated as [..., N] directly: a decode step runs ~120 of
  // these, and each reshape or view is a libtorch dispatch.
  SPECDEC_CHECK(x.dim() >= 1 && x.size(-1) == k, "linear layer: input of ", x.sizes(),
                ", expected ", k, " features");
  const at::Tensor xc = x.contiguous();
  const int64_t rows = xc.numel() / k;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  at::Tensor y = at::empty(shape, x.options());  // [R, N] in memory
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  SPECDEC_CHECK(!b.defined() || (b.numel() == n && b.scalar_type() == at::kFloat),
                "linear layer: bias of ", b.sizes(), " for ", n, " outputs");
  SPECDEC_CHECK(!residual.defined() ||
                    (residual.sizes() == y.sizes() && residual.scalar_type() == at::kFloat),
                "linear layer: residual of ", residual.sizes(), " for an output of ", y.sizes());
  const at::Tensor bc = b.defined() ? b.contiguous() : b,
                   rc = residual.defined() ? residual.contiguous() : residual;
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  const float* resp = rc.defined() ? rc.data_ptr<float>() : nullptr;
  // The 8-bit activations of tuning::kRowTile rows, reused by this thread's passes (a name, so that
  // the lambdas below, run by other threads, see this thread's).
  thread_local ActRows reused;
  ActRows& act = reused;
  for (int64_t r0 = 0; r0 < rows; r0 += tuning::kRowTile) {
    const int64_t r = std::min(tuning::kRowTile, rows - r0);
    if (kernel.int8_activations) {
      act.resize(r, k);
      at::parallel_for(0, r, rows_per_task(k),
                       [&](int64_t a, int64_t b) { act.quantize(xp + r0 * k, a, b); });
    }
    const ActView view = act.view(0);
    const void* xr = kernel.int8_activations ? static_cast<const void*>(&view)
                                             : static_cast<const void*>(xp + r0 * k);
    // whole groups of 16 weight rows per thread (an interleaved kernel needs them)
    const RowsFn fn =
        kernel.rows_long && n * row_bytes >= tuning::kLongStream ? kernel.rows_long : kernel.rows;
    at::parallel_for(0, (n + kInterleave - 1) / kInterleave, 1, [&](int64_t g0, int64_t g1) {
      const int64_t c0 = g0 * kInterleave, c1 = std::min(n, g1 * kInterleave);
      fn(xr, r, k, w, row_bytes, c0, c1, n, yp + r0 * n);
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

int64_t rows_per_task(int64_t row_floats) {
  return std::max<int64_t>(1, kMinTaskFloats / std::max<int64_t>(1, row_floats));
}

}  // namespace specdec::kernels
