#include "policy_store/store_server.h"

#include <doctest/doctest.h>

#include <curl/curl.h>

#include "policy_store/http_store.h"
#include "tests/http_test_util.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

using weft::testing::Raw;

std::string Text(const weft::testing::RawReply& reply) { return reply.text(); }

TEST_CASE("HTTP store server: authentication, ranges, caching headers, hostile requests") {
  Served served("secret");
  REQUIRE(served.backend->PutImmutable("blobs/abc", Bytes("0123456789")).ok());
  HttpStore anonymous(served.url, "", FastRetries());
  HttpStore wrong(served.url, "guess", FastRetries());
  CHECK(anonymous.PutImmutable("blobs/new", Bytes("x")).message().find("401") != std::string::npos);
  CHECK(wrong.CompareAndSwap("runs/r/latest", std::nullopt, "0").message().find("writer token") !=
        std::string::npos);
  CHECK(wrong.Delete("blobs/abc").code() == StatusCode::kInvalidArgument);
  CHECK(*anonymous.Exists("blobs/abc"));  // reads need no token

  const std::string object = served.url + "/v1/objects/blobs/abc";
  auto whole = Raw(object, "GET");
  CHECK(whole.status == 200);
  CHECK(Text(whole) == "0123456789");
  auto part = Raw(object, "GET", {"Range: bytes=2-5"});
  CHECK(part.status == 206);
  CHECK(Text(part) == "2345");
  CHECK(Text(Raw(object, "GET", {"Range: bytes=7-"})) == "789");
  CHECK(Text(Raw(object, "GET", {"Range: bytes=-3"})) == "789");
  CHECK(Raw(object, "GET", {"Range: bytes=20-30"}).status == 416);
  CHECK(Raw(object, "GET", {"If-None-Match: \"abc\""}).status == 304);
  CHECK(Raw(served.url + "/v1/objects/../../etc/passwd", "GET").status == 400);
  CHECK(Raw(served.url + "/v1/objects/blobs/abc?x=1", "GET").status == 400);
  CHECK(Raw(served.url + "/v1/nothing", "GET").status == 404);
  CHECK(Raw(object, "PATCH").status == 405);
  CHECK(Raw(served.url + "/v1/cas/runs/r/latest", "POST", {"Authorization: Bearer secret"},
            "{\"desired\": 3}")
            .status == 400);
  auto too_big = Raw(served.url + "/v1/objects/blobs/big", "PUT", {"Authorization: Bearer secret"},
                     std::string((1 << 20) + 10, 'x'));
  CHECK(too_big.status == 413);
  CHECK(!*served.backend->Exists("blobs/big"));
  CHECK(Raw(served.url + "/livez", "GET").status == 200);
}

TEST_CASE("HTTP store: a read-only server refuses writes; an unreachable server is unavailable") {
  Served served("");
  HttpStore store(served.url, "anything", FastRetries());
  CHECK(store.PutImmutable("blobs/x", Bytes("x")).message().find("read-only") != std::string::npos);
  const std::string url = served.url;
  served.server->Stop();
  HttpStore gone(url, "", FastRetries());
  Status status = gone.Get("blobs/x").status();
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK(status.message().find("gave up after 2 tries") != std::string::npos);
}

}  // namespace
}  // namespace weft::policy_store
