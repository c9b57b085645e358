// Little-endian byte writing and bounds-checked reading for binary formats.
//
// ByteReader never reads past its span: every Read* returns false (and leaves the output
// untouched) when too few bytes remain, so a decoder can check lengths before it trusts them.
// Varints are unsigned LEB128, at most 10 bytes, and a varint that overflows 64 bits is an error.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

// The bytes of a text, viewed where they are (valid as long as the text is).
inline std::span<const uint8_t> TextBytes(std::string_view text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}

  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { Fixed(v); }
  void U32(uint32_t v) { Fixed(v); }
  void U64(uint64_t v) { Fixed(v); }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<uint8_t>(v) | 0x80);
      v >>= 7;
    }
    out_->push_back(static_cast<uint8_t>(v));
  }
  void Bytes(std::span<const uint8_t> bytes) {
    out_->insert(out_->end(), bytes.begin(), bytes.end());
  }
  void Bytes(const std::string& text) { out_->insert(out_->end(), text.begin(), text.end()); }
  size_t size() const { return out_->size(); }

 private:
  template <typename T>
  void Fixed(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  size_t position() const { return position_; }
  std::span<const uint8_t> Whole() const { return bytes_; }
  size_t remaining() const { return bytes_.size() - position_; }
  bool at_end() const { return position_ == bytes_.size(); }

  bool U8(uint8_t* v) { return Fixed(v); }
  bool U16(uint16_t* v) { return Fixed(v); }
  bool U32(uint32_t* v) { return Fixed(v); }
  bool U64(uint64_t* v) { return Fixed(v); }
  bool Varint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (position_ >= bytes_.size()) return false;
      uint8_t byte = bytes_[position_++];
      if (shift == 63 && byte > 1) return false;  // more than 64 bits
      result |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }
  // A view of the next n bytes, advancing past them.
  bool Bytes(size_t n, std::span<const uint8_t>* out) {
    if (n > remaining()) return false;
    *out = bytes_.subspan(position_, n);
    position_ += n;
    return true;
  }

 private:
  template <typename T>
  bool Fixed(T* v) {
    if (remaining() < sizeof(T)) return false;
    T result = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      result |= static_cast<T>(static_cast<T>(bytes_[position_ + i]) << (8 * i));
    }
    position_ += sizeof(T);
    *v = result;
    return true;
  }
  std::span<const uint8_t> bytes_;
  size_t position_ = 0;
};

}  // namespace weft
