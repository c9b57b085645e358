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
#include "sync/codes.h"
#include "sync/convert.h"
#include "sync/cpu.h"
#include "sync/scan_simd.h"
#include "sync/sparse_decode.h"

namespace weft::sync {
using detail::BytesFor;
using detail::ChooseParameter;
using detail::ExpGolombBits;
using detail::PutExpGolomb;
using detail::PutRice;
using detail::RiceCost;
static_assert(detail::kRiceEscape == detail::kSparseRiceEscape);

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

namespace {

// Lists each change as it is decoded.
template <typename T>
class ListSink {
 public:
  explicit ListSink(ChangeList* changes) : changes_(changes) {}
  void Begin(uint32_t n) {
    changes_->offsets.resize(n);
    changes_->residuals.resize(n);
  }
  uint32_t* offsets() { return changes_->offsets.data(); }
  uint32_t* magnitudes() { return changes_->residuals.data(); }
  void Put(uint32_t, uint32_t) {}
  void Step(uint32_t) {}
  void EndBlock(uint32_t first, uint32_t count, uint64_t signs) {
    detail::ApplySigns<T>(changes_->residuals.data() + first, count, signs);
  }

 private:
  ChangeList* changes_;
};

template <typename T>
[[gnu::flatten]] Status DecodeIntoPlain(const SparseHeader& header,
                                        std::span<const uint8_t> payload, uint32_t chunk_elements,
                                        ValueCoding coding, ChangeList* changes) {
  ListSink<T> sink(changes);
  return detail::DecodeSparse<T>(header, payload, chunk_elements, coding, sink);
}

#if defined(__x86_64__)
// The same compiled for BMI2's shifts.
template <typename T>
[[gnu::flatten]] WEFT_TARGET_AVX2 Status DecodeIntoAvx2(const SparseHeader& header,
                                                        std::span<const uint8_t> payload,
                                                        uint32_t chunk_elements, ValueCoding coding,
                                                        ChangeList* changes) {
  ListSink<T> sink(changes);
  return detail::DecodeSparse<T>(header, payload, chunk_elements, coding, sink);
}
#endif

template <typename T>
Status DecodeInto(const SparseHeader& header, std::span<const uint8_t> payload,
                  uint32_t chunk_elements, ValueCoding coding, ChangeList* changes) {
#if defined(__x86_64__)
  if (Cpu().avx2) return DecodeIntoAvx2<T>(header, payload, chunk_elements, coding, changes);
#endif
  return DecodeIntoPlain<T>(header, payload, chunk_elements, coding, changes);
}

}  // namespace

Status DecodeChanges(const SparseHeader& header, std::span<const uint8_t> payload,
                     uint32_t chunk_elements, uint8_t width, ValueCoding coding,
                     ChangeList* changes) {
  changes->clear();
  Status status;
  switch (width) {
    case 1:
      status = DecodeInto<uint8_t>(header, payload, chunk_elements, coding, changes);
      break;
    case 2:
      status = DecodeInto<uint16_t>(header, payload, chunk_elements, coding, changes);
      break;
    default:
      status = DecodeInto<uint32_t>(header, payload, chunk_elements, coding, changes);
      break;
  }
  if (!status.ok()) changes->clear();
  return status;
}

}  // namespace weft::sync
