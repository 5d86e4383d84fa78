#include "kernels/cpu_features.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/common.hpp"

#ifdef SPECDEC_X86
#include <cpuid.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace specdec::kernels {

#ifdef SPECDEC_X86
namespace {
// CPUID's vendor string is `name` ("AuthenticAMD", "GenuineIntel"): EBX, EDX, ECX of leaf 0.
bool vendor_is(const char* name) {
  unsigned a = 0, regs[3] = {0, 0, 0};
  if (!__get_cpuid(0, &a, &regs[0], &regs[2], &regs[1])) return false;
  return std::memcmp(regs, name, 12) == 0;
}
}  // namespace

bool amd_family_26() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!vendor_is("AuthenticAMD") || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    return ((a >> 8) & 0xF) == 0xF && ((a >> 20) & 0xFF) + 0xF == 26;
  }();
  return yes;
}

bool intel() {
  static const bool yes = vendor_is("GenuineIntel");
  return yes;
}

bool has_avx512_vnni() { return __builtin_cpu_supports("avx512vnni"); }

namespace {
// Linux gives a process the tile data state (XFEATURE_XTILEDATA, 18) only when it asks
// (ARCH_REQ_XCOMP_PERM), and then every signal frame of the process carries 8 KB more, which can
// overflow a host application's small alternate signal stacks. So amx_supported() only looks (the
// CPU's AMX-TILE and AMX-INT8, the kernel's support: ARCH_GET_XCOMP_SUPP), and the permission is
// asked once, by amx_permitted(), when a kernel of the AMX family is made.
constexpr int kXtileData = 18;
bool amx_supported() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
    return false;
#ifdef __linux__
  uint64_t features = 0;
  return syscall(SYS_arch_prctl, 0x1021, &features) == 0 && (features >> kXtileData & 1);
#else
  return false;
#endif
}
}  // namespace
bool amx_permitted() {
#ifdef __linux__
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, kXtileData) == 0;
  return permitted;
#else
  return false;
#endif
}
#endif  // SPECDEC_X86

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAmx:
      return "amx";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kPortable:
      return "portable";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
#ifdef SPECDEC_X86
  // FMA and F16C through cpuid: clang's __builtin_cpu_supports knows no "f16c". libgcc's
  // avx512 flags include the operating system's support for the 512-bit registers.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool avx2 = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_FMA) && (c & bit_F16C) &&
                    __builtin_cpu_supports("avx2");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    out.push_back(Isa::kAvx512);
  // AMX after AVX-512: opt-in (SPECDEC_KERNELS=amx) until it measures faster at every thread count
  if (!out.empty() && has_avx512_vnni() && amx_supported()) out.push_back(Isa::kAmx);
  if (avx2) out.push_back(Isa::kAvx2);
#endif
  out.push_back(Isa::kPortable);
  return out;
}

Isa default_isa() {
  static const Isa isa = [] {
    const std::vector<Isa> have = available_isas();
    const char* env = std::getenv("SPECDEC_KERNELS");
    if (!env || !*env) return have.front();
    for (Isa i : have)
      if (env == std::string(isa_name(i))) return i;
    std::string names;
    for (Isa i : have) names += std::string(names.empty() ? "" : ", ") + isa_name(i);
    throw Error("SPECDEC_KERNELS=" + std::string(env) +
                ": not a kernel this build and CPU can run (" + names + ")");
  }();
  return isa;
}

}  // namespace specdec::kernels
