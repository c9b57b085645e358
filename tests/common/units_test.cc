#include "common/units.h"

#include <doctest/doctest.h>

namespace weft {
namespace {

TEST_CASE("units: sizes and durations") {
  CHECK(*ParseByteSize("512") == 512);
  CHECK(*ParseByteSize("64MiB") == 64ull << 20);
  CHECK(*ParseByteSize("1.5G") == 1500000000ull);
  CHECK(*ParseByteSize("100 mb") == 100000000ull);
  CHECK(ParseByteSize("ten").status().message().find("'ten' is not a byte size") !=
        std::string::npos);
  CHECK(!ParseByteSize("-1").ok());
  CHECK(!ParseByteSize("5 parsecs").ok());
  CHECK(ParseDuration("40ms")->count() == 40000);
  CHECK(ParseDuration("2.5s")->count() == 2500000);
  CHECK(ParseDuration("1m")->count() == 60000000);
  CHECK(!ParseDuration("5").ok());
}

TEST_CASE("units: sizes printed in binary units") {
  CHECK(FormatBytes(0) == "0 B");
  CHECK(FormatBytes(1023) == "1023 B");
  CHECK(FormatBytes(1536) == "1.5 KiB");
  CHECK(FormatBytes(10.0 * (1ull << 30)) == "10.0 GiB");
  CHECK(FormatBytes(3.0 * (1ull << 40)) == "3.0 TiB");
}

}  // namespace
}  // namespace weft
