// Bit-level writer and reader for the delta codec's streams (LSB-first within little-endian
// bytes, docs/formats.md "Bit streams").
//
// BitWriter appends to a byte vector. BitReader never reads outside its span: reading past the end
// yields zero bits and sets failed(), which decoders check before trusting anything they read.
// Neither is thread-safe; use one per stream.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace weft::sync {

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>* out) : out_(out) {}

  // Appends the low `count` bits of `value`, count <= 32.
  void Put(uint64_t value, int count) {
    accumulator_ |= value << filled_;
    filled_ += count;
    if (filled_ >= 32) {
      uint8_t bytes[4];
      for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(accumulator_ >> (8 * i));
      out_->insert(out_->end(), bytes, bytes + 4);
      accumulator_ >>= 32;
      filled_ -= 32;
    }
  }
  // Writes the last partial byte, zero-padded. The writer must not be used afterwards.
  void Finish() {
    while (filled_ > 0) {
      out_->push_back(static_cast<uint8_t>(accumulator_));
      accumulator_ >>= 8;
      filled_ = filled_ > 8 ? filled_ - 8 : 0;
    }
  }

 private:
  std::vector<uint8_t>* out_;
  uint64_t accumulator_ = 0;
  int filled_ = 0;
};

class BitReader {
 public:
  explicit BitReader(std::span<const uint8_t> bytes) : bytes_(bytes) { Refill(); }

  // The next `count` bits (count <= 32) without consuming them; zeros past the end.
  uint64_t Peek(int count) {
    if (available_ < count) Refill();
    return accumulator_ & ((uint64_t{1} << count) - 1);
  }
  void Skip(int count) {
    if (available_ < count) {
      Refill();
      if (available_ < count) {
        failed_ = true;
        accumulator_ = 0;
        available_ = 0;
        return;
      }
    }
    accumulator_ >>= count;
    available_ -= count;
  }
  uint64_t Get(int count) {
    uint64_t value = Peek(count);
    Skip(count);
    return value;
  }
  // Number of zero bits before the next one bit, looking at most `limit` (<= 32) bits ahead;
  // returns `limit` if all of them are zero. Consumes nothing.
  int CountZeros(int limit) {
    if (available_ < limit) Refill();
    uint64_t window = accumulator_ | (uint64_t{1} << limit);
    return std::countr_zero(window);
  }

  bool failed() const { return failed_; }
  // True when every byte was consumed except zero padding in the final partial byte.
  bool ConsumedExactly() const {
    return !failed_ && position_ == bytes_.size() && available_ < 8 && accumulator_ == 0;
  }

 private:
  void Refill() {
    if (position_ + 8 <= bytes_.size()) {
      uint64_t word;
      std::memcpy(&word, bytes_.data() + position_, 8);
      if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
      accumulator_ |= word << available_;
      int take = (63 - available_) >> 3;
      position_ += static_cast<size_t>(take);
      available_ += take * 8;
      return;
    }
    while (available_ <= 56 && position_ < bytes_.size()) {
      accumulator_ |= static_cast<uint64_t>(bytes_[position_++]) << available_;
      available_ += 8;
    }
  }

  std::span<const uint8_t> bytes_;
  size_t position_ = 0;
  uint64_t accumulator_ = 0;
  int available_ = 0;
  bool failed_ = false;
};

}  // namespace weft::sync
