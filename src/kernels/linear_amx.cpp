// AMX (Intel's tile unit; AMX-INT8) for Q8_0 with 8-bit activations: the same integers, the same
// float operations, so the bits of the AVX-512 VNNI kernel.
#include "kernels/families.hpp"
#include "kernels/lanes_avx512.hpp"

#ifdef SPECDEC_X86
namespace specdec::kernels::amx {
namespace {

// AMX (Intel's tile unit; AMX-INT8) for Q8_0: the same integers, the same float operations, so the
// bits of avx512::Lanes16. For a tile of TB >= tuning::kAmxFrom activation rows, per block of a
// group of 16 weight rows: tile A = the TB rows' 32 quantized activations, tile B = the block's 8
// value chunks as stored (exactly the layout TDPBSSD reads: 4 values of each of 16 columns per
// row), so one tile multiply gives the TB x 16 exact integer sums; they go through memory into the
// lanes, where the documented float operations run as in Lanes16. Fewer rows take Lanes16 (one tile
// multiply costs about what 4 rows' vpdpbusd do). The nibble formats are not sent here: unpacking
// their values into memory for the tile load, once per block and tile of rows, made a 128-token
// prefill no faster than the VNNI kernel, often slower, on an Intel Xeon (Emerald Rapids).
#define SPECDEC_AMX \
  __attribute__((   \
      target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))

struct alignas(64) TileConfig {  // the 64-byte operand of LDTILECFG, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

struct Q8_0Amx {
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  static constexpr int kMaxRows = 16;
  template <int TB>
  SPECDEC_AMX static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t, int64_t n,
                               int64_t n_total, float* y) {
    if constexpr (TB < tuning::kAmxFrom) {
      avx512::Lanes16<avx512::Q8_0Lanes>::template tile<TB>(x, k, gw, t, n, n_total, y);
    } else {
      constexpr int64_t bytes = kInterleave * Interleaved<kType>::kBytes;
      TileConfig cfg;
      cfg.rows[0] = TB, cfg.colsb[0] = 32;  // A: TB rows of 32 int8 activations
      cfg.rows[1] = 8, cfg.colsb[1] = 64;   // B: 8 chunks of 16 x 4 values
      cfg.rows[2] = TB, cfg.colsb[2] = 64;  // C: TB x 16 int32 sums
      _tile_loadconfig(&cfg);
      alignas(64) int32_t isum[kMaxRows][16];
      __m512 acc[TB];
      for (int j = 0; j < TB; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* blk = gw + b * bytes;
        prefetch_ahead(blk, bytes);
        _tile_zero(2);
        _tile_loadd(0, x.q + t * k + b * 32, k);
        _tile_loadd(1, blk + 2 * kInterleave, 64);  // after the 16 rows' d
        _tile_dpbssd(2, 0, 1);
        _tile_stored(2, isum, 64);
        const __m512 dw = avx512::field(blk, 0);
        for (int j = 0; j < TB; ++j) {
          const __m512 dx = _mm512_set1_ps(x.d[(t + j) * (k / 32) + b]);
          acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(isum[j])),
                                   _mm512_mul_ps(dw, dx), acc[j]);
        }
      }
      _tile_release();
      for (int j = 0; j < TB; ++j) _mm512_storeu_ps(y + (t + j) * n_total + n, acc[j]);
    }
  }
};

}  // namespace

RowsFn rows_q8_0() { return rows_interleaved<Q8_0Amx>; }

}  // namespace specdec::kernels::amx
#endif  // SPECDEC_X86
