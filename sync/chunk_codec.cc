#include "sync/chunk_codec.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "sync/bit_stream.h"
#include "sync/convert.h"
#include "sync/cpu.h"
#include "sync/scan_simd.h"

namespace weft::sync {
namespace {

// ---- Codes -------------------------------------------------------------------------------------

constexpr int kRiceEscape = 24;  // unary prefixes reaching this length escape to a raw 32-bit gap

inline void PutRice(BitWriter& out, uint32_t value, int k) {
  uint32_t quotient = value >> k;
  if (quotient < kRiceEscape) {
    // Unary quotient (zeros, then a one), then the k low bits: at most 24 + 26 bits.
    uint64_t low = value & ((uint64_t{1} << k) - 1);
    out.Put((uint64_t{1} << quotient) | (low << (quotient + 1)),
            static_cast<int>(quotient) + 1 + k);
  } else {
    out.Put(0, kRiceEscape);
    out.Put(value, 32);
  }
}

// Decodes one Rice code; the reader must hold at least 56 bits unless the stream ends sooner.
inline uint32_t GetRice(BitReader& in, int k) {
  in.Refill();
  const uint64_t bits = in.bits();
  const int zeros = std::countr_zero(bits | (uint64_t{1} << kRiceEscape));
  if (zeros < kRiceEscape) {
    const uint32_t low = static_cast<uint32_t>(bits >> (zeros + 1)) & ((uint32_t{1} << k) - 1);
    in.Consume(zeros + 1 + k);
    return (static_cast<uint32_t>(zeros) << k) | low;
  }
  in.Consume(kRiceEscape);
  return static_cast<uint32_t>(in.Get(32));
}

inline uint64_t ExpGolombBits(uint32_t value, int k) {
  uint64_t x = uint64_t{value} + (uint64_t{1} << k);
  int length = std::bit_width(x);
  return 2 * static_cast<uint64_t>(length) - static_cast<uint64_t>(k) - 1;
}

inline void PutExpGolomb(BitWriter& out, uint32_t value, int k) {
  const uint64_t x = uint64_t{value} + (uint64_t{1} << k);
  const int length = std::bit_width(x);
  const int zeros = length - k - 1;
  out.Put(uint64_t{1} << zeros, zeros + 1);
  if (length > 1) out.Put(x & ((uint64_t{1} << (length - 1)) - 1), length - 1);
}

// Returns false on a code longer than any valid one.
inline bool GetExpGolomb(BitReader& in, int k, uint32_t* value) {
  in.Refill();
  const int zeros = std::countr_zero(in.bits() | (uint64_t{1} << 32));
  if (zeros > 31 - k) return false;
  in.Consume(zeros + 1);
  const int length = zeros + k + 1;
  const uint64_t low = length > 1 ? in.Get(length - 1) : 0;
  const uint64_t x = (uint64_t{1} << (length - 1)) | low;
  *value = static_cast<uint32_t>(x - (uint64_t{1} << k));
  return true;
}

// The parameter in [0, max_k] that minimises the exact cost, and that cost. The cost of these
// codes is convex in k, so a local search from the estimate log2(mean) finds the minimum.
template <typename CostFn>
std::pair<int, uint64_t> ChooseParameter(double mean, int max_k, CostFn cost) {
  int best = mean < 1.0 ? 0 : std::min(max_k, static_cast<int>(std::log2(mean)));
  uint64_t best_cost = cost(best);
  for (int step : {-1, +1}) {
    for (int k = best + step; k >= 0 && k <= max_k; k += step) {
      uint64_t c = cost(k);
      if (c >= best_cost) break;
      best = k;
      best_cost = c;
    }
  }
  return {best, best_cost};
}

// Written as a select over 32-bit lanes so that the compiler vectorises it; a chunk's values are
// below 2^32 and 2^20 codes of at most 56 bits each fit a 32-bit partial sum.
template <typename Vector>
uint64_t RiceCost(const Vector& values, int k) {
  uint64_t total = 0;
  const size_t n = values.size();
  for (size_t begin = 0; begin < n; begin += 1 << 20) {
    const size_t end = std::min(n, begin + (size_t{1} << 20));
    uint32_t partial = 0;
    for (size_t i = begin; i < end; ++i) {
      const int32_t quotient = static_cast<int32_t>(values[i] >> k);
      partial +=
          quotient < kRiceEscape ? static_cast<uint32_t>(quotient + 1 + k) : kRiceEscape + 32;
    }
    total += partial;
  }
  return total;
}

uint32_t BytesFor(uint64_t bits) { return static_cast<uint32_t>((bits + 7) / 8); }

}  // namespace

void ScanFromMasterBf16Ref(const float* master, uint8_t* served, uint32_t count,
                           uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                           Digest* digest_change) {
  for (uint32_t j = 0; j < count; ++j) {
    const uint16_t y = FloatToBf16Ref(master[j]);
    uint16_t x;
    std::memcpy(&x, served + size_t{j} * 2, 2);
    if (x == y) continue;
    detail::Record<uint16_t>(KeyKind::kFloat, x, y, offset_base + j, index_base + j, changes,
                             digest_change);
    std::memcpy(served + size_t{j} * 2, &y, 2);
  }
}

void ScanFromMasterBf16(const float* master, uint8_t* served, uint32_t count, uint32_t offset_base,
                        uint64_t index_base, ChangeList* changes, Digest* digest_change) {
  if (Cpu().avx512) {
    return detail::ScanFromMasterBf16Avx512(master, served, count, offset_base, index_base, changes,
                                            digest_change);
  }
  ScanFromMasterBf16Ref(master, served, count, offset_base, index_base, changes, digest_change);
}

bool HasFusedBf16Kernel() { return Cpu().avx512; }

KeyKind KeyKindFor(DType dtype) {
  if (CodingFor(dtype) == ValueCoding::kXor) return KeyKind::kXor;
  return Info(dtype).is_float ? KeyKind::kFloat : KeyKind::kInteger;
}

void ScanChangesRef(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
                    uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                    Digest* digest_change) {
  switch (width) {
    case 1:
      return detail::ScanScalar<uint8_t>(kind, old_bytes, new_bytes, 0, count, offset_base,
                                         index_base, changes, digest_change);
    case 2:
      return detail::ScanScalar<uint16_t>(kind, old_bytes, new_bytes, 0, count, offset_base,
                                          index_base, changes, digest_change);
    default:
      return detail::ScanScalar<uint32_t>(kind, old_bytes, new_bytes, 0, count, offset_base,
                                          index_base, changes, digest_change);
  }
}

void ScanChanges(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
                 uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                 Digest* digest_change) {
  if (Cpu().avx2) {
    return detail::ScanAvx2(kind, width, old_bytes, new_bytes, count, offset_base, index_base,
                            changes, digest_change);
  }
  ScanChangesRef(kind, width, old_bytes, new_bytes, count, offset_base, index_base, changes,
                 digest_change);
}

void EncodeChanges(const ChangeList& changes, uint8_t width, ValueCoding coding,
                   SparseHeader* header, std::vector<uint8_t>* payload) {
  const size_t n = changes.size();
  const bool ordered = coding == ValueCoding::kOrderedDiff;
  const int bits = 8 * width;

  // One pass: position gaps, signs (packed), and the changes whose magnitude exceeds one. Written
  // without branches on the data: the lists are sized for the worst case, every change writes a
  // large-change entry and only the count decides whether it stays.
  U32Vector gaps(n), big_gaps(n), big_values(n);
  std::vector<uint8_t> signs(ordered ? BytesFor(n) + kBitWriterSlack : 0, 0);
  uint64_t gap_sum = 0, big_gap_sum = 0, big_value_sum = 0, sign_word = 0;
  size_t big_count = 0;
  uint32_t previous = std::numeric_limits<uint32_t>::max();  // offset "-1"
  size_t previous_big = std::numeric_limits<size_t>::max();  // change "-1"
  const uint32_t* offsets = changes.offsets.data();
  const uint32_t* residuals = changes.residuals.data();
  for (size_t j = 0; j < n; ++j) {
    const uint32_t residual = residuals[j];
    uint32_t magnitude = residual;
    if (ordered) {
      // Sign-extend the w-bit residual; the magnitude of -2^(w-1) is 2^(w-1).
      const int64_t value = static_cast<int64_t>(uint64_t{residual} << (64 - bits)) >> (64 - bits);
      const uint64_t negative = value < 0;
      sign_word |= negative << (j & 63);
      if ((j & 63) == 63) {
        std::memcpy(&signs[j >> 3 & ~size_t{7}], &sign_word, 8);
        sign_word = 0;
      }
      magnitude = static_cast<uint32_t>(negative ? -value : value);
    }
    const uint32_t gap = offsets[j] - previous - 1;
    gaps[j] = gap;
    gap_sum += gap;
    previous = offsets[j];
    const uint32_t big_gap = static_cast<uint32_t>(j - previous_big - 1);
    const bool is_big = magnitude > 1;
    big_gaps[big_count] = big_gap;
    big_values[big_count] = magnitude - 2;
    big_gap_sum += is_big ? big_gap : 0;
    big_value_sum += is_big ? magnitude - 2 : 0;
    previous_big = is_big ? j : previous_big;
    big_count += is_big;
  }
  if (ordered && (n & 63) != 0) std::memcpy(&signs[(n - 1) >> 3 & ~size_t{7}], &sign_word, 8);
  big_gaps.resize(big_count);
  big_values.resize(big_count);

  header->change_count = static_cast<uint32_t>(n);
  header->big_count = static_cast<uint32_t>(big_gaps.size());
  auto [k_gap, gap_bits] = ChooseParameter(static_cast<double>(gap_sum) / n, kMaxGapParameter,
                                           [&](int k) { return RiceCost(gaps, k); });
  int k_big = 0, k_mag = 0;
  uint64_t big_bits = 0, magnitude_bits = 0;
  if (!big_gaps.empty()) {
    std::tie(k_big, big_bits) =
        ChooseParameter(static_cast<double>(big_gap_sum) / big_gaps.size(), kMaxGapParameter,
                        [&](int k) { return RiceCost(big_gaps, k); });
    std::tie(k_mag, magnitude_bits) = ChooseParameter(
        static_cast<double>(big_value_sum) / big_values.size(), kMaxMagnitudeOrder, [&](int k) {
          uint64_t total = 0;
          for (uint32_t v : big_values) total += ExpGolombBits(v, k);
          return total;
        });
  }
  header->k_gap = static_cast<uint8_t>(k_gap);
  header->k_big = static_cast<uint8_t>(k_big);
  header->k_mag = static_cast<uint8_t>(k_mag);
  header->gap_bytes = BytesFor(gap_bits);
  header->sign_bytes = ordered ? BytesFor(n) : 0;
  header->big_bytes = BytesFor(big_bits);
  header->mag_bytes = BytesFor(magnitude_bits);

  // The sizes are exact, so the streams are written straight into place.
  const size_t start = payload->size();
  payload->resize(start + header->payload_bytes() + kBitWriterSlack);
  uint8_t* out = payload->data() + start;
  {
    BitWriter writer(out);
    for (uint32_t g : gaps) PutRice(writer, g, k_gap);
    assert(writer.bytes() == header->gap_bytes);
  }
  out += header->gap_bytes;
  if (ordered) std::memcpy(out, signs.data(), header->sign_bytes);
  out += header->sign_bytes;
  {
    BitWriter writer(out);
    for (uint32_t g : big_gaps) PutRice(writer, g, k_big);
    assert(writer.bytes() == header->big_bytes);
  }
  out += header->big_bytes;
  {
    BitWriter writer(out);
    for (uint32_t v : big_values) PutExpGolomb(writer, v, k_mag);
    assert(writer.bytes() == header->mag_bytes);
  }
  payload->resize(start + header->payload_bytes());
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
  // One sign bit per change, LSB first: read directly; the padding of the last byte must be zero.
  const uint8_t* signs = payload.data() + at;
  if (ordered && n % 8 != 0 && (signs[header.sign_bytes - 1] >> (n % 8)) != 0) {
    return DataLoss("sign stream has trailing bits");
  }
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
      next_big =
          bigs_read < header.big_count ? j + 1 + uint64_t{GetRice(bigs, header.k_big)} : UINT64_MAX;
    }
    uint64_t residual = magnitude;
    if (ordered && ((signs[j >> 3] >> (j & 7)) & 1) != 0) residual = (0 - magnitude) & mask;
    changes->offsets[j] = static_cast<uint32_t>(position);
    changes->residuals[j] = static_cast<uint32_t>(residual);
  }
  if (bigs_read != header.big_count) return DataLoss("large-change positions run past the changes");
  if (!gaps.ConsumedExactly() || !bigs.ConsumedExactly() || !magnitudes.ConsumedExactly()) {
    return DataLoss("a stream is truncated or has trailing bits");
  }
  return Status::Ok();
}

}  // namespace weft::sync
