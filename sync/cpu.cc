#include "sync/cpu.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace weft::sync {
namespace {

CpuFeatures Detect() {
  CpuFeatures features;
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return features;
  const bool fma = ecx & (1u << 12), popcnt = ecx & (1u << 23), f16c = ecx & (1u << 29);
  const bool osxsave = ecx & (1u << 27);
  if (!osxsave) return features;
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool ymm_saved = (xcr0_low & 0x6) == 0x6;
  const bool zmm_saved = (xcr0_low & 0xE6) == 0xE6;  // also opmask and the upper ZMM state
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return features;
  const bool avx2 = ebx & (1u << 5), bmi1 = ebx & (1u << 3), bmi2 = ebx & (1u << 8);
  const bool avx512f = ebx & (1u << 16), avx512dq = ebx & (1u << 17), avx512bw = ebx & (1u << 30);
  features.avx2 = ymm_saved && avx2 && f16c && fma && bmi1 && bmi2 && popcnt;
  features.avx512 = features.avx2 && zmm_saved && avx512f && avx512bw && avx512dq;
#endif
  return features;
}

CpuFeatures Capped(CpuFeatures features) {
  const char* cap = std::getenv("WEFT_CPU");
  if (cap == nullptr) return features;
  if (std::strcmp(cap, "avx2") == 0 || std::strcmp(cap, "scalar") == 0) features.avx512 = false;
  if (std::strcmp(cap, "scalar") == 0) features.avx2 = false;
  return features;
}

}  // namespace

const CpuFeatures& Cpu() {
  static const CpuFeatures features = Capped(Detect());
  return features;
}

}  // namespace weft::sync
