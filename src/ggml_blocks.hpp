// ggml block layouts shared by the reference dequantizers (gguf.cpp) and the kernels (private).
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "specdec/gguf.hpp"

namespace specdec {

// The one table of ggml's formats this reader knows (ggml-common.h): values and bytes per block.
struct GgmlFormat {
  GgmlType type;
  const char* name;
  int64_t block_values, block_bytes;
};
inline constexpr GgmlFormat kGgmlFormats[] = {
    {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kBF16, "BF16", 1, 2},     {GgmlType::kQ4_0, "Q4_0", 32, 18},
    {GgmlType::kQ4_1, "Q4_1", 32, 20},   {GgmlType::kQ5_0, "Q5_0", 32, 22},
    {GgmlType::kQ5_1, "Q5_1", 32, 24},   {GgmlType::kQ8_0, "Q8_0", 32, 34},
    {GgmlType::kQ4_K, "Q4_K", 256, 144}, {GgmlType::kQ5_K, "Q5_K", 256, 176},
    {GgmlType::kQ6_K, "Q6_K", 256, 210},
};
// The row of ggml type id `id` in kGgmlFormats, or -1. (An index, not a pointer: GCC's
// -fsanitize=undefined makes pointer comparisons non-constant, and the kernels need constants.)
constexpr int ggml_format_index(uint32_t id) {
  for (int i = 0; i < static_cast<int>(sizeof(kGgmlFormats) / sizeof(kGgmlFormats[0])); ++i)
    if (static_cast<uint32_t>(kGgmlFormats[i].type) == id) return i;
  return -1;
}
constexpr const GgmlFormat* find_ggml_format(uint32_t id) {
  const int i = ggml_format_index(id);
  return i < 0 ? nullptr : &kGgmlFormats[i];
}
// The row of a format known at compile time (kernels: block sizes as constants).
template <GgmlType T>
constexpr const GgmlFormat& ggml_format() {
  constexpr int i = ggml_format_index(static_cast<uint32_t>(T));
  static_assert(i >= 0, "a format of kGgmlFormats");
  return kGgmlFormats[i];
}

// A float16 (IEEE half) stored little-endian at p, as float.
inline float ggml_half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

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
