// attention_f32 and cached_attention_f32: one query row per task, its scores, softmax and weighted
// sum in a fixed order (plain C++, or AVX2/AVX-512 copies of the same operations).
#include <algorithm>
#include <limits>

#include "kernels/exp.hpp"
#include "kernels/x86.hpp"

namespace specdec::kernels {
namespace {

// One query row of attention_f32: scores, softmax and the weighted sum of the values. Plain C++ for
// any x86-64 (SSE2) and other CPUs; on x86, an AVX2 copy without FMA: the scores of 8 keys at once
// (scores_avx2), their exponentials 8 at a time (exps_avx2) and the weighted sum with its
// accumulators in registers (weigh_avx2; on AVX-512 CPUs in 16 lanes, weigh_avx512). Each lane
// does what the scalar code does (a multiply, then an add, in the same order), so all give the
// same bits (LayerKernels.AttentionIsTheSameOnEveryIsa).
struct AttentionRow {
  const float* q;     // [D]
  const float* k;     // key j at k + j * k_stride, [D]
  const float* v;     // value j at v + j * v_stride, [D]
  const float* mask;  // additive, entry j at mask + j * mask_stride; null: none
  int64_t k_stride, v_stride, mask_stride, len, d;
  float scale;
  float* p;    // [len] scratch
  float* out;  // [D]
};

// Key j's score: q . k_j * scale, plus the mask (-inf stays -inf).
inline float masked(const AttentionRow& a, int64_t j, float x) {
  if (a.mask) {
    const float add = a.mask[j * a.mask_stride];
    x = add == -std::numeric_limits<float>::infinity() ? add : x + add;
  }
  return x;
}

// Whether the mask hides key j (its score is -inf whatever q . k_j is, so it is not computed: a
// prefill's query skips the keys after its own).
inline bool hidden(const AttentionRow& a, int64_t j) {
  return a.mask && a.mask[j * a.mask_stride] == -std::numeric_limits<float>::infinity();
}

// The scores of keys [from, len) into a.p, one at a time; returns the largest of them and `mx`.
inline float scores_plain(const AttentionRow& a, int64_t from = 0,
                          float mx = -std::numeric_limits<float>::infinity()) {
  for (int64_t j = from; j < a.len; ++j) {
    if (hidden(a, j)) {
      a.p[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    a.p[j] = masked(a, j, dot(a.q, a.k + j * a.k_stride, a.d) * a.scale);
    mx = std::max(mx, a.p[j]);
  }
  return mx;
}

// The scores of keys [from, len) in a.p become e^(score - mx) (exp_clamped), a masked key's 0.
inline void exps_plain(const AttentionRow& a, float mx, int64_t from = 0) {
  for (int64_t j = from; j < a.len; ++j)
    a.p[j] = a.p[j] == -std::numeric_limits<float>::infinity() ? 0.0f : exp_clamped(a.p[j] - mx);
}

// out[c] for c in [from, D): the sum over the keys, in order, of p[j] * v_j[c] (a multiply, then an
// add), skipping keys of weight 0.
inline void weigh_plain(const AttentionRow& a, int64_t from = 0) {
  if (from >= a.d) return;
  for (int64_t c = from; c < a.d; ++c) a.out[c] = 0;
  for (int64_t j = 0; j < a.len; ++j) {
    if (a.p[j] == 0.0f) continue;
    const float* v = a.v + j * a.v_stride;
    for (int64_t c = from; c < a.d; ++c) a.out[c] += a.p[j] * v[c];
  }
}

// The sum of the exponentials: key j's into partial sum j mod 8 (the last len mod 8 keys too), the
// 8 combined in a fixed tree. A masked key's 0 changes no partial sum, so a query row gets the same
// total whether the keys after its own (a later query's in a pass of several, or the padding of a
// shorter row in a batch) are in the pass or not; any vector width gives the same bits. Under a
// mask, a visible key's partial sum is its rank among the visible keys counted from the first
// one's index: j itself when they are one run (a chain's, a window's), and for a tree's node, whose
// ancestors' keys are spread over the pass, the sums the path would get as a chain.
inline float exps_total(const AttentionRow& a) {
  const float* p = a.p;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (!a.mask) {
    const int64_t n8 = a.len - a.len % 8;
    for (int64_t j = 0; j < n8; j += 8)
      for (int l = 0; l < 8; ++l) acc[l] += p[j + l];
    for (int64_t j = n8; j < a.len; ++j) acc[j - n8] += p[j];
  } else {
    int64_t lane = -1;
    for (int64_t j = 0; j < a.len; ++j) {
      if (hidden(a, j)) continue;
      if (lane < 0) lane = j;
      acc[lane++ % 8] += p[j];
    }
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Scores, their exponentials, the weights e_j / exps_total (each division rounds once, so any
// vector width gives the same bits), the weighted sum of the values.
template <class Scores, class Exps, class Weigh>
__attribute__((always_inline)) inline void attend(const AttentionRow& a, Scores scores, Exps exps,
                                                  Weigh weigh) {
  const float mx = scores(a);
  exps(a, mx);
  const float total = exps_total(a);
  for (int64_t j = 0; j < a.len; ++j) a.p[j] /= total;
  weigh(a);
}

void attend_default(const AttentionRow& a) {
  attend(
      a, [](const AttentionRow& r) { return scores_plain(r); },
      [](const AttentionRow& r, float mx) { exps_plain(r, mx); },
      [](const AttentionRow& r) { weigh_plain(r); });
}

#ifdef SPECDEC_X86
// The scores of 8 keys at a time, each exactly as dot() computes it: 8 lanes of multiply-then-add
// over the head dimension, then dot()'s tree over the lanes, done for the 8 keys at once on the
// transposed lanes; then the last D mod 8 products in order.
__attribute__((target("avx2"))) inline float scores_avx2(const AttentionRow& a) {
  float mx = -std::numeric_limits<float>::infinity();
  const int64_t d8 = a.d - a.d % 8;
  int64_t j = 0;
  for (; j + 8 <= a.len; j += 8) {
    bool all_hidden = true;
    for (int i = 0; i < 8; ++i) all_hidden = all_hidden && hidden(a, j + i);
    if (all_hidden) {
      for (int i = 0; i < 8; ++i) a.p[j + i] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float* kr[8];
    __m256 r[8];
    for (int i = 0; i < 8; ++i) kr[i] = a.k + (j + i) * a.k_stride, r[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d8; c += 8) {
      const __m256 qv = _mm256_loadu_ps(a.q + c);
      for (int i = 0; i < 8; ++i)
        r[i] = _mm256_add_ps(r[i], _mm256_mul_ps(qv, _mm256_loadu_ps(kr[i] + c)));
    }
    // Transpose: lane l of every key into one vector, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
    // (l6 + l7)).
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44),
                 u1 = _mm256_shuffle_ps(t0, t2, 0xEE);  // lanes 0|4, 1|5
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44),
                 u3 = _mm256_shuffle_ps(t1, t3, 0xEE);  // lanes 2|6, 3|7
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    const __m256 l0 = _mm256_permute2f128_ps(u0, u4, 0x20),
                 l4 = _mm256_permute2f128_ps(u0, u4, 0x31);
    const __m256 l1 = _mm256_permute2f128_ps(u1, u5, 0x20),
                 l5 = _mm256_permute2f128_ps(u1, u5, 0x31);
    const __m256 l2 = _mm256_permute2f128_ps(u2, u6, 0x20),
                 l6 = _mm256_permute2f128_ps(u2, u6, 0x31);
    const __m256 l3 = _mm256_permute2f128_ps(u3, u7, 0x20),
                 l7 = _mm256_permute2f128_ps(u3, u7, 0x31);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l0, l1), _mm256_add_ps(l2, l3)),
                                     _mm256_add_ps(_mm256_add_ps(l4, l5), _mm256_add_ps(l6, l7)));
    float sv[8];
    _mm256_storeu_ps(sv, sum);
    for (int i = 0; i < 8; ++i) {
      float x = sv[i];
      for (int64_t c = d8; c < a.d; ++c) x += a.q[c] * kr[i][c];
      a.p[j + i] = masked(a, j + i, x * a.scale);
      mx = std::max(mx, a.p[j + i]);
    }
  }
  return scores_plain(a, j, mx);  // the last len mod 8 keys
}

// exps_plain() 8 keys at a time (exp8), then the last len mod 8.
__attribute__((target("avx2"))) inline void exps_avx2(const AttentionRow& a, float mx) {
  const __m256 m = _mm256_set1_ps(mx),
               masked = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= a.len; j += 8) {
    const __m256 s = _mm256_loadu_ps(a.p + j);
    const __m256 off = _mm256_cmp_ps(s, masked, _CMP_EQ_OQ);  // the masked keys' lanes
    if (_mm256_movemask_ps(off) ==
        0xFF) {  // all 8 masked (a prefill's later keys): no exponentials
      _mm256_storeu_ps(a.p + j, _mm256_setzero_ps());
      continue;
    }
    _mm256_storeu_ps(a.p + j, _mm256_andnot_ps(off, exp8(_mm256_sub_ps(s, m))));
  }
  exps_plain(a, mx, j);
}

// weigh_plain() for out[c0, c0 + 8 NV), the NV accumulators of 8 lanes in registers across the keys
// (the plain loop keeps them in memory: a load and a store per key).
template <int NV>
__attribute__((target("avx2"))) inline void weigh_lanes(const AttentionRow& a, int64_t c0) {
  __m256 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < a.len; ++j) {
    if (a.p[j] == 0.0f) continue;
    const __m256 w = _mm256_set1_ps(a.p[j]);
    const float* v = a.v + j * a.v_stride + c0;
    for (int i = 0; i < NV; ++i)
      acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(w, _mm256_loadu_ps(v + 8 * i)));
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(a.out + c0 + 8 * i, acc[i]);
}

__attribute__((target("avx2"))) inline void weigh_avx2(const AttentionRow& a) {
  int64_t c = 0;
  for (; c + 64 <= a.d; c += 64) weigh_lanes<8>(a, c);
  for (; c + 8 <= a.d; c += 8) weigh_lanes<1>(a, c);
  weigh_plain(a, c);
}

__attribute__((target("avx2"))) void attend_avx2(const AttentionRow& a) {
  attend(a, scores_avx2, exps_avx2, weigh_avx2);
}

// weigh_lanes() in 16 lanes: each output feature still gets its multiply, then add, key by key, so
// the width changes no bit; half the instructions per key.
template <int NV>
SPECDEC_AVX512 inline void weigh_lanes16(const AttentionRow& a, int64_t c0) {
  __m512 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < a.len; ++j) {
    if (a.p[j] == 0.0f) continue;
    const __m512 w = _mm512_set1_ps(a.p[j]);
    const float* v = a.v + j * a.v_stride + c0;
    for (int i = 0; i < NV; ++i)
      acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(w, _mm512_loadu_ps(v + 16 * i)));
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(a.out + c0 + 16 * i, acc[i]);
}

SPECDEC_AVX512 inline void weigh_avx512(const AttentionRow& a) {
  int64_t c = 0;
  for (; c + 128 <= a.d; c += 128) weigh_lanes16<8>(a, c);
  if (c + 64 <= a.d) weigh_lanes16<4>(a, c), c += 64;
  for (; c + 16 <= a.d; c += 16) weigh_lanes16<1>(a, c);
  if (c + 8 <= a.d) weigh_lanes<1>(a, c), c += 8;
  weigh_plain(a, c);
}

// attend_avx2 with the weighted sum in 16 lanes (the same bits).
SPECDEC_AVX512 void attend_avx512(const AttentionRow& a) {
  attend(a, scores_avx2, exps_avx2, weigh_avx512);
}
#endif

// Where attend_rows finds a pass's operands: q [B, Hq, T, D] contiguous; keys and values of batch
// row b and key/value head h at k + b * k_b + h * k_h, key j j * k_j further on (contiguous D);
// the mask (null: none) of (b, key/value head, query head in its group, query t) at
// mask + b * m_b + h * m_h + g * m_g + t * m_t, key j j * m_j further on; out [B, T, Hq * D].
struct AttentionPass {
  const float *q, *k, *v;
  float* out;
  int64_t b, hq, hkv, t, d, len;
  float scale;
  int64_t k_b, k_h, k_j, v_b, v_h, v_j;
  const float* mask = nullptr;
  int64_t m_b = 0, m_h = 0, m_g = 0, m_t = 0, m_j = 0;
};

// One AttentionRow per (row, query head, query) over the threads.
void attend_rows(const AttentionPass& a, Isa isa) {
  void (*row_fn)(const AttentionRow&) = attend_default;
#ifdef SPECDEC_X86
  if (isa == Isa::kAvx512 || isa == Isa::kAmx)
    row_fn = attend_avx512;
  else if (isa != Isa::kPortable)
    row_fn = attend_avx2;
#else
  (void)isa;
#endif
  const int64_t groups = a.hq / a.hkv;
  at::parallel_for(0, a.b * a.hq * a.t, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(a.len);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / (a.hq * a.t), h = (r / a.t) % a.hq, ti = r % a.t, kh = h / groups;
      AttentionRow row;
      row.q = a.q + r * a.d;
      row.k = a.k + bi * a.k_b + kh * a.k_h;
      row.v = a.v + bi * a.v_b + kh * a.v_h;
      row.mask =
          a.mask ? a.mask + bi * a.m_b + kh * a.m_h + (h % groups) * a.m_g + ti * a.m_t : nullptr;
      row.k_stride = a.k_j, row.v_stride = a.v_j, row.mask_stride = a.m_j;
      row.len = a.len, row.d = a.d, row.scale = a.scale;
      row.p = p.data();
      row.out = a.out + (bi * a.t + ti) * a.hq * a.d + h * a.d;
      row_fn(row);
    }
  });
}

}  // namespace

at::Tensor attention_f32(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& mask, double scale, Isa isa) {
  if (!cpu_f32(q) || !cpu_f32(keys) || !cpu_f32(values) || (mask.defined() && !cpu_f32(mask)) ||
      q.dim() != 4 || keys.dim() != 4 || keys.stride(3) != 1 || values.stride(3) != 1)
    return {};
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3);
  const int64_t hkv = keys.size(1), len = keys.size(2), groups = hq / hkv;
  const at::Tensor qc = q.contiguous();                     // [B, Hq, T, D]
  at::Tensor out = at::empty({b, t, hq * d}, q.options());  // [B, T, Hq * D]
  AttentionPass a{qc.data_ptr<float>(),
                  keys.data_ptr<float>(),
                  values.data_ptr<float>(),
                  out.data_ptr<float>(),
                  b,
                  hq,
                  hkv,
                  t,
                  d,
                  len,
                  static_cast<float>(scale),
                  keys.stride(0),
                  keys.stride(1),
                  keys.stride(2),
                  values.stride(0),
                  values.stride(1),
                  values.stride(2)};
  if (mask.defined()) {
    const at::Tensor m = mask.expand({b, hkv, groups, t, len});  // [B, Hkv, g, T, L] view
    a.mask = m.data_ptr<float>();
    a.m_b = m.stride(0), a.m_h = m.stride(1), a.m_g = m.stride(2), a.m_t = m.stride(3),
    a.m_j = m.stride(4);
  }
  attend_rows(a, isa);
  return out;
}

at::Tensor cached_attention_f32(const at::Tensor& qkv, int64_t hq, int64_t hkv, int64_t d,
                                const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& keys, const at::Tensor& values,
                                const std::vector<int64_t>& past, const at::Tensor& mask,
                                double scale, Isa isa) {
  if (!cpu_f32(qkv) || !cpu_f32(keys) || !cpu_f32(values) || qkv.dim() != 3 ||
      !qkv.is_contiguous() || qkv.size(2) != (hq + 2 * hkv) * d || !keys.is_contiguous() ||
      !values.is_contiguous() || keys.dim() != 4 || keys.sizes() != values.sizes() ||
      keys.size(0) < qkv.size(0) || keys.size(1) != hkv || keys.size(3) != d || hq % hkv != 0 ||
      past.empty() || static_cast<int64_t>(past.size()) != qkv.size(0))
    return {};
  const int64_t b = qkv.size(0), t = qkv.size(1), cap = keys.size(2);
  const int64_t longest = *std::max_element(past.begin(), past.end());
  if (*std::min_element(past.begin(), past.end()) < 0 || longest >= cap) return {};
  // The keys attended over: as KVCache::append's views, up to the longest row's end.
  const int64_t len = std::min(cap, longest + t);
  const auto shaped = [](const at::Tensor& m, std::initializer_list<int64_t> one,
                         std::initializer_list<int64_t> per_row) {
    return cpu_f32(m) && m.is_contiguous() &&
           (m.sizes() == at::IntArrayRef(one) || m.sizes() == at::IntArrayRef(per_row));
  };
  if (mask.defined() && !shaped(mask, {t, len}, {b, 1, 1, t, len})) return {};
  const bool rotary = cos.defined();
  const int64_t rot = rotary ? cos.size(-1) : 0;
  if (rotary && (rot > d || !shaped(cos, {t, rot}, {b, 1, t, rot}) || !sin.defined() ||
                 sin.sizes() != cos.sizes() || !shaped(sin, {t, rot}, {b, 1, t, rot})))
    return {};
  const int64_t width = (hq + 2 * hkv) * d, heads = hq + 2 * hkv;
  const int64_t table_row =
      rotary && cos.dim() == 4 ? t : 0;  // batch row b's tables start b * t rows on
  at::Tensor q = at::empty({b, hq, t, d}, qkv.options());  // rotated queries
  at::Tensor out = at::empty({b, t, hq * d}, qkv.options());
  const float* x = qkv.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = keys.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  const float* cp = rotary ? cos.data_ptr<float>() : nullptr;
  const float* sp = rotary ? sin.data_ptr<float>() : nullptr;
  // Each head row of each token (queries, keys, values) as Attention's split, rotary_f32 and
  // KVCache::append leave it: queries rotated into q; keys rotated and values copied into the
  // cache at the row's next positions, those past the capacity dropped (only padding is there).
  at::parallel_for(0, b * t * heads, rows_per_task(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / (t * heads), ti = (r / heads) % t, h = r % heads;
      const float* xr = x + (bi * t + ti) * width + h * d;
      const float* c = rotary ? cp + (bi * table_row + ti) * rot : nullptr;
      const float* s = rotary ? sp + (bi * table_row + ti) * rot : nullptr;
      const int64_t pos = past[static_cast<size_t>(bi)] + ti;
      if (h < hq) {
        rotate_row(xr, c, s, rot, d, qp + ((bi * hq + h) * t + ti) * d);
      } else if (pos >= cap) {
        continue;
      } else if (h < hq + hkv) {
        rotate_row(xr, c, s, rot, d, kp + ((bi * hkv + h - hq) * cap + pos) * d);
      } else {
        std::memcpy(vp + ((bi * hkv + h - hq - hkv) * cap + pos) * d, xr, d * sizeof(float));
      }
    }
  });
  const int64_t row = hkv * cap * d;  // the buffers' strides: row, head, position
  AttentionPass a{qp,  kp,      vp,  out.data_ptr<float>(),     b,   hq,      hkv,
                  t,   d,       len, static_cast<float>(scale), row, cap * d, d,
                  row, cap * d, d};
  if (mask.defined()) {
    a.mask = mask.data_ptr<float>(), a.m_t = len, a.m_j = 1;
    if (mask.dim() == 5) a.m_b = t * len;
  }
  attend_rows(a, isa);
  return out;
}

}  // namespace specdec::kernels
