#include "sync/convert.h"
#include "tests/source_dir.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#ifdef WEFT_HAVE_CUDA_REFERENCE
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace weft::sync {
namespace {

bool IsNan(uint32_t bits) { return (bits & 0x7FFFFFFFu) > 0x7F800000u; }

// Bit patterns that exercise every rounding case: specials, subnormals, ties and near-ties at the
// rounding position of each format, the FP8 and FP16 boundaries, and random patterns.
std::vector<uint32_t> EdgePatterns() {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF,
                                0xFFFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                                0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7FA00000, 0xFFA12345};
  std::mt19937_64 rng(7);
  for (int exponent = 0; exponent < 256; ++exponent) {
    for (uint32_t sign : {0u, 1u}) {
      uint32_t base = (sign << 31) | (static_cast<uint32_t>(exponent) << 23);
      // Ties and neighbours at the rounding position of 2-, 3-, 7- and 10-bit mantissas.
      for (int kept : {2, 3, 7, 10}) {
        uint32_t half = 1u << (22 - kept);
        for (uint32_t high = 0; high < 4; ++high) {
          uint32_t top = (high << (23 - kept)) |
                         (static_cast<uint32_t>(rng()) & 0x7FFFFFu & ~((2u << (22 - kept)) - 1));
          for (uint32_t low : {half - 1, half, half + 1, 0u, 2 * half - 1}) {
            bits.push_back(base | ((top | low) & 0x7FFFFFu));
          }
        }
      }
      bits.push_back(base);
      bits.push_back(base | 0x7FFFFF);
    }
  }
  for (float f : {448.0f, 464.0f, 463.99997f, 464.00003f, 480.0f, 57344.0f, 61440.0f, 61439.996f,
                  65504.0f, 65520.0f, 65519.996f, 0.0009765625f, 0.001953125f, 1.52587890625e-05f,
                  7.62939453125e-06f, 5.960464477539063e-08f, 2.9802322387695312e-08f}) {
    for (float s : {1.0f, -1.0f}) {
      uint32_t b;
      float v = f * s;
      std::memcpy(&b, &v, 4);
      for (int d = -2; d <= 2; ++d) bits.push_back(b + static_cast<uint32_t>(d));
    }
  }
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  return bits;
}

std::vector<float> AsFloats(const std::vector<uint32_t>& bits) {
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * 4);
  return values;
}

// Every bulk conversion on `in`, SIMD against the scalar reference, bit for bit.
void RequireSimdMatchesScalar(std::span<const float> in, float divisor = 1.0f) {
  std::vector<uint16_t> a(in.size()), b(in.size());
  ConvertBf16(in, a);
  ConvertBf16Ref(in, b);
  REQUIRE(a == b);
  ConvertF16(in, a);
  ConvertF16Ref(in, b);
  REQUIRE(a == b);
  std::vector<uint8_t> c(in.size()), d(in.size());
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (Saturation saturation : {Saturation::kSaturateFinite, Saturation::kNoSaturate}) {
      ConvertFp8(in, c, format, saturation, divisor);
      ConvertFp8RefBulk(in, d, format, saturation, divisor);
      REQUIRE(c == d);
    }
  }
}

TEST_CASE("BF16 rounding: known values") {
  CHECK(FloatToBf16Ref(1.0f) == 0x3F80);
  CHECK(FloatToBf16Ref(-2.0f) == 0xC000);
  CHECK(FloatToBf16Ref(BitsToFloat(0x3F808000)) == 0x3F80);  // tie to even (down)
  CHECK(FloatToBf16Ref(BitsToFloat(0x3F818000)) == 0x3F82);  // tie to even (up)
  CHECK(FloatToBf16Ref(BitsToFloat(0x3F808001)) == 0x3F81);
  CHECK(FloatToBf16Ref(BitsToFloat(0x7F7FFFFF)) == 0x7F80);  // max float rounds to infinity
  CHECK(FloatToBf16Ref(-0.0f) == 0x8000);
  CHECK(FloatToBf16Ref(BitsToFloat(0x7F800001)) == 0x7FC0);  // signalling NaN is quieted
  CHECK(FloatToBf16Ref(BitsToFloat(0xFFA00000)) == 0xFFE0);  // sign and payload kept
}

TEST_CASE("FP16 rounding: known values") {
  CHECK(FloatToF16Ref(1.0f) == 0x3C00);
  CHECK(FloatToF16Ref(65504.0f) == 0x7BFF);
  CHECK(FloatToF16Ref(65519.996f) == 0x7BFF);
  CHECK(FloatToF16Ref(65520.0f) == 0x7C00);
  CHECK(FloatToF16Ref(-INFINITY) == 0xFC00);
  CHECK(FloatToF16Ref(5.960464477539063e-08f) == 0x0001);   // smallest subnormal
  CHECK(FloatToF16Ref(2.9802322387695312e-08f) == 0x0000);  // half of it: tie to even zero
  CHECK(FloatToF16Ref(-2.9802322387695312e-08f) == 0x8000);
  CHECK(FloatToF16Ref(6.097555160522461e-05f) == 0x03FF);  // largest subnormal
}

TEST_CASE("FP8 rounding: known values") {
  using enum Fp8Format;
  using enum Saturation;
  CHECK(FloatToFp8Ref(448.0f, kE4M3, kSaturateFinite) == 0x7E);
  CHECK(FloatToFp8Ref(464.0f, kE4M3, kSaturateFinite) == 0x7E);  // tie to even stays at 448
  CHECK(FloatToFp8Ref(500.0f, kE4M3, kNoSaturate) == 0x7F);
  CHECK(FloatToFp8Ref(-500.0f, kE4M3, kNoSaturate) == 0xFF);
  CHECK(FloatToFp8Ref(INFINITY, kE4M3, kSaturateFinite) == 0x7E);
  CHECK(FloatToFp8Ref(-INFINITY, kE5M2, kNoSaturate) == 0xFC);
  CHECK(FloatToFp8Ref(61440.0f, kE5M2, kSaturateFinite) == 0x7B);
  CHECK(FloatToFp8Ref(61440.0f, kE5M2, kNoSaturate) == 0x7C);
  CHECK(FloatToFp8Ref(std::nanf(""), kE5M2, kSaturateFinite) == 0x7F);
  CHECK(FloatToFp8Ref(-std::nanf(""), kE4M3, kNoSaturate) == 0x7F);
  CHECK(FloatToFp8Ref(-0.0f, kE4M3, kNoSaturate) == 0x80);
  CHECK(FloatToFp8Ref(0.0009765625f, kE4M3, kNoSaturate) == 0x00);  // 2^-10: tie to zero
  CHECK(FloatToFp8Ref(0.001953125f, kE4M3, kNoSaturate) == 0x01);   // 2^-9: min subnormal
}

TEST_CASE("narrowing then widening returns every non-NaN code") {
  for (uint32_t code = 0; code < 65536; ++code) {
    uint16_t c = static_cast<uint16_t>(code);
    float bf = Bf16ToFloat(c);
    float half = F16ToFloat(c);
    if (std::isnan(bf)) {
      CHECK(std::isnan(Bf16ToFloat(FloatToBf16Ref(bf))));
    } else {
      REQUIRE(FloatToBf16Ref(bf) == c);
    }
    if (std::isnan(half)) {
      CHECK(std::isnan(F16ToFloat(FloatToF16Ref(half))));
    } else {
      REQUIRE(FloatToF16Ref(half) == c);
    }
  }
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (int code = 0; code < 256; ++code) {
      float value = Fp8ToFloat(static_cast<uint8_t>(code), format);
      if (std::isnan(value)) continue;
      if (std::isinf(value)) {
        CHECK(FloatToFp8Ref(value, format, Saturation::kNoSaturate) == code);
        continue;
      }
      REQUIRE(FloatToFp8Ref(value, format, Saturation::kNoSaturate) == code);
      REQUIRE(FloatToFp8Ref(value, format, Saturation::kSaturateFinite) == code);
    }
  }
  CHECK(Fp8ToFloat(0x7E, Fp8Format::kE4M3) == 448.0f);
  CHECK(Fp8ToFloat(0x7B, Fp8Format::kE5M2) == 57344.0f);
  CHECK(std::isnan(Fp8ToFloat(0xFF, Fp8Format::kE4M3)));
}

TEST_CASE("PyTorch reference: BF16 and FP16 bit for bit") {
  std::ifstream in(weft::testing::TestDataDir() + "/torch_conversions.bin", std::ios::binary);
  REQUIRE(in.good());
  uint32_t count = 0;
  in.read(reinterpret_cast<char*>(&count), 4);
  REQUIRE(count > 20000);
  std::vector<float> inputs(count);
  std::vector<uint16_t> bf16(count), f16(count);
  in.read(reinterpret_cast<char*>(inputs.data()), count * 4);
  in.read(reinterpret_cast<char*>(bf16.data()), count * 2);
  in.read(reinterpret_cast<char*>(f16.data()), count * 2);
  REQUIRE(in.good());
  std::vector<uint16_t> ours(count);
  int mismatches = 0;
  for (uint32_t i = 0; i < count; ++i) {
    mismatches += FloatToBf16Ref(inputs[i]) != bf16[i];
    mismatches += FloatToF16Ref(inputs[i]) != f16[i];
  }
  CHECK(mismatches == 0);
  ConvertBf16(inputs, ours);
  CHECK(ours == bf16);
  ConvertF16(inputs, ours);
  CHECK(ours == f16);
}

TEST_CASE("NaN stays NaN with its sign") {
  for (uint32_t bits : {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0xFFFFFFFFu, 0x7FA5A5A5u}) {
    float nan = BitsToFloat(bits);
    uint16_t b = FloatToBf16Ref(nan);
    uint16_t h = FloatToF16Ref(nan);
    CHECK(std::isnan(Bf16ToFloat(b)));
    CHECK(std::isnan(F16ToFloat(h)));
    CHECK((b >> 15) == (bits >> 31));
    CHECK((h >> 15) == (bits >> 31));
  }
}

TEST_CASE("SIMD conversions equal the scalar references on every edge case and tail length") {
  std::vector<float> values = AsFloats(EdgePatterns());
  for (float divisor : {1.0f, 0.0004464f, 3.0f, 1e-30f}) RequireSimdMatchesScalar(values, divisor);
  // Every length up to a few vectors, at every offset of the first element.
  for (size_t offset = 0; offset < 3; ++offset) {
    for (size_t n = 0; n < 70; ++n) {
      RequireSimdMatchesScalar(std::span<const float>(values).subspan(1000 + offset, n));
    }
  }
}

TEST_CASE("AbsMax ignores NaN, sees infinities and negative values, and equals its reference") {
  std::vector<float> values = AsFloats(EdgePatterns());
  CHECK(AbsMax(values) == AbsMaxRef(values));
  CHECK(std::isinf(AbsMax(values)));
  std::vector<float> small = {NAN, -3.0f, 2.0f, NAN, -0.0f};
  for (size_t n = 0; n <= small.size(); ++n) {
    CHECK(AbsMax(std::span<const float>(small).first(n)) ==
          AbsMaxRef(std::span<const float>(small).first(n)));
  }
  CHECK(AbsMax(small) == 3.0f);
  std::vector<float> many(1000, 0.5f);
  many[997] = -7.0f;
  many[3] = NAN;
  CHECK(AbsMax(many) == 7.0f);
}

#ifdef WEFT_HAVE_CUDA_REFERENCE
TEST_CASE("NVIDIA reference (cuda_fp8.h, cuda_fp16.h, cuda_bf16.h on the host): bit for bit") {
  std::vector<uint32_t> patterns = EdgePatterns();
  // A strided sweep over all 2^32 patterns as well.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4093)
    patterns.push_back(static_cast<uint32_t>(bits));
  int fp8_mismatches = 0, half_mismatches = 0, bf16_mismatches = 0;
  for (uint32_t bits : patterns) {
    float x = BitsToFloat(bits);
    for (auto [format, interpretation] :
         {std::pair{Fp8Format::kE4M3, __NV_E4M3}, std::pair{Fp8Format::kE5M2, __NV_E5M2}}) {
      fp8_mismatches += FloatToFp8Ref(x, format, Saturation::kSaturateFinite) !=
                        __nv_cvt_float_to_fp8(x, __NV_SATFINITE, interpretation);
      fp8_mismatches += FloatToFp8Ref(x, format, Saturation::kNoSaturate) !=
                        __nv_cvt_float_to_fp8(x, __NV_NOSAT, interpretation);
    }
    if (IsNan(bits)) continue;  // CUDA's host paths return one canonical NaN for both formats
    __half_raw half = __half_raw(__float2half_rn(x));
    half_mismatches += FloatToF16Ref(x) != half.x;
    __nv_bfloat16_raw bf = __nv_bfloat16_raw(__float2bfloat16_rn(x));
    bf16_mismatches += FloatToBf16Ref(x) != bf.x;
  }
  CHECK(fp8_mismatches == 0);
  CHECK(half_mismatches == 0);
  CHECK(bf16_mismatches == 0);
}
#endif

// All 2^32 inputs; about a minute. Run with: weft_sync_tests -tc='*exhaustive*' --no-skip
TEST_CASE("exhaustive: SIMD equals scalar for all 2^32 inputs" * doctest::skip()) {
  constexpr size_t kBlock = 1 << 16;
  std::vector<uint32_t> bits(kBlock);
  for (uint64_t start = 0; start < (uint64_t{1} << 32); start += kBlock) {
    for (size_t i = 0; i < kBlock; ++i) bits[i] = static_cast<uint32_t>(start + i);
    RequireSimdMatchesScalar({reinterpret_cast<const float*>(bits.data()), kBlock});
  }
}

}  // namespace
}  // namespace weft::sync
