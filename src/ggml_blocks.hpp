// ggml block layouts shared by the reference dequantizers (gguf.cpp) and the kernels (private).
#pragma once

#include <cstdint>
#include <cstring>

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

// Q5_0 and Q5_1: the 5-bit values q[0..31] of a block from its qh (4 bytes, little-endian: bit j is
// the fifth bit of value j) and qs (16 bytes: value j < 16 the low nibble of qs[j], value j + 16
// the high one).
inline void ggml_q5_values(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
  }
}

}  // namespace specdec
