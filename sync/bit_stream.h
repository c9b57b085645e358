// Bit-level writer and reader for the delta codec's streams (LSB-first within little-endian
// bytes: the conventions at the top of docs/formats.md).
//
// BitWriter writes into a buffer the caller sized exactly, plus kBitWriterSlack bytes: every Put
// stores a whole 64-bit word, which keeps it free of branches. BitReader never reads outside its
// span: consuming more bits than the stream holds sets failed() and yields zeros, and decoders
// check failed() before they trust anything they read. Neither is thread-safe.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>

namespace weft::sync {

inline constexpr size_t kBitWriterSlack = 8;

class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : start_(out), out_(out) {}

  // Appends the low `count` bits of `value` (count <= 56; higher bits of value must be zero).
  void Put(uint64_t value, int count) {
    accumulator_ |= value << filled_;
    filled_ += count;
    uint64_t word = accumulator_;
    if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
    std::memcpy(out_, &word, 8);
    const int bytes = filled_ >> 3;
    out_ += bytes;
    accumulator_ >>= 8 * bytes;  // bytes <= 7
    filled_ &= 7;
  }
  // Bytes written, counting a final partial byte (its unused high bits are zero).
  size_t bytes() const { return static_cast<size_t>(out_ - start_) + (filled_ > 0 ? 1 : 0); }

 private:
  uint8_t* start_;
  uint8_t* out_;
  uint64_t accumulator_ = 0;
  int filled_ = 0;
};

class BitReader {
 public:
  explicit BitReader(std::span<const uint8_t> bytes) : bytes_(bytes) { Refill(); }

  // Buffers at least 56 bits, or everything left in the stream.
  void Refill() {
    if (position_ + 8 <= bytes_.size()) {
      uint64_t word;
      std::memcpy(&word, bytes_.data() + position_, 8);
      if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
      accumulator_ |= word << available_;
      const int take = (63 - available_) >> 3;
      position_ += static_cast<size_t>(take);
      available_ += take * 8;
      return;
    }
    while (available_ <= 56 && position_ < bytes_.size()) {
      accumulator_ |= static_cast<uint64_t>(bytes_[position_++]) << available_;
      available_ += 8;
    }
  }
  // The buffered bits, next bit lowest. Bits beyond available() are the stream's following bits
  // or zero; they are only valid to act on after a Consume that stays within available().
  uint64_t bits() const { return accumulator_; }
  int available() const { return available_; }
  void Consume(int count) {
    if (count > available_) {
      failed_ = true;
      accumulator_ = 0;
      available_ = 0;
      return;
    }
    accumulator_ >>= count;
    available_ -= count;
  }
  // `count` bits (<= 56), refilling as needed.
  uint64_t Get(int count) {
    if (available_ < count) Refill();
    uint64_t value = accumulator_ & ((uint64_t{1} << count) - 1);
    Consume(count);
    return failed_ ? 0 : value;
  }

  bool failed() const { return failed_; }
  // True when every byte was consumed except zero padding in the final partial byte.
  bool ConsumedExactly() const {
    return !failed_ && position_ == bytes_.size() && available_ < 8 && accumulator_ == 0;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t position_ = 0;
  uint64_t accumulator_ = 0;
  int available_ = 0;
  bool failed_ = false;
};

}  // namespace weft::sync
