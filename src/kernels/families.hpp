// Each kernel family's rows function for a weight format (linear.cpp picks the family).
#pragma once

#include "kernels/common.hpp"

namespace specdec::kernels {

namespace portable {
RowsFn rows(GgmlType type, bool int8_activations);
}
#ifdef SPECDEC_X86
namespace avx2 {
RowsFn rows(GgmlType type, bool int8_activations);
}
namespace avx512 {
// int8_activations: the VNNI kernels (the CPU must have AVX-512 VNNI).
RowsFn rows(GgmlType type, bool int8_activations);
// The VNNI kernel of a block format prefetching tuning::kPrefetchAheadLong ahead.
RowsFn rows_long(GgmlType type);
}  // namespace avx512
namespace amx {
RowsFn rows_q8_0();  // Q8_0 with 8-bit activations
}
#endif

}  // namespace specdec::kernels
