#include "sync/chunk_codec.h"

#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "sync/convert.h"
#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

ChangeList RandomChanges(std::mt19937_64& rng, uint32_t chunk, double density, uint8_t width,
                         double one_fraction) {
  ChangeList list;
  std::bernoulli_distribution pick(density), small(one_fraction);
  const uint64_t mask = width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
  for (uint32_t i = 0; i < chunk; ++i) {
    if (!pick(rng)) continue;
    uint64_t residual;
    if (small(rng)) {
      residual = (rng() & 1) ? 1 : mask;  // +1 or -1
    } else {
      residual = rng() & mask;
      if (residual == 0) residual = 3;
    }
    list.offsets.push_back(i);
    list.residuals.push_back(static_cast<uint32_t>(residual));
  }
  if (list.empty()) {
    list.offsets.push_back(chunk - 1);
    list.residuals.push_back(1);
  }
  return list;
}

TEST_CASE("order key: a bijection that sorts like the floats") {
  for (uint32_t a = 0; a < 65536; ++a) {
    uint16_t bits = static_cast<uint16_t>(a);
    REQUIRE(OrderKeyInverse(OrderKey(bits)) == bits);
  }
  // -0 sits just below +0; one ulp up from -smallest-subnormal reaches -0.
  CHECK(static_cast<uint16_t>(OrderKey<uint16_t>(0x0000) - OrderKey<uint16_t>(0x8000)) == 1);
  CHECK(static_cast<uint16_t>(OrderKey<uint16_t>(0x8000) - OrderKey<uint16_t>(0x8001)) == 1);
  CHECK(static_cast<uint16_t>(OrderKey<uint16_t>(0x3F81) - OrderKey<uint16_t>(0x3F80)) == 1);
  CHECK(static_cast<uint16_t>(OrderKey<uint16_t>(0xBF80) - OrderKey<uint16_t>(0xBF81)) == 1);
}

TEST_CASE("change lists round-trip through the entropy coder") {
  std::mt19937_64 rng(3);
  for (uint8_t width : {1, 2, 4}) {
    for (ValueCoding coding : {ValueCoding::kOrderedDiff, ValueCoding::kXor}) {
      if (coding == ValueCoding::kXor && width != 1) continue;
      for (double density : {0.0001, 0.005, 0.02, 0.1, 0.5, 1.0}) {
        for (double ones : {1.0, 0.88, 0.3, 0.0}) {
          CAPTURE(width);
          CAPTURE(density);
          CAPTURE(ones);
          const uint32_t chunk = 1 << 14;
          ChangeList list = RandomChanges(rng, chunk, density, width, ones);
          SparseHeader header;
          std::vector<uint8_t> payload;
          EncodeChanges(list, width, coding, &header, &payload);
          CHECK(header.payload_bytes() == payload.size());
          ChangeList decoded;
          REQUIRE(DecodeChanges(header, payload, chunk, width, coding, &decoded).ok());
          CHECK(decoded.offsets == list.offsets);
          CHECK(decoded.residuals == list.residuals);
        }
      }
    }
  }
}

TEST_CASE("a +-1 change at 2% density costs close to the entropy floor") {
  std::mt19937_64 rng(4);
  const uint32_t chunk = 1 << 20;
  ChangeList list = RandomChanges(rng, chunk, 0.02, 2, 1.0);
  SparseHeader header;
  std::vector<uint8_t> payload;
  EncodeChanges(list, 2, ValueCoding::kOrderedDiff, &header, &payload);
  double bits_per_change = 8.0 * payload.size() / list.size();
  // H(0.02)/0.02 = 7.07 bits for positions, 1 bit for the sign.
  CHECK(bits_per_change < 8.07 * 1.03);
}

TEST_CASE("the decoder rejects malformed sparse payloads without crashing") {
  std::mt19937_64 rng(5);
  const uint32_t chunk = 4096;
  ChangeList list = RandomChanges(rng, chunk, 0.05, 2, 0.8);
  SparseHeader header;
  std::vector<uint8_t> payload;
  EncodeChanges(list, 2, ValueCoding::kOrderedDiff, &header, &payload);
  ChangeList out;
  SUBCASE("counts larger than the streams can hold") {
    SparseHeader lie = header;
    lie.change_count = chunk;
    CHECK(DecodeChanges(lie, payload, chunk, 2, ValueCoding::kOrderedDiff, &out).code() ==
          StatusCode::kDataLoss);
    lie = header;
    lie.big_count = header.change_count + 1;
    CHECK(!DecodeChanges(lie, payload, chunk, 2, ValueCoding::kOrderedDiff, &out).ok());
  }
  SUBCASE("a chunk smaller than the positions") {
    CHECK(!DecodeChanges(header, payload, list.offsets.back(), 2, ValueCoding::kOrderedDiff, &out)
               .ok());
  }
  SUBCASE("truncated streams") {
    SparseHeader cut = header;
    cut.gap_bytes -= 1;
    std::vector<uint8_t> shorter(payload.begin() + 1, payload.end());
    CHECK(!DecodeChanges(cut, shorter, chunk, 2, ValueCoding::kOrderedDiff, &out).ok());
  }
  SUBCASE("random corruption: rejected, or a well-formed list") {
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<uint8_t> bad = payload;
      bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      Status status = DecodeChanges(header, bad, chunk, 2, ValueCoding::kOrderedDiff, &out);
      if (!status.ok()) continue;
      for (size_t j = 0; j < out.size(); ++j) {
        REQUIRE(out.offsets[j] < chunk);
        if (j > 0) REQUIRE(out.offsets[j] > out.offsets[j - 1]);
        REQUIRE(out.residuals[j] != 0);
        REQUIRE(out.residuals[j] <= 0xFFFF);
      }
    }
  }
}

TEST_CASE("fused BF16 convert + scan (SIMD) equals its scalar reference") {
  std::mt19937_64 rng(7);
  for (uint32_t count : {0u, 5u, 31u, 32u, 33u, 4095u, 4096u, 4097u, 10000u}) {
    // Masters built from every kind of bit pattern, and a served tensor close to their BF16 values.
    std::vector<uint32_t> bits(count);
    for (auto& b : bits) b = static_cast<uint32_t>(rng());
    const uint32_t specials[] = {0x7F800001, 0xFFC00000, 0x7F800000, 0x80000000, 0x00000001,
                                 0x807FFFFF, 0x3F808000, 0x3F818000, 0x7F7FFFFF};
    for (uint32_t i = 0; i < count; i += 3) bits[i] = specials[rng() % 9];
    std::vector<float> master(count);
    if (count > 0) std::memcpy(master.data(), bits.data(), size_t{count} * 4);
    std::vector<uint16_t> served(count);
    ConvertBf16Ref(master, served);
    for (auto& v : served)
      if (rng() % 20 == 0) v ^= static_cast<uint16_t>(1 + rng() % 7);
    std::vector<uint16_t> a = served, b = served;
    ChangeList fast, slow;
    Digest fast_digest, slow_digest;
    ScanFromMasterBf16(master.data(), reinterpret_cast<uint8_t*>(a.data()), count, 3, 77, &fast,
                       &fast_digest);
    ScanFromMasterBf16Ref(master.data(), reinterpret_cast<uint8_t*>(b.data()), count, 3, 77, &slow,
                          &slow_digest);
    CHECK(fast.offsets == slow.offsets);
    CHECK(fast.residuals == slow.residuals);
    CHECK(fast_digest == slow_digest);
    CHECK(a == b);
    std::vector<uint16_t> expected(count);
    ConvertBf16Ref(master, expected);
    CHECK(a == expected);
  }
}

TEST_CASE("SIMD scan equals the scalar scan") {
  std::mt19937_64 rng(6);
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF8E4M3, DType::kU8, DType::kI32}) {
    const uint8_t width = CodedWidth(dtype);
    for (uint32_t count : {0u, 1u, 31u, 32u, 33u, 63u, 64u, 65u, 1000u, 4099u}) {
      std::vector<uint8_t> old_bytes = testing::RandomTensor(dtype, count, rng);
      std::vector<uint8_t> new_bytes = testing::Perturb(old_bytes, dtype, 0.1, rng);
      ChangeList fast, slow;
      Digest fast_digest, slow_digest;
      ScanChanges(KeyKindFor(dtype), width, old_bytes.data(), new_bytes.data(), count, 7, 1000,
                  &fast, &fast_digest);
      ScanChangesRef(KeyKindFor(dtype), width, old_bytes.data(), new_bytes.data(), count, 7, 1000,
                     &slow, &slow_digest);
      CHECK(fast.offsets == slow.offsets);
      CHECK(fast.residuals == slow.residuals);
      CHECK(fast_digest == slow_digest);
    }
  }
}

}  // namespace
}  // namespace weft::sync
