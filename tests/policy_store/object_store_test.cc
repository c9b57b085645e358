#include "policy_store/object_store.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

// The ObjectStore contract, checked the same way for every backend.
void CheckStoreSemantics(ObjectStore& s) {
  CHECK(s.Get("things/x").status().code() == StatusCode::kNotFound);
  REQUIRE(s.PutImmutable("things/x", Bytes("hello")).ok());
  CHECK(s.PutImmutable("things/x", Bytes("hello")).ok());  // the same bytes again
  CHECK(s.PutImmutable("things/x", Bytes("other")).code() == StatusCode::kConflict);
  auto stored = s.Get("things/x");
  REQUIRE(stored.ok());
  CHECK(std::string(stored->begin(), stored->end()) == "hello");
  CHECK(*s.Exists("things/x"));
  CHECK(!*s.Exists("things/y"));
  CHECK(s.PutImmutable("../escape", Bytes("x")).code() == StatusCode::kInvalidArgument);
  REQUIRE(s.PutImmutable("things/empty", {}).ok());
  CHECK(s.Get("things/empty")->empty());

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

  // A key that names a directory of keys is no object.
  CHECK(s.Get("runs/r").status().code() == StatusCode::kNotFound);
  CHECK(!*s.Exists("runs/r"));

  // Written in pieces: created, the same bytes again, other bytes.
  auto write = [&](const std::string& key, std::vector<std::string> pieces) -> Result<bool> {
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, s.NewImmutableWriter(key));
    for (const std::string& piece : pieces) WEFT_RETURN_IF_ERROR(writer->Write(Bytes(piece)));
    return writer->Commit();
  };
  CHECK(write("things/pieces", {"ab", "cd"}).value() == true);
  CHECK(write("things/pieces", {"a", "bcd"}).value() == false);
  CHECK(write("things/pieces", {"abce"}).status().code() == StatusCode::kConflict);
  CHECK(write("things/x", {"other"}).status().code() == StatusCode::kConflict);
  auto pieces = s.Get("things/pieces");
  REQUIRE(pieces.ok());
  CHECK(std::string(pieces->begin(), pieces->end()) == "abcd");
  CHECK(s.NewImmutableWriter("../escape").status().code() == StatusCode::kInvalidArgument);
  {
    // Abandoned before Commit: nothing appears, during or after.
    auto abandoned = s.NewImmutableWriter("things/abandoned");
    REQUIRE(abandoned.ok());
    REQUIRE((*abandoned)->Write(Bytes("half of it")).ok());
    CHECK(*s.List("things/") ==
          std::vector<std::string>{"things/empty", "things/pieces", "things/x"});
  }
  CHECK(!*s.Exists("things/abandoned"));
  CHECK(s.List("things/")->size() == 3);
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

TEST_CASE("store URIs: an unknown scheme is refused, not taken for a directory") {
  Result<std::unique_ptr<ObjectStore>> store = OpenStore("s3://bucket/prefix");
  REQUIRE(!store.ok());
  CHECK(store.status().code() == StatusCode::kInvalidArgument);
  CHECK(store.status().message() ==
        "store 's3://bucket/prefix': unknown scheme 's3' (a store is a directory, file://PATH, "
        "http:// or https://)");
  CHECK(!std::filesystem::exists("s3:"));
}

TEST_CASE("directory store: immutable objects, compare-and-swap, listing, deletion") {
  std::string root = TempRoot("store");
  auto store = DirectoryStore::Open(root);
  REQUIRE(store.ok());
  CheckStoreSemantics(**store);
  CHECK(!std::filesystem::exists(std::filesystem::path(root).parent_path() / "escape"));
  std::filesystem::remove_all(root);
}

TEST_CASE("directory store: errors name keys, never the directory; its own files are not listed") {
  std::string root = TempRoot("store_paths");
  auto store = std::move(DirectoryStore::Open(root)).value();
  REQUIRE(store->PutImmutable("runs/r/versions/a", Bytes("1")).ok());
  REQUIRE(store->CompareAndSwap("runs/r/latest", std::nullopt, "0").ok());
  // Under an object: a conflict naming the key.
  Status under = store->PutImmutable("runs/r/versions/a/b", Bytes("2"));
  CHECK(under.code() == StatusCode::kConflict);
  CHECK(under.message().find("runs/r/versions/a/b") != std::string::npos);
  CHECK(under.message().find(root) == std::string::npos);
  CHECK(store->CompareAndSwap("runs/r/versions/a/b", std::nullopt, "1").code() ==
        StatusCode::kConflict);
  CHECK(store->NewImmutableWriter("runs/r/versions/a/b").status().code() == StatusCode::kConflict);
  // A directory: no object to read, replace or delete.
  Status directory = store->Get("runs/r/versions").status();
  CHECK(directory.code() == StatusCode::kNotFound);
  CHECK(directory.message() == "runs/r/versions: no such object");
  CHECK(store->PutImmutable("runs/r/versions", Bytes("x")).code() == StatusCode::kConflict);
  CHECK(store->CompareAndSwap("runs/r/versions", std::nullopt, "x").code() ==
        StatusCode::kConflict);
  CHECK(store->Delete("runs/r/versions").ok());
  CHECK(std::filesystem::is_directory(root + "/runs/r/versions"));
  // Hidden files and directories under a prefix are the store's own.
  std::filesystem::create_directories(root + "/runs/r/.hidden");
  std::ofstream(root + "/runs/r/.hidden/x") << "x";
  std::ofstream(root + "/runs/r/.y.tmp-123456") << "y";
  CHECK(*store->List("runs/") == std::vector<std::string>{"runs/r/latest", "runs/r/versions/a"});
  std::filesystem::remove_all(root);
}

TEST_CASE("HTTP store: the same contract through weft's store server") {
  Served served("secret");
  HttpStore store(served.url, "secret", FastRetries());
  CheckStoreSemantics(store);
  // What the server wrote landed in its backend.
  CHECK(*served.backend->Exists("things/x"));
  CHECK(*served.backend->Exists("things/pieces"));
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
