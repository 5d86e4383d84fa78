// Tile and prefetch choices: measured per CPU (docs/kernels.md, "Tiles and tuning"). None of them
// changes a result's bits, only its speed.
#pragma once

#include <cstdint>
#include <limits>

namespace specdec::kernels::tuning {

// Passes of up to kStreamRows input rows (decode, verification) stream one weight row at a time;
// more rows (prefill) take the wide tiles, as do weight rows of kLongRow columns or more from
// WideFrom's number of input rows (AVX-512, float32 activations).
constexpr int64_t kStreamRows = 8, kLongRow = 2048;
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
struct WideFrom {
  int64_t f16, f32, q8_0_q4_0, q4_k, others;
};
constexpr WideFrom kWideFrom{1, 4, 6, 8, kNever};  // AMD Zen 4, and every CPU not measured apart
constexpr WideFrom kWideFromZen5{3, 3, 8, kNever, kNever};  // AMD family 26
// The AVX-512 and 8-bit kernels prefetch this many bytes of weights ahead of the row they read;
// float32 rows only on Zen 5 (elsewhere the hardware prefetcher alone streams them faster).
constexpr int64_t kPrefetchAhead = 8192;
// On Intel, the AVX-512 8-bit kernels prefetch kPrefetchAheadLong bytes ahead instead in a matrix
// of kLongStream bytes or more (an output head): on a Xeon with AMX a 2 KiB distance streamed such
// matrices 9-28% faster, while 8 KiB kept the short matrices of SmolLM2's layers faster.
constexpr int64_t kPrefetchAheadLong = 2048, kLongStream = 16 << 20;
// Input rows quantized and multiplied per sweep over the weights (keeps them in L2).
constexpr int64_t kRowTile = 64;
// Q8_0 8-bit tiles of at least this many activation rows take AMX; fewer take AVX-512 VNNI.
constexpr int kAmxFrom = 4;

}  // namespace specdec::kernels::tuning
