#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

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

// Cross-attention entries of one row: [H, S, D] per layer, every value `base` + layer.
std::vector<at::Tensor> cross_entries(int64_t s, double base) {
  return {at::full({2, s, 4}, base), at::full({2, s, 4}, base + 1)};
}

TEST(KVCache, CrossAttentionEntriesSurviveCropAndReset) {
  KVCache c(2, 1, 2, 8, 4, at::TensorOptions().dtype(at::kFloat));
  EXPECT_THROW(c.cross(0, 1), Error);  // nothing attached yet
  const auto k = cross_entries(5, 3.0), v = cross_entries(5, 7.0);
  EXPECT_THROW(c.set_cross(1, k, v), Error);                // no row 1
  EXPECT_THROW(c.set_cross(0, {k[0]}, {v[0]}), Error);      // one layer of two
  EXPECT_THROW(c.set_cross(0, k, {v[0], v[1][0]}), Error);  // a [S, D] entry
  c.set_cross(0, k, v);
  c.append(0, at::ones({1, 2, 3, 4}), at::ones({1, 2, 3, 4}));
  c.append(1, at::ones({1, 2, 3, 4}), at::ones({1, 2, 3, 4}));
  c.advance(3);
  c.crop(1);
  c.reset();
  const KVCache::Cross x = c.cross(1, 1);
  EXPECT_TRUE(at::equal(x.keys, k[1].unsqueeze(0)));
  EXPECT_TRUE(at::equal(x.values, v[1].unsqueeze(0)));
  EXPECT_FALSE(x.mask.defined());  // one row: no padding
}

// Rows set at different times with encoder outputs of different lengths share buffers padded to
// the longest; a pass over some rows sees the longest of theirs, and a mask over each one's
// padding.
TEST(KVCache, CrossAttentionRowsOfDifferentLengthsJoinAtAnyTime) {
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  KVCache c(2, 3, 2, 8, 4, opts);
  c.set_cross(1, cross_entries(3, 10), cross_entries(3, 20));
  EXPECT_THROW(c.cross(0, 2), Error);                          // row 0 has none yet
  c.set_cross(0, cross_entries(5, 30), cross_entries(5, 40));  // longer: the buffers grow
  const float inf = std::numeric_limits<float>::infinity();
  KVCache::Cross x = c.cross(1, 2);
  ASSERT_EQ(x.keys.sizes(), (std::vector<int64_t>{2, 2, 5, 4}));
  EXPECT_TRUE(at::equal(x.keys[0], at::full({2, 5, 4}, 31.0)));
  EXPECT_TRUE(at::equal(x.keys[1].narrow(1, 0, 3), at::full({2, 3, 4}, 11.0)));
  EXPECT_TRUE(at::equal(x.values[1].narrow(1, 0, 3), at::full({2, 3, 4}, 21.0)));
  ASSERT_TRUE(x.mask.defined());
  ASSERT_EQ(x.mask.sizes(), (std::vector<int64_t>{2, 1, 1, 1, 5}));
  const std::vector<float> row1{0, 0, 0, -inf, -inf};
  EXPECT_TRUE(at::equal(x.mask[0].flatten(), at::zeros({5})));
  EXPECT_TRUE(at::equal(x.mask[1].flatten(), at::tensor(row1)));
  EXPECT_FALSE(c.cross(0, 1).mask.defined());  // row 0 alone fills its 5 positions

  // Row 1 moves to row 2 (compaction), row 0 starts over shorter: a pass over the three rows
  // reaches only as far as the longest of them now holds.
  c.copy_row(1, 2);
  c.set_cross(0, cross_entries(2, 50), cross_entries(2, 60));
  x = c.cross(0, 3);
  ASSERT_EQ(x.keys.sizes(), (std::vector<int64_t>{3, 2, 3, 4}));
  EXPECT_TRUE(at::equal(x.keys[2], at::full({2, 3, 4}, 10.0)));
  EXPECT_TRUE(at::equal(x.values[0].narrow(1, 0, 2), at::full({2, 2, 4}, 60.0)));
  const std::vector<float> row0{0, 0, -inf};
  EXPECT_TRUE(at::equal(x.mask[0].flatten(), at::tensor(row0)));
  EXPECT_TRUE(at::equal(x.mask[2].flatten(), at::zeros({3})));

  // From another cache (a row prefilled on its own), with a longer encoder output.
  KVCache other(2, 1, 2, 8, 4, opts);
  other.set_cross(0, cross_entries(7, 70), cross_entries(7, 80));
  c.copy_row(other, 0, 1);
  x = c.cross(1, 3);
  ASSERT_EQ(x.keys.sizes(), (std::vector<int64_t>{3, 2, 7, 4}));
  EXPECT_TRUE(at::equal(x.keys[1], at::full({2, 7, 4}, 71.0)));
  EXPECT_TRUE(at::equal(x.mask[1].flatten(), at::zeros({7})));
  EXPECT_EQ(x.mask[2].flatten()[3].item<float>(), -inf);
}

}  // namespace
}  // namespace specdec
