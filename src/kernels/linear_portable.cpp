// The portable family (any CPU): plain C++ in a fixed order, for every format.
#include "kernels/families.hpp"
#include "kernels/int8.hpp"

namespace specdec::kernels::portable {
namespace {

// Groups of rows in plain C++ (the portable family).
template <GgmlType T>
struct GroupPortable {
  static constexpr GgmlType kType = T;
  static constexpr int kMaxRows = 1;
  template <int TB>
  static void tile(const ActView& x, int64_t k, const uint8_t* gw, int64_t t, int64_t n,
                   int64_t n_total, float* y) {
    for (int64_t r = 0; r < kInterleave; ++r)
      y[t * n_total + n + r] = interleaved_dot<T>(gw, r, true, x, t, k);
  }
};

// The portable kernel (any CPU, any format): each weight row dequantized by ggml_dequantize into a
// buffer, each output element a fixed-order dot(): also independent of the number of rows in the
// pass (its results differ from the AVX2 kernel's in the last bits).
template <GgmlType T>
void rows_portable(const void* xv, int64_t t_rows, int64_t k, const uint8_t* w, int64_t row_bytes,
                   int64_t n0, int64_t n1, int64_t n_total, float* y) {
  const float* x = static_cast<const float*>(xv);
  thread_local std::vector<float> buf;
  if (T != GgmlType::kF32) buf.resize(k);
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = reinterpret_cast<const float*>(w + n * row_bytes);
    if (T != GgmlType::kF32) {
      ggml_dequantize(T, w + n * row_bytes, buf.data(), k);
      wr = buf.data();
    }
    for (int64_t t = 0; t < t_rows; ++t) y[t * n_total + n] = dot(wr, x + t * k, k);
  }
}

}  // namespace

RowsFn rows(GgmlType type, bool int8_activations) {
  return with_format(type, [&](auto format) -> RowsFn {
    constexpr GgmlType T = decltype(format)::value;
    if constexpr (kHasInt8<T>)
      if (int8_activations) return rows_interleaved<GroupPortable<T>>;
    return rows_portable<T>;
  });
}

}  // namespace specdec::kernels::portable
