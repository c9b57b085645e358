#include "sync/digest.h"

#include <cstring>
#include <vector>

#include "common/parallel.h"

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

}  // namespace

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
  size_t count = bytes.size() / element_size;
  switch (element_size) {
    case 1: return SumTerms<uint8_t>(bytes.data(), count, first_index);
    case 2: return SumTerms<uint16_t>(bytes.data(), count, first_index);
    case 4: return SumTerms<uint32_t>(bytes.data(), count, first_index);
    default: return SumTerms<uint64_t>(bytes.data(), count, first_index);
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
