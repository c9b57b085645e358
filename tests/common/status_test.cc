#include "common/status.h"

#include <doctest/doctest.h>

#include "common/byte_io.h"
#include "common/parallel.h"

#include <atomic>
#include <thread>
#include <vector>

namespace weft {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  WEFT_ASSIGN_OR_RETURN(int half, Half(x));
  WEFT_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST_CASE("Status carries a code, a message and context") {
  Status ok;
  CHECK(ok.ok());
  Status error = DataLoss("checksum mismatch").WithContext("chunk 3").WithContext("model.delta");
  CHECK(error.code() == StatusCode::kDataLoss);
  CHECK(error.message() == "model.delta: chunk 3: checksum mismatch");
  CHECK(error.ToString() == "data loss: model.delta: chunk 3: checksum mismatch");
  CHECK(Status::Ok().WithContext("x").ok());
}

TEST_CASE("Result and the propagation macros") {
  CHECK(Quarter(8).value() == 2);
  Result<int> odd = Quarter(6);
  REQUIRE(!odd.ok());
  CHECK(odd.status().code() == StatusCode::kInvalidArgument);
  CHECK(odd.status().message() == "3 is odd");
}

TEST_CASE("ByteReader never reads past its span") {
  std::vector<uint8_t> bytes;
  ByteWriter out(&bytes);
  out.U32(0xDEADBEEF);
  out.Varint(300);
  out.Varint(~uint64_t{0});
  ByteReader in(bytes);
  uint32_t u32;
  uint64_t v;
  REQUIRE(in.U32(&u32));
  CHECK(u32 == 0xDEADBEEF);
  REQUIRE(in.Varint(&v));
  CHECK(v == 300);
  REQUIRE(in.Varint(&v));
  CHECK(v == ~uint64_t{0});
  CHECK(in.at_end());
  CHECK(!in.U32(&u32));
  std::vector<uint8_t> overlong(11, 0xFF);
  ByteReader bad(overlong);
  CHECK(!bad.Varint(&v));
  std::vector<uint8_t> truncated = {0x80};
  ByteReader cut(truncated);
  CHECK(!cut.Varint(&v));
}

TEST_CASE("ParallelFor visits every index exactly once") {
  for (int threads : {1, 2, 8}) {
    std::vector<std::atomic<int>> seen(1000);
    ParallelFor(seen.size(), threads, [&](size_t i) { seen[i].fetch_add(1); });
    for (auto& s : seen) CHECK(s.load() == 1);
  }
  ParallelFor(0, 4, [](size_t) { FAIL("called for an empty range"); });
}

TEST_CASE("ParallelFor nests and runs from several threads at once without deadlock") {
  std::atomic<int> total{0};
  // Nested: the inner loops run inline on whichever thread runs the outer item.
  ParallelFor(8, 4, [&](size_t) { ParallelFor(10, 4, [&](size_t) { total.fetch_add(1); }); });
  CHECK(total.load() == 80);
  // Concurrent callers: one holds the pool, the others run inline; every index still runs once.
  total = 0;
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round)
        ParallelFor(100, 3, [&](size_t) { total.fetch_add(1); });
    });
  }
  for (auto& caller : callers) caller.join();
  CHECK(total.load() == 4 * 50 * 100);
}

}  // namespace
}  // namespace weft
