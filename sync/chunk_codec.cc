#include "sync/chunk_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "sync/bit_stream.h"
#include "sync/convert_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft::sync {
namespace {

// ---- Scanning ----------------------------------------------------------------------------------

template <typename T>
inline void Record(KeyKind kind, T old_value, T new_value, uint32_t offset, uint64_t index,
                   ChangeList* changes, Digest* digest_change) {
  changes->offsets.push_back(offset);
  changes->residuals.push_back(static_cast<uint32_t>(Residual<T>(kind, old_value, new_value)));
  if (digest_change != nullptr) *digest_change += ElementChange(index, old_value, new_value);
}

template <typename T>
void ScanScalar(KeyKind kind, const uint8_t* old_bytes, const uint8_t* new_bytes, uint32_t begin,
                uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                Digest* digest_change) {
  for (uint32_t j = begin; j < count; ++j) {
    T a, b;
    std::memcpy(&a, old_bytes + size_t{j} * sizeof(T), sizeof(T));
    std::memcpy(&b, new_bytes + size_t{j} * sizeof(T), sizeof(T));
    if (a != b) Record<T>(kind, a, b, offset_base + j, index_base + j, changes, digest_change);
  }
}

#if defined(__x86_64__)
#define WEFT_AVX2 __attribute__((target("avx2,bmi,bmi2")))

// Returns a mask with bit b set when byte b of the 64-byte blocks differ at an element boundary:
// one bit per element, at the element's first byte.
template <typename T>
WEFT_AVX2 inline uint64_t DiffMask64(const uint8_t* a, const uint8_t* b) {
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
WEFT_AVX2 void ScanAvx2(KeyKind kind, const uint8_t* old_bytes, const uint8_t* new_bytes,
                        uint32_t count, uint32_t offset_base, uint64_t index_base,
                        ChangeList* changes, Digest* digest_change) {
  constexpr uint32_t kPerBlock = 64 / sizeof(T);
  uint32_t j = 0;
  for (; j + kPerBlock <= count; j += kPerBlock) {
    const uint8_t* a = old_bytes + size_t{j} * sizeof(T);
    const uint8_t* b = new_bytes + size_t{j} * sizeof(T);
    uint64_t mask = DiffMask64<T>(a, b);
    while (mask != 0) {
      uint32_t element = static_cast<uint32_t>(std::countr_zero(mask)) / sizeof(T);
      mask &= mask - 1;
      T x, y;
      std::memcpy(&x, a + element * sizeof(T), sizeof(T));
      std::memcpy(&y, b + element * sizeof(T), sizeof(T));
      Record<T>(kind, x, y, offset_base + j + element, index_base + j + element, changes,
                digest_change);
    }
  }
  ScanScalar<T>(kind, old_bytes, new_bytes, j, count, offset_base, index_base, changes,
                digest_change);
}

const bool kUseAvx2 = detail::CpuHasAvx2F16c();
#endif

// ---- Codes ---------------------------------------------------------------------------------------

constexpr int kRiceEscape = 24;  // unary prefixes reaching this length escape to a raw 32-bit gap

inline uint64_t RiceBits(uint32_t value, int k) {
  uint32_t quotient = value >> k;
  return quotient < kRiceEscape ? quotient + 1 + static_cast<uint64_t>(k) : kRiceEscape + 32;
}

inline void PutRice(BitWriter& out, uint32_t value, int k) {
  uint32_t quotient = value >> k;
  if (quotient < kRiceEscape) {
    out.Put(uint64_t{1} << quotient, static_cast<int>(quotient) + 1);
    if (k > 0) out.Put(value & ((1u << k) - 1u), k);
  } else {
    out.Put(0, kRiceEscape);
    out.Put(value, 32);
  }
}

inline uint32_t GetRice(BitReader& in, int k) {
  int zeros = in.CountZeros(kRiceEscape);
  if (zeros < kRiceEscape) {
    in.Skip(zeros + 1);
    uint32_t low = k > 0 ? static_cast<uint32_t>(in.Get(k)) : 0;
    return (static_cast<uint32_t>(zeros) << k) | low;
  }
  in.Skip(kRiceEscape);
  return static_cast<uint32_t>(in.Get(32));
}

inline uint64_t ExpGolombBits(uint32_t value, int k) {
  uint64_t x = uint64_t{value} + (uint64_t{1} << k);
  int length = std::bit_width(x);
  return 2 * static_cast<uint64_t>(length) - static_cast<uint64_t>(k) - 1;
}

inline void PutExpGolomb(BitWriter& out, uint32_t value, int k) {
  uint64_t x = uint64_t{value} + (uint64_t{1} << k);
  int length = std::bit_width(x);
  int zeros = length - k - 1;
  out.Put(uint64_t{1} << zeros, zeros + 1);
  if (length > 1) out.Put(x & ((uint64_t{1} << (length - 1)) - 1), length - 1);
}

// Returns false on a code longer than any valid one.
inline bool GetExpGolomb(BitReader& in, int k, uint32_t* value) {
  int zeros = in.CountZeros(32);
  if (zeros > 31 - k) return false;
  in.Skip(zeros + 1);
  int length = zeros + k + 1;
  uint64_t low = length > 1 ? in.Get(length - 1) : 0;
  uint64_t x = (uint64_t{1} << (length - 1)) | low;
  *value = static_cast<uint32_t>(x - (uint64_t{1} << k));
  return true;
}

// Picks the parameter in [0, max_k] that minimises the exact cost, searching around the
// estimate from the mean (cost is convex in k for these codes, so a local search suffices).
template <typename CostFn>
int ChooseParameter(double mean, int max_k, CostFn cost) {
  int estimate = mean < 1.0 ? 0 : std::min(max_k, static_cast<int>(std::log2(mean)));
  int best = estimate;
  uint64_t best_cost = cost(estimate);
  for (int k = estimate - 1; k >= 0; --k) {
    uint64_t c = cost(k);
    if (c >= best_cost) break;
    best = k;
    best_cost = c;
  }
  for (int k = estimate + 1; k <= max_k; ++k) {
    uint64_t c = cost(k);
    if (c >= best_cost) break;
    best = k;
    best_cost = c;
  }
  return best;
}

uint32_t BytesFor(uint64_t bits) { return static_cast<uint32_t>((bits + 7) / 8); }

}  // namespace

KeyKind KeyKindFor(DType dtype) {
  if (CodingFor(dtype) == ValueCoding::kXor) return KeyKind::kXor;
  return Info(dtype).is_float ? KeyKind::kFloat : KeyKind::kInteger;
}

void ScanChangesRef(KeyKind kind, uint8_t width, const uint8_t* old_bytes,
                    const uint8_t* new_bytes, uint32_t count, uint32_t offset_base,
                    uint64_t index_base, ChangeList* changes, Digest* digest_change) {
  switch (width) {
    case 1:
      return ScanScalar<uint8_t>(kind, old_bytes, new_bytes, 0, count, offset_base, index_base,
                                 changes, digest_change);
    case 2:
      return ScanScalar<uint16_t>(kind, old_bytes, new_bytes, 0, count, offset_base, index_base,
                                  changes, digest_change);
    default:
      return ScanScalar<uint32_t>(kind, old_bytes, new_bytes, 0, count, offset_base, index_base,
                                  changes, digest_change);
  }
}

void ScanChanges(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
                 uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                 Digest* digest_change) {
#if defined(__x86_64__)
  if (kUseAvx2) {
    switch (width) {
      case 1:
        return ScanAvx2<uint8_t>(kind, old_bytes, new_bytes, count, offset_base, index_base,
                                 changes, digest_change);
      case 2:
        return ScanAvx2<uint16_t>(kind, old_bytes, new_bytes, count, offset_base, index_base,
                                  changes, digest_change);
      default:
        return ScanAvx2<uint32_t>(kind, old_bytes, new_bytes, count, offset_base, index_base,
                                  changes, digest_change);
    }
  }
#endif
  ScanChangesRef(kind, width, old_bytes, new_bytes, count, offset_base, index_base, changes,
                 digest_change);
}

void EncodeChanges(const ChangeList& changes, uint8_t width, ValueCoding coding,
                   SparseHeader* header, std::vector<uint8_t>* payload) {
  const size_t n = changes.size();
  const bool ordered = coding == ValueCoding::kOrderedDiff;
  const int bits = 8 * width;

  // Magnitudes (>= 1) and signs of the residuals.
  std::vector<uint32_t> magnitudes(n);
  std::vector<uint8_t> negative(ordered ? n : 0);
  std::vector<uint32_t> gaps(n);
  uint64_t gap_sum = 0;
  uint32_t previous = std::numeric_limits<uint32_t>::max();  // offset "-1"
  std::vector<uint32_t> big_gaps;
  std::vector<uint32_t> big_values;
  uint64_t big_gap_sum = 0, big_value_sum = 0;
  size_t previous_big = std::numeric_limits<size_t>::max();
  for (size_t j = 0; j < n; ++j) {
    uint32_t residual = changes.residuals[j];
    uint32_t magnitude = residual;
    if (ordered) {
      // Sign-extend the w-bit residual; the magnitude of -2^(w-1) is 2^(w-1).
      int64_t signed_residual = static_cast<int64_t>(uint64_t{residual} << (64 - bits)) >> (64 - bits);
      negative[j] = signed_residual < 0;
      magnitude = static_cast<uint32_t>(signed_residual < 0 ? -signed_residual : signed_residual);
    }
    magnitudes[j] = magnitude;
    gaps[j] = changes.offsets[j] - previous - 1;
    gap_sum += gaps[j];
    previous = changes.offsets[j];
    if (magnitude > 1) {
      uint32_t big_gap = static_cast<uint32_t>(j - previous_big - 1);
      big_gaps.push_back(big_gap);
      big_values.push_back(magnitude - 2);
      big_gap_sum += big_gap;
      big_value_sum += magnitude - 2;
      previous_big = j;
    }
  }

  auto rice_cost = [](const std::vector<uint32_t>& values) {
    return [&values](int k) {
      uint64_t total = 0;
      for (uint32_t v : values) total += RiceBits(v, k);
      return total;
    };
  };
  header->change_count = static_cast<uint32_t>(n);
  header->big_count = static_cast<uint32_t>(big_gaps.size());
  header->k_gap = static_cast<uint8_t>(
      ChooseParameter(static_cast<double>(gap_sum) / n, kMaxGapParameter, rice_cost(gaps)));
  header->k_big = 0;
  header->k_mag = 0;
  if (!big_gaps.empty()) {
    header->k_big = static_cast<uint8_t>(ChooseParameter(
        static_cast<double>(big_gap_sum) / big_gaps.size(), kMaxGapParameter, rice_cost(big_gaps)));
    header->k_mag = static_cast<uint8_t>(ChooseParameter(
        static_cast<double>(big_value_sum) / big_values.size(), kMaxMagnitudeOrder, [&](int k) {
          uint64_t total = 0;
          for (uint32_t v : big_values) total += ExpGolombBits(v, k);
          return total;
        }));
  }

  size_t start = payload->size();
  {
    BitWriter out(payload);
    for (uint32_t g : gaps) PutRice(out, g, header->k_gap);
    out.Finish();
  }
  header->gap_bytes = static_cast<uint32_t>(payload->size() - start);
  start = payload->size();
  if (ordered) {
    BitWriter out(payload);
    for (uint8_t s : negative) out.Put(s, 1);
    out.Finish();
  }
  header->sign_bytes = static_cast<uint32_t>(payload->size() - start);
  start = payload->size();
  {
    BitWriter out(payload);
    for (uint32_t g : big_gaps) PutRice(out, g, header->k_big);
    out.Finish();
  }
  header->big_bytes = static_cast<uint32_t>(payload->size() - start);
  start = payload->size();
  {
    BitWriter out(payload);
    for (uint32_t v : big_values) PutExpGolomb(out, v, header->k_mag);
    out.Finish();
  }
  header->mag_bytes = static_cast<uint32_t>(payload->size() - start);
}

Status DecodeChanges(const SparseHeader& header, std::span<const uint8_t> payload,
                     uint32_t chunk_elements, uint8_t width, ValueCoding coding,
                     ChangeList* changes) {
  changes->clear();
  const bool ordered = coding == ValueCoding::kOrderedDiff;
  const uint32_t n = header.change_count;
  if (header.k_gap > kMaxGapParameter || header.k_big > kMaxGapParameter ||
      header.k_mag > kMaxMagnitudeOrder) {
    return DataLoss("code parameter out of range");
  }
  if (n == 0 || n > chunk_elements) {
    return DataLoss("change count " + std::to_string(n) + " outside 1.." +
                    std::to_string(chunk_elements));
  }
  if (header.big_count > n) return DataLoss("more large changes than changes");
  if (header.payload_bytes() != payload.size()) return DataLoss("stream lengths do not add up");
  // Every code word takes at least k + 1 bits: bound the counts by the stream sizes before
  // allocating anything proportional to them.
  if (uint64_t{n} * (header.k_gap + 1u) > uint64_t{header.gap_bytes} * 8) {
    return DataLoss("change count exceeds what the position stream can hold");
  }
  if (uint64_t{header.big_count} * (header.k_big + 1u) > uint64_t{header.big_bytes} * 8 ||
      uint64_t{header.big_count} > uint64_t{header.mag_bytes} * 8) {
    return DataLoss("large-change count exceeds what its streams can hold");
  }
  if (header.sign_bytes != (ordered ? BytesFor(n) : 0u)) {
    return DataLoss("sign stream has the wrong length");
  }
  const uint64_t max_magnitude =
      ordered ? uint64_t{1} << (8 * width - 1) : (uint64_t{1} << (8 * width)) - 1;

  size_t at = 0;
  BitReader gaps(payload.subspan(at, header.gap_bytes));
  at += header.gap_bytes;
  BitReader signs(payload.subspan(at, header.sign_bytes));
  at += header.sign_bytes;
  BitReader bigs(payload.subspan(at, header.big_bytes));
  at += header.big_bytes;
  BitReader magnitudes(payload.subspan(at, header.mag_bytes));

  changes->offsets.resize(n);
  changes->residuals.resize(n);
  const uint64_t mask = width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
  uint64_t position = std::numeric_limits<uint64_t>::max();  // "-1"
  uint32_t bigs_read = 0;
  uint64_t next_big = header.big_count > 0 ? GetRice(bigs, header.k_big) : UINT64_MAX;
  for (uint32_t j = 0; j < n; ++j) {
    position += uint64_t{GetRice(gaps, header.k_gap)} + 1;
    if (position >= chunk_elements) return DataLoss("change position outside the chunk");
    uint64_t magnitude = 1;
    if (j == next_big) {
      uint32_t value;
      if (!GetExpGolomb(magnitudes, header.k_mag, &value)) return DataLoss("malformed magnitude");
      magnitude = uint64_t{value} + 2;
      if (magnitude > max_magnitude) return DataLoss("magnitude too large for the element width");
      ++bigs_read;
      next_big = bigs_read < header.big_count ? j + 1 + uint64_t{GetRice(bigs, header.k_big)}
                                              : UINT64_MAX;
    }
    uint64_t residual = magnitude;
    if (ordered && signs.Get(1) != 0) residual = (0 - magnitude) & mask;
    changes->offsets[j] = static_cast<uint32_t>(position);
    changes->residuals[j] = static_cast<uint32_t>(residual);
  }
  if (bigs_read != header.big_count) return DataLoss("large-change positions run past the changes");
  if (!gaps.ConsumedExactly() || !signs.ConsumedExactly() || !bigs.ConsumedExactly() ||
      !magnitudes.ConsumedExactly()) {
    return DataLoss("a stream is truncated or has trailing bits");
  }
  return Status::Ok();
}

}  // namespace weft::sync
