// Helpers shared by the sync tests (and the test model maker): random tensors with the bit
// patterns that break codecs.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sync/dtype.h"

namespace weft::sync::testing {

// Random bytes for `count` elements of `dtype`, a quarter of them drawn from special patterns
// (NaN payloads, infinities, signed zeros, subnormals, extremes) for float types.
inline std::vector<uint8_t> RandomTensor(DType dtype, uint64_t count, std::mt19937_64& rng) {
  const uint8_t size = Info(dtype).size;
  std::vector<uint8_t> bytes(count * size);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  if (Info(dtype).is_float && size <= 4) {
    const uint32_t specials4[] = {0x7FC00000, 0xFFC00001, 0x7F800000, 0xFF800000, 0x00000000,
                                  0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x3C23D70A};
    const uint16_t specials2[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x0000, 0x8000,
                                  0x0001, 0x807F, 0x7C00, 0x7E01, 0xFC00, 0x03FF};
    const uint8_t specials1[] = {0x7F, 0xFF, 0x7E, 0xFE, 0x00, 0x80, 0x01, 0x81, 0x7C, 0x7B};
    for (uint64_t i = 0; i < count; ++i) {
      if (rng() % 4 != 0) continue;
      if (size == 4) std::memcpy(&bytes[i * 4], &specials4[rng() % 10], 4);
      if (size == 2) std::memcpy(&bytes[i * 2], &specials2[rng() % 12], 2);
      if (size == 1) bytes[i] = specials1[rng() % 10];
    }
  }
  return bytes;
}

// Changes about `density` of the elements: mostly by one unit in the last place, sometimes by
// more, sometimes to a special pattern.
inline std::vector<uint8_t> Perturb(const std::vector<uint8_t>& bytes, DType dtype, double density,
                                    std::mt19937_64& rng) {
  std::vector<uint8_t> out = bytes;
  const uint8_t size = Info(dtype).size;
  const uint64_t count = bytes.size() / size;
  std::bernoulli_distribution pick(density);
  std::vector<uint8_t> special = RandomTensor(dtype, 1, rng);
  for (uint64_t i = 0; i < count; ++i) {
    if (!pick(rng)) continue;
    uint64_t value = 0;
    std::memcpy(&value, &out[i * size], size);
    switch (rng() % 8) {
      case 0:
        value += 1 + rng() % 1000;
        break;
      case 1:
        value ^= rng();
        break;
      case 2:
        special = RandomTensor(dtype, 1, rng);
        std::memcpy(&value, special.data(), size);
        break;
      case 3:
      case 4:
      case 5:
        value += 1;
        break;
      default:
        value -= 1;
        break;
    }
    std::memcpy(&out[i * size], &value, size);
  }
  return out;
}

inline const DType kAllDTypes[] = {DType::kF32,    DType::kF16, DType::kBF16, DType::kF8E4M3,
                                   DType::kF8E5M2, DType::kF64, DType::kI8,   DType::kU8,
                                   DType::kI16,    DType::kU16, DType::kI32,  DType::kU32,
                                   DType::kI64,    DType::kU64, DType::kBool};

}  // namespace weft::sync::testing
