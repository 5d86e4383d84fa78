// The layer kernels on every ISA: attention (plain, masked, fused with the cache step) and SiLU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/kernels.hpp"
#include "specdec/kv_cache.hpp"

namespace specdec {
namespace {

// The attention kernel's vectorized copies (AVX2; AVX-512's weighted sum) compute the scalar code's
// bits (grouped-query heads, a causal mask, a strided view of a longer cache, head sizes that are
// not a multiple of 16 or of 8), and agree with libtorch's softmax(q k^T) v.
TEST(LayerKernels, AttentionIsTheSameOnEveryIsa) {
  const std::vector<kernels::Isa> have = kernels::available_isas();
  if (have.front() == kernels::Isa::kPortable) GTEST_SKIP() << "no x86 kernel in this build or CPU";
  for (int64_t d : {64, 36, 40}) {
    const int64_t t = 5, len = 300, hq = 6, hkv = 2;
    const at::Tensor q = at::randn({2, hq, t, d});
    const at::Tensor cache_k = at::randn({2, hkv, 512, d}), cache_v = at::randn({2, hkv, 512, d});
    const at::Tensor k = cache_k.narrow(2, 0, len), v = cache_v.narrow(2, 0, len);  // strided views
    const at::Tensor mask =
        at::full({t, len}, -std::numeric_limits<float>::infinity()).triu(len - t + 1);
    const at::Tensor plain = kernels::attention_f32(q, k, v, mask, 0.125, kernels::Isa::kPortable);
    for (const kernels::Isa isa : have)
      EXPECT_TRUE(at::equal(kernels::attention_f32(q, k, v, mask, 0.125, isa), plain))
          << kernels::isa_name(isa) << " head size " << d;
    const at::Tensor kk = k.repeat_interleave(hq / hkv, 1), vv = v.repeat_interleave(hq / hkv, 1);
    const at::Tensor probs = at::softmax(at::matmul(q, kk.transpose(-1, -2)) * 0.125 + mask, -1);
    const at::Tensor want = at::matmul(probs, vv).transpose(1, 2).reshape({2, t, hq * d});
    EXPECT_TRUE(at::allclose(plain, want, 1e-4, 1e-5)) << "head size " << d;
  }
}

// A query row's attention ignores the keys its mask hides: each row of a causal pass of 5 queries
// equals bitwise the one-query attention over only the keys it sees (as a decode step computes
// it), on every kernel family, for visible lengths on both sides of a multiple of 8. (Summing the
// exponentials with the masked keys' zeros shifting which partial sum a key joins broke this.)
TEST(LayerKernels, AttentionRowIsTheSameWithoutTheKeysItMasks) {
  for (const kernels::Isa isa : kernels::available_isas())
    for (int64_t d : {64, 36}) {
      const int64_t t = 5, len = 19, hq = 4, hkv = 2;
      const at::Tensor q = at::randn({1, hq, t, d}), k = at::randn({1, hkv, len, d}),
                       v = at::randn({1, hkv, len, d});
      const at::Tensor mask =
          at::full({t, len}, -std::numeric_limits<float>::infinity()).triu(len - t + 1);
      const at::Tensor pass = kernels::attention_f32(q, k, v, mask, 0.125, isa);  // [1, t, hq * d]
      for (int64_t j = 0; j < t; ++j) {
        const int64_t seen = len - t + 1 + j;
        const at::Tensor one =
            kernels::attention_f32(q.narrow(2, j, 1).contiguous(), k.narrow(2, 0, seen),
                                   v.narrow(2, 0, seen), {}, 0.125, isa);
        EXPECT_TRUE(at::equal(pass.narrow(1, j, 1), one))
            << kernels::isa_name(isa) << " d " << d << " query " << j;
      }
    }
}

// The fused attention step gives bitwise what its unfused steps give (the projection's q|k|v split
// into heads, rotary_f32 on queries and keys, KVCache::append, then attention_f32 over the cache's
// views), and writes the cache only where append writes: grouped-query heads with a causal mask
// over a cache already holding positions; rows at different positions (a ragged batch: tables and
// mask per row) with a row so near the capacity that its padding is dropped; partial rotary on a
// head size that is not a multiple of 8; no rotary at all; on every kernel family. Inputs it does
// not serve (a row past the capacity, a mask of another shape) give an undefined tensor and write
// nothing.
TEST(LayerKernels, FusedCachedAttentionIsTheUnfusedStepsBitwise) {
  struct Case {
    int64_t t, hq, hkv, d, rot;
    std::vector<int64_t> past;
    bool mask;
  };
  const int64_t cap = 32;
  for (const Case& c :
       {Case{3, 6, 2, 64, 64, {7, 7}, true}, Case{1, 3, 3, 36, 16, {20}, false},
        Case{4, 4, 1, 16, 0, {0, 0, 0}, true}, Case{5, 6, 2, 64, 32, {3, 29, 11}, true}}) {
    const auto b = static_cast<int64_t>(c.past.size());
    const bool same =
        std::all_of(c.past.begin(), c.past.end(), [&](int64_t p) { return p == c.past[0]; });
    const int64_t longest = *std::max_element(c.past.begin(), c.past.end());
    const int64_t len = std::min(cap, longest + c.t), width = (c.hq + 2 * c.hkv) * c.d;
    const at::Tensor y = at::randn({b, c.t, width});
    const std::vector<int64_t> table =
        same ? std::vector<int64_t>{c.t, c.rot} : std::vector<int64_t>{b, 1, c.t, c.rot};
    const at::Tensor cos = c.rot ? at::randn(table) : at::Tensor(),
                     sin = c.rot ? at::randn(table) : at::Tensor();
    at::Tensor mask;  // causal per row: query j of row r sees keys up to past[r] + j
    if (c.mask) {
      mask = at::zeros({b, 1, 1, c.t, len});
      for (int64_t r = 0; r < b; ++r)
        for (int64_t j = 0; j < c.t; ++j)
          mask[r][0][0][j]
              .narrow(0, std::min(len, c.past[r] + j + 1), len - std::min(len, c.past[r] + j + 1))
              .fill_(-std::numeric_limits<float>::infinity());
      if (same) mask = mask[0][0][0].contiguous();  // [T, L]
    }
    // A cache of one row more than the pass, random values everywhere.
    const at::Tensor keys0 = at::randn({b + 1, c.hkv, cap, c.d}),
                     values0 = at::randn({b + 1, c.hkv, cap, c.d});
    for (const kernels::Isa isa : kernels::available_isas()) {
      // Unfused: the steps Attention takes without the fused kernel.
      const auto parts = y.split({c.hq * c.d, c.hkv * c.d, c.hkv * c.d}, -1);
      at::Tensor q = parts[0].view({b, c.t, c.hq, c.d}).transpose(1, 2);
      at::Tensor k = parts[1].view({b, c.t, c.hkv, c.d}).transpose(1, 2);
      const at::Tensor v = parts[2].view({b, c.t, c.hkv, c.d}).transpose(1, 2);
      if (c.rot) q = kernels::rotary_f32(q, cos, sin), k = kernels::rotary_f32(k, cos, sin);
      KVCache cache(1, b + 1, c.hkv, cap, c.d, at::TensorOptions().dtype(at::kFloat));
      cache.buffers(0).first.copy_(keys0), cache.buffers(0).second.copy_(values0);
      std::vector<int64_t> lengths = c.past;
      lengths.push_back(0);
      cache.advance(lengths);
      const auto [kv, vv] = cache.append(0, k, v);
      const at::Tensor want = kernels::attention_f32(q, kv, vv, mask, 0.125, isa);
      // Fused.
      const at::Tensor keys = keys0.clone(), values = values0.clone();
      const at::Tensor got = kernels::cached_attention_f32(y, c.hq, c.hkv, c.d, cos, sin, keys,
                                                           values, c.past, mask, 0.125, isa);
      ASSERT_TRUE(got.defined()) << kernels::isa_name(isa);
      const std::string what = std::string(kernels::isa_name(isa)) + " rows " + std::to_string(b);
      EXPECT_TRUE(at::equal(got, want)) << what;
      EXPECT_TRUE(at::equal(keys, cache.buffers(0).first)) << what;
      EXPECT_TRUE(at::equal(values, cache.buffers(0).second)) << what;
      // Refused: nothing written.
      std::vector<int64_t> full = c.past;
      full[0] = cap;
      EXPECT_FALSE(kernels::cached_attention_f32(y, c.hq, c.hkv, c.d, cos, sin, keys, values, full,
                                                 {}, 0.125, isa)
                       .defined());
      EXPECT_FALSE(kernels::cached_attention_f32(y, c.hq, c.hkv, c.d, cos, sin, keys, values,
                                                 c.past, at::zeros({c.t, len + 1}), 0.125, isa)
                       .defined());
      EXPECT_TRUE(at::equal(keys, cache.buffers(0).first) &&
                  at::equal(values, cache.buffers(0).second));
    }
  }
}

// SiLU and tanh GELU on the shared exp: the x86 copy gives the portable code's bits (rows whose
// width is not a multiple of 8, so every lane and the tails are used; NaN, infinities, zeros,
// values beyond the clamp), the gated form equals the two steps bitwise, and both are within a few
// ulp of v / (1 + e^-v) and of Hugging Face's 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) in
// double precision (for GELU, plus the rounding of the exponent's argument, which it computes in
// float32).
TEST(LayerKernels, ActivationsAreTheSameOnEveryIsaAndCloseToLibtorch) {
  at::Tensor x = at::randn({3, 2, 2 * 37}) * 8;
  const float special[] = {0.0f,
                           -0.0f,
                           1e-30f,
                           -1e-30f,
                           86.9f,
                           -87.5f,
                           88.5f,
                           -100.0f,
                           200.0f,
                           -1e4f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::nanf(""),
                           -0.5f,
                           3.0f,
                           -3.0f};
  float* xp = x.data_ptr<float>();
  for (size_t i = 0; i < std::size(special); ++i) xp[5 * i] = special[i];
  const at::Tensor gate = x.narrow(-1, 0, 37), up = x.narrow(-1, 37, 37);
  const auto bits = [](const at::Tensor& t) { return t.contiguous().view(at::kInt); };  // NaN too
  const at::Tensor xd = x.to(at::kDouble);
  const double k = std::sqrt(2.0 / M_PI);
  const at::Tensor exponent = -2 * k * (xd + 0.044715 * xd.pow(3));  // GELU's e^t
  for (const std::string name : {"silu", "gelu_tanh"}) {
    SCOPED_TRACE(name);
    const at::Tensor plain = kernels::activation_f32(x, name, false, kernels::Isa::kPortable);
    for (const kernels::Isa isa : kernels::available_isas()) {
      EXPECT_TRUE(at::equal(bits(kernels::activation_f32(x, name, false, isa)), bits(plain)))
          << kernels::isa_name(isa);
      const at::Tensor gated = kernels::activation_f32(x, name, true, isa);
      EXPECT_TRUE(
          at::equal(bits(gated), bits(kernels::activation_f32(gate, name, false, isa) * up)))
          << kernels::isa_name(isa);
    }
    const at::Tensor got = kernels::activation_f32(x, name);
    const bool silu = name == "silu";
    // GELU: Hugging Face's value by the identity 1 + tanh(u) = 2 / (1 + e^(-2u)), which keeps
    // its precision where 1 + tanh(u) cancels; the formula itself is checked absolutely below.
    const at::Tensor want = (xd / (1 + at::exp(silu ? -xd : exponent))).to(at::kFloat);
    const at::Tensor finite = at::isfinite(x) & at::isfinite(want);
    if (!silu) {
      const at::Tensor hf = 0.5 * xd * (1 + at::tanh(-exponent / 2));
      EXPECT_TRUE(((got - hf).abs() <= 1e-6 * (1 + xd.abs()))
                      .masked_fill(~finite, true)
                      .all()
                      .item<bool>());
    }
    // Relative error within 2^-21 (a few ulp; GELU: plus 2^-22 per unit of its exponent), or
    // absolute below 1e-30 (e^t beyond the clamp).
    const at::Tensor rel = silu ? at::full_like(xd, 4.8e-7) : 4.8e-7 + 2.4e-7 * exponent.abs();
    const at::Tensor err = (got - want).abs().masked_fill(~finite, 0);
    const at::Tensor bound = (want.abs() * rel.to(at::kFloat)).clamp_min(1e-30);
    const at::Tensor bad = at::nonzero((err > bound).flatten());
    for (int64_t i = 0; i < std::min<int64_t>(bad.size(0), 5); ++i) {
      const int64_t j = bad[i][0].item<int64_t>();
      ADD_FAILURE() << name << "(" << x.flatten()[j].item<float>()
                    << ") = " << got.flatten()[j].item<float>() << ", want "
                    << want.flatten()[j].item<float>();
    }
    // +inf stays +inf (e^-inf clamps to e^-87), NaN stays NaN.
    EXPECT_EQ(got[0][0][50].item<float>(), std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(got[0][0][60].item<float>()));
  }
}

// kernels::argmax gives libtorch's argmax(-1) (its oracle here) on every ISA and every kind of
// row: ties (the first maximum), NaN (the first NaN, also past a larger value), -inf only, +inf,
// -0.0 beside 0.0, lengths around the 8- and 32-value blocks, Gemma 3's vocabulary, strided and
// 3-d inputs.
TEST(LayerKernels, ArgmaxIsLibtorchs) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const auto same = [](const at::Tensor& x) {
    const at::Tensor want = x.argmax(-1);
    for (const kernels::Isa isa : kernels::available_isas()) {
      const at::Tensor got = kernels::argmax(x, isa);
      EXPECT_EQ(got.sizes(), want.sizes());
      EXPECT_TRUE(at::equal(got, want)) << got << " against " << want << " for " << x.sizes();
    }
  };
  for (const int64_t v : {1, 2, 7, 8, 9, 31, 32, 33, 40, 1000, 49152, 262144}) {
    at::Tensor x = at::randn({3, v});
    same(x);
    x = at::randint(0, 3, {4, v}).to(at::kFloat);  // many equal maxima
    same(x);
    x.fill_(-inf);  // nothing but -inf
    same(x);
  }
  at::Tensor x = at::randn({7, 100});
  x[0][37] = nan;  // NaN wins, the first one
  x[0][90] = nan;
  x[1][99] = nan;
  x[2][5] = inf;  // +inf beside a larger index of +inf
  x[2][80] = inf;
  x[3].fill_(0.0f);  // -0.0 and 0.0 compare equal: the first
  x[3][10] = -0.0f;
  x[4][0] = nan;
  x[5].fill_(-inf);
  x[5][99] = -1e30f;
  x[6][3] = 1e30f;  // a NaN after the maximum, in the tail past the last block of 32
  x[6][97] = nan;
  same(x);
  same(at::randn({40, 7}).t());               // strided rows
  same(at::randn({2, 5, 300}));               // 3-d
  same(at::randn({4, 64}).narrow(1, 3, 50));  // a view inside longer rows
}

}  // namespace
}  // namespace specdec
