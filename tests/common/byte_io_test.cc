#include "common/byte_io.h"

#include <doctest/doctest.h>

#include <vector>

namespace weft {
namespace {

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

TEST_CASE("ByteWriter writes fixed widths little-endian, and the reader reads them back") {
  std::vector<uint8_t> bytes;
  ByteWriter out(&bytes);
  out.U8(0x01);
  out.U16(0x0302);
  out.U64(0x0B0A090807060504ull);
  out.Bytes(std::string("xy"));
  CHECK(out.size() == 13);
  CHECK(bytes == std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 'x', 'y'});
  ByteReader in(bytes);
  uint8_t u8;
  uint16_t u16;
  uint64_t u64;
  std::span<const uint8_t> tail;
  REQUIRE(in.U8(&u8));
  REQUIRE(in.U16(&u16));
  REQUIRE(in.U64(&u64));
  CHECK(u16 == 0x0302);
  CHECK(u64 == 0x0B0A090807060504ull);
  CHECK(in.position() == 11);
  CHECK(in.remaining() == 2);
  CHECK(!in.Bytes(3, &tail));  // past the end: nothing consumed
  REQUIRE(in.Bytes(2, &tail));
  CHECK(tail.size() == 2);
  CHECK(in.at_end());
}

}  // namespace
}  // namespace weft
