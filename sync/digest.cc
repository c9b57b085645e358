#include "sync/digest.h"

#include <cstring>
#include <vector>

#include "common/parallel.h"
#include "sync/cpu.h"
#include "sync/digest_simd.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from an "undefined" register, which -Wmaybe-uninitialized
// and -Wuninitialized report at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace weft::sync {
namespace {

template <typename T>
Digest SumTerms(const uint8_t* bytes, size_t count, uint64_t first_index) {
  Digest sum;
  for (size_t j = 0; j < count; ++j) {
    T value;
    std::memcpy(&value, bytes + j * sizeof(T), sizeof(T));
    sum += ElementTerm(digest_detail::PositionKey(first_index + j), static_cast<uint64_t>(value));
  }
  return sum;
}

#if defined(__x86_64__)

// Eight elements of T from `bytes`, zero-extended to 64 bits.
template <typename T>
WEFT_TARGET_AVX512 inline __m512i LoadElements8(const uint8_t* bytes) {
  if constexpr (sizeof(T) == 1) {
    return _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  } else if constexpr (sizeof(T) == 2) {
    return _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  } else if constexpr (sizeof(T) == 4) {
    return _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
  } else {
    return _mm512_loadu_si512(bytes);
  }
}

template <typename T>
WEFT_TARGET_AVX512 Digest SumTermsAvx512(const uint8_t* bytes, size_t count, uint64_t first_index) {
  using namespace digest_detail;
  __m512i index = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first_index)),
                                   _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
  const __m512i eight = _mm512_set1_epi64(8);
  DigestLanes sum = ZeroLanes();
  size_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const DigestLanes terms =
        ElementTerms8(PositionKeys8(index), LoadElements8<T>(bytes + j * sizeof(T)));
    sum.lane0 = _mm512_add_epi64(sum.lane0, terms.lane0);
    sum.lane1 = _mm512_add_epi64(sum.lane1, terms.lane1);
    index = _mm512_add_epi64(index, eight);
  }
  return ReduceLanes(sum) + SumTerms<T>(bytes + j * sizeof(T), count - j, first_index + j);
}

// Four elements of T from `bytes`, zero-extended to 64 bits.
template <typename T>
WEFT_TARGET_AVX2 inline __m256i LoadElements4(const uint8_t* bytes) {
  if constexpr (sizeof(T) == 1) {
    uint32_t four;
    std::memcpy(&four, bytes, 4);
    return _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(static_cast<int>(four)));
  } else if constexpr (sizeof(T) == 2) {
    return _mm256_cvtepu16_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  } else if constexpr (sizeof(T) == 4) {
    return _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes));
  }
}

template <typename T>
WEFT_TARGET_AVX2 Digest SumTermsAvx2(const uint8_t* bytes, size_t count, uint64_t first_index) {
  using namespace digest_detail;
  __m256i index = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first_index)),
                                   _mm256_set_epi64x(3, 2, 1, 0));
  const __m256i four = _mm256_set1_epi64x(4);
  DigestLanes4 sum{_mm256_setzero_si256(), _mm256_setzero_si256()};
  size_t j = 0;
  for (; j + 4 <= count; j += 4) {
    const DigestLanes4 terms =
        ElementTerms4(PositionKeys4(index), LoadElements4<T>(bytes + j * sizeof(T)));
    sum.lane0 = _mm256_add_epi64(sum.lane0, terms.lane0);
    sum.lane1 = _mm256_add_epi64(sum.lane1, terms.lane1);
    index = _mm256_add_epi64(index, four);
  }
  return ReduceLanes4(sum) + SumTerms<T>(bytes + j * sizeof(T), count - j, first_index + j);
}

WEFT_TARGET_AVX2 Digest SumElementChangesAvx2(uint64_t first, const uint32_t* offsets,
                                              const uint32_t* old_values,
                                              const uint32_t* new_values, size_t n) {
  using namespace digest_detail;
  const __m256i base = _mm256_set1_epi64x(static_cast<long long>(first));
  DigestLanes4 sum{_mm256_setzero_si256(), _mm256_setzero_si256()};
  size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m256i index = _mm256_add_epi64(
        base,
        _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets + j))));
    const __m256i key = PositionKeys4(index);
    const __m256i before =
        _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(old_values + j)));
    const __m256i after =
        _mm256_cvtepu32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(new_values + j)));
    const DigestLanes4 now = ElementTerms4(key, after), was = ElementTerms4(key, before);
    sum.lane0 = _mm256_add_epi64(sum.lane0, _mm256_sub_epi64(now.lane0, was.lane0));
    sum.lane1 = _mm256_add_epi64(sum.lane1, _mm256_sub_epi64(now.lane1, was.lane1));
  }
  return ReduceLanes4(sum) +
         SumElementChangesRef(first, offsets + j, old_values + j, new_values + j, n - j);
}

WEFT_TARGET_AVX512 Digest SumElementChangesAvx512(uint64_t first, const uint32_t* offsets,
                                                  const uint32_t* old_values,
                                                  const uint32_t* new_values, size_t n) {
  using namespace digest_detail;
  const __m512i base = _mm512_set1_epi64(static_cast<long long>(first));
  DigestLanes sum = ZeroLanes();
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m512i index = _mm512_add_epi64(
        base,
        _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets + j))));
    const __m512i before =
        _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(old_values + j)));
    const __m512i after =
        _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(new_values + j)));
    AddElementChanges8(index, before, after, &sum);
  }
  return ReduceLanes(sum) +
         SumElementChangesRef(first, offsets + j, old_values + j, new_values + j, n - j);
}
#endif

}  // namespace

Digest SumElementChangesRef(uint64_t first, const uint32_t* offsets, const uint32_t* old_values,
                            const uint32_t* new_values, size_t n) {
  Digest sum;
  for (size_t j = 0; j < n; ++j)
    sum += ElementChange(first + offsets[j], old_values[j], new_values[j]);
  return sum;
}

Digest SumElementChanges(uint64_t first, const uint32_t* offsets, const uint32_t* old_values,
                         const uint32_t* new_values, size_t n) {
#if defined(__x86_64__)
  if (Cpu().avx512) return SumElementChangesAvx512(first, offsets, old_values, new_values, n);
  if (Cpu().avx2) return SumElementChangesAvx2(first, offsets, old_values, new_values, n);
#endif
  return SumElementChangesRef(first, offsets, old_values, new_values, n);
}

std::string Digest::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(32, '0');
  for (int i = 0; i < 16; ++i) {
    hex[15 - i] = kDigits[(lane0 >> (4 * i)) & 0xF];
    hex[31 - i] = kDigits[(lane1 >> (4 * i)) & 0xF];
  }
  return hex;
}

std::optional<Digest> Digest::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  Digest digest;
  for (int i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t nibble;
    if (c >= '0' && c <= '9') {
      nibble = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      nibble = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
    uint64_t& lane = i < 16 ? digest.lane0 : digest.lane1;
    lane = (lane << 4) | nibble;
  }
  return digest;
}

Digest BaseDigest(uint64_t element_count, DType dtype) {
  using namespace digest_detail;
  uint64_t header = element_count ^ (static_cast<uint64_t>(dtype) << 56);
  return Digest{MixA(header ^ 0x243F6A8885A308D3ull), MixB(header ^ 0x13198A2E03707344ull)};
}

Digest ElementsDigest(std::span<const uint8_t> bytes, uint8_t element_size, uint64_t first_index) {
#if defined(__x86_64__)
  if (Cpu().avx512) {
    const size_t count = bytes.size() / element_size;
    switch (element_size) {
      case 1:
        return SumTermsAvx512<uint8_t>(bytes.data(), count, first_index);
      case 2:
        return SumTermsAvx512<uint16_t>(bytes.data(), count, first_index);
      case 4:
        return SumTermsAvx512<uint32_t>(bytes.data(), count, first_index);
      default:
        return SumTermsAvx512<uint64_t>(bytes.data(), count, first_index);
    }
  }
  if (Cpu().avx2) {
    const size_t count = bytes.size() / element_size;
    switch (element_size) {
      case 1:
        return SumTermsAvx2<uint8_t>(bytes.data(), count, first_index);
      case 2:
        return SumTermsAvx2<uint16_t>(bytes.data(), count, first_index);
      case 4:
        return SumTermsAvx2<uint32_t>(bytes.data(), count, first_index);
      default:
        return SumTermsAvx2<uint64_t>(bytes.data(), count, first_index);
    }
  }
#endif
  return ElementsDigestRef(bytes, element_size, first_index);
}

Digest ElementsDigestRef(std::span<const uint8_t> bytes, uint8_t element_size,
                         uint64_t first_index) {
  size_t count = bytes.size() / element_size;
  switch (element_size) {
    case 1:
      return SumTerms<uint8_t>(bytes.data(), count, first_index);
    case 2:
      return SumTerms<uint16_t>(bytes.data(), count, first_index);
    case 4:
      return SumTerms<uint32_t>(bytes.data(), count, first_index);
    default:
      return SumTerms<uint64_t>(bytes.data(), count, first_index);
  }
}

Digest TensorDigest(DType dtype, std::span<const uint8_t> bytes, int threads) {
  const uint8_t size = CodedWidth(dtype);
  const uint64_t count = bytes.size() / size;
  constexpr uint64_t kBlock = 1u << 20;
  const size_t blocks = static_cast<size_t>((count + kBlock - 1) / kBlock);
  std::vector<Digest> partial(blocks);
  ParallelFor(blocks, threads, [&](size_t b) {
    uint64_t first = b * kBlock;
    uint64_t n = std::min(kBlock, count - first);
    partial[b] = ElementsDigest(bytes.subspan(first * size, n * size), size, first);
  });
  Digest digest = BaseDigest(count, dtype);
  for (const Digest& d : partial) digest += d;
  return digest;
}

}  // namespace weft::sync
