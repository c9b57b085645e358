#include "sync/convert.h"

#include <array>
#include <cassert>
#include <cmath>
#include <cstring>

#include "sync/convert_simd.h"
#include "sync/cpu.h"

namespace weft::sync {
namespace {

struct Fp8Params {
  int mantissa_bits;
  int bias;
  uint32_t half_min_subnormal;  // float bits of min_subnormal / 2: at or below rounds to zero
  uint32_t min_normal;          // float bits of the smallest normal
  uint32_t overflow_above;      // float bits: strictly above this the value overflows
  uint8_t max_finite;
  uint8_t overflow_code;  // result of an overflow without saturation (NaN or infinity)
};

constexpr Fp8Params kE4M3 = {
    3,    7,   0x3A800000u /*2^-10*/, 0x3C800000u /*2^-6*/, 0x43E80000u /*464 = 448 + ulp/2*/,
    0x7E, 0x7F};
// 61440 = 57344 + ulp/2 is a tie that rounds to the (odd) infinity, so it overflows too.
constexpr Fp8Params kE5M2 = {
    2,    15,  0x37000000u /*2^-17*/, 0x38800000u /*2^-14*/, 0x476FFFFFu /*just below 61440*/,
    0x7B, 0x7C};

const Fp8Params& ParamsFor(Fp8Format format) { return format == Fp8Format::kE4M3 ? kE4M3 : kE5M2; }

std::array<float, 256> MakeFp8Table(Fp8Format format) {
  std::array<float, 256> table{};
  const Fp8Params& p = ParamsFor(format);
  for (int code = 0; code < 256; ++code) {
    int sign = code >> 7;
    int exponent = (code >> p.mantissa_bits) & ((1 << (7 - p.mantissa_bits)) - 1);
    int mantissa = code & ((1 << p.mantissa_bits) - 1);
    int max_exponent = (1 << (7 - p.mantissa_bits)) - 1;
    float value;
    if (format == Fp8Format::kE4M3 && exponent == max_exponent && mantissa == 7) {
      value = std::nanf("");
    } else if (format == Fp8Format::kE5M2 && exponent == max_exponent) {
      value = mantissa == 0 ? INFINITY : std::nanf("");
    } else if (exponent == 0) {
      value = std::ldexp(static_cast<float>(mantissa), 1 - p.bias - p.mantissa_bits);
    } else {
      value = std::ldexp(static_cast<float>(mantissa + (1 << p.mantissa_bits)),
                         exponent - p.bias - p.mantissa_bits);
    }
    table[code] = sign ? -value : value;
  }
  return table;
}

const std::array<float, 256> kE4M3Table = MakeFp8Table(Fp8Format::kE4M3);
const std::array<float, 256> kE5M2Table = MakeFp8Table(Fp8Format::kE5M2);

const bool kUseSimd = Cpu().avx2;

}  // namespace

uint16_t FloatToBf16Ref(float value) {
  uint32_t bits = FloatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t FloatToF16Ref(float value) {
  uint32_t bits = FloatBits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {  // NaN: quiet, keep sign and the top payload bits
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (magnitude >= 0x38800000u) {  // normal in FP16 (>= 2^-14)
    uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to zero
  // Subnormal in FP16: the value in units of 2^-24, rounded to nearest even.
  uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126u - (magnitude >> 23);  // 14..24
  uint32_t result = significand >> shift;
  uint32_t remainder = significand & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (remainder > half || (remainder == half && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

uint8_t FloatToFp8Ref(float value, Fp8Format format, Saturation saturation) {
  const Fp8Params& p = ParamsFor(format);
  uint32_t bits = FloatBits(value);
  uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7F;  // every NaN becomes the canonical NaN
  if (magnitude <= p.half_min_subnormal) return sign;
  if (magnitude > p.overflow_above) {
    return static_cast<uint8_t>(
        sign | (saturation == Saturation::kSaturateFinite ? p.max_finite : p.overflow_code));
  }
  int drop = 23 - p.mantissa_bits;  // float mantissa bits below the FP8 mantissa
  uint32_t result;
  uint32_t remainder;
  uint32_t half;
  if (magnitude >= p.min_normal) {
    int exponent = static_cast<int>(magnitude >> 23) - 127 + p.bias;
    uint32_t mantissa = (magnitude >> drop) & ((1u << p.mantissa_bits) - 1u);
    result = (static_cast<uint32_t>(exponent) << p.mantissa_bits) | mantissa;
    remainder = magnitude & ((1u << drop) - 1u);
    half = 1u << (drop - 1);
  } else {                                                            // subnormal in FP8
    int exponent = static_cast<int>(magnitude >> 23) - 127 + p.bias;  // <= 0
    int shift = drop + 1 - exponent;
    uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    result = significand >> shift;
    remainder = significand & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
  }
  if (remainder > half || (remainder == half && (result & 1u))) ++result;
  return static_cast<uint8_t>(sign | result);
}

float Bf16ToFloat(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

float F16ToFloat(uint16_t bits) {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // Subnormal or zero: mantissa * 2^-24 is exact in FP32.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

float Fp8ToFloat(uint8_t bits, Fp8Format format) {
  return format == Fp8Format::kE4M3 ? kE4M3Table[bits] : kE5M2Table[bits];
}

float Fp8MaxFinite(Fp8Format format) { return format == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

void ConvertBf16Ref(std::span<const float> in, std::span<uint16_t> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = FloatToBf16Ref(in[i]);
}

void ConvertF16Ref(std::span<const float> in, std::span<uint16_t> out) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = FloatToF16Ref(in[i]);
}

void ConvertFp8RefBulk(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                       Saturation saturation, float divisor) {
  assert(in.size() == out.size());
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = FloatToFp8Ref(in[i] / divisor, format, saturation);
}

void ConvertBf16(std::span<const float> in, std::span<uint16_t> out) {
  if (kUseSimd) return detail::ConvertBf16Avx2(in, out);
  ConvertBf16Ref(in, out);
}

void ConvertF16(std::span<const float> in, std::span<uint16_t> out) {
  if (kUseSimd) return detail::ConvertF16Avx2(in, out);
  ConvertF16Ref(in, out);
}

void ConvertFp8(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                Saturation saturation, float divisor) {
  if (kUseSimd) return detail::ConvertFp8Avx2(in, out, format, saturation, divisor);
  ConvertFp8RefBulk(in, out, format, saturation, divisor);
}

float AbsMaxRef(std::span<const float> values) {
  float result = 0.0f;
  for (float v : values) {
    float magnitude = std::fabs(v);
    result = magnitude > result ? magnitude : result;  // false for NaN: skipped
  }
  return result;
}

float AbsMax(std::span<const float> values) {
  if (kUseSimd) return detail::AbsMaxAvx2(values);
  return AbsMaxRef(values);
}

void ConvertToFloat(DType dtype, std::span<const uint8_t> in, std::span<float> out) {
  const size_t n = out.size();
  assert(in.size() == n * Info(dtype).size);
  auto load = [&]<typename T>(size_t i, T*) {
    T value;
    std::memcpy(&value, in.data() + i * sizeof(T), sizeof(T));
    return value;
  };
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32:
        out[i] = load(i, static_cast<float*>(nullptr));
        break;
      case DType::kF64:
        out[i] = static_cast<float>(load(i, static_cast<double*>(nullptr)));
        break;
      case DType::kBF16:
        out[i] = Bf16ToFloat(load(i, static_cast<uint16_t*>(nullptr)));
        break;
      case DType::kF16:
        out[i] = F16ToFloat(load(i, static_cast<uint16_t*>(nullptr)));
        break;
      case DType::kF8E4M3:
        out[i] = Fp8ToFloat(in[i], Fp8Format::kE4M3);
        break;
      case DType::kF8E5M2:
        out[i] = Fp8ToFloat(in[i], Fp8Format::kE5M2);
        break;
      case DType::kI8:
        out[i] = static_cast<int8_t>(in[i]);
        break;
      case DType::kU8:
        out[i] = in[i];
        break;
      case DType::kBool:
        out[i] = in[i] != 0 ? 1.0f : 0.0f;
        break;
      case DType::kI16:
        out[i] = load(i, static_cast<int16_t*>(nullptr));
        break;
      case DType::kU16:
        out[i] = load(i, static_cast<uint16_t*>(nullptr));
        break;
      case DType::kI32:
        out[i] = static_cast<float>(load(i, static_cast<int32_t*>(nullptr)));
        break;
      case DType::kU32:
        out[i] = static_cast<float>(load(i, static_cast<uint32_t*>(nullptr)));
        break;
      case DType::kI64:
        out[i] = static_cast<float>(load(i, static_cast<int64_t*>(nullptr)));
        break;
      case DType::kU64:
        out[i] = static_cast<float>(load(i, static_cast<uint64_t*>(nullptr)));
        break;
    }
  }
}

}  // namespace weft::sync
