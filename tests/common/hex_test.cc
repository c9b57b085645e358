#include "common/hex.h"

#include <doctest/doctest.h>

#include <vector>

#include "common/http_server.h"

namespace weft {
namespace {

TEST_CASE("hex: lowercase digits, two per byte, and the check of such text") {
  const std::vector<uint8_t> bytes = {0x00, 0x0f, 0xa5, 0xff};
  CHECK(HexEncode(bytes) == "000fa5ff");
  CHECK(HexEncode({}) == "");
  CHECK(IsLowerHex("0123456789abcdef"));
  CHECK(IsLowerHex(""));
  CHECK(!IsLowerHex("ABCDEF"));
  CHECK(!IsLowerHex("12g4"));
  CHECK(
      !IsLowerHex(std::string("12\0"
                              "4",
                              4)));
}

TEST_CASE("token digests: equal tokens match, anything else and empty tokens do not") {
  const http::TokenDigest token("secret");
  CHECK(token.Matches(http::TokenDigest("secret")));
  CHECK(!token.Matches(http::TokenDigest("secreT")));
  CHECK(!token.Matches(http::TokenDigest("secret ")));
  CHECK(!token.Matches(http::TokenDigest("")));
  CHECK(!http::TokenDigest("").Matches(http::TokenDigest("")));
  CHECK(!http::TokenDigest().Matches(http::TokenDigest()));
  http::RequestHeader request;
  request.set(boost::beast::http::field::authorization, "Bearer secret");
  CHECK(http::BearerToken(request) == "secret");
  CHECK(http::BearerMatches(request, "secret"));
  CHECK(!http::BearerMatches(request, ""));
  request.set(boost::beast::http::field::authorization, "Basic secret");
  CHECK(http::BearerToken(request).empty());
  CHECK(!http::BearerMatches(request, "secret"));
}

}  // namespace
}  // namespace weft
