#include "policy_store/store_server.h"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "policy_store/http_store.h"
#include "tests/http_test_util.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

using weft::testing::Raw;
using weft::testing::RawConnection;
using weft::testing::StatusOf;

std::string Text(const weft::testing::RawReply& reply) { return reply.text(); }

// Files under `dir` whose name starts with '.' (a write in progress), with their sizes.
std::vector<uint64_t> HiddenFiles(const std::string& dir) {
  std::vector<uint64_t> sizes;
  std::error_code error;
  for (const auto& file : std::filesystem::recursive_directory_iterator(dir, error)) {
    if (file.is_regular_file() && file.path().filename().string().front() == '.' &&
        file.path().filename() != ".lock")
      sizes.push_back(file.file_size());
  }
  return sizes;
}

TEST_CASE("HTTP store server: authentication, ranges, caching headers, hostile requests") {
  Served served("secret");
  REQUIRE(served.backend->PutImmutable("blobs/abc", TextBytes("0123456789")).ok());
  HttpStore anonymous(served.url, "", FastRetries());
  HttpStore wrong(served.url, "guess", FastRetries());
  CHECK(anonymous.PutImmutable("blobs/new", TextBytes("x")).message().find("401") !=
        std::string::npos);
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
  auto too_big = Raw(served.url + "/v1/objects/runs/r/big", "PUT", {"Authorization: Bearer secret"},
                     std::string((1 << 20) + 10, 'x'));
  CHECK(too_big.status == 413);
  CHECK(!*served.backend->Exists("runs/r/big"));
  CHECK(Raw(served.url + "/livez", "GET").status == 200);
}

TEST_CASE("HTTP store: a read-only server refuses writes; an unreachable server is unavailable") {
  Served served("");
  HttpStore store(served.url, "anything", FastRetries());
  CHECK(store.PutImmutable("blobs/x", TextBytes("x")).message().find("read-only") !=
        std::string::npos);
  const std::string url = served.url;
  served.server->Stop();
  HttpStore gone(url, "", FastRetries());
  Status status = gone.Get("blobs/x").status();
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK(status.message().find("gave up after 2 tries") != std::string::npos);
}

TEST_CASE("store server: refusals come from the header, before any of the body is read") {
  Served served("secret");
  Served read_only("");
  // Each request announces a body it never sends: only an answer from the header can arrive.
  struct Case {
    const Served* server;
    std::string request;
    int status;
  };
  const std::string blob = "/v1/objects/blobs/" + std::string(64, 'a');
  for (const Case& c : std::vector<Case>{
           {&served, "PUT " + blob + " HTTP/1.1\r\nContent-Length: 900000\r\n", 401},
           {&served,
            "PUT " + blob +
                " HTTP/1.1\r\nAuthorization: Bearer guess\r\n"
                "Content-Length: 900000\r\n",
            401},
           {&read_only,
            "PUT " + blob +
                " HTTP/1.1\r\nAuthorization: Bearer secret\r\n"
                "Content-Length: 900000\r\n",
            403},
           {&served, "POST /v1/objects/runs/r/x HTTP/1.1\r\nContent-Length: 900000\r\n", 405},
           {&served,
            "PUT /v1/objects/runs/r/x HTTP/1.1\r\nAuthorization: Bearer secret\r\n"
            "Content-Length: 2000000\r\n",
            413},
           {&served,
            "POST /v1/cas/runs/r/latest HTTP/1.1\r\nAuthorization: Bearer secret\r\n"
            "Content-Length: 900000\r\n",
            413},
           {&served,
            "PUT /v1/objects/blobs/abc HTTP/1.1\r\nAuthorization: Bearer secret\r\n"
            "Content-Length: 900000\r\n",
            400},
           {&served,
            "PUT /v1/objects/runs/.x HTTP/1.1\r\nAuthorization: Bearer secret\r\n"
            "Content-Length: 900000\r\n",
            400},
       }) {
    CAPTURE(c.request);
    RawConnection connection(weft::testing::PortOf(c.server->url), std::chrono::seconds(2));
    connection.Send(c.request + "Host: h\r\n\r\n");
    CHECK(StatusOf(connection.ReadAll()) == c.status);
  }
  CHECK(HiddenFiles(served.root).empty());
}

TEST_CASE("store server: slow readers of a large blob hold a piece each, not the blob") {
  Served served("");
  const std::vector<uint8_t> blob = Pattern(size_t{32} << 20, 7);
  const std::string key = BlobKey(Sha256Hex(blob));
  REQUIRE(served.backend->PutImmutable(key, blob).ok());
  const uint64_t before = ResidentBytes();
  // Eight clients ask for the whole blob and read only its first bytes: a server that held the
  // object per request would grow by 256 MB.
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 8; ++i) {
    slow.push_back(std::make_unique<RawConnection>(weft::testing::PortOf(served.url)));
    slow.back()->Send("GET /v1/objects/" + key + " HTTP/1.1\r\nHost: h\r\n\r\n");
    CHECK(StatusOf(slow.back()->ReadSome()) == 200);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t grown = ResidentGrowthSince(before);
  CAPTURE(grown);
  CHECK(grown < (uint64_t{48} << 20));
  // HEAD says the size without reading the blob; a range comes whole.
  RawConnection head(weft::testing::PortOf(served.url), std::chrono::seconds(1));
  head.Send("HEAD /v1/objects/" + key + " HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  const std::string headers = head.ReadAll();
  CHECK(StatusOf(headers) == 200);
  CHECK(headers.find("Content-Length: 33554432\r\n") != std::string::npos);
  CHECK(headers.substr(headers.find("\r\n\r\n") + 4).empty());
  auto range = Raw(served.url + "/v1/objects/" + key, "GET", {"Range: bytes=1000-1099"});
  CHECK(range.status == 206);
  CHECK(range.body == std::vector<uint8_t>(blob.begin() + 1000, blob.begin() + 1100));
  // A whole read streams every byte.
  auto whole = Raw(served.url + "/v1/objects/" + key, "GET");
  CHECK(whole.status == 200);
  CHECK(whole.body == blob);
  CHECK(Raw(served.url + "/livez", "GET").status == 200);
  auto metrics = Raw(served.url + "/metrics", "GET");
  CHECK(metrics.status == 200);
  CHECK(metrics.text().find("weft_store_server_object_streams ") != std::string::npos);
}

TEST_CASE("store server: a compare-and-swap conflict names a large object by size and hash") {
  Served served("secret");
  const std::vector<uint8_t> big = Pattern(size_t{32} << 20, 9);
  REQUIRE(served.backend
              ->CompareAndSwap("runs/r/pins/big", std::nullopt, std::string(big.begin(), big.end()))
              .ok());
  const uint64_t before = ResidentBytes();
  auto conflict =
      Raw(served.url + "/v1/cas/runs/r/pins/big", "POST", {"Authorization: Bearer secret"},
          "{\"expected\": \"1\", \"desired\": \"2\"}");
  CHECK(conflict.status == 409);
  CHECK(conflict.body.size() < 1024);
  CHECK(conflict.text().find("33554432 bytes with SHA-256 " + Sha256Hex(big)) != std::string::npos);
  CHECK(ResidentGrowthSince(before) < (uint64_t{24} << 20));
  // A short value is named as it is.
  REQUIRE(served.backend->CompareAndSwap("runs/r/latest", std::nullopt, "7\n").ok());
  auto small = Raw(served.url + "/v1/cas/runs/r/latest", "POST", {"Authorization: Bearer secret"},
                   "{\"expected\": \"6\\n\", \"desired\": \"8\\n\"}");
  CHECK(small.status == 409);
  CHECK(small.text().find("found '7\\n'") != std::string::npos);
}

TEST_CASE("store server: immutable objects refuse compare-and-swap; pointers refuse PUT") {
  Served served("secret");
  const std::vector<std::string> writer = {"Authorization: Bearer secret"};
  const std::string blob = BlobKey(Sha256Hex(TextBytes("weights")));
  REQUIRE(served.backend->PutImmutable(blob, TextBytes("weights")).ok());
  const std::string manifest = ManifestKey("r", 3);
  REQUIRE(served.backend->PutImmutable(manifest, TextBytes("{}")).ok());
  for (const auto& [object, held] : std::vector<std::pair<std::string, std::string>>{
           {blob, "weights"}, {manifest, "{}"}, {"runs/r/shards/x", ""}, {"other", ""}}) {
    const std::string key = object;  // (a structured binding cannot be captured)
    CAPTURE(key);
    const nlohmann::json body = {
        {"expected", held.empty() ? nlohmann::json() : nlohmann::json(held)}, {"desired", "evil"}};
    auto refused = Raw(served.url + "/v1/cas/" + key, "POST", writer, body.dump());
    CHECK(refused.status == 409);
    CHECK(refused.text().find(key + " is immutable") != std::string::npos);
  }
  auto text = [&](const std::string& key) {
    const std::vector<uint8_t> bytes = served.backend->Get(key).value();
    return std::string(bytes.begin(), bytes.end());
  };
  CHECK(text(blob) == "weights");
  CHECK(text(manifest) == "{}");
  CHECK(!served.backend->Exists("other").value());
  // The pointers change by compare-and-swap only.
  auto put = Raw(served.url + "/v1/objects/runs/r/latest", "PUT", writer, "9\n");
  CHECK(put.status == 409);
  CHECK(put.text().find("changes only by compare-and-swap") != std::string::npos);
  CHECK(Raw(served.url + "/v1/objects/runs/r/pins/w1", "PUT", writer, "1").status == 409);
  CHECK(!served.backend->Exists("runs/r/latest").value());
  CHECK(Raw(served.url + "/v1/cas/runs/r/latest", "POST", writer,
            R"({"expected": null, "desired": "0\n"})")
            .status == 200);
  CHECK(Raw(served.url + "/v1/cas/runs/r/pins/w1", "POST", writer,
            R"({"expected": null, "desired": "0"})")
            .status == 200);
  // The rule itself.
  CHECK(IsMutableKey("runs/r/latest"));
  CHECK(IsMutableKey("runs/r/pins/holder"));
  CHECK(!IsMutableKey("runs/r/pins/a/b"));
  CHECK(!IsMutableKey("runs/r/pins/"));
  CHECK(!IsMutableKey("runs//latest"));
  CHECK(!IsMutableKey("runs/latest"));
  CHECK(!IsMutableKey("runs/r/latest/x"));
  CHECK(!IsMutableKey("blobs/latest"));
}

TEST_CASE("store server: a PUT streams to a temporary file, stored once it has arrived whole") {
  Served served("secret");
  const std::string body = std::string(300000, 'a') + std::string(300000, 'b');
  const std::string header =
      "PUT /v1/objects/runs/r/big HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer secret\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  auto wait_for_upload = [&](uint64_t bytes) {
    for (int i = 0; i < 200; ++i) {
      std::vector<uint64_t> sizes = HiddenFiles(served.root);
      if (sizes.size() == 1 && sizes[0] == bytes) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  {
    RawConnection cut(weft::testing::PortOf(served.url), std::chrono::seconds(2));
    cut.Send(header + body.substr(0, 300000));
    CHECK(wait_for_upload(300000));  // on disk as it arrives, not in memory
  }
  // Cut off: the partial file goes, nothing is stored.
  for (int i = 0; i < 200 && !HiddenFiles(served.root).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(HiddenFiles(served.root).empty());
  CHECK(!*served.backend->Exists("runs/r/big"));

  RawConnection whole(weft::testing::PortOf(served.url), std::chrono::seconds(2));
  whole.Send(header + body.substr(0, 300000));
  CHECK(wait_for_upload(300000));
  CHECK(!*served.backend->Exists("runs/r/big"));
  whole.Send(body.substr(300000));
  CHECK(StatusOf(whole.ReadAll()) == 201);
  auto stored = served.backend->Get("runs/r/big");
  REQUIRE(stored.ok());
  CHECK(std::string(stored->begin(), stored->end()) == body);
  CHECK(HiddenFiles(served.root).empty());
}

TEST_CASE("store server: a blob's bytes must hash to its name, or nothing is stored") {
  Served served("secret");
  HttpStore store(served.url, "secret", FastRetries());
  const std::string right = "the right bytes", wrong = "other bytes";
  const std::string right_hash = Sha256Hex(TextBytes(right)),
                    wrong_hash = Sha256Hex(TextBytes(wrong));
  const std::string key = BlobKey(right_hash);
  Status refused = store.PutImmutable(key, TextBytes(wrong));
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("HTTP 400") != std::string::npos);
  CHECK(refused.message().find("hash to " + wrong_hash + ", not to " + right_hash) !=
        std::string::npos);
  CHECK(!*served.backend->Exists(key));
  // The right bytes are not blocked by the wrong ones.
  REQUIRE(store.PutImmutable(key, TextBytes(right)).ok());
  CHECK(*store.Get(key) == std::vector<uint8_t>(right.begin(), right.end()));
  CHECK(store.PutImmutable(key, TextBytes(right)).ok());  // again: idempotent
  // Keys under blobs/ are hashes: 64 lowercase hex digits.
  for (const std::string& bad :
       std::vector<std::string>{"blobs/abc", "blobs/" + std::string(64, 'A'),
                                "blobs/" + right_hash + "0", "blobs/" + right_hash + "/x"}) {
    CAPTURE(bad);
    CHECK(store.PutImmutable(bad, TextBytes(right)).code() == StatusCode::kInvalidArgument);
  }
  // Chunked, in pieces: hashed as it streams.
  const std::string chunked_hash = Sha256Hex(TextBytes("hello world"));
  RawConnection connection(weft::testing::PortOf(served.url), std::chrono::seconds(2));
  connection.Send("PUT /v1/objects/blobs/" + chunked_hash +
                  " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer secret\r\nConnection: close\r\n"
                  "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  CHECK(StatusOf(connection.ReadAll()) == 201);
  CHECK(*served.backend->Exists("blobs/" + chunked_hash));
}

TEST_CASE("store server: wrong methods are 405 with Allow; If-None-Match: * makes a PUT create") {
  Served served("secret");
  auto answer = [&](const std::string& request) {
    RawConnection connection(weft::testing::PortOf(served.url), std::chrono::seconds(2));
    connection.Send(request +
                    " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer secret\r\n"
                    "Connection: close\r\n\r\n");
    return connection.ReadAll();
  };
  for (const auto& [method_path, allow] : std::vector<std::pair<std::string, std::string>>{
           {"POST /livez", "GET, HEAD"},
           {"DELETE /livez", "GET, HEAD"},
           {"PUT /v1/list/runs/", "GET, HEAD"},
           {"GET /v1/cas/runs/r/latest", "POST"},
           {"PATCH /v1/objects/runs/r/x", "GET, HEAD, PUT, DELETE"},
       }) {
    const std::string request = method_path;  // (a structured binding cannot be captured)
    CAPTURE(request);
    const std::string text = answer(request);
    CHECK(StatusOf(text) == 405);
    CHECK(text.find("\r\nAllow: " + allow + "\r\n") != std::string::npos);
  }
  CHECK(StatusOf(answer("HEAD /livez")) == 200);
  CHECK(StatusOf(answer("GET /livez")) == 200);

  const std::string object = served.url + "/v1/objects/runs/r/versions/x";
  const std::vector<std::string> writer = {"Authorization: Bearer secret"};
  auto with = [&](std::vector<std::string> headers, const std::string& extra) {
    headers.push_back(extra);
    return headers;
  };
  CHECK(Raw(object, "PUT", with(writer, "If-None-Match: *"), "one").status == 201);
  CHECK(Raw(object, "PUT", writer, "one").status == 201);  // the same bytes again
  auto exists = Raw(object, "PUT", with(writer, "If-None-Match: *"), "one");
  CHECK(exists.status == 412);
  CHECK(exists.text().find("already exists") != std::string::npos);
  CHECK(Raw(object, "PUT", with(writer, "If-None-Match: *"), "two").status == 412);
  CHECK(Raw(object, "PUT", writer, "two").status == 409);
  CHECK(Raw(object, "PUT", with(writer, "If-None-Match: \"abc\""), "one").status == 400);
  CHECK(Text(Raw(object, "GET")) == "one");
}

TEST_CASE("store server: directories, the lock and hidden files are no objects; no paths leak") {
  Served served("secret");
  REQUIRE(served.backend->PutImmutable("runs/r/versions/a", TextBytes("1")).ok());
  REQUIRE(served.backend->CompareAndSwap("runs/r/latest", std::nullopt, "0\n").ok());
  REQUIRE(std::filesystem::exists(served.root + "/.lock"));
  std::ofstream(served.root + "/runs/r/versions/.b.tmp-123456") << "in progress";
  const std::vector<std::string> writer = {"Authorization: Bearer secret"};
  const std::string objects = served.url + "/v1/objects/";

  // A key naming a directory: 404, at once, naming the key and not where the store lives.
  HttpStore store(served.url, "secret", FastRetries());
  for (const std::string key : {"runs", "runs/r", "runs/r/versions"}) {
    CAPTURE(key);
    auto directory = Raw(objects + key, "GET");
    CHECK(directory.status == 404);
    CHECK(directory.text().find(served.root) == std::string::npos);
    CHECK(directory.text().find(key + ": no such object") != std::string::npos);
    CHECK(store.Get(key).status().code() == StatusCode::kNotFound);
    CHECK(!*store.Exists(key));  // HEAD
  }
  // Under an object: a conflict, not a retried 503, and no path either.
  auto under = Raw(objects + "runs/r/versions/a/b", "PUT", writer, "x");
  CHECK(under.status == 409);
  CHECK(under.text().find(served.root) == std::string::npos);

  // The store's own files: refused whatever the method.
  for (const std::string key : {".lock", "runs/r/versions/.b.tmp-123456", "runs/.x/latest"}) {
    CAPTURE(key);
    CHECK(Raw(objects + key, "GET").status == 400);
    CHECK(Raw(objects + key, "PUT", writer, "").status == 400);
    CHECK(Raw(objects + key, "DELETE", writer).status == 400);
    CHECK(
        Raw(served.url + "/v1/cas/" + key, "POST", writer, R"({"expected": null, "desired": "1"})")
            .status == 400);
  }
  CHECK(Raw(served.url + "/v1/list/.x/", "GET").status == 400);
  CHECK(std::filesystem::exists(served.root + "/.lock"));
  CHECK(std::filesystem::exists(served.root + "/runs/r/versions/.b.tmp-123456"));
  auto listing = Raw(served.url + "/v1/list/runs/r/", "GET");
  CHECK(listing.text() == R"({"keys":["runs/r/latest","runs/r/versions/a"]})");
}

}  // namespace
}  // namespace weft::policy_store
