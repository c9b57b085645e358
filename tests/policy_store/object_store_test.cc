#include "policy_store/object_store.h"

#include <curl/curl.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "policy_store/manifest.h"
#include "policy_store/store_server.h"
#include "tests/http_test_util.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

std::span<const uint8_t> Bytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

TEST_CASE("keys: path traversal, absolute paths and odd characters are refused") {
  CHECK(ValidateKey("blobs/abc").ok());
  CHECK(ValidateKey("runs/r-1/versions/00000000000000000001.json").ok());
  for (const char* bad :
       {"", "/etc/passwd", "../x", "a/../b", "a//b", "a/./b", "a/b/", "a b", "a\\b", "a/\x01"}) {
    CAPTURE(bad);
    CHECK(ValidateKey(bad).code() == StatusCode::kInvalidArgument);
  }
  CHECK(!ValidateKey(std::string(600, 'a')).ok());
}

// The ObjectStore contract, checked the same way for every backend.
void CheckStoreSemantics(ObjectStore& s) {
  CHECK(s.Get("blobs/x").status().code() == StatusCode::kNotFound);
  REQUIRE(s.PutImmutable("blobs/x", Bytes("hello")).ok());
  CHECK(s.PutImmutable("blobs/x", Bytes("hello")).ok());  // the same bytes again
  CHECK(s.PutImmutable("blobs/x", Bytes("other")).code() == StatusCode::kConflict);
  auto stored = s.Get("blobs/x");
  REQUIRE(stored.ok());
  CHECK(std::string(stored->begin(), stored->end()) == "hello");
  CHECK(*s.Exists("blobs/x"));
  CHECK(!*s.Exists("blobs/y"));
  CHECK(s.PutImmutable("../escape", Bytes("x")).code() == StatusCode::kInvalidArgument);
  REQUIRE(s.PutImmutable("blobs/empty", {}).ok());
  CHECK(s.Get("blobs/empty")->empty());

  CHECK(s.CompareAndSwap("runs/r/latest", std::string("0\n"), "1\n").code() ==
        StatusCode::kConflict);
  REQUIRE(s.CompareAndSwap("runs/r/latest", std::nullopt, "0\n").ok());
  CHECK(s.CompareAndSwap("runs/r/latest", std::nullopt, "0\n").code() == StatusCode::kConflict);
  REQUIRE(s.CompareAndSwap("runs/r/latest", std::string("0\n"), "1\n").ok());
  CHECK(s.CompareAndSwap("runs/r/latest", std::string("0\n"), "2\n").code() ==
        StatusCode::kConflict);

  REQUIRE(s.PutImmutable("runs/r/versions/b", Bytes("2")).ok());
  REQUIRE(s.PutImmutable("runs/r/versions/a", Bytes("1")).ok());
  auto keys = s.List("runs/r/versions/");
  REQUIRE(keys.ok());
  CHECK(*keys == std::vector<std::string>{"runs/r/versions/a", "runs/r/versions/b"});
  CHECK(s.List("nothing/here/")->empty());
  REQUIRE(s.Delete("runs/r/versions/a").ok());
  CHECK(s.Delete("runs/r/versions/a").ok());  // already gone
  CHECK(s.List("runs/r/versions/")->size() == 1);
}

TEST_CASE("directory store: immutable objects, compare-and-swap, listing, deletion") {
  std::string root = TempRoot("store");
  auto store = DirectoryStore::Open(root);
  REQUIRE(store.ok());
  CheckStoreSemantics(**store);
  CHECK(!std::filesystem::exists(std::filesystem::path(root).parent_path() / "escape"));
  std::filesystem::remove_all(root);
}

// A store server on an ephemeral loopback port, backed by a directory store.
struct Served {
  std::string root;
  std::unique_ptr<DirectoryStore> backend;
  std::unique_ptr<StoreServer> server;
  std::string url;

  explicit Served(std::string token) : root(TempRoot("http")) {
    backend = std::move(DirectoryStore::Open(root)).value();
    StoreServerOptions options;
    options.writer_token = std::move(token);
    options.max_body_bytes = 1 << 20;
    server = std::move(StoreServer::Start(*backend, options)).value();
    url = "http://127.0.0.1:" + std::to_string(server->port());
  }
  ~Served() {
    server->Stop();
    std::filesystem::remove_all(root);
  }
};

HttpStoreOptions FastRetries() {
  HttpStoreOptions options;
  options.attempts = 2;
  options.first_backoff = std::chrono::milliseconds(10);
  options.deadline = std::chrono::milliseconds(10000);
  return options;
}

using testing::Raw;

std::string Text(const testing::RawReply& reply) { return reply.text(); }

TEST_CASE("HTTP store: the same contract through weft's store server") {
  Served served("secret");
  HttpStore store(served.url, "secret", FastRetries());
  CheckStoreSemantics(store);
  // What the server wrote landed in its backend.
  CHECK(*served.backend->Exists("blobs/x"));
}

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

TEST_CASE("directory store: racing compare-and-swaps, exactly one winner per step") {
  std::string root = TempRoot("race");
  auto store = DirectoryStore::Open(root);
  REQUIRE(store.ok());
  ObjectStore& s = **store;
  REQUIRE(s.CompareAndSwap("runs/r/latest", std::nullopt, "0").ok());
  std::atomic<int> wins{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int step = 0; step < 15; ++step) {  // each step fsyncs twice: keep it short
        auto current = s.Get("runs/r/latest");
        if (!current.ok()) continue;
        std::string text(current->begin(), current->end());
        if (s.CompareAndSwap("runs/r/latest", text, std::to_string(std::stoi(text) + 1)).ok())
          wins++;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  auto final_value = s.Get("runs/r/latest");
  CHECK(std::stoi(std::string(final_value->begin(), final_value->end())) == wins.load());
  std::filesystem::remove_all(root);
}

TEST_CASE("manifests: round trip and strict parsing") {
  Manifest m;
  m.run_id = "run-1";
  m.version = 3;
  m.tensors.push_back({"w", sync::DType::kBF16, {2, 3}, sync::Digest{1, 2}});
  m.delta_base = 2;
  m.delta = BlobRef{std::string(64, 'a'), 100};
  m.last_keyframe = 0;
  m.delta_bytes_since_keyframe = 300;
  m.skips.push_back({2, BlobRef{std::string(64, 'b'), 50}});
  m.skips.push_back({0, BlobRef{std::string(64, 'c'), 70}});
  auto parsed = Manifest::FromJson(m.ToJson());
  REQUIRE(parsed.ok());
  CHECK(parsed->ToJson() == m.ToJson());
  CHECK(parsed->tensors[0].digest == sync::Digest{1, 2});
  REQUIRE(parsed->skips.size() == 2);
  CHECK(parsed->skips[1].base == 0);
  CHECK(parsed->skips[1].blob.bytes == 70);

  auto error = [](std::string json) { return Manifest::FromJson(json).status().message(); };
  std::string good = m.ToJson();
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string copy = good;
    copy.replace(copy.find(from), from.size(), to);
    return copy;
  };
  CHECK(error("{").find("not valid JSON") != std::string::npos);
  CHECK(error(replace("\"run\"", "\"runn\"")).find("unknown field 'runn'") != std::string::npos);
  CHECK(error(replace("\"BF16\"", "\"Q3\"")).find("dtype") != std::string::npos);
  CHECK(error(replace(std::string(64, 'a'), std::string(63, 'a') + "g")).find("sha256") !=
        std::string::npos);
  CHECK(error(replace("\"run-1\"", "\"../x\"")).find("run id") != std::string::npos);
  CHECK(error(replace("\"base\": 2", "\"base\": 3")).find("before the version") !=
        std::string::npos);
  CHECK(Sha256Hex({}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

}  // namespace
}  // namespace weft::policy_store
