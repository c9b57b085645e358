// Internal: the SIMD conversion kernels behind sync/convert.h. Use convert.h instead.
//
// On x86-64 these are compiled per function for the AVX2 level of sync/cpu.h and are only called
// when Cpu().avx2 is true. Elsewhere Cpu().avx2 is false and the kernels are the scalar
// references.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "sync/convert.h"

namespace weft::sync::detail {

// How far ahead streaming kernels prefetch. Hardware prefetchers alone leave these kernels at about
// half of the machine's read bandwidth; a software prefetch this far ahead closes the gap.
inline constexpr size_t kPrefetchBytes = 4096;

void ConvertBf16Avx2(std::span<const float> in, std::span<uint16_t> out);
void ConvertF16Avx2(std::span<const float> in, std::span<uint16_t> out);
float AbsMaxAvx2(std::span<const float> values);
void ConvertFp8Avx2(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                    Saturation saturation, float divisor);

}  // namespace weft::sync::detail
