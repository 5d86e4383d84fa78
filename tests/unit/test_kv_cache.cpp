#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "specdec/kv_cache.hpp"
#include "specdec/error.hpp"

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
  EXPECT_THROW(c.append(0, at::ones({1, 2, 8, 4}), at::ones({1, 2, 8, 4})), Error);
  try {
    c.append(0, at::ones({1, 2, 8, 4}), at::ones({1, 2, 8, 4}));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity 8 exceeded"), std::string::npos);
  }
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
