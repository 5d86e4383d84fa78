// The float32 CPU linear kernel: agrees with libtorch, and is bitwise independent of how many rows
// share a call (a verification pass computes exactly what single-token passes compute).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "kernels.hpp"

namespace specdec {
namespace {

TEST(LinearKernel, MatchesLibtorchAndIsBatchInvariant) {
  for (int64_t k : {64, 100, 2048}) {  // 100: a tail that is not a multiple of 8
    const at::Tensor w = at::randn({37, k});
    const at::Tensor b = at::randn({37});
    const at::Tensor x = at::randn({1, 11, k});
    const at::Tensor y = kernels::linear_f32(x, w, b);
    if (!y.defined()) GTEST_SKIP() << "CPU without AVX2/FMA: libtorch's linear is used instead";
    const at::Tensor ref = at::linear(x, w, b);
    EXPECT_LT((y - ref).abs().max().item<float>(), 1e-4 * ref.abs().max().item<float>());
    for (int64_t t = 0; t < 11; ++t) {
      const at::Tensor one = kernels::linear_f32(x.narrow(1, t, 1), w, b);
      EXPECT_TRUE(at::equal(one[0][0], y[0][t])) << "row " << t << " K " << k;
    }
    EXPECT_TRUE(at::equal(kernels::linear_f32(x.narrow(1, 3, 6), w, b), y.narrow(1, 3, 6)));
  }
  EXPECT_FALSE(kernels::linear_f32(at::randn({2, 8}).to(at::kBFloat16), at::randn({4, 8}), {}).defined());
}

}  // namespace
}  // namespace specdec
