// White-box checks of shared building blocks in src/layers (private header).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "layers.hpp"
#include "specdec/error.hpp"
#include "specdec/kv_cache.hpp"

namespace specdec {
namespace {

std::vector<int64_t> buckets(const std::vector<int64_t>& rel, bool bidirectional) {
  const at::Tensor b =
      layers::relative_position_bucket(at::tensor(rel, at::kLong), bidirectional, 32, 128);
  return std::vector<int64_t>(b.data_ptr<int64_t>(), b.data_ptr<int64_t>() + b.numel());
}

TEST(Layers, T5RelativePositionBuckets) {
  // Worked out by hand from T5's rule (32 buckets, max distance 128), away from bucket boundaries.
  // Encoder (bidirectional): 16 buckets a side, exact below 8, then 8 + floor(8 ln(d/8) / ln 16),
  // at most 15; keys after the query add 16.
  EXPECT_EQ(buckets({0, -3, 3, -8, -12, -20, -40, -100, -1000, 100}, true),
            (std::vector<int64_t>{0, 3, 19, 8, 9, 10, 12, 15, 15, 31}));
  // Decoder (causal): keys after the query are bucket 0; exact below 16, then
  // 16 + floor(16 ln(d/16) / ln 8), at most 31.
  EXPECT_EQ(buckets({5, -5, -20, -50, -127, -500}, false),
            (std::vector<int64_t>{0, 5, 17, 24, 31, 31}));
}

TEST(Layers, AttendWithAPerHeadBiasEqualsTheExplicitSoftmax) {
  at::manual_seed(3);
  const at::Tensor q = at::randn({1, 2, 3, 4}), k = at::randn({1, 2, 5, 4}),
                   v = at::randn({1, 2, 5, 4});
  const at::Tensor bias = at::randn({2, 1, 3, 5});            // [H, 1, T, L] as T5 passes it
  const at::Tensor got = layers::attend(q, k, v, bias, 1.0);  // [1, 3, 2 * 4]
  const at::Tensor probs =
      at::softmax(at::matmul(q, k.transpose(-1, -2)) + bias.squeeze(1).unsqueeze(0), -1);
  const at::Tensor want = at::matmul(probs, v).transpose(1, 2).reshape({1, 3, 8});
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6));
}

TEST(Layers, RotaryRefusesPositionsPastTheLastButNotPadding) {
  const layers::Rotary rotary(4, 10000.0, RopeScaling{}, 8, at::kFloat, c10::Device(c10::kCPU));
  EXPECT_EQ(rotary.tables(6, 2).first.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_THROW(rotary.tables(7, 2), Error);
  // Rows of different lengths (7 and 2 positions held): row 0's one real token is its position 7;
  // the padding after it (positions 8 and 9) is computed, not refused.
  KVCache cache(1, 2, 1, 16, 4, at::TensorOptions().dtype(at::kFloat));
  cache.advance({7, 2});
  const at::Tensor ids = at::zeros({2, 3}, at::kLong);
  const layers::Pass fits(ids, cache, {1, 3}, c10::Device(c10::kCPU));
  EXPECT_EQ(rotary.tables(fits).first.sizes(), (std::vector<int64_t>{2, 1, 3, 4}));
  const layers::Pass past(ids, cache, {2, 3}, c10::Device(c10::kCPU));
  EXPECT_THROW(rotary.tables(past), Error);
}

}  // namespace
}  // namespace specdec
