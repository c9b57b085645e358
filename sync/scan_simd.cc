#include "sync/scan_simd.h"

#include <algorithm>
#include <bit>

#include "sync/convert_simd.h"
#include "sync/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft::sync::detail {
namespace {

// Appends base + (bit index) / kUnitBytes for every set bit of `mask` at offsets[size...] and
// returns the new size. Changes are rare and scattered, so a loop over the set bits mispredicts at
// every block: the first four are written unconditionally (entries past the last real one are
// overwritten later; offsets needs four spare entries) and only masks with more take a branch.
template <uint32_t kUnitBytes>
inline size_t AppendSetBits(uint64_t mask, uint32_t base, uint32_t* offsets, size_t size) {
  const int changed = std::popcount(mask);
  for (int t = 0; t < 4; ++t) {
    offsets[size + t] = base + static_cast<uint32_t>(std::countr_zero(mask)) / kUnitBytes;
    mask &= mask - 1;
  }
  if (changed > 4) {
    size_t extra = size + 4;
    while (mask != 0) {
      offsets[extra++] = base + static_cast<uint32_t>(std::countr_zero(mask)) / kUnitBytes;
      mask &= mask - 1;
    }
  }
  return size + static_cast<size_t>(changed);
}

// Finishes a window of changes found by a SIMD scan: for the change offsets[k] (k < count),
// element offsets[k] - element_base of `old_units` and `new_units` are its old and new values.
// Writes each residual and returns the digest change (summed in batches, SIMD when available) of
// elements at tensor index first_index + offsets[k]; counts are at most kWindowUnits.
inline constexpr uint32_t kWindowUnits = 4096;  // units whose changes are finished while in L1

template <typename T>
Digest FinishWindow(KeyKind kind, const uint8_t* old_units, const uint8_t* new_units,
                    const uint32_t* offsets, uint32_t* residuals, size_t count,
                    uint32_t element_base, uint64_t first_index, bool want_digest) {
  uint32_t before[kWindowUnits], after[kWindowUnits];
  for (size_t k = 0; k < count; ++k) {
    const uint32_t element = offsets[k] - element_base;
    T x, y;
    std::memcpy(&x, old_units + size_t{element} * sizeof(T), sizeof(T));
    std::memcpy(&y, new_units + size_t{element} * sizeof(T), sizeof(T));
    residuals[k] = static_cast<uint32_t>(Residual<T>(kind, x, y));
    before[k] = x;
    after[k] = y;
  }
  return want_digest ? SumElementChanges(first_index, offsets, before, after, count) : Digest{};
}

#if defined(__x86_64__)

// Returns a mask with bit b set when byte b of the 64-byte blocks differ at an element boundary:
// one bit per element, at the element's first byte.
template <typename T>
WEFT_TARGET_AVX2 inline uint64_t DiffMask64(const uint8_t* a, const uint8_t* b) {
  __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
  __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
  __m256i e0, e1;
  uint64_t lanes;
  if constexpr (sizeof(T) == 1) {
    e0 = _mm256_cmpeq_epi8(a0, b0);
    e1 = _mm256_cmpeq_epi8(a1, b1);
    lanes = ~uint64_t{0};
  } else if constexpr (sizeof(T) == 2) {
    e0 = _mm256_cmpeq_epi16(a0, b0);
    e1 = _mm256_cmpeq_epi16(a1, b1);
    lanes = 0x5555555555555555ull;
  } else {
    e0 = _mm256_cmpeq_epi32(a0, b0);
    e1 = _mm256_cmpeq_epi32(a1, b1);
    lanes = 0x1111111111111111ull;
  }
  uint64_t equal = static_cast<uint32_t>(_mm256_movemask_epi8(e0)) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(e1))) << 32);
  return ~equal & lanes;
}

template <typename T>
WEFT_TARGET_AVX2 void ScanAvx2Of(KeyKind kind, const uint8_t* old_bytes, const uint8_t* new_bytes,
                                 uint32_t count, uint32_t offset_base, uint64_t index_base,
                                 ChangeList* changes, Digest* digest_change) {
  constexpr uint32_t kPerBlock = 64 / sizeof(T);
  constexpr uint32_t kWindow = kWindowUnits;
  const uint32_t blocks_end = count - count % kPerBlock;
  size_t size = changes->size();
  // Room for every element plus the unconditional writes past the last change.
  changes->offsets.resize(size + count + 4);
  changes->residuals.resize(size + count + 4);
  uint32_t* offsets = changes->offsets.data();
  uint32_t* residuals = changes->residuals.data();
  Digest digest;
  uint32_t j = 0;
  while (j < blocks_end) {
    const size_t window_start = size;
    const uint32_t window_end = std::min(blocks_end, j + kWindow);
    for (; j < window_end; j += kPerBlock) {
      const uint8_t* a = old_bytes + size_t{j} * sizeof(T);
      const uint8_t* b = new_bytes + size_t{j} * sizeof(T);
      _mm_prefetch(reinterpret_cast<const char*>(a) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b) + kPrefetchBytes, _MM_HINT_T0);
      size = AppendSetBits<sizeof(T)>(DiffMask64<T>(a, b), offset_base + j, offsets, size);
    }
    digest += FinishWindow<T>(kind, old_bytes, new_bytes, offsets + window_start,
                              residuals + window_start, size - window_start, offset_base,
                              index_base - offset_base, digest_change != nullptr);
  }
  changes->offsets.resize(size);
  changes->residuals.resize(size);
  if (digest_change != nullptr) *digest_change += digest;
  ScanScalar<T>(kind, old_bytes, new_bytes, blocks_end, count, offset_base, index_base, changes,
                digest_change);
}

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from an "undefined" register, which -Wmaybe-uninitialized
// and -Wuninitialized report at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// FP32 -> BF16 round to nearest even on 16 lanes (the low half of each 32-bit lane), exactly as
// FloatToBf16Ref: integer rounding, so subnormals and NaN payloads come out right.
WEFT_TARGET_AVX512 inline __m512i Bf16Round16(const float* source) {
  const __m512i bits = _mm512_loadu_si512(source);
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x0040)));
}

}  // namespace

WEFT_TARGET_AVX512 void ScanFromMasterBf16Avx512(const float* master, uint8_t* served_bytes,
                                                 uint32_t count, uint32_t offset_base,
                                                 uint64_t index_base, ChangeList* changes,
                                                 Digest* digest_change) {
  constexpr uint32_t kPerBlock = 32;
  constexpr uint32_t kWindow = kWindowUnits;
  uint16_t* served = reinterpret_cast<uint16_t*>(served_bytes);
  // Word indices that gather the low 16 bits of the 32 lanes of two vectors.
  const __m512i pick_low =
      _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                       24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  alignas(64) uint16_t fresh[kWindow];
  const uint32_t blocks_end = count - count % kPerBlock;
  size_t size = changes->size();
  changes->offsets.resize(size + count + 4);
  changes->residuals.resize(size + count + 4);
  uint32_t* offsets = changes->offsets.data();
  uint32_t* residuals = changes->residuals.data();
  Digest digest;
  uint32_t j = 0;
  while (j < blocks_end) {
    const size_t window_start = size;
    const uint32_t window_begin = j;
    const uint32_t window_end = std::min(blocks_end, j + kWindow);
    for (; j < window_end; j += kPerBlock) {
      _mm_prefetch(reinterpret_cast<const char*>(master + j) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(master + j + 16) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(served + j) + kPrefetchBytes, _MM_HINT_T0);
      const __m512i converted = _mm512_permutex2var_epi16(Bf16Round16(master + j), pick_low,
                                                          Bf16Round16(master + j + 16));
      _mm512_store_si512(fresh + (j - window_begin), converted);
      const uint64_t mask = _mm512_cmpneq_epi16_mask(converted, _mm512_loadu_si512(served + j));
      size = AppendSetBits<1>(mask, offset_base + j, offsets, size);
    }
    // The old values are still in `served` (window-relative), the new ones in `fresh`.
    const size_t window_changes = size - window_start;
    digest +=
        FinishWindow<uint16_t>(KeyKind::kFloat, served_bytes + size_t{window_begin} * 2,
                               reinterpret_cast<const uint8_t*>(fresh), offsets + window_start,
                               residuals + window_start, window_changes, offset_base + window_begin,
                               index_base - offset_base, digest_change != nullptr);
    for (size_t k = 0; k < window_changes; ++k) {
      const uint32_t element = offsets[window_start + k] - offset_base;
      served[element] = fresh[element - window_begin];
    }
  }
  changes->offsets.resize(size);
  changes->residuals.resize(size);
  if (digest_change != nullptr) *digest_change += digest;
  ScanFromMasterBf16Ref(master + blocks_end, served_bytes + size_t{blocks_end} * 2,
                        count - blocks_end, offset_base + blocks_end, index_base + blocks_end,
                        changes, digest_change);
}

void ScanAvx2(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
              uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
              Digest* digest_change) {
  switch (width) {
    case 1:
      return ScanAvx2Of<uint8_t>(kind, old_bytes, new_bytes, count, offset_base, index_base,
                                 changes, digest_change);
    case 2:
      return ScanAvx2Of<uint16_t>(kind, old_bytes, new_bytes, count, offset_base, index_base,
                                  changes, digest_change);
    default:
      return ScanAvx2Of<uint32_t>(kind, old_bytes, new_bytes, count, offset_base, index_base,
                                  changes, digest_change);
  }
}

#else  // not x86-64: the scalar references

}  // namespace

void ScanAvx2(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
              uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
              Digest* digest_change) {
  ScanChangesRef(kind, width, old_bytes, new_bytes, count, offset_base, index_base, changes,
                 digest_change);
}

void ScanFromMasterBf16Avx512(const float* master, uint8_t* served, uint32_t count,
                              uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                              Digest* digest_change) {
  ScanFromMasterBf16Ref(master, served, count, offset_base, index_base, changes, digest_change);
}
#endif

}  // namespace weft::sync::detail
