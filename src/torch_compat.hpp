// Everything that differs between the libtorch versions specdec builds against (Debian's 1.13 and
// 2.x), in one place. Private to the library and its tests.
#pragma once

#include <torch/version.h>

// c10's synchronisation hook (torch.cuda.set_sync_debug_mode, reported through
// c10::WarningHandler): a libtorch 2.x built with CUDA (the build defines SPECDEC_TORCH_CUDA when
// its c10_cuda is found).
#if defined(SPECDEC_TORCH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define SPECDEC_CUDA_SYNC_HOOK 1
#else
#define SPECDEC_CUDA_SYNC_HOOK 0
#endif

namespace specdec::compat {

// libtorch 1.x has no float16 matrix product on the CPU; 2.x has.
inline constexpr bool kCpuHalfMatmul = TORCH_VERSION_MAJOR >= 2;
inline constexpr int kMajor = TORCH_VERSION_MAJOR, kMinor = TORCH_VERSION_MINOR;

}  // namespace specdec::compat
