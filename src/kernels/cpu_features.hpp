// Every CPUID decision of the kernels, in one place (cpu_features.cpp).
#pragma once

namespace specdec::kernels {

#if (defined(__x86_64__) || defined(__i386__)) && !defined(SPECDEC_NO_X86_KERNELS)
bool amd_family_26();  // AMD Zen 5, whose tile choices were measured apart (tuning.hpp)
bool intel();          // whose prefetch distance for long streams was measured apart (tuning.hpp)
bool has_avx512_vnni();
// Asks Linux once for the AMX tile state (see cpu_features.cpp); false if refused.
bool amx_permitted();
#endif

}  // namespace specdec::kernels
