// The CPU linear kernels of every weight format: float32 agrees with libtorch; every format is
// bitwise independent of how many rows share a call (a verification pass computes exactly what
// single-token passes compute); a packed format gives bitwise the float32 kernel's results on its
// dequantized values (the kernels dequantize in registers with ggml_dequantize's roundings).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/kernels.hpp"
#include "linear.hpp"
#include "specdec/error.hpp"
#include "specdec/kv_cache.hpp"
#include "test_util.hpp"

namespace specdec {
namespace {

// Every row grouping of x [1, T, K] gives the rows of the whole pass bitwise.
void expect_batch_invariant(const Linear& l, const at::Tensor& x, const std::string& what) {
  const at::Tensor y = l(x);
  for (int64_t t = 0; t < x.size(1); ++t)
    ASSERT_TRUE(at::equal(l(x.narrow(1, t, 1))[0][0], y[0][t])) << what << " row " << t;
  EXPECT_TRUE(at::equal(l(x.narrow(1, 3, 6)), y.narrow(1, 3, 6))) << what;
}

TEST(LinearKernel, Float32MatchesLibtorchAndIsBatchInvariant) {
  for (int64_t k : {64, 100, 2048}) {  // 100: a tail that is not a multiple of 8
    const at::Tensor w = at::randn({37, k});
    const at::Tensor b = at::randn({37});
    const at::Tensor x = at::randn({1, 11, k});
    const Linear l(w, b);
    const at::Tensor ref = at::linear(x, w, b);
    EXPECT_LT((l(x) - ref).abs().max().item<float>(), 1e-4 * ref.abs().max().item<float>());
    expect_batch_invariant(l, x, "float32 K " + std::to_string(k));
  }
}

// Blocks of `type`: random bytes (or every byte `fill`) with small finite float16 scales at each
// type's scale fields (d, m, dmin), the second field of a block unlike its first (a kernel that
// swapped them gives other numbers).
at::Tensor random_blocks(GgmlType type, int64_t rows, int64_t k, int fill = -1) {
  const int64_t blocks = k / ggml_block_elements(type), bytes = ggml_block_bytes(type);
  at::Tensor out = fill < 0 ? at::randint(0, 256, {rows, blocks * bytes}, at::kByte)
                            : at::full({rows, blocks * bytes}, fill, at::kByte);
  std::vector<int> scale_fields;
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      scale_fields = {0};
      break;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      scale_fields = {0, 2};
      break;
    case GgmlType::kQ6_K:
      scale_fields = {208};
      break;
    default:
      break;
  }
  uint8_t* p = out.data_ptr<uint8_t>();
  for (int64_t blk = 0; blk < rows * blocks; ++blk)
    for (size_t f = 0; f < scale_fields.size(); ++f) {
      const uint16_t h =
          c10::Half((0.001f + 0.05f * static_cast<float>(blk % 7)) * (f ? 0.37f : 1.0f)).x;
      std::memcpy(p + blk * bytes + scale_fields[f], &h, 2);
    }
  return out;
}

TEST(LinearKernel, EveryPackedFormatEqualsFloat32OnItsDequantizedValues) {
  const GgmlType types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                            GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
  for (GgmlType type : types) {
    const int64_t k = ggml_block_elements(type) == 256 ? 512 : 96, n = 21;
    const at::Tensor bytes = random_blocks(type, n, k);
    at::Tensor dense = at::empty({n, k});
    ggml_dequantize(type, bytes.data_ptr<uint8_t>(), dense.data_ptr<float>(), n * k);
    const at::Tensor b = at::randn({n});
    const Linear packed(type, bytes, k, b), reference(dense, b);
    const std::string name = ggml_type_name(static_cast<uint32_t>(type));
    for (int64_t t : {1, 2, 5, 13}) {
      const at::Tensor x = at::randn({1, t, k});
      EXPECT_TRUE(at::equal(packed(x), reference(x))) << name << " rows " << t;
    }
    expect_batch_invariant(packed, at::randn({1, 11, k}), name);
    // The embedding lookup of a shared matrix gives its dequantized rows.
    const at::Tensor ids = at::tensor({3, 0, 20}, at::kLong).view({1, 3});
    EXPECT_TRUE(at::equal(packed.rows(ids, at::kFloat)[0], dense.index_select(0, ids[0]))) << name;
    EXPECT_THROW(packed.rows(at::tensor({21}, at::kLong).view({1, 1}), at::kFloat), Error) << name;
  }
}

// The documented reduction order of the x86 kernels, written out in scalar code: 16 partial sums
// (lane = k mod 16) fed by fused multiply-adds over whole chunks of 8 in k order, lanes l and l + 8
// added, the 8 results summed in the fixed tree, then the last K mod 8 products in order.
float documented_order(const float* w, const float* x, int64_t k) {
  float lane[16] = {};
  for (int64_t c = 0; c + 8 <= k; c += 8)
    for (int l = 0; l < 8; ++l) {
      float& acc = lane[(c % 16) + l];
      acc = std::fma(w[c + l], x[c + l], acc);
    }
  float h[8];
  for (int l = 0; l < 8; ++l) h[l] = lane[l] + lane[l + 8];
  float s = ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
  for (int64_t c = k - k % 8; c < k; ++c) s = std::fma(w[c], x[c], s);
  return s;
}

// Every x86 kernel family computes exactly that order: float32 weights, K with and without a last
// chunk of 8 and a tail, pass sizes that take every tile shape (one weight row at a time up to 8
// input rows, wider tiles beyond).
TEST(LinearKernel, X86KernelsFollowTheDocumentedOrder) {
  std::vector<kernels::Isa> isas;
  for (kernels::Isa isa : kernels::available_isas())
    if (isa != kernels::Isa::kPortable) isas.push_back(isa);
  if (isas.empty()) GTEST_SKIP() << "no x86 kernel in this build or CPU";
  for (kernels::Isa isa : isas)
    for (int64_t k : {8, 16, 24, 29, 100, 2048}) {
      const int64_t n = 13;
      const at::Tensor w = at::randn({n, k}), x = at::randn({20, k});
      const kernels::LinearKernel kernel = kernels::linear_kernel(GgmlType::kF32, false, isa);
      for (int64_t t : {1, 3, 8, 9, 20}) {
        const at::Tensor y = kernels::linear_packed(
            x.narrow(0, 0, t), kernel, static_cast<const uint8_t*>(w.data_ptr()), k * 4, n, k, {});
        for (int64_t r = 0; r < t; ++r)
          for (int64_t c = 0; c < n; ++c) {
            const float want = documented_order(w[c].data_ptr<float>(), x[r].data_ptr<float>(), k);
            ASSERT_EQ(y[r][c].item<float>(), want)
                << kernels::isa_name(isa) << " K " << k << " rows " << t << " (" << r << ", " << c
                << ")";
          }
      }
    }
}

// AVX-512 and AVX2 (and AMX where the CPU has it) give the same bits in every format, with float32
// and with 8-bit activations.
TEST(LinearKernel, KernelFamiliesGiveTheSameBitsInEveryFormat) {
  std::vector<kernels::Isa> families;
  for (kernels::Isa isa : kernels::available_isas())
    if (isa != kernels::Isa::kPortable) families.push_back(isa);
  if (families.size() < 2) GTEST_SKIP() << "this CPU has no AVX-512: one x86 family only";
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kBF16, GgmlType::kF16,  GgmlType::kQ8_0,
                            GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                            GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
  // Short rows, and long ones (k >= 2048) whose passes take the wide tiles from fewer input rows.
  for (GgmlType type : types)
    for (bool int8 : {false, true})
      for (bool long_rows : {false, true}) {
        if (int8 && !kernels::has_int8_kernel(type)) continue;
        const int64_t block = ggml_block_elements(type);
        const int64_t k = long_rows      ? (block == 1 ? 2056 : 2048)
                          : block == 256 ? 512
                          : block == 1   ? 100
                                         : 96;
        const int64_t n = 21;
        at::Tensor bytes;
        if (block == 1) {  // the float formats: any K
          at::Tensor f = at::randn({n, k});
          if (type != GgmlType::kF32) f = f.to(type == GgmlType::kBF16 ? at::kBFloat16 : at::kHalf);
          bytes = f.view(at::kByte).contiguous();
        } else {
          bytes = random_blocks(type, n, k);
        }
        const std::string name = std::string(ggml_type_name(static_cast<uint32_t>(type))) +
                                 (int8 ? " int8" : "") + " K " + std::to_string(k);
        const at::Tensor x = at::randn({20, k});
        kernels::prepare_weights(kernels::linear_kernel(type, int8), type,
                                 bytes.data_ptr<uint8_t>(), n,
                                 bytes.size(1));  // the same layout for both families
        for (int64_t t : {1, 2, 3, 4, 6, 7, 8, 9, 20}) {
          std::vector<at::Tensor> y;
          for (kernels::Isa isa : families)
            y.push_back(kernels::linear_packed(x.narrow(0, 0, t),
                                               kernels::linear_kernel(type, int8, isa),
                                               bytes.data_ptr<uint8_t>(), bytes.size(1), n, k, {}));
          for (size_t i = 1; i < y.size(); ++i)
            EXPECT_TRUE(at::equal(y[0], y[i]))
                << name << " rows " << t << ": " << kernels::isa_name(families[0]) << " against "
                << kernels::isa_name(families[i]);
        }
      }
}

TEST(LinearKernel, SixteenBitFormatsEqualFloat32OnTheirValues) {
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t k : {64, 100}) {
      const at::Tensor w = at::randn({19, k}).to(dtype);
      const Linear half(w), reference(w.to(at::kFloat));
      for (int64_t t : {1, 4, 7}) {
        const at::Tensor x = at::randn({2, t, k});
        EXPECT_TRUE(at::equal(half(x), reference(x))) << dtype << " K " << k << " rows " << t;
      }
      expect_batch_invariant(half, at::randn({1, 11, k}), std::string(c10::toString(dtype)));
    }
  }
}

// 8-bit activations: the kernel's result equals sum_c w[c] * d_x * q_x[c] computed independently in
// double precision from the dequantized weights and the same quantized activations (the kernels
// split it into d_w d_x sum(q_w q_x) per block plus m_w s_x), and is bitwise batch-invariant.
// The integer formula for output (t, r) of 8-bit activations `act` against weights `dense` [N, k]
// (dequantized), in double: the sum over c of w[r][c] d_x q_x, and the sum of the terms'
// magnitudes, which float32 rounding follows.
std::pair<double, double> int8_formula(const at::Tensor& dense, const kernels::ActRows& act,
                                       int64_t t, int64_t r, int64_t k) {
  double want = 0, size = 0;
  for (int64_t c = 0; c < k; ++c) {
    const double term =
        static_cast<double>(dense[r][c].item<float>()) * act.d[(t * k + c) / 32] * act.q[t * k + c];
    want += term, size += std::fabs(term);
  }
  return {want, size};
}

TEST(LinearKernel, Int8ActivationKernelsMatchTheIntegerFormula) {
  const int64_t n = 21;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const std::string name = ggml_type_name(static_cast<uint32_t>(type));
    const int64_t k = ggml_block_elements(type) == 256 ? 512 : 96;  // 96: an odd number of blocks
    const at::Tensor bytes = random_blocks(type, n, k);
    at::Tensor dense = at::empty({n, k});
    ggml_dequantize(type, bytes.data_ptr<uint8_t>(), dense.data_ptr<float>(), n * k);
    const Linear l(type, bytes, k, {}, /*int8_activations=*/true);
    const at::Tensor x = at::randn({1, 5, k});
    const at::Tensor y = l(x);  // [1, 5, N]
    kernels::ActRows act(5, k);
    act.quantize(x.data_ptr<float>(), 0, 5);
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t r = 0; r < n; ++r) {
        const auto [want, size] = int8_formula(dense, act, t, r, k);
        EXPECT_NEAR(y[0][t][r].item<double>(), want, 1e-5 * (1 + size))
            << name << " row " << t << " col " << r;
      }
    expect_batch_invariant(l, at::randn({1, 11, k}), name + " int8");
    // Close to the float kernel's result on the same weights (8-bit activations lose little).
    const Linear exact(type, bytes, k);
    EXPECT_LT((y - exact(x)).norm().item<double>(), 0.02 * exact(x).norm().item<double>()) << name;
  }
}

// The integer sums at their extremes, in every kernel family: every value byte 0xFF (the largest
// unsigned value of each format: 15, 31, 63 and the 6-bit scales) or, for Q8_0, 0x80 (-128),
// against activations of +-127. 16-bit partial sums (AVX2's maddubs) that hold for random values
// can wrap here; the result must still be the integer formula's.
TEST(LinearKernel, Int8ActivationKernelsHoldTheExtremeValues) {
  const int64_t n = 21;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const std::string name = ggml_type_name(static_cast<uint32_t>(type));
    const int64_t k = ggml_block_elements(type) == 256 ? 512 : 96;
    const at::Tensor bytes = random_blocks(type, n, k, type == GgmlType::kQ8_0 ? 0x80 : 0xFF);
    at::Tensor dense = at::empty({n, k});
    ggml_dequantize(type, bytes.data_ptr<uint8_t>(), dense.data_ptr<float>(), n * k);
    for (kernels::Isa isa : kernels::available_isas()) {
      const kernels::LinearKernel kernel = kernels::linear_kernel(type, true, isa);
      at::Tensor w = bytes.clone();
      kernels::prepare_weights(kernel, type, w.data_ptr<uint8_t>(), n, w.size(1));
      for (int64_t t : {1, 6, 20}) {
        const at::Tensor x =
            at::ones({t, k}) * (at::arange(t).remainder(2) * 2 - 1).unsqueeze(1);  // +1, -1, ...
        const at::Tensor y =
            kernels::linear_packed(x, kernel, w.data_ptr<uint8_t>(), w.size(1), n, k, {});
        kernels::ActRows act(t, k);
        act.quantize(x.data_ptr<float>(), 0, t);
        for (int64_t i = 0; i < t * k; ++i) ASSERT_EQ(std::abs(act.q[i]), 127);
        for (int64_t row = 0; row < t; ++row)
          for (int64_t r = 0; r < n; ++r) {
            const auto [want, size] = int8_formula(dense, act, row, r, k);
            ASSERT_NEAR(y[row][r].item<double>(), want, 1e-5 * (1 + size))
                << name << " " << kernels::isa_name(isa) << " " << t << " rows, row " << row
                << " col " << r;
          }
      }
    }
  }
}

// Q5_0 under 8-bit activations computes what Q8_0 computes on the same values: both sum the exact
// integers d_w d_x sum(q_w q_x) per block, so a Q5_0 layer gives bitwise what a Q8_0 layer built
// from Q8_0 blocks written here by hand (the same d, q - 16) gives, in every kernel family: every
// value -16..15, both nibbles, every fifth bit, whole groups of 16 rows and the rows after them.
TEST(LinearKernel, Q5_0WithInt8ActivationsEqualsQ8_0OnTheSameValues) {
  const int64_t n = 37, k = 96;  // two whole groups of 16 rows and 5 more; 3 blocks per row
  at::Tensor q5 = random_blocks(GgmlType::kQ5_0, n, k);
  at::Tensor q8 = at::empty({n, k / 32 * 34}, at::kByte);
  const uint8_t* src = q5.data_ptr<uint8_t>();
  uint8_t* dst = q8.data_ptr<uint8_t>();
  for (int64_t b = 0; b < n * k / 32; ++b) {  // ggml's dequantize_row_q5_0, written out per value
    const uint8_t* blk = src + b * 22;
    dst[b * 34] = blk[0], dst[b * 34 + 1] = blk[1];
    for (int j = 0; j < 32; ++j) {
      const int nibble = j < 16 ? blk[6 + j] & 15 : blk[6 + j - 16] >> 4;
      const int fifth = (blk[2 + j / 8] >> (j % 8)) & 1;  // bit j of the little-endian qh
      dst[b * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>((nibble | fifth << 4) - 16));
    }
  }
  at::Tensor from5 = at::empty({n, k}), from8 = at::empty({n, k});
  ggml_dequantize(GgmlType::kQ5_0, src, from5.data_ptr<float>(), n * k);
  ggml_dequantize(GgmlType::kQ8_0, dst, from8.data_ptr<float>(), n * k);
  ASSERT_TRUE(at::equal(from5, from8));  // the hand-written blocks hold the same weights

  const at::Tensor q5_before = q5.clone();
  const Linear five(GgmlType::kQ5_0, q5, k, {}, /*int8_activations=*/true);
  EXPECT_EQ(five.type(), GgmlType::kQ5_0);
  EXPECT_EQ(five.bytes(), n * k / 32 * 22);
  EXPECT_TRUE(at::equal(q5, q5_before));  // the caller's bytes are left as they were
  for (kernels::Isa isa : kernels::available_isas()) {
    const kernels::LinearKernel k5 = kernels::linear_kernel(GgmlType::kQ5_0, true, isa),
                                k8 = kernels::linear_kernel(GgmlType::kQ8_0, true, isa);
    at::Tensor w5 = q5.clone(), w8 = q8.clone();
    kernels::prepare_weights(k5, GgmlType::kQ5_0, w5.data_ptr<uint8_t>(), n, w5.size(1));
    kernels::prepare_weights(k8, GgmlType::kQ8_0, w8.data_ptr<uint8_t>(), n, w8.size(1));
    for (int64_t t : {1, 6, 20}) {
      const at::Tensor x = at::randn({t, k});
      const at::Tensor y5 =
          kernels::linear_packed(x, k5, w5.data_ptr<uint8_t>(), w5.size(1), n, k, {});
      EXPECT_TRUE(at::equal(
          y5, kernels::linear_packed(x, k8, w8.data_ptr<uint8_t>(), w8.size(1), n, k, {})))
          << kernels::isa_name(isa) << " " << t << " rows";
      if (isa == kernels::default_isa()) EXPECT_TRUE(at::equal(five(x), y5)) << t << " rows";
    }
  }
  // the embedding lookup gives the Q5_0 weights
  const at::Tensor ids = at::arange(n, at::kLong).view({1, n});
  EXPECT_TRUE(at::equal(five.rows(ids, at::kFloat)[0], from5));
}

float half_bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// The 8-bit-activation kernels' order, as documented in kernels/int8.hpp, written out here from the
// plain blocks: per block (K-quants: sub-block) of 32 the integer sum of q_w * q_x (Q6_K: scale_a
// times the sum over the first 16 plus scale_b times the sum over the others), then in order
// acc = fma(sum, d_w * d_x, acc) (Q4_K: d_w = d * scale), and for Q4_1, Q5_1 and Q4_K then
// acc = fma(minimum, s_x, acc) (Q4_1, Q5_1: m; Q4_K: -dmin * min).
float documented_int8_order(GgmlType type, const uint8_t* row, const kernels::ActRows& act,
                            int64_t t) {
  const int64_t k = act.k, blocks = k / 32;
  const int8_t* qx = act.q.data() + t * k;
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const float dx = act.d[t * blocks + b], sx = act.s[t * blocks + b];
    const int8_t* x = qx + 32 * b;
    int32_t isum = 0;
    switch (type) {
      case GgmlType::kQ8_0: {
        const uint8_t* blk = row + b * 34;
        for (int j = 0; j < 32; ++j) isum += static_cast<int8_t>(blk[2 + j]) * x[j];
        acc = std::fma(static_cast<float>(isum), half_bits(blk) * dx, acc);
        break;
      }
      case GgmlType::kQ4_0:
      case GgmlType::kQ4_1: {
        const bool q4_1 = type == GgmlType::kQ4_1;
        const uint8_t* blk = row + b * (q4_1 ? 20 : 18);
        const uint8_t* qs = blk + (q4_1 ? 4 : 2);
        const int offset = q4_1 ? 0 : 8;
        for (int j = 0; j < 16; ++j)
          isum += ((qs[j] & 15) - offset) * x[j] + ((qs[j] >> 4) - offset) * x[j + 16];
        acc = std::fma(static_cast<float>(isum), half_bits(blk) * dx, acc);
        if (q4_1) acc = std::fma(half_bits(blk + 2), sx, acc);
        break;
      }
      // Q5_0: d, qh (4 bytes), 16 bytes of nibbles; Q5_1: d, m, the same. ggml's
      // dequantize_row_q5_*: value j < 16 is the low nibble of qs[j] with bit j of qh as 16, value
      // j + 16 the high nibble with bit j + 16; Q5_0 subtracts 16.
      case GgmlType::kQ5_0:
      case GgmlType::kQ5_1: {
        const bool q5_1 = type == GgmlType::kQ5_1;
        const uint8_t* blk = row + b * (q5_1 ? 24 : 22);
        const uint8_t* qh = blk + (q5_1 ? 4 : 2);
        const uint8_t* qs = qh + 4;
        const int offset = q5_1 ? 0 : 16;
        auto bit = [&](int i) { return (qh[i / 8] >> (i % 8)) & 1; };
        for (int j = 0; j < 16; ++j)
          isum += ((qs[j] & 15) + 16 * bit(j) - offset) * x[j] +
                  ((qs[j] >> 4) + 16 * bit(j + 16) - offset) * x[j + 16];
        acc = std::fma(static_cast<float>(isum), half_bits(blk) * dx, acc);
        if (q5_1) acc = std::fma(half_bits(blk + 2), sx, acc);
        break;
      }
      // Q4_K: d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles; Q5_K: the
      // same with 32 bytes of fifth bits before the nibbles
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K: {
        const bool q5 = type == GgmlType::kQ5_K;
        const uint8_t* blk = row + b / 8 * (q5 ? 176 : 144);
        const int s = static_cast<int>(b % 8);
        const uint8_t* sc = blk + 4;
        const int scale = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        const int min = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        for (int j = 0; j < 32; ++j) {  // ggml: qh[l] & u1 (1, 4, 16, 64) or u2 (2, 8, 32, 128)
          const int low = (blk[(q5 ? 48 : 16) + 32 * (s / 2) + j] >> (4 * (s % 2))) & 15;
          isum += (low + (q5 && (blk[16 + j] & (1 << s)) ? 16 : 0)) * x[j];
        }
        acc = std::fma(static_cast<float>(isum), half_bits(blk) * static_cast<float>(scale) * dx,
                       acc);
        acc = std::fma(-(half_bits(blk + 2) * static_cast<float>(min)), sx, acc);
        break;
      }
      default: {  // Q6_K: ql[128], qh[64], 16 int8 scales, d; value i of 256 as ggml_dequantize
        const uint8_t* blk = row + b / 8 * 210;
        const int64_t i0 = b % 8 * 32;  // this sub-block's values i0..i0+31 of the super-block
        int32_t half[2] = {0, 0};
        for (int64_t i = i0; i < i0 + 32; ++i) {
          const int64_t h = i / 128, l = i % 32, quarter = i % 128 / 32;  // ggml's n, l and q1..q4
          const uint8_t ql = blk[64 * h + l + (quarter % 2) * 32], qh = blk[128 + 32 * h + l];
          const int q =
              ((quarter < 2 ? ql & 15 : ql >> 4) | (((qh >> (2 * quarter)) & 3) << 4)) - 32;
          half[(i - i0) / 16] += q * x[i - i0];
        }
        const int64_t is = b % 8 / 4 * 8 + b % 4 * 2;  // ggml's sc[is + 2 * quarter] for l < 16
        isum = static_cast<int8_t>(blk[192 + is]) * half[0] +
               static_cast<int8_t>(blk[192 + is + 1]) * half[1];
        acc = std::fma(static_cast<float>(isum), half_bits(blk + 208) * dx, acc);
      }
    }
  }
  return acc;
}

// Every family (AVX-512 VNNI, AVX2, portable) computes exactly that, for whole groups of 16
// interleaved rows and the plain rows after them, any pass size and thread count.
TEST(LinearKernel, InterleavedInt8KernelsFollowTheDocumentedOrderOnEveryFamily) {
  const int64_t n = 37;  // 2 groups of 16 and 5 plain rows
  const test::ThreadsGuard restore;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K})
    for (int64_t k : {256, 2048}) {
      const std::string name = ggml_type_name(static_cast<uint32_t>(type));
      const at::Tensor plain = random_blocks(type, n, k), x = at::randn({20, k});
      kernels::ActRows act(20, k);
      act.quantize(x.data_ptr<float>(), 0, 20);
      std::vector<float> want(20 * n);
      for (int64_t t = 0; t < 20; ++t)
        for (int64_t r = 0; r < n; ++r)
          want[t * n + r] = documented_int8_order(type, plain[r].data_ptr<uint8_t>(), act, t);
      for (kernels::Isa isa : kernels::available_isas()) {
        const kernels::LinearKernel kernel = kernels::linear_kernel(type, true, isa);
        ASSERT_TRUE(kernel.interleaved) << name;
        at::Tensor w = plain.clone();
        kernels::prepare_weights(kernel, type, w.data_ptr<uint8_t>(), n, w.size(1));
        EXPECT_FALSE(at::equal(w.narrow(0, 0, 32), plain.narrow(0, 0, 32)));  // the groups moved
        EXPECT_TRUE(at::equal(w.narrow(0, 32, 5), plain.narrow(0, 32, 5)));   // the rest did not
        for (int nt : {1, 3}) {
          at::set_num_threads(nt);
          for (int64_t t : {1, 3, 8, 9, 20}) {
            const at::Tensor y = kernels::linear_packed(x.narrow(0, 0, t), kernel,
                                                        w.data_ptr<uint8_t>(), w.size(1), n, k, {});
            for (int64_t i = 0; i < t; ++i)
              for (int64_t r = 0; r < n; ++r)
                ASSERT_EQ(y[i][r].item<float>(), want[i * n + r])
                    << name << " " << kernels::isa_name(isa) << " K " << k << " rows " << t
                    << " threads " << nt << " (" << i << ", " << r << ")";
          }
        }
      }
    }
}

// The interleaved layout: stored_row gives every row back; a layer built on shared bytes leaves
// them alone; its embedding lookup gives the dequantized rows; fused parts stay one matrix only
// in whole groups.
TEST(LinearKernel, InterleavedRowsKeepEveryRow) {
  const int64_t n = 37, k = 64;
  const at::Tensor plain = random_blocks(GgmlType::kQ4_0, n, k), keep = plain.clone();
  const Linear l(GgmlType::kQ4_0, plain, k, {}, /*int8_activations=*/true);
  EXPECT_TRUE(at::equal(plain, keep));  // copied: the caller still holds `plain`
  at::Tensor moved = plain.clone();
  const uint8_t* where = moved.data_ptr<uint8_t>();
  const Linear in_place(GgmlType::kQ4_0, std::move(moved), k, {}, true);
  EXPECT_EQ(in_place.tensors()[0].data_ptr<uint8_t>(), where);  // reordered where it was
  EXPECT_FALSE(at::equal(in_place.tensors()[0], plain));
  for (GgmlType type :  // every interleaved format gives every row back
       {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const kernels::LinearKernel kernel = kernels::linear_kernel(type, true);
    const at::Tensor rows = random_blocks(type, n, 256);
    at::Tensor w = rows.clone();
    kernels::prepare_weights(kernel, type, w.data_ptr<uint8_t>(), n, w.size(1));
    std::vector<uint8_t> row(w.size(1));
    for (int64_t r = 0; r < n; ++r) {
      kernels::stored_row(kernel, type, w.data_ptr<uint8_t>(), n, w.size(1), r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), rows[r].data_ptr<uint8_t>(), row.size()), 0)
          << ggml_type_name(static_cast<uint32_t>(type)) << " row " << r;
    }
  }
  at::Tensor dense = at::empty({n, k});
  ggml_dequantize(GgmlType::kQ4_0, plain.data_ptr<uint8_t>(), dense.data_ptr<float>(), n * k);
  const at::Tensor ids = at::tensor({3, 0, 20, 36, 17}, at::kLong).view({1, 5});
  EXPECT_TRUE(at::equal(l.rows(ids, at::kFloat)[0], dense.index_select(0, ids[0])));
  // q|k|v of 32 + 16 rows: one matrix; with a part of 5 rows: the parts one by one. Both compute
  // what the parts compute.
  const Linear a(GgmlType::kQ4_0, plain.narrow(0, 0, 32).clone(), k, {}, true),
      b(GgmlType::kQ4_0, plain.narrow(0, 16, 16).clone(), k, {}, true),
      c(GgmlType::kQ4_0, plain.narrow(0, 32, 5).clone(), k, {}, true);
  const at::Tensor x = at::randn({1, 4, k});
  for (const Linear& fused : {Linear::cat({a, b}), Linear::cat({a, c, b})}) {
    const at::Tensor y = fused(x);
    const int64_t parts_rows = fused.out_features();
    EXPECT_TRUE(at::equal(y.narrow(2, 0, 32), a(x)));
    EXPECT_TRUE(at::equal(y.narrow(2, parts_rows - 16, 16), b(x)));
  }
  EXPECT_EQ(Linear::cat({a, b}).tensors().size(), 1u);  // one matrix
  EXPECT_EQ(Linear::cat({a, c, b}).tensors().size(), 3u);
}

TEST(LinearKernel, ActivationQuantizationByHand) {
  std::vector<float> x(64, 0.0f);                           // block 0 by hand, block 1 zeros
  x[0] = 127.0f, x[1] = -3.4f, x[2] = 2.5f, x[31] = -0.6f;  // amax 127: d = 1, q = round(x)
  x[5] = -2.5f, x[6] = 0.49999997f, x[7] = -126.5f;
  kernels::ActRows a(1, 64);
  a.quantize(x.data(), 0, 1);
  EXPECT_EQ(a.d[0], 1.0f);
  EXPECT_EQ(a.q[0], 127);
  EXPECT_EQ(a.q[1], -3);
  EXPECT_EQ(a.q[2], 3);  // round half away from zero, as ggml
  EXPECT_EQ(a.q[31], -1);
  EXPECT_EQ(a.q[5], -3);
  EXPECT_EQ(a.q[6], 0);  // the largest float below 0.5 (0.5 + it rounds to 1 in float32)
  EXPECT_EQ(a.q[7], -127);
  EXPECT_EQ(a.s[0], 127.0f - 3 + 3 - 3 - 127 - 1);
  EXPECT_EQ(a.sum[0], 127 - 3 + 3 - 3 - 127 - 1);
  EXPECT_EQ(a.sum16[0], 127 - 3 + 3 - 3 - 127);  // q[0..15]
  EXPECT_EQ(a.sum16[1], -1);                     // q[16..31]
  EXPECT_EQ(a.sum16[2], 0);
  EXPECT_EQ(a.d[1], 0.0f);
  EXPECT_EQ(a.s[1], 0.0f);
  EXPECT_EQ(a.sum[1], 0);
  EXPECT_EQ(a.q[37], 0);
}

// Every family quantizes activations to the same bits: random rows, halves that round away from
// zero at every scale, zeros and an all-zero block.
TEST(LinearKernel, ActivationQuantizationIsTheSameInEveryFamily) {
  const int64_t rows = 7, k = 256;
  at::Tensor x = at::randn({rows, k}) * at::randint(1, 1000, {rows, 1}).to(at::kFloat);
  float* p = x.data_ptr<float>();
  for (int64_t c = 0; c < k; ++c)
    p[k + c] = c % 32 == 0 ? 127.0f : static_cast<float>(c % 50) - 24.5f;  // d = 1: ties
  for (int64_t c = 0; c < 32; ++c) p[2 * k + c] = 0.0f;
  p[3 * k + 5] = -0.0f;
  kernels::ActRows want(rows, k);
  want.quantize(p, 0, rows, kernels::Isa::kPortable);
  for (const kernels::Isa isa : kernels::available_isas()) {
    kernels::ActRows got(rows, k);
    got.quantize(p, 0, rows, isa);
    EXPECT_EQ(got.q, want.q) << kernels::isa_name(isa);
    EXPECT_EQ(got.d, want.d) << kernels::isa_name(isa);
    EXPECT_EQ(got.s, want.s) << kernels::isa_name(isa);
    EXPECT_EQ(got.sum, want.sum) << kernels::isa_name(isa);
    EXPECT_EQ(got.sum16, want.sum16) << kernels::isa_name(isa);
  }
}

TEST(LinearKernel, FusedPartsOfDifferentFormatsRunOneByOne) {
  const int64_t k = 64;
  const at::Tensor a = at::randn({8, k}), c = at::randn({5, k});
  at::Tensor q8 = at::empty({5, k / 32 * 34}, at::kByte);
  ggml_quantize(GgmlType::kQ8_0, c.data_ptr<float>(), q8.data_ptr<uint8_t>(), 5 * k);
  at::Tensor c_deq = at::empty({5, k});
  ggml_dequantize(GgmlType::kQ8_0, q8.data_ptr<uint8_t>(), c_deq.data_ptr<float>(), 5 * k);
  const Linear mixed = Linear::cat({Linear(a), Linear(GgmlType::kQ8_0, q8, k)});
  const Linear same = Linear::cat({Linear(a), Linear(c_deq)});
  EXPECT_EQ(mixed.out_features(), 13);
  const at::Tensor x = at::randn({1, 3, k});
  EXPECT_TRUE(at::equal(mixed(x), same(x)));
  EXPECT_THROW(Linear(GgmlType::kQ8_0, q8, k + 32), Error);  // bytes that do not hold K values
}

// A residual the layer adds (Linear::operator()(x, residual)) is bitwise the one libtorch adds to
// its output, with and without a bias: for the packed kernels, whose threads add it to the columns
// they write, over more rows than one sweep takes; for a layer of parts in different formats; and
// for bfloat16 weights through at::linear. A residual of another shape is an error.
TEST(LinearKernel, ResidualIsAddedAsLibtorchAddsIt) {
  const int64_t n = 40, k = 64;  // n: two and a half groups of 16 weight rows
  const at::Tensor w = at::randn({n, k}), bias = at::randn({n});
  at::Tensor q8 = at::empty({n, k / 32 * 34}, at::kByte);
  ggml_quantize(GgmlType::kQ8_0, w.data_ptr<float>(), q8.data_ptr<uint8_t>(), n * k);
  const std::vector<std::pair<std::string, Linear>> layers = {
      {"f32", Linear(w)},
      {"f32 bias", Linear(w, bias)},
      {"q8_0 bias", Linear(GgmlType::kQ8_0, q8.clone(), k, bias)},
      {"q8_0 int8 bias", Linear(GgmlType::kQ8_0, q8.clone(), k, bias, /*int8_activations=*/true)},
      {"parts", Linear::cat({Linear(w.narrow(0, 0, 8).clone()),
                             Linear(GgmlType::kQ8_0, q8.narrow(0, 8, n - 8).clone(), k)})}};
  const at::Tensor x = at::randn({2, 40, k}), residual = at::randn({2, 40, n}) * 10;  // 80 rows
  for (const auto& [name, l] : layers) {
    EXPECT_TRUE(at::equal(l(x, residual), residual + l(x))) << name;
    EXPECT_TRUE(at::equal(l(x.narrow(1, 5, 1), residual.narrow(1, 5, 1).contiguous()),
                          residual.narrow(1, 5, 1) + l(x.narrow(1, 5, 1))))
        << name << ", one row";
  }
  const Linear bf16(w.to(at::kBFloat16), bias.to(at::kBFloat16));
  const at::Tensor xb = x.to(at::kBFloat16), rb = residual.to(at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16(xb, rb), rb + bf16(xb)));
  EXPECT_THROW(layers[0].second(x, at::randn({2, 40, n + 1})), Error);
}

// The huge-page arena: a copy holds the source's values, the source's whole pages read zero once
// handed back, copies lie one after another, and a fused layer of arena parts is a view of them
// (no copy) that computes what the concatenated matrix computes; parts that are not adjacent run
// one after the other.
TEST(WeightArena, CopiesHandBackTheSourceAndFuseWithoutACopy) {
  const int64_t k = 2048;
  const at::Tensor a = at::randn({600, k}), b = at::randn({40, k}), c = at::randn({8, k});
  WeightArena arena;
  at::Tensor src = a.clone();  // 4.9 MB: pieces of 2 MiB and a partial one
  auto [copy, chunk] = arena.copy(src, true);
  ASSERT_TRUE(chunk);
  EXPECT_TRUE(at::equal(copy, a));
  EXPECT_NE(copy.data_ptr(), src.data_ptr());
  // The source's page-aligned interior reads zero; its partial first and last pages are kept.
  const auto* s = static_cast<const uint8_t*>(src.data_ptr());
  const auto first =
      (reinterpret_cast<uintptr_t>(s) + 4095) / 4096 * 4096 - reinterpret_cast<uintptr_t>(s);
  const auto last = (reinterpret_cast<uintptr_t>(s) + src.nbytes()) / 4096 * 4096 -
                    reinterpret_cast<uintptr_t>(s);
  EXPECT_TRUE(std::all_of(s + first, s + last, [](uint8_t v) { return v == 0; }));
  EXPECT_TRUE(
      at::equal(src.flatten().narrow(0, 0, first / 4), a.flatten().narrow(0, 0, first / 4)));
  // Kept (release_source = false): the source stays as it was.
  at::Tensor kept = b.clone();
  auto [copy_b, chunk_b] = arena.copy(kept, false);
  EXPECT_TRUE(at::equal(kept, b));
  EXPECT_EQ(chunk_b, chunk);
  EXPECT_EQ(static_cast<const uint8_t*>(copy.data_ptr()) + copy.nbytes(), copy_b.data_ptr());

  Linear la(a.clone()), lb(b.clone()), lc(c.clone());
  la.move_to(arena);
  lb.move_to(arena);
  const at::Tensor x = at::randn({1, 5, k});
  const Linear fused = Linear::cat({la, lb});
  EXPECT_EQ(fused.tensors().at(0).data_ptr(), la.tensors().at(0).data_ptr())
      << "a view, not a copy";
  EXPECT_TRUE(at::equal(fused(x), Linear(at::cat({a, b}))(x)));
  lc.move_to(arena);
  const Linear apart = Linear::cat({la, lc});  // lb lies between them
  EXPECT_EQ(apart.tensors().size(), 2u) << "the parts, one after the other";
  EXPECT_TRUE(at::equal(apart(x), Linear(at::cat({a, c}))(x)));
  // A layer whose weights someone else holds stays where it is.
  const at::Tensor shared = c.clone();
  Linear ls(shared);
  ls.move_to(arena);
  EXPECT_EQ(ls.tensors().at(0).data_ptr(), shared.data_ptr());
}

}  // namespace
}  // namespace specdec

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

// SiLU's own exp: the x86 copy gives the portable code's bits (rows whose width is not a multiple
// of 8, so every lane and the tails are used; NaN, infinities, zeros, values beyond the clamp), the
// gated form equals the two steps bitwise, and both are within a few ulp of v / (1 + e^-v) in
// double precision.
TEST(LayerKernels, SiluIsTheSameOnEveryIsaAndCloseToLibtorch) {
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
  const at::Tensor plain = kernels::activation_f32(x, "silu", false, kernels::Isa::kPortable);
  for (const kernels::Isa isa : kernels::available_isas()) {
    EXPECT_TRUE(at::equal(bits(kernels::activation_f32(x, "silu", false, isa)), bits(plain)))
        << kernels::isa_name(isa);
    const at::Tensor gated = kernels::activation_f32(x, "silu", true, isa);
    EXPECT_TRUE(
        at::equal(bits(gated), bits(kernels::activation_f32(gate, "silu", false, isa) * up)))
        << kernels::isa_name(isa);
  }
  const at::Tensor got = kernels::activation_f32(x, "silu");
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor want = (xd / (1 + at::exp(-xd))).to(at::kFloat);
  const at::Tensor finite = at::isfinite(x);
  // Relative error within 2^-21 (a few ulp), or absolute below 1e-30 (e^-v beyond the clamp).
  const at::Tensor err = (got - want).abs().masked_fill(~finite, 0);
  const at::Tensor bound = (want.abs() * 4.8e-7).clamp_min(1e-30);
  const at::Tensor bad = at::nonzero((err > bound).flatten());
  for (int64_t i = 0; i < std::min<int64_t>(bad.size(0), 5); ++i) {
    const int64_t j = bad[i][0].item<int64_t>();
    ADD_FAILURE() << "silu(" << x.flatten()[j].item<float>()
                  << ") = " << got.flatten()[j].item<float>() << ", want "
                  << want.flatten()[j].item<float>();
  }
  // +inf stays +inf (e^-inf clamps to e^-87), NaN stays NaN.
  EXPECT_EQ(got[0][0][50].item<float>(), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(got[0][0][60].item<float>()));
}

}  // namespace
}  // namespace specdec
