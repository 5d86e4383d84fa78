// The formats the linear kernels read, and the one switch that turns a runtime format into a
// compile-time one: every family's dispatch (linear_*.cpp) and the int8 layouts go through it.
#pragma once

#include <type_traits>

#include "kernels/common.hpp"

namespace specdec::kernels {

template <GgmlType T>
using Format = std::integral_constant<GgmlType, T>;
template <GgmlType T>
constexpr int64_t kBlockValues = ggml_format<T>().block_values;
template <GgmlType T>
constexpr int64_t kBlockBytes = ggml_format<T>().block_bytes;

// f(Format<T>{}) for the format `type` (an Error for a type the kernels do not know).
template <class F>
decltype(auto) with_format(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::kF32:
      return f(Format<GgmlType::kF32>{});
    case GgmlType::kF16:
      return f(Format<GgmlType::kF16>{});
    case GgmlType::kBF16:
      return f(Format<GgmlType::kBF16>{});
    case GgmlType::kQ8_0:
      return f(Format<GgmlType::kQ8_0>{});
    case GgmlType::kQ4_0:
      return f(Format<GgmlType::kQ4_0>{});
    case GgmlType::kQ4_1:
      return f(Format<GgmlType::kQ4_1>{});
    case GgmlType::kQ5_0:
      return f(Format<GgmlType::kQ5_0>{});
    case GgmlType::kQ5_1:
      return f(Format<GgmlType::kQ5_1>{});
    case GgmlType::kQ4_K:
      return f(Format<GgmlType::kQ4_K>{});
    case GgmlType::kQ5_K:
      return f(Format<GgmlType::kQ5_K>{});
    case GgmlType::kQ6_K:
      return f(Format<GgmlType::kQ6_K>{});
  }
  throw Error("linear kernels: unknown weight format " +
              std::to_string(static_cast<uint32_t>(type)));
}

// Every block format has an 8-bit-activation kernel (its layout and arithmetic: Interleaved<T>,
// int8.hpp); the float formats have none.
template <GgmlType T>
constexpr bool kHasInt8 = kBlockValues<T> > 1;

}  // namespace specdec::kernels
