// The 8-bit-activation linear kernels: the integer formula, the interleaved layout, quantization.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/kernels.hpp"
#include "kernels_test_util.hpp"
#include "linear.hpp"
#include "test_util.hpp"

namespace specdec {
namespace {

using test::expect_batch_invariant;
using test::random_blocks;

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
      std::vector<std::pair<std::string, kernels::LinearKernel>> kernels;
      for (kernels::Isa isa : kernels::available_isas()) {
        kernels.emplace_back(kernels::isa_name(isa), kernels::linear_kernel(type, true, isa));
        if (kernels.back().second.rows_long) {  // the long streams' prefetch distance (Intel)
          kernels::LinearKernel long_streams = kernels.back().second;
          long_streams.rows = long_streams.rows_long;
          kernels.emplace_back(std::string(kernels::isa_name(isa)) + " long streams", long_streams);
        }
      }
      for (const auto& [isa, kernel] : kernels) {
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
                    << name << " " << isa << " K " << k << " rows " << t << " threads " << nt
                    << " (" << i << ", " << r << ")";
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

}  // namespace
}  // namespace specdec
