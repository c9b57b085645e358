// Conversion between FP32 and the serving formats: BF16, FP16, FP8 E4M3FN and FP8 E5M2.
//
// Rounding is round-to-nearest-even everywhere, bit-exact with the references:
//   BF16: PyTorch's float->bfloat16 for every non-NaN input.
//   FP16: IEEE binary16 (PyTorch, x86 F16C, CUDA's __float2half_rn) for every non-NaN input;
//         overflow goes to infinity.
//   FP8:  NVIDIA's __nv_cvt_float_to_fp8 (cuda_fp8.h), in both saturation modes, for every input
//         including NaN: kSaturateFinite clamps out-of-range values and infinities to the largest
//         finite value; kNoSaturate gives NaN (E4M3) or infinity (E5M2). Every NaN becomes 0x7F.
// NaN into BF16/FP16 stays NaN: the result is quiet and keeps the sign and the top payload bits,
// as the x86 conversion instructions do. (The references disagree among themselves on NaN: PyTorch
// returns 0x7FC0 from its scalar path and 0xFFFF from its AVX2 path; tests check "is NaN".)
//
// Each conversion has a scalar reference (*Ref) and bulk functions that use SIMD when the CPU has
// it (AVX2 + F16C on x86-64) and fall back to the references otherwise. The bulk functions are
// bit-identical to the references for every input; tests compare them. All functions are pure and
// thread-safe.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "sync/dtype.h"

namespace weft::sync {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };
enum class Saturation : uint8_t { kSaturateFinite, kNoSaturate };

uint16_t FloatToBf16Ref(float value);
uint16_t FloatToF16Ref(float value);
uint8_t FloatToFp8Ref(float value, Fp8Format format, Saturation saturation);

float Bf16ToFloat(uint16_t bits);
float F16ToFloat(uint16_t bits);
float Fp8ToFloat(uint8_t bits, Fp8Format format);

// The largest finite value of an FP8 format: 448 (E4M3), 57344 (E5M2).
float Fp8MaxFinite(Fp8Format format);

// Bulk FP32 -> target conversion of `in` into `out` (out.size() == in.size()). When `divisor` is
// given, each element is converted as in[i] / divisor (the FP8 scale), computed in FP32.
void ConvertBf16(std::span<const float> in, std::span<uint16_t> out);
void ConvertF16(std::span<const float> in, std::span<uint16_t> out);
void ConvertFp8(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                Saturation saturation, float divisor = 1.0f);

// Scalar-only versions of the bulk functions, for tests and benchmarks.
void ConvertBf16Ref(std::span<const float> in, std::span<uint16_t> out);
void ConvertF16Ref(std::span<const float> in, std::span<uint16_t> out);
void ConvertFp8RefBulk(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                       Saturation saturation, float divisor = 1.0f);

// The largest |x| over `values`, ignoring NaN (0 for an empty or all-NaN span). SIMD when
// available; AbsMaxRef is the scalar reference.
float AbsMax(std::span<const float> values);
float AbsMaxRef(std::span<const float> values);

// Widening: element i of a tensor of `dtype` (any float or integer type) as FP32.
void ConvertToFloat(DType dtype, std::span<const uint8_t> in, std::span<float> out);

inline uint32_t FloatBits(float value) { return std::bit_cast<uint32_t>(value); }
inline float BitsToFloat(uint32_t bits) { return std::bit_cast<float>(bits); }

}  // namespace weft::sync
