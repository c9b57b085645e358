#include "sync/digest.h"

#include <doctest/doctest.h>

#include <random>

#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

TEST_CASE("incremental digest updates equal a full recomputation") {
  std::mt19937_64 rng(1);
  for (DType dtype : testing::kAllDTypes) {
    CAPTURE(Info(dtype).safetensors_name);
    const uint8_t width = CodedWidth(dtype);
    std::vector<uint8_t> bytes = testing::RandomTensor(dtype, 5000, rng);
    Digest digest = TensorDigest(dtype, bytes);
    for (int step = 0; step < 200; ++step) {
      uint64_t index = rng() % (bytes.size() / width);
      uint64_t old_value = 0, new_value = rng();
      std::memcpy(&old_value, &bytes[index * width], width);
      new_value &= width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
      std::memcpy(&bytes[index * width], &new_value, width);
      digest += ElementChange(index, old_value, new_value);
    }
    CHECK(digest == TensorDigest(dtype, bytes));
    CHECK(digest == TensorDigest(dtype, bytes, 2));
  }
}

TEST_CASE("element sums: the vector path equals the scalar reference for every width and offset") {
  std::mt19937_64 rng(3);
  for (uint8_t width : {1, 2, 4, 8}) {
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{37}, size_t{1000}}) {
      for (uint64_t first : {uint64_t{0}, uint64_t{5}, ~uint64_t{0} - 3, rng()}) {
        CAPTURE(width);
        CAPTURE(count);
        std::vector<uint8_t> bytes(count * width);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        CHECK(ElementsDigest(bytes, width, first) == ElementsDigestRef(bytes, width, first));
      }
    }
  }
}

TEST_CASE("every single-element change changes the digest") {
  std::mt19937_64 rng(2);
  std::vector<uint8_t> bytes = testing::RandomTensor(DType::kBF16, 1000, rng);
  Digest base = TensorDigest(DType::kBF16, bytes);
  for (int i = 0; i < 1000; ++i) {
    std::vector<uint8_t> changed = bytes;
    changed[2 * i] ^= static_cast<uint8_t>(1u << (i % 8));
    CHECK(TensorDigest(DType::kBF16, changed) != base);
  }
  // -0 and +0 are different served values.
  uint16_t zeros[2] = {0x0000, 0x8000};
  uint16_t swapped_zeros[2] = {0x0000, 0x0000};
  CHECK(TensorDigest(DType::kBF16, {reinterpret_cast<uint8_t*>(zeros), 4}) !=
        TensorDigest(DType::kBF16, {reinterpret_cast<uint8_t*>(swapped_zeros), 4}));
}

TEST_CASE("swapped elements, a different length or a different dtype change the digest") {
  std::vector<uint8_t> bytes = {1, 0, 2, 0, 3, 0, 4, 0};
  std::vector<uint8_t> swapped = {2, 0, 1, 0, 3, 0, 4, 0};
  Digest a = TensorDigest(DType::kBF16, bytes);
  CHECK(a != TensorDigest(DType::kBF16, swapped));
  CHECK(a != TensorDigest(DType::kF16, bytes));
  CHECK(a != TensorDigest(DType::kBF16, std::span<const uint8_t>(bytes).first(6)));
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  longer.push_back(0);
  CHECK(a != TensorDigest(DType::kBF16, longer));
}

TEST_CASE("batched digest changes (SIMD) equal the scalar reference") {
  std::mt19937_64 rng(3);
  for (size_t n : {0, 1, 7, 8, 9, 1000}) {
    std::vector<uint32_t> offsets(n), before(n), after(n);
    for (size_t j = 0; j < n; ++j) {
      offsets[j] = static_cast<uint32_t>(rng());
      before[j] = static_cast<uint32_t>(rng());
      after[j] = j % 3 == 0 ? before[j] : static_cast<uint32_t>(rng());
    }
    for (uint64_t first : {uint64_t{0}, uint64_t{1} << 40, ~uint64_t{0} - 5}) {
      Digest fast = SumElementChanges(first, offsets.data(), before.data(), after.data(), n);
      Digest slow = SumElementChangesRef(first, offsets.data(), before.data(), after.data(), n);
      CHECK(fast == slow);
    }
  }
}

TEST_CASE("hex form round-trips and rejects malformed text") {
  Digest d{0x0123456789ABCDEFull, 0xFEDCBA9876543210ull};
  CHECK(d.ToHex() == "0123456789abcdeffedcba9876543210");
  CHECK(Digest::FromHex(d.ToHex()) == d);
  CHECK(!Digest::FromHex("0123"));
  CHECK(!Digest::FromHex("0123456789abcdeffedcba987654321g"));
  CHECK(!Digest::FromHex("0123456789ABCDEFFEDCBA9876543210"));
}

}  // namespace
}  // namespace weft::sync
