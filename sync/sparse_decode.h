// Internal: the sparse chunk decoder (docs/formats.md, "Sparse payload"), written once as a
// template over what is done with the changes, for DecodeChanges (which lists them) and for
// applying a delta (delta_encode.cc, which resolves them against the served tensor while it
// decodes). Use chunk_codec.h instead.
//
// Both get every check of DecodeChanges: the header against the payload before anything is
// allocated, every position inside the chunk, every magnitude within the element width, and every
// stream consumed exactly, up to zero padding in its last byte.
//
// The functions are always inlined, so that a caller compiled for a wider instruction set (BMI2
// for the shifts of the bit reader) gets its own copy.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "common/status.h"
#include "sync/chunk_codec.h"

namespace weft::sync::detail {

inline constexpr int kSparseRiceEscape = 24;  // unary prefixes this long escape to 32 raw bits
// Changes decoded between two calls of the sink's EndBlock: one word of signs.
inline constexpr uint32_t kSparseBlock = 64;
// Changes decoded between two calls of the sink's Step within a block.
inline constexpr uint32_t kSparseStep = 8;

// Reads the codes of one stream (Rice with k <= kMaxGapParameter, Exp-Golomb with
// k <= kMaxMagnitudeOrder), LSB first, never outside its span. While at least eight bytes remain,
// a refill is one unaligned load: the buffer then also holds the stream's next bits above the
// counted ones, which a later refill ORs in again at the same place. Reading past the end sets a
// failure that ConsumedExactly reports; the values read are then meaningless but harmless.
class CodeReader {
 public:
  [[gnu::always_inline]] explicit CodeReader(std::span<const uint8_t> bytes)
      : next_(bytes.data()), end_(bytes.data() + bytes.size()) {
    Refill();
  }

  // One Rice code (an escaped value is 32 bits).
  [[gnu::always_inline]] uint64_t Rice(int k) {
    if (available_ < kSparseRiceEscape + k) Refill();
    const int zeros = std::countr_zero(buffer_);  // 64 for an empty buffer
    if (zeros >= kSparseRiceEscape) [[unlikely]] {
      Consume(kSparseRiceEscape);
      Refill();
      const uint64_t value = buffer_ & 0xFFFFFFFFull;
      Consume(32);
      return value;
    }
    const uint64_t low = (buffer_ >> (zeros + 1)) & ((uint64_t{1} << k) - 1);
    Consume(zeros + 1 + k);
    return (static_cast<uint64_t>(zeros) << k) | low;
  }

  // R Rice codes, calling emit(value) for each. While eight bytes remain, one load refills the
  // buffer for all R, and a code whose unary part is at most `max_zeros` long (R codes of at most
  // max_zeros + 1 + k bits must fit in 56) takes no branch beyond that check; other codes, and
  // the end of the stream, go through Rice().
  template <int R, typename Emit>
  [[gnu::always_inline]] void RiceGroup(int k, int max_zeros, Emit&& emit) {
    int r = 0;
    if (end_ - next_ >= 8) [[likely]] {
      Refill();
      uint64_t buffer = buffer_;
      int available = available_;
      const int k1 = k + 1;
      const uint64_t low_mask = (uint64_t{1} << k) - 1;
      for (; r < R; ++r) {
        const int zeros = std::countr_zero(buffer);
        if (zeros > max_zeros) [[unlikely]]
          break;
        const uint64_t low = (buffer >> (zeros + 1)) & low_mask;
        // Shifted by k + 1 while tzcnt runs, then by the unary part: two steps on the dependency
        // chain from one code to the next, not three.
        buffer = (buffer >> k1) >> zeros;
        available -= zeros + k1;
        emit((static_cast<uint64_t>(zeros) << k) | low);
      }
      buffer_ = buffer;
      available_ = available;
    }
    for (; r < R; ++r) emit(Rice(k));
  }

  // One Exp-Golomb code of order k; false for a code longer than any valid one.
  [[gnu::always_inline]] bool ExpGolomb(int k, uint32_t* value) {
    if (available_ < 56) Refill();
    const int zeros = std::countr_zero(buffer_);  // 64 for an empty buffer
    if (zeros > 31 - k) return false;
    const int bits = zeros + k;  // after the unary part: the value plus 2^k, less its top bit
    uint64_t low;
    if (2 * zeros + k + 1 <= available_) [[likely]] {
      low = (buffer_ >> (zeros + 1)) & ((uint64_t{1} << bits) - 1);
      Consume(zeros + 1 + bits);
    } else {
      Consume(zeros + 1);
      Refill();
      low = buffer_ & ((uint64_t{1} << bits) - 1);
      Consume(bits);
    }
    *value = static_cast<uint32_t>(((uint64_t{1} << bits) | low) - (uint64_t{1} << k));
    return true;
  }

  // True when every byte was consumed except zero padding in the final partial byte.
  bool ConsumedExactly() {
    RefillSlowly();
    return !failed_ && next_ == end_ && available_ < 8 && buffer_ == 0;
  }

 private:
  // Buffers at least 56 bits, or everything left in the stream.
  [[gnu::always_inline]] void Refill() {
    if (end_ - next_ >= 8) [[likely]] {
      uint64_t word;
      std::memcpy(&word, next_, 8);
      if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
      buffer_ |= word << available_;
      next_ += (63 - available_) >> 3;
      available_ |= 56;
      return;
    }
    RefillSlowly();
  }
  void RefillSlowly() {
    while (available_ <= 56 && next_ < end_) {
      buffer_ |= static_cast<uint64_t>(*next_++) << available_;
      available_ += 8;
    }
  }
  [[gnu::always_inline]] void Consume(int count) {
    if (count > available_) [[unlikely]] {
      failed_ = true;
      buffer_ = 0;
      available_ = 0;
      return;
    }
    buffer_ >>= count;
    available_ -= count;
  }

  const uint8_t* next_;  // the first byte not yet buffered
  const uint8_t* end_;
  uint64_t buffer_ = 0;  // bits from the stream's current position, lowest first
  int available_ = 0;    // of which this many are counted as buffered
  bool failed_ = false;
};

// The checks of a sparse header against its payload, before anything is allocated.
inline Status CheckSparseHeader(const SparseHeader& header, size_t payload_bytes,
                                uint32_t chunk_elements, ValueCoding coding) {
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
  if (header.payload_bytes() != payload_bytes) return DataLoss("stream lengths do not add up");
  // Every code word takes at least k + 1 bits: bound the counts by the stream sizes before
  // allocating anything proportional to them.
  if (uint64_t{n} * (header.k_gap + 1u) > uint64_t{header.gap_bytes} * 8) {
    return DataLoss("change count exceeds what the position stream can hold");
  }
  if (uint64_t{header.big_count} * (header.k_big + 1u) > uint64_t{header.big_bytes} * 8 ||
      uint64_t{header.big_count} > uint64_t{header.mag_bytes} * 8) {
    return DataLoss("large-change count exceeds what its streams can hold");
  }
  const uint64_t sign_bytes = coding == ValueCoding::kOrderedDiff ? (uint64_t{n} + 7) / 8 : 0;
  if (header.sign_bytes != sign_bytes) return DataLoss("sign stream has the wrong length");
  return Status::Ok();
}

// Decodes the large-change positions and magnitudes (streams 3 and 4): magnitudes[j] is set for
// each change j whose magnitude exceeds one (the caller sets the others to one). `max_magnitude`
// is the largest a unit of the chunk's width allows.
[[gnu::always_inline]] inline Status DecodeLargeChanges(const SparseHeader& header,
                                                        std::span<const uint8_t> big_stream,
                                                        std::span<const uint8_t> magnitude_stream,
                                                        uint64_t max_magnitude,
                                                        uint32_t* magnitudes) {
  CodeReader bigs(big_stream);
  CodeReader values(magnitude_stream);
  uint64_t index = std::numeric_limits<uint64_t>::max();  // change "-1"
  for (uint32_t b = 0; b < header.big_count; ++b) {
    index += bigs.Rice(header.k_big) + 1;
    uint32_t value;
    if (!values.ExpGolomb(header.k_mag, &value)) return DataLoss("malformed magnitude");
    if (index >= header.change_count) {
      return DataLoss("large-change positions run past the changes");
    }
    const uint64_t magnitude = uint64_t{value} + 2;
    if (magnitude > max_magnitude) return DataLoss("magnitude too large for the element width");
    magnitudes[index] = static_cast<uint32_t>(magnitude);
  }
  if (!bigs.ConsumedExactly() || !values.ConsumedExactly()) {
    return DataLoss("a stream is truncated or has trailing bits");
  }
  return Status::Ok();
}

// residuals[i] = the residual of a change of magnitude residuals[i], negative where bit i of
// `signs` is set, for i < count (the two's complement in T's width).
template <typename T>
[[gnu::always_inline]] inline void ApplySigns(uint32_t* residuals, uint32_t count, uint64_t signs) {
  if (count == kSparseBlock) {
    // Eight at a time, in a form compilers vectorise.
    for (uint32_t g = 0; g < kSparseBlock; g += 8) {
      const uint32_t byte = static_cast<uint32_t>(signs >> g) & 0xFF;
      for (uint32_t i = 0; i < 8; ++i) {
        const uint32_t negative = (byte >> i) & 1;
        residuals[g + i] = static_cast<T>((residuals[g + i] ^ (0 - negative)) + negative);
      }
    }
    return;
  }
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t negative = static_cast<uint32_t>(signs >> i) & 1;
    residuals[i] = static_cast<T>((residuals[i] ^ (0 - negative)) + negative);
  }
}

// Decodes a sparse payload of a chunk of `chunk_elements` units of type T (uint8_t, uint16_t or
// uint32_t) into the sink's arrays, calling, in order:
//   sink.Begin(n)                   once, after the header checks: sink.offsets() and
//                                   sink.magnitudes() must then hold n entries each, which
//                                   DecodeSparse fills;
//   sink.Put(j, offset)             for each change j in [0, n), after writing its offset (not
//                                   yet known to be inside the chunk);
//   sink.Step(s)                    after each kSparseStep changes of a block of kSparseBlock
//                                   changes, s = 0, 1, ... (not for a shorter last block);
//   sink.EndBlock(first, count, signs)  after each block of kSparseBlock changes (fewer at the
//                                   end), once its offsets are known to be inside the chunk
//                                   (its magnitudes are written before any block); bit i of
//                                   `signs` tells whether change first + i is negative (see
//                                   ApplySigns).
// Nothing the sink was given is valid unless Ok is returned.
template <typename T, typename Sink>
[[gnu::always_inline]] inline Status DecodeSparse(const SparseHeader& header,
                                                  std::span<const uint8_t> payload,
                                                  uint32_t chunk_elements, ValueCoding coding,
                                                  Sink& sink) {
  WEFT_RETURN_IF_ERROR(CheckSparseHeader(header, payload.size(), chunk_elements, coding));
  const bool ordered = coding == ValueCoding::kOrderedDiff;
  const uint32_t n = header.change_count;
  constexpr int kBits = 8 * sizeof(T);
  const uint64_t max_magnitude = ordered ? uint64_t{1} << (kBits - 1) : (uint64_t{1} << kBits) - 1;

  const uint8_t* at = payload.data();
  const std::span<const uint8_t> gap_stream(at, header.gap_bytes);
  at += header.gap_bytes;
  // One sign bit per change, LSB first: the padding of the last byte must be zero.
  const uint8_t* signs = at;
  if (ordered && n % 8 != 0 && (signs[header.sign_bytes - 1] >> (n % 8)) != 0) {
    return DataLoss("sign stream has trailing bits");
  }
  at += header.sign_bytes;
  const std::span<const uint8_t> big_stream(at, header.big_bytes);
  at += header.big_bytes;
  const std::span<const uint8_t> magnitude_stream(at, header.mag_bytes);

  sink.Begin(n);
  uint32_t* offsets = sink.offsets();
  uint32_t* magnitudes = sink.magnitudes();
  // The magnitudes first (one, except for the large changes), so that the main loop only decodes
  // positions.
  std::fill(magnitudes, magnitudes + n, 1u);
  WEFT_RETURN_IF_ERROR(
      DecodeLargeChanges(header, big_stream, magnitude_stream, max_magnitude, magnitudes));

  CodeReader gaps(gap_stream);
  // Codes decoded per refill, and the longest unary part that keeps them within 56 bits.
  const int k = header.k_gap;
  const int group = k <= 7 ? 4 : (k <= 21 ? 2 : 1);
  const int max_zeros = std::min(kSparseRiceEscape - 1, 56 / group - 1 - k);
  uint64_t position = std::numeric_limits<uint64_t>::max();  // "-1"
  uint32_t j = 0;
  auto emit = [&](uint64_t gap) {
    position += gap + 1;
    offsets[j] = static_cast<uint32_t>(position);
    sink.Put(j, static_cast<uint32_t>(position));
    ++j;
  };
  for (uint32_t first = 0; first < n; first += kSparseBlock) {
    const uint32_t end = std::min(n, first + kSparseBlock);
    if (end - first == kSparseBlock) {
      for (uint32_t s = 0; s < kSparseBlock / kSparseStep; ++s) {
        if (group == 4) {
          gaps.RiceGroup<4>(k, max_zeros, emit);
          gaps.RiceGroup<4>(k, max_zeros, emit);
        } else if (group == 2) {
          for (int g = 0; g < 4; ++g) gaps.RiceGroup<2>(k, max_zeros, emit);
        } else {
          for (int g = 0; g < 8; ++g) gaps.RiceGroup<1>(k, max_zeros, emit);
        }
        sink.Step(s);
      }
    } else {
      while (j < end) emit(gaps.Rice(k));
    }
    // Positions ascend (and cannot wrap in 64 bits): the block's last one bounds the others.
    if (position >= chunk_elements) return DataLoss("change position outside the chunk");
    uint64_t sign_word = 0;
    if (ordered) {
      if (end - first == kSparseBlock) {
        std::memcpy(&sign_word, signs + first / 8, 8);
        if constexpr (std::endian::native == std::endian::big) {
          sign_word = __builtin_bswap64(sign_word);
        }
      } else {
        for (uint32_t b = 0; b < (end - first + 7) / 8; ++b) {
          sign_word |= uint64_t{signs[first / 8 + b]} << (8 * b);
        }
      }
    }
    sink.EndBlock(first, end - first, sign_word);
  }
  if (!gaps.ConsumedExactly()) return DataLoss("a stream is truncated or has trailing bits");
  return Status::Ok();
}

}  // namespace weft::sync::detail
