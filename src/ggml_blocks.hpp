// ggml block layouts shared by the reference dequantizers (gguf.cpp) and the kernels (private).
#pragma once

#include <cstdint>

namespace specdec {

// K-quants (Q4_K, Q5_K): the 6-bit scale and min of sub-block j (0-7) of a block, packed into
// 12 bytes (ggml's get_scale_min_k4).
inline void ggml_scale_min_k4(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace specdec
