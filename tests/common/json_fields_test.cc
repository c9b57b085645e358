#include "common/json_fields.h"

#include <doctest/doctest.h>

namespace weft {
namespace {

using Json = nlohmann::json;

TEST_CASE("JSON fields: unknown, missing and mistyped fields are errors that name them") {
  const Json object = Json::parse(R"({"name": "a", "count": 3, "extra": true})");
  CHECK(CheckFields(object, "thing", {"name", "count"}, {"extra"}).ok());
  CHECK(CheckFields(object, "thing", {"name"}, {"count"}).message() ==
        "thing has an unknown field 'extra'");
  CHECK(CheckFields(object, "thing", {"name", "count", "size"}, {"extra"}).message() ==
        "thing lacks the field 'size'");
  CHECK(CheckFields(Json::array(), "thing", {}).message() == "thing is not an object");
  CHECK(CheckFields(Json(nullptr), "thing", {}).code() == StatusCode::kInvalidArgument);

  CHECK(*GetUnsigned(object, "count", "thing") == 3);
  CHECK(GetUnsigned(Json::parse(R"({"count": -1})"), "count", "thing").status().message() ==
        "thing.count is not a non-negative integer");
  CHECK(!GetUnsigned(Json::parse(R"({"count": 1.5})"), "count", "thing").ok());
  CHECK(!GetUnsigned(Json::parse(R"({"count": "3"})"), "count", "thing").ok());
  CHECK(*GetUnsigned(Json::parse(R"({"count": 18446744073709551615})"), "count", "thing") ==
        ~uint64_t{0});
  CHECK(*GetString(object, "name", "thing") == "a");
  CHECK(GetString(object, "count", "thing").status().message() == "thing.count is not a string");
}

}  // namespace
}  // namespace weft
