// CPU kernels where libtorch's generic path is slow for speculative decoding's shapes.
#pragma once

#include <ATen/ATen.h>

namespace specdec::kernels {

// y = x @ w^T + b for float32 CPU tensors: x [..., K], w [N, K] contiguous, b [N] or undefined.
// Each weight row is streamed from memory once for all rows of x (a K+1-token verification pass
// costs about what one decode pass costs), and every output element is computed with the same
// fixed summation order whatever the number of rows: results are bitwise independent of how many
// tokens share a pass. Returns an undefined tensor when the inputs are not of that kind.
at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

}  // namespace specdec::kernels
