#include "sync/codes.h"

#include <cassert>
#include <cstring>
#include <limits>
#include <string>

namespace weft::sync::detail {
namespace {

// Returns false on a code longer than any valid one.
bool GetExpGolomb(BitReader& in, int k, uint32_t* value) {
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

}  // namespace

// Written as a select over 32-bit lanes so that the compiler vectorises it; 2^20 codes of at most
// 56 bits each fit a 32-bit partial sum.
uint64_t RiceCost(std::span<const uint32_t> values, int k) {
  uint64_t total = 0;
  const size_t n = values.size();
  for (size_t begin = 0; begin < n; begin += size_t{1} << 20) {
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

std::pair<int, uint64_t> ChooseRice(std::span<const uint32_t> values) {
  uint64_t sum = 0;
  for (uint32_t v : values) sum += v;
  return ChooseParameter(static_cast<double>(sum) / static_cast<double>(values.size()),
                         kMaxRiceParameter, [&](int k) { return RiceCost(values, k); });
}

ValueStreams::ValueStreams(std::span<const uint32_t> residuals, uint8_t width, ValueCoding coding) {
  const size_t n = residuals.size();
  const bool ordered = coding == ValueCoding::kOrderedDiff;
  const int bits = 8 * width;
  if (ordered) signs_.assign(BytesFor(n), 0);
  size_t previous_big = std::numeric_limits<size_t>::max();  // change "-1"
  uint64_t big_value_sum = 0;
  for (size_t j = 0; j < n; ++j) {
    uint32_t magnitude = residuals[j];
    if (ordered) {
      // Sign-extend the w-bit residual; the magnitude of -2^(w-1) is 2^(w-1).
      const int64_t value =
          static_cast<int64_t>(uint64_t{residuals[j]} << (64 - bits)) >> (64 - bits);
      signs_[j >> 3] |= static_cast<uint8_t>((value < 0 ? 1u : 0u) << (j & 7));
      magnitude = static_cast<uint32_t>(value < 0 ? -value : value);
    }
    if (magnitude > 1) {
      big_gaps_.push_back(static_cast<uint32_t>(j - previous_big - 1));
      big_values_.push_back(magnitude - 2);
      big_value_sum += magnitude - 2;
      previous_big = j;
    }
  }
  header_.change_count = static_cast<uint32_t>(n);
  header_.big_count = static_cast<uint32_t>(big_gaps_.size());
  header_.sign_bytes = static_cast<uint32_t>(signs_.size());
  if (!big_gaps_.empty()) {
    auto [kb, big_bits] = ChooseRice(big_gaps_);
    auto [km, magnitude_bits] = ChooseParameter(
        static_cast<double>(big_value_sum) / big_values_.size(), kMaxExpGolombOrder, [&](int k) {
          uint64_t total = 0;
          for (uint32_t v : big_values_) total += ExpGolombBits(v, k);
          return total;
        });
    header_.k_big = static_cast<uint8_t>(kb);
    header_.k_mag = static_cast<uint8_t>(km);
    header_.big_bytes = BytesFor(big_bits);
    header_.mag_bytes = BytesFor(magnitude_bits);
  }
}

void ValueStreams::Write(uint8_t* out) const {
  if (!signs_.empty()) std::memcpy(out, signs_.data(), signs_.size());
  out += header_.sign_bytes;
  {
    BitWriter writer(out);
    for (uint32_t g : big_gaps_) PutRice(writer, g, header_.k_big);
    assert(writer.bytes() == header_.big_bytes);
  }
  out += header_.big_bytes;
  BitWriter writer(out);
  for (uint32_t v : big_values_) PutExpGolomb(writer, v, header_.k_mag);
  assert(writer.bytes() == header_.mag_bytes);
}

Status CheckValueStreams(const ValueStreamHeader& header, ValueCoding coding) {
  if (header.k_big > kMaxRiceParameter || header.k_mag > kMaxExpGolombOrder) {
    return DataLoss("code parameter out of range");
  }
  if (header.big_count > header.change_count) return DataLoss("more large changes than changes");
  if (uint64_t{header.big_count} * (header.k_big + 1u) > uint64_t{header.big_bytes} * 8 ||
      uint64_t{header.big_count} > uint64_t{header.mag_bytes} * 8) {
    return DataLoss("large-change count exceeds what its streams can hold");
  }
  if (header.sign_bytes !=
      (coding == ValueCoding::kOrderedDiff ? BytesFor(header.change_count) : 0u)) {
    return DataLoss("sign stream has the wrong length");
  }
  return Status::Ok();
}

Status DecodeValueStreams(const ValueStreamHeader& header, std::span<const uint8_t> streams,
                          uint8_t width, ValueCoding coding, uint32_t* residuals) {
  const bool ordered = coding == ValueCoding::kOrderedDiff;
  const uint32_t n = header.change_count;
  // One sign bit per change, LSB first: the padding of the last byte must be zero.
  const uint8_t* signs = streams.data();
  if (ordered && n % 8 != 0 && (signs[header.sign_bytes - 1] >> (n % 8)) != 0) {
    return DataLoss("sign stream has trailing bits");
  }
  BitReader bigs(streams.subspan(header.sign_bytes, header.big_bytes));
  BitReader magnitudes(
      streams.subspan(size_t{header.sign_bytes} + header.big_bytes, header.mag_bytes));
  const uint64_t max_magnitude =
      ordered ? uint64_t{1} << (8 * width - 1) : (uint64_t{1} << (8 * width)) - 1;
  const uint64_t mask = width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
  uint32_t bigs_read = 0;
  uint64_t next_big = header.big_count > 0 ? GetRice(bigs, header.k_big) : UINT64_MAX;
  for (uint32_t j = 0; j < n; ++j) {
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
    residuals[j] = static_cast<uint32_t>(residual);
  }
  if (bigs_read != header.big_count) return DataLoss("large-change positions run past the changes");
  if (!bigs.ConsumedExactly() || !magnitudes.ConsumedExactly()) {
    return DataLoss("a stream is truncated or has trailing bits");
  }
  return Status::Ok();
}

}  // namespace weft::sync::detail
