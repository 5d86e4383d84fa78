#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "specdec/error.hpp"
#include "specdec/kv_cache.hpp"

namespace specdec {
namespace {

TEST(KVCache, AppendCropAndCapacity) {
  KVCache c(2, 1, 2, 8, 4, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(c.length(), 0);
  const at::Tensor k = at::ones({1, 2, 3, 4}), v = at::full({1, 2, 3, 4}, 2.0);
  for (int64_t l = 0; l < 2; ++l) {
    auto [ks, vs] = c.append(l, k, v);
    EXPECT_EQ(ks.size(2), 3);
    EXPECT_TRUE(at::equal(vs, v));
  }
  c.advance(3);
  EXPECT_EQ(c.length(), 3);
  // Crop is O(1): the storage is untouched, only the length moves.
  auto [before, unused] = c.append(0, at::zeros({1, 2, 0, 4}), at::zeros({1, 2, 0, 4}));
  const void* storage = before.data_ptr();
  c.crop(1);
  EXPECT_EQ(c.length(), 1);
  auto [k2, v2] = c.append(0, at::full({1, 2, 2, 4}, 5.0), at::full({1, 2, 2, 4}, 6.0));
  EXPECT_EQ(k2.data_ptr(), storage);
  EXPECT_EQ(k2.size(2), 3);
  EXPECT_EQ(k2[0][0][0][0].item<float>(), 1.0f);  // kept position
  EXPECT_EQ(k2[0][0][1][0].item<float>(), 5.0f);  // overwritten in place
  EXPECT_THROW(c.crop(5), Error);
  // Past the capacity, append writes what fits (a ragged pass's padding); advance refuses it.
  auto [k3, v3] = c.append(0, at::full({1, 2, 8, 4}, 7.0), at::full({1, 2, 8, 4}, 7.0));
  EXPECT_EQ(k3.size(2), 8);
  EXPECT_EQ(k3[0][0][7][0].item<float>(), 7.0f);
  EXPECT_THROW(c.advance(8), Error);
}

TEST(KVCache, RowsKeepTheirOwnLengths) {
  KVCache c(1, 3, 1, 6, 2, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(c.batch(), 3);
  c.advance(std::vector<int64_t>{1, 3, 0});
  EXPECT_EQ(c.length(0), 1);
  EXPECT_EQ(c.length(1), 3);
  EXPECT_EQ(c.length(2), 0);
  EXPECT_THROW(c.length(), Error);  // rows differ
  // Each row appends at its own length; the views span the longest row plus the new positions.
  const at::Tensor k =
      at::arange(6, at::kFloat).view({3, 1, 2, 1}).expand({3, 1, 2, 2}).contiguous();
  auto [ks, vs] = c.append(0, k, k);
  EXPECT_EQ(ks.size(2), 5);
  EXPECT_EQ(ks[0][0][1][0].item<float>(), 0.0f);  // row 0 at positions 1, 2
  EXPECT_EQ(ks[0][0][2][0].item<float>(), 1.0f);
  EXPECT_EQ(ks[1][0][3][0].item<float>(), 2.0f);  // row 1 at positions 3, 4
  EXPECT_EQ(ks[2][0][0][0].item<float>(), 4.0f);  // row 2 at positions 0, 1
  c.advance(std::vector<int64_t>{2, 1, 2});       // row 1 keeps only one of them
  EXPECT_EQ(c.length(1), 4);
  c.crop(0, 1);
  EXPECT_EQ(c.length(0), 1);
  EXPECT_EQ(c.length(2), 2);
  EXPECT_THROW(c.crop(2, 3), Error);
  // Compaction: row 2 moves into row 0's slot, positions and length.
  c.copy_row(2, 0);
  EXPECT_EQ(c.length(0), 2);
  EXPECT_EQ(ks[0][0][1][0].item<float>(), 5.0f);
  EXPECT_THROW(c.copy_row(3, 0), Error);
}

TEST(KVCache, CrossAttentionEntriesSurviveCropAndReset) {
  KVCache c(2, 1, 2, 8, 4, at::TensorOptions().dtype(at::kFloat));
  EXPECT_THROW(c.cross(0), Error);  // nothing attached yet
  const at::Tensor k = at::full({1, 2, 5, 4}, 3.0), v = at::full({1, 2, 5, 4}, 4.0);
  c.set_cross(1, k, v);
  EXPECT_THROW(c.cross(0), Error);  // layer 0 still has none
  EXPECT_THROW(c.set_cross(2, k, v), Error);
  c.append(0, at::ones({1, 2, 3, 4}), at::ones({1, 2, 3, 4}));
  c.append(1, at::ones({1, 2, 3, 4}), at::ones({1, 2, 3, 4}));
  c.advance(3);
  c.crop(1);
  c.reset();
  EXPECT_TRUE(at::equal(c.cross(1).first, k));
  EXPECT_TRUE(at::equal(c.cross(1).second, v));
}

}  // namespace
}  // namespace specdec
