#include "common/status.h"

#include <doctest/doctest.h>

#include <string>

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

}  // namespace
}  // namespace weft
