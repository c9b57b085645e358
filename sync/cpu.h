// What the CPU can run, detected once (cpuid, and xgetbv for the OS saving the vector state).
// Kernels with SIMD paths check these flags and fall back to their scalar references.
//
// The environment variable WEFT_CPU caps what is used: "avx2" turns the AVX-512 paths off,
// "scalar" every SIMD path, so that the fallbacks can be tested on any machine.
#pragma once

namespace weft::sync {

struct CpuFeatures {
  bool avx2_f16c = false;  // AVX2, F16C, BMI1, BMI2
  bool avx512dq = false;   // AVX-512 F + DQ (64-bit lane multiplies)
  bool avx512bw = false;   // AVX-512 F + BW (16-bit lanes) and AVX2
};

const CpuFeatures& Cpu();

}  // namespace weft::sync
