// CPU kernels where libtorch's generic path is slow for speculative decoding's shapes.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "specdec/gguf.hpp"

namespace specdec::kernels {

// y = x @ W^T + b for float32 CPU activations x [..., K] and a weight matrix W [N, K] stored in
// one of ggml's formats (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): row n of
// W is the `row_bytes` bytes at w + n * row_bytes. Each weight row is streamed from memory once for
// all rows of x (a K+1-token verification pass costs about what one decode pass costs), and every
// output element is computed with the same fixed summation order whatever the number of rows and
// threads: results are bitwise independent of how many tokens share a pass. The weights are
// dequantized in registers with ggml_dequantize's roundings, so a packed matrix gives bitwise the
// results of the float32 kernel on its dequantized values (activations stay float32).
using RowsFn = void (*)(const void* x, int64_t t_rows, int64_t k, const uint8_t* w,
                        int64_t row_bytes, int64_t n0, int64_t n1, int64_t n_total, float* y);
struct LinearKernel {
  RowsFn rows = nullptr;
  // Where set, `rows` with another prefetch distance, for matrices of tuning::kLongStream bytes
  // or more (the same bits).
  RowsFn rows_long = nullptr;
  // x reaches `rows` as an ActView (ActRows) instead of floats: an exact integer dot product per
  // block of 32, as llama.cpp computes Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K (faster; the values differ
  // from the float32 kernel's on the dequantized weights, still batch-invariant).
  bool int8_activations = false;
  // The weight rows are stored interleaved kInterleave at a time (prepare_weights), so that one
  // sequential read feeds kInterleave outputs in the lanes of a register: every 8-bit-activation
  // kernel. `rows` then takes n0 a multiple of kInterleave.
  bool interleaved = false;
  explicit operator bool() const { return rows != nullptr; }
};
constexpr int64_t kInterleave = 16;
// Reorders W [n, row_bytes] in place into the layout `kernel` reads (a no-op unless
// kernel.interleaved). Each whole group of 16 rows r..r+15 keeps its bytes, block by block: the
// block's 2-byte scale fields of the 16 rows, then for each 4 bytes of the rest of the block, those
// of the 16 rows. Rows beyond the last whole group keep their layout.
void prepare_weights(const LinearKernel& kernel, GgmlType type, uint8_t* w, int64_t n,
                     int64_t row_bytes);
// Row r of W as stored before prepare_weights (`out`: row_bytes bytes).
void stored_row(const LinearKernel& kernel, GgmlType type, const uint8_t* w, int64_t n,
                int64_t row_bytes, int64_t r, uint8_t* out);
// Activation rows quantized like ggml's Q8_1, in blocks of 32: x[r][c] ~ d[r][c / 32] * q[r][c].
// One array per field, so that a kernel loads the values of consecutive blocks at once.
struct ActView {  // row t of a pass: q + t * K, sum16 + t * K / 16, d, s, sum + t * K / 32
  const int8_t* q;
  const float *d, *s;    // s = d * sum(q) of the block
  const int32_t* sum;    // sum(q) of the block
  const int32_t* sum16;  // sum(q) of each half of 16 of the block
};
// The kernel families: AVX-512 (F, BW, DQ, VL; VNNI for 8-bit activations where the CPU has it)
// and AVX2 (with FMA and F16C) give bitwise the same results; the portable fixed-order kernel (any
// CPU) differs from them in the last bits with float32 activations, and gives their bits with
// 8-bit activations. AMX is AVX-512 with VNNI whose Q8_0 8-bit-activation passes of 4 or more rows
// take Intel's tile unit (AMX-INT8): the same bits again (opt-in: listed after AVX-512).
enum class Isa { kAmx, kAvx512, kAvx2, kPortable };
const char* isa_name(Isa isa);  // "amx", "avx512", "avx2", "portable"
// What this build and CPU can run, the default first (always ends with kPortable).
std::vector<Isa> available_isas();
// The first of available_isas(), or the one SPECDEC_KERNELS names (an Error if it names none of
// them); decided once per process.
Isa default_isa();
struct ActRows {
  ActRows(int64_t rows = 0, int64_t k = 0) { resize(rows, k); }
  void resize(int64_t rows, int64_t k);  // keeps the memory it has
  // Quantizes rows r0..r1 of x [rows, K], each on its own (a row's values do not depend on others).
  // Every family gives the same bits (AVX2 and AVX-512 share one vectorized copy).
  void quantize(const float* x, int64_t r0, int64_t r1, Isa isa = default_isa());
  ActView view(int64_t r0) const;  // from row r0 on
  int64_t k;
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> sum, sum16;
};
// True for the formats that have an 8-bit-activation kernel: every block format (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
bool has_int8_kernel(GgmlType type);
// The kernel for `type` in family `isa` (one of available_isas()). `int8_activations` applies
// where has_int8_kernel(type), and is ignored elsewhere.
LinearKernel linear_kernel(GgmlType type, bool int8_activations = false, Isa isa = default_isa());
// y = x W^T + b (+ residual) for x [..., K] and W [N, K] in the kernel's format: b [N] and
// residual (float32, the shape of y: the layer's input to a residual connection) may be
// undefined. Each output element gets (x W^T + b) + residual, the two additions libtorch's
// `residual + (y + b)` makes, on the thread that computed it.
at::Tensor linear_packed(const at::Tensor& x, const LinearKernel& kernel, const uint8_t* w,
                         int64_t row_bytes, int64_t n, int64_t k, const at::Tensor& b,
                         const at::Tensor& residual = {});

// Elementwise and per-row kernels split their rows over threads only in tasks of at least this
// many floats (rows_per_task rows of row_floats each): a parallel region costs its threads a fork
// and a join, which for a few short rows (a decode step's norms, SiLU, rotary, activation
// quantization) cost more than the work. Which thread computes a row never changes its bits.
constexpr int64_t kMinTaskFloats = 16384;
int64_t rows_per_task(int64_t row_floats);

// The rest of a forward pass, for float32 CPU tensors, with the same promise: every output row is
// computed by one thread with one fixed order of operations, whatever the number of rows in the
// pass and the thread count (libtorch's own kernels split reductions and vector tails at
// size-dependent offsets). Each returns an undefined tensor for inputs of another kind, and the
// caller falls back to libtorch.

// softmax(q k^T * scale + mask) v per head. q [B, Hq, T, D]; keys, values [B, Hkv, L, D] (any
// strides with a contiguous last dimension, e.g. views of the KV cache); Hq a multiple of Hkv
// (grouped-query attention); mask undefined or broadcastable to [B, Hkv, Hq / Hkv, T, L] (additive:
// a causal -inf triangle [T, L], a per-head bias [Hq, 1, T, L]). Keys whose mask is -inf are
// skipped. Returns [B, T, Hq * D]. `isa`: any x86 family runs an AVX2-vectorized copy of the same
// scalar code (the same bits).
at::Tensor attention_f32(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& mask, double scale, Isa isa = default_isa());
// One attention step against a KV cache, fused: what Attention's projection split, rotary_f32,
// KVCache::append and attention_f32 compute one after the other, with their bits, without their
// intermediate tensors (a decode step's ~30 small libtorch operations per layer). qkv [B, T,
// (Hq + 2 Hkv) D] contiguous: a fused q|k|v projection's output; cos, sin [T, rot] (every row's
// positions alike) or [B, 1, T, rot] (per row; rot <= D), or undefined: no rotary; keys, values: a
// KVCache's buffers [>= B, Hkv, capacity, D] of one layer, row b holding past[b] positions. Row b's
// rotated keys and its values are written at positions [past[b], past[b] + T) (those past the
// capacity dropped: only padding is there), then its rotated queries attend over the first
// L = min(capacity, max_b past[b] + T) positions under `mask` (additive, [T, L] or [B, 1, 1, T, L],
// or undefined). Returns [B, T, Hq * D], or an undefined tensor for inputs of another kind (nothing
// written; the caller takes the unfused path).
at::Tensor cached_attention_f32(const at::Tensor& qkv, int64_t hq, int64_t hkv, int64_t d,
                                const at::Tensor& cos, const at::Tensor& sin,
                                const at::Tensor& keys, const at::Tensor& values,
                                const std::vector<int64_t>& past, const at::Tensor& mask,
                                double scale, Isa isa = default_isa());
// w * (x / sqrt(mean(x^2) + eps)) over the last dimension.
at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& w, double eps);
// (x - mean) / sqrt(var + eps) * w + b over the last dimension (b may be undefined).
at::Tensor layer_norm_f32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                          double eps);
// Rotary embedding of x [B, H, T, D] (any strides, contiguous last dimension) with cos, sin
// [T, rot] (or [B, 1, T, rot]: a position per row and token): the first rot features rotated (x *
// cos + rotate_half(x) * sin), the rest kept; one fused pass with the same roundings as the
// composite. Returns a contiguous [B, H, T, D].
at::Tensor rotary_f32(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// "silu", "gelu" (erf), "gelu_tanh", "relu", element by element. `gated`: x is a gated MLP's
// fused gate|up [..., 2 I] and the result act(gate) * up [..., I] (the bits of the two steps,
// without the intermediate tensors). SiLU uses specdec's own exp (multiplies and adds, within a
// few ulp; x86 families run it 8 lanes at a time to the portable code's bits); the others libm
// per element.
at::Tensor activation_f32(const at::Tensor& x, const std::string& name, bool gated = false,
                          Isa isa = default_isa());
// The index of the largest value of each row of x [..., V], as x.argmax(-1) gives it (the first of
// equal maxima; the first NaN in a row that holds one), int64 [...] on x's device. Float32 on the
// CPU: 8 lanes at a time on x86 (libtorch's CPU argmax compares one value at a time; figures in
// docs/kernels.md); other dtypes and devices, libtorch's.
at::Tensor argmax(const at::Tensor& x, Isa isa = default_isa());

}  // namespace specdec::kernels
