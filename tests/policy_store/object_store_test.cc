#include "policy_store/object_store.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

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

TEST_CASE("directory store: immutable objects, compare-and-swap, listing, deletion") {
  std::string root = TempRoot("store");
  auto store = DirectoryStore::Open(root);
  REQUIRE(store.ok());
  CheckStoreSemantics(**store);
  CHECK(!std::filesystem::exists(std::filesystem::path(root).parent_path() / "escape"));
  std::filesystem::remove_all(root);
}

TEST_CASE("HTTP store: the same contract through weft's store server") {
  Served served("secret");
  HttpStore store(served.url, "secret", FastRetries());
  CheckStoreSemantics(store);
  // What the server wrote landed in its backend.
  CHECK(*served.backend->Exists("blobs/x"));
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

}  // namespace
}  // namespace weft::policy_store
