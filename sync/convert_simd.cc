#include "sync/convert_simd.h"

#include "sync/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft::sync::detail {

#if defined(__x86_64__)

namespace {

WEFT_TARGET_AVX2 inline __m256i Bf16Convert8(const float* source) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(source));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

}  // namespace

WEFT_TARGET_AVX2 void ConvertBf16Avx2(std::span<const float> in, std::span<uint16_t> out) {
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(in.data() + i) + kPrefetchBytes, _MM_HINT_T0);
    __m256i low = Bf16Convert8(in.data() + i);
    __m256i high = Bf16Convert8(in.data() + i + 8);
    // packus works within 128-bit lanes; the permute restores element order.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + i), packed);
  }
  for (; i < n; ++i) out[i] = FloatToBf16Ref(in[i]);
}

WEFT_TARGET_AVX2 void ConvertF16Avx2(std::span<const float> in, std::span<uint16_t> out) {
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(in.data() + i) + kPrefetchBytes, _MM_HINT_T0);
    __m256 values = _mm256_loadu_ps(in.data() + i);
    __m128i halves = _mm256_cvtps_ph(values, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data() + i), halves);
  }
  for (; i < n; ++i) out[i] = FloatToF16Ref(in[i]);
}

WEFT_TARGET_AVX2 float AbsMaxAvx2(std::span<const float> values) {
  const size_t n = values.size();
  const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(values.data() + i) + kPrefetchBytes, _MM_HINT_T0);
    // max_ps returns its second operand when the first is NaN, so NaNs are skipped.
    a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(values.data() + i), sign_off), a);
    b = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(values.data() + i + 8), sign_off), b);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(a, b));
  float result = AbsMaxRef(values.subspan(i));
  for (float lane : lanes) result = lane > result ? lane : result;
  return result;
}

namespace {

// Branch-free FP8 rounding on eight floats at once; mirrors FloatToFp8Ref case by case.
template <int kMantissaBits, int kBias>
WEFT_TARGET_AVX2 inline __m256i Fp8Convert8(__m256 values, uint32_t min_normal,
                                            uint32_t overflow_above, uint32_t overflow_result,
                                            __m256 subnormal_magic) {
  constexpr int kDrop = 23 - kMantissaBits;
  __m256i bits = _mm256_castps_si256(values);
  __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  // Normal range: rebias the exponent, then round to nearest even by adding (half - 1 + lsb).
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(magnitude, kDrop), _mm256_set1_epi32(1));
  __m256i normal =
      _mm256_add_epi32(_mm256_sub_epi32(magnitude, _mm256_set1_epi32((127 - kBias) << 23)),
                       _mm256_add_epi32(_mm256_set1_epi32((1 << (kDrop - 1)) - 1), lsb));
  normal = _mm256_srli_epi32(normal, kDrop);
  // Subnormal range (and zero): adding 2^k whose ulp is the FP8 subnormal step rounds to nearest
  // even in hardware; the low bits of the sum are the FP8 code.
  __m256 absolute = _mm256_castsi256_ps(magnitude);
  __m256i subnormal =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(absolute, subnormal_magic)),
                       _mm256_castps_si256(subnormal_magic));
  __m256i is_normal =
      _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(static_cast<int>(min_normal - 1)));
  __m256i result = _mm256_blendv_epi8(subnormal, normal, is_normal);
  __m256i overflows =
      _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(static_cast<int>(overflow_above)));
  result =
      _mm256_blendv_epi8(result, _mm256_set1_epi32(static_cast<int>(overflow_result)), overflows);
  result = _mm256_or_si256(result, sign);
  __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(result, _mm256_set1_epi32(0x7F), is_nan);
}

template <int kMantissaBits, int kBias>
WEFT_TARGET_AVX2 void ConvertFp8Loop(std::span<const float> in, std::span<uint8_t> out,
                                     Fp8Format format, Saturation saturation, float divisor,
                                     uint32_t min_normal, uint32_t overflow_above,
                                     uint32_t max_finite, uint32_t overflow_code, float magic) {
  const size_t n = in.size();
  const uint32_t overflow_result =
      saturation == Saturation::kSaturateFinite ? max_finite : overflow_code;
  const __m256 subnormal_magic = _mm256_set1_ps(magic);
  const __m256 scale = _mm256_set1_ps(divisor);
  const bool divide = divisor != 1.0f;
  size_t i = 0;
  const __m256i shuffle =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(in.data() + i) + kPrefetchBytes, _MM_HINT_T0);
    __m256 values = _mm256_loadu_ps(in.data() + i);
    if (divide) values = _mm256_div_ps(values, scale);
    __m256i codes = Fp8Convert8<kMantissaBits, kBias>(values, min_normal, overflow_above,
                                                      overflow_result, subnormal_magic);
    __m256i bytes = _mm256_shuffle_epi8(codes, shuffle);
    uint32_t low = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 0));
    uint32_t high = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 4));
    uint64_t packed = low | (static_cast<uint64_t>(high) << 32);
    __builtin_memcpy(out.data() + i, &packed, 8);
  }
  for (; i < n; ++i) out[i] = FloatToFp8Ref(in[i] / divisor, format, saturation);
}

}  // namespace

void ConvertFp8Avx2(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                    Saturation saturation, float divisor) {
  // magic = 2^(23 + log2(min subnormal)): E4M3 min subnormal 2^-9, E5M2 2^-16.
  if (format == Fp8Format::kE4M3) {
    ConvertFp8Loop<3, 7>(in, out, format, saturation, divisor, 0x3C800000u, 0x43E80000u, 0x7E, 0x7F,
                         16384.0f);
  } else {
    ConvertFp8Loop<2, 15>(in, out, format, saturation, divisor, 0x38800000u, 0x476FFFFFu, 0x7B,
                          0x7C, 128.0f);
  }
}

#else  // not x86-64: scalar references only

float AbsMaxAvx2(std::span<const float> values) { return AbsMaxRef(values); }
void ConvertBf16Avx2(std::span<const float> in, std::span<uint16_t> out) {
  ConvertBf16Ref(in, out);
}
void ConvertF16Avx2(std::span<const float> in, std::span<uint16_t> out) { ConvertF16Ref(in, out); }
void ConvertFp8Avx2(std::span<const float> in, std::span<uint8_t> out, Fp8Format format,
                    Saturation saturation, float divisor) {
  ConvertFp8RefBulk(in, out, format, saturation, divisor);
}

#endif

}  // namespace weft::sync::detail
