// What the CPU can run, detected once (cpuid, and xgetbv for the OS saving the vector state), and
// the two SIMD levels weft's x86-64 kernels are compiled for, defined here once: a kernel marked
// WEFT_TARGET_AVX2 runs only when Cpu().avx2, one marked WEFT_TARGET_AVX512 only when
// Cpu().avx512. Each level's check covers every feature its target attribute lets the compiler use.
// Kernels with SIMD paths fall back to their scalar references otherwise.
//
// The environment variable WEFT_CPU caps what is used: "avx2" turns the AVX-512 paths off,
// "scalar" every SIMD path, so that the fallbacks can be tested on any machine.
#pragma once

#if defined(__x86_64__)
#define WEFT_TARGET_AVX2 __attribute__((target("avx2,f16c,fma,bmi,bmi2,popcnt")))
#define WEFT_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx2,f16c,fma,bmi,bmi2,popcnt")))
#endif

namespace weft::sync {

struct CpuFeatures {
  bool avx2 = false;    // AVX2, F16C, FMA, BMI1, BMI2, POPCNT
  bool avx512 = false;  // all of those and AVX-512 F, BW and DQ
};

const CpuFeatures& Cpu();

}  // namespace weft::sync
