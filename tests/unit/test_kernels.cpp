// The CPU linear kernels of every weight format with float32 activations: float32 agrees with
// libtorch; every format is bitwise independent of how many rows share a call (a verification pass
// computes exactly what single-token passes compute); a packed format gives bitwise the float32
// kernel's results on its dequantized values (the kernels dequantize in registers with
// ggml_dequantize's roundings); residuals, fused parts and the weight arena. (8-bit activations:
// test_kernels_int8.cpp; attention and SiLU: test_layer_kernels.cpp.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/kernels.hpp"
#include "kernels_test_util.hpp"
#include "linear.hpp"
#include "specdec/error.hpp"

namespace specdec {
namespace {

using test::expect_batch_invariant;
using test::random_blocks;

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
