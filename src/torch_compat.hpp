// Everything that differs between the libtorch versions specdec builds against (Debian's 1.13 and
// 2.x), in one place. Private to the library and its tests.
#pragma once

#include <torch/version.h>

namespace specdec::compat {

// libtorch 1.x has no float16 matrix product on the CPU; 2.x has.
inline constexpr bool kCpuHalfMatmul = TORCH_VERSION_MAJOR >= 2;
inline constexpr int kMajor = TORCH_VERSION_MAJOR, kMinor = TORCH_VERSION_MINOR;

}  // namespace specdec::compat
