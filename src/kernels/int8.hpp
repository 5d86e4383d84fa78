// 8-bit activations (LinearKernel::int8_activations): each block format's layout in groups of 16
// interleaved rows, its arithmetic in plain C++ (the reference every family's kernel reproduces
// bitwise), and the driver that runs a family's group tiles over the rows of a pass.
#pragma once

#include <algorithm>

#include "kernels/formats.hpp"

namespace specdec::kernels {

// --- 8-bit activations (LinearKernel::int8_activations): weight rows interleaved 16 at a time ---
// The activation rows are quantized like ggml's Q8_1 (ActRows): per block of 32, q_x = round(x /
// d_x), s_x = d_x * sum(q_x). One output element (weight row . activation row t), in every family,
// tile and thread split: per block of 32 weights (K-quants: sub-block) b, the exact integer isum =
// sum of q_w * q_x, then in block order from acc = 0:
//   Q8_0: q_w signed;       acc = fma(isum, d_w * d_x, acc)
//   Q4_0: q_w = nibble - 8; acc = fma(isum, d_w * d_x, acc)
//   Q4_1: q_w = nibble;     acc = fma(isum, d_w * d_x, acc); acc = fma(m_w, s_x, acc)
//   Q5_0: q_w = 5 bits - 16; as Q4_0
//   Q5_1: q_w = 5 bits;     as Q4_1
//   Q4_K: q_w = nibble;     acc = fma(isum, (d * scale_b) * d_x, acc);
//                           acc = fma(-(dmin * min_b), s_x, acc)
//   Q5_K: q_w = 5 bits;     as Q4_K
//   Q6_K: q_w = 6 bits - 32, halves a, b of 16 with int8 scales: isum = scale_a * isum_a +
//         scale_b * isum_b (exact);   acc = fma(isum, d * d_x, acc)
// (isum as float: exact, below 2^24.) In a whole group of 16 rows (prepare_weights) row r is lane
// r of a vector, so no sum crosses lanes; the rows after the last whole group keep their layout and
// go through Interleaved<T>::block, which is this arithmetic in plain C++. The values are those of
// llama.cpp's approach (integer dot products per block), not the float32 kernel's.

// Where byte j of block b of row r lies in its group of 16 rows: a block's 2-byte fields (its
// float16 scales: kFields bytes from kFieldsAt) first, each for the 16 rows one after the other,
// then every 4 bytes of the rest of the block (in block order) for the 16 rows.
template <class I>
constexpr bool in_fields(int64_t j) {
  return j >= I::kFieldsAt && j < I::kFieldsAt + I::kFields;
}
template <class I>
constexpr int64_t interleaved_offset(int64_t b, int64_t r, int64_t j) {
  const int64_t base = b * kInterleave * I::kBytes;
  if (in_fields<I>(j))
    return base + (j - I::kFieldsAt) / 2 * 2 * kInterleave + 2 * r + (j - I::kFieldsAt) % 2;
  const int64_t rest = j < I::kFieldsAt ? j : j - I::kFields;  // position among the other bytes
  return base + I::kFields * kInterleave + rest / 4 * 4 * kInterleave + 4 * r + rest % 4;
}

// The bytes of a block that move together from byte j: a 2-byte field, or 4 other bytes.
template <class I>
constexpr int64_t piece(int64_t j) {
  return in_fields<I>(j) ? 2 : 4;
}

template <GgmlType T>
struct Interleaved;
template <GgmlType T>
struct Block {  // a block's size, from the format table
  static constexpr int64_t kValues = kBlockValues<T>, kBytes = kBlockBytes<T>;
};

template <>
struct Interleaved<GgmlType::kQ8_0> : Block<GgmlType::kQ8_0> {
  static constexpr int64_t kFieldsAt = 0, kFields = 2;  // d, 32 values
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t b,
                    float& acc) {
    const int64_t e = t * (k / 32) + b;
    const int8_t* q = x.q + t * k + b * 32;
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += static_cast<int8_t>(blk[2 + j]) * q[j];
    acc = std::fma(static_cast<float>(isum), ggml_half(blk) * x.d[e], acc);
  }
};

// Q4_0 (d, 16 bytes of nibbles) and Q4_1 (d, m, the same): value j < 16 is the low nibble of byte
// j, value j + 16 its high nibble.
template <GgmlType T>
struct Nibbles32 : Block<T> {
  static constexpr int64_t kFieldsAt = 0, kFields = T == GgmlType::kQ4_1 ? 4 : 2;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t b,
                    float& acc) {
    const int64_t e = t * (k / 32) + b;
    const int8_t* q = x.q + t * k + b * 32;
    int32_t isum = T == GgmlType::kQ4_0 ? -8 * x.sum[e] : 0;
    for (int j = 0; j < 16; ++j)
      isum += (blk[kFields + j] & 0x0F) * q[j] + (blk[kFields + j] >> 4) * q[j + 16];
    acc = std::fma(static_cast<float>(isum), ggml_half(blk) * x.d[e], acc);
    if (T == GgmlType::kQ4_1) acc = std::fma(ggml_half(blk + 2), x.s[e], acc);
  }
};
template <>
struct Interleaved<GgmlType::kQ4_0> : Nibbles32<GgmlType::kQ4_0> {};
template <>
struct Interleaved<GgmlType::kQ4_1> : Nibbles32<GgmlType::kQ4_1> {};

// Q5_0 (d, qh[4], qs[16]) and Q5_1 (d, m, qh, qs): the values of ggml_q5_values (Q5_0: minus 16).
template <GgmlType T>
struct Fives32 : Block<T> {
  static constexpr bool kQ5_1 = T == GgmlType::kQ5_1;
  static constexpr int64_t kFieldsAt = 0, kFields = kQ5_1 ? 4 : 2;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t b,
                    float& acc) {
    const int64_t e = t * (k / 32) + b;
    const int8_t* q = x.q + t * k + b * 32;
    int v[32];
    ggml_q5_values(blk + kFields, blk + kFields + 4, v);
    int32_t isum = kQ5_1 ? 0 : -16 * x.sum[e];
    for (int j = 0; j < 32; ++j) isum += v[j] * q[j];
    acc = std::fma(static_cast<float>(isum), ggml_half(blk) * x.d[e], acc);
    if (kQ5_1) acc = std::fma(ggml_half(blk + 2), x.s[e], acc);
  }
};
template <>
struct Interleaved<GgmlType::kQ5_0> : Fives32<GgmlType::kQ5_0> {};
template <>
struct Interleaved<GgmlType::kQ5_1> : Fives32<GgmlType::kQ5_1> {};

// Q4_K (d, dmin, 12 bytes of scales, 128 of nibbles) and Q5_K (d, dmin, scales, 32 bytes of high
// bits, 128 of nibbles): sub-block s is the low (even s) or high nibbles of qs[32 (s / 2)..], with
// bit s of qh[j] as the fifth bit of its value j in Q5_K.
template <GgmlType T>
struct KNibbles : Block<T> {
  static constexpr bool kQ5 = T == GgmlType::kQ5_K;
  static constexpr int64_t kFieldsAt = 0, kFields = 4;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t sb,
                    float& acc) {
    const uint8_t* qs = blk + (kQ5 ? 48 : 16);
    for (int s = 0; s < 8; ++s) {
      int sc, mn;
      ggml_scale_min_k4(s, blk + 4, &sc, &mn);
      const int64_t e = t * (k / 32) + sb * 8 + s;
      const int8_t* q = x.q + t * k + sb * 256 + 32 * s;
      int32_t isum = 0;
      for (int j = 0; j < 32; ++j) {
        int v = (qs[32 * (s / 2) + j] >> (4 * (s % 2))) & 0x0F;
        if (kQ5) v |= ((blk[16 + j] >> s) & 1) << 4;
        isum += v * q[j];
      }
      acc =
          std::fma(static_cast<float>(isum), ggml_half(blk) * static_cast<float>(sc) * x.d[e], acc);
      acc = std::fma(-(ggml_half(blk + 2) * static_cast<float>(mn)), x.s[e], acc);
    }
  }
};
template <>
struct Interleaved<GgmlType::kQ4_K> : KNibbles<GgmlType::kQ4_K> {};
template <>
struct Interleaved<GgmlType::kQ5_K> : KNibbles<GgmlType::kQ5_K> {};

template <>
struct Interleaved<GgmlType::kQ6_K>
    : Block<GgmlType::kQ6_K> {  // ql[128], qh[64], 16 int8 scales, d
  static constexpr int64_t kFieldsAt = 208, kFields = 2;
  static void block(const uint8_t* blk, const ActView& x, int64_t t, int64_t k, int64_t sb,
                    float& acc) {
    // Sub-block s of half h = s / 4 (r = s % 4): the low (r < 2) or high nibbles of ql[64 h +
    // 32 (r % 2)..], bits 2r, 2r + 1 of qh[32 h..] as bits 4-5, minus 32; its halves of 16 have the
    // scales 8 h + 2 r and 8 h + 2 r + 1.
    for (int s = 0; s < 8; ++s) {
      const int h = s / 4, r = s % 4;
      const int64_t e = t * (k / 32) + sb * 8 + s;
      const int8_t* q = x.q + t * k + sb * 256 + 32 * s;
      int32_t half[2] = {0, 0};
      for (int j = 0; j < 32; ++j) {
        const int lo = (blk[64 * h + 32 * (r % 2) + j] >> (r >= 2 ? 4 : 0)) & 0x0F;
        const int hi = (blk[128 + 32 * h + j] >> (2 * r)) & 3;
        half[j / 16] += ((lo | hi << 4) - 32) * q[j];
      }
      const int32_t isum = static_cast<int8_t>(blk[192 + 8 * h + 2 * r]) * half[0] +
                           static_cast<int8_t>(blk[192 + 8 * h + 2 * r + 1]) * half[1];
      acc = std::fma(static_cast<float>(isum), ggml_half(blk + 208) * x.d[e], acc);
    }
  }
};

// Block b of row r as stored: from its group at `w` (interleaved), or the plain row at `w`.
template <GgmlType T>
const uint8_t* plain_block(const uint8_t* w, int64_t r, int64_t b, bool interleaved, uint8_t* buf) {
  using I = Interleaved<T>;
  if (!interleaved) return w + b * I::kBytes;
  for (int64_t j = 0; j < I::kBytes; j += piece<I>(j))
    std::memcpy(buf + j, w + interleaved_offset<I>(b, r, j), piece<I>(j));
  return buf;
}

// One output: row r of the group at `w` (interleaved) or the plain row at `w`, against activation
// row t.
template <GgmlType T>
float interleaved_dot(const uint8_t* w, int64_t r, bool interleaved, const ActView& x, int64_t t,
                      int64_t k) {
  using I = Interleaved<T>;
  uint8_t buf[I::kBytes];
  float acc = 0.0f;
  for (int64_t b = 0; b < k / I::kValues; ++b)
    I::block(plain_block<T>(w, r, b, interleaved, buf), x, t, k, b, acc);
  return acc;
}

// A last tile of `rest` < Group::kMaxRows activation rows.
template <class Group, int R>
inline void group_rest(int64_t rest, const ActView& x, int64_t k, const uint8_t* gw, int64_t t,
                       int64_t n, int64_t n_total, float* y) {
  if constexpr (R > 0) {
    if (rest == R)
      Group::template tile<R>(x, k, gw, t, n, n_total, y);
    else
      group_rest<Group, R - 1>(rest, x, k, gw, t, n, n_total, y);
  }
}

// The rows [n0, n1) (n0 a multiple of 16 below the last whole group): whole groups by
// Group::tile, the rest one output at a time.
template <class Group>
void rows_interleaved(const void* xv, int64_t t_rows, int64_t k, const uint8_t* w,
                      int64_t row_bytes, int64_t n0, int64_t n1, int64_t n_total, float* y) {
  const ActView& x = *static_cast<const ActView*>(xv);
  const int64_t whole = n_total / kInterleave * kInterleave;
  SPECDEC_CHECK(n0 % kInterleave == 0 || n0 >= whole, "interleaved rows from ", n0);
  int64_t n = n0;
  for (; n + kInterleave <= std::min(n1, whole); n += kInterleave) {
    int64_t t = 0;
    for (; t + Group::kMaxRows <= t_rows; t += Group::kMaxRows)
      Group::template tile<Group::kMaxRows>(x, k, w + n * row_bytes, t, n, n_total, y);
    group_rest<Group, Group::kMaxRows - 1>(t_rows - t, x, k, w + n * row_bytes, t, n, n_total, y);
  }
  for (; n < n1; ++n)
    for (int64_t t = 0; t < t_rows; ++t)
      y[t * n_total + n] = interleaved_dot<Group::kType>(w + n * row_bytes, 0, false, x, t, k);
}

}  // namespace specdec::kernels
