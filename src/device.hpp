// Moving the small tensors the host builds every step (token ids, positions, indices, masks) to the
// model's device without making the host wait for the device.
#pragma once

#include <ATen/ATen.h>

namespace specdec::detail {

// On CUDA: staged in pinned memory and copied with non_blocking (a plain copy from pageable memory
// synchronises the stream; libtorch's caching host allocator keeps the pinned buffer alive until
// the copy has run). Elsewhere, or already there: an ordinary copy, or the tensor itself.
inline at::Tensor to_device(const at::Tensor& t, c10::Device device) {
  if (t.device() == device) return t;
  if (device.is_cuda() && t.is_cpu()) return t.pin_memory().to(device, /*non_blocking=*/true);
  return t.to(device);
}

}  // namespace specdec::detail
