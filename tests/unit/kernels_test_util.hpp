// Helpers of the linear-kernel tests: random blocks of a format, and the batch-invariance check.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "linear.hpp"
#include "specdec/gguf.hpp"

namespace specdec::test {

// Every row grouping of x [1, T, K] gives the rows of the whole pass bitwise.
inline void expect_batch_invariant(const Linear& l, const at::Tensor& x, const std::string& what) {
  const at::Tensor y = l(x);
  for (int64_t t = 0; t < x.size(1); ++t)
    ASSERT_TRUE(at::equal(l(x.narrow(1, t, 1))[0][0], y[0][t])) << what << " row " << t;
  EXPECT_TRUE(at::equal(l(x.narrow(1, 3, 6)), y.narrow(1, 3, 6))) << what;
}

// Blocks of `type`: random bytes (or every byte `fill`) with small finite float16 scales at each
// type's scale fields (d, m, dmin), the second field of a block unlike its first (a kernel that
// swapped them gives other numbers).
inline at::Tensor random_blocks(GgmlType type, int64_t rows, int64_t k, int fill = -1) {
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

}  // namespace specdec::test
