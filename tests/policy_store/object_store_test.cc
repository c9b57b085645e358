#include "policy_store/object_store.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "policy_store/blob_fetch.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "tests/policy_store/store_contract.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/temp_path.h"

namespace weft::policy_store {
namespace {

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
  Result<std::unique_ptr<ObjectStore>> store = OpenStore("gs://bucket/prefix");
  REQUIRE(!store.ok());
  CHECK(store.status().code() == StatusCode::kInvalidArgument);
  CHECK(store.status().message() ==
        "store 'gs://bucket/prefix': unknown scheme 'gs' (a store is a directory (an absolute "
        "path, or a relative one with no ':' in its first segment; ./NAME for one that has), "
        "file:///ABSOLUTE/PATH, http(s)://HOST:PORT or s3://BUCKET/PREFIX)");
  CHECK(!std::filesystem::exists("gs:"));
}

TEST_CASE("store URIs: typos are refused, reading creates nothing, one parser for every form") {
  const std::string here = weft::testing::TempPath("uris");
  std::filesystem::create_directories(here);
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(here);
  OpenOptions creating;
  creating.create = true;
  for (const std::string& typo : std::vector<std::string>{
           "s3:/bucket/x", "s3:bucket", "s3//bucket", "http:/127.0.0.1:1", "https//h",
           "file:relative", "file://relative", "http://", "http://:80", "s3://", "s3:///x", "",
           std::string("/tmp/a\0b", 8), "dir\nname", "C:/x"}) {
    CAPTURE(typo);
    Result<StoreLocation> parsed = ParseStoreUri(typo);
    REQUIRE(!parsed.ok());
    CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    CHECK(parsed.status().message().find("http(s)://HOST:PORT or s3://BUCKET/PREFIX") !=
          std::string::npos);
    CHECK(OpenStore(typo, creating).status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(ParseStoreUri(std::string("/tmp/a\0b", 8)).status().message().find("\\x00") !=
        std::string::npos);
  CHECK(std::filesystem::is_empty(here));  // nothing was created for any of them
  // What is accepted, and what each means.
  auto parsed = [](const std::string& uri) { return ParseStoreUri(uri).value(); };
  CHECK(parsed("store").kind == StoreLocation::Kind::kDirectory);
  CHECK(parsed("store").path == "store");
  CHECK(parsed("./s3:odd").path == "./s3:odd");
  CHECK(parsed("/abs/dir").path == "/abs/dir");
  CHECK(parsed("file:///abs/dir").path == "/abs/dir");
  CHECK(parsed("s3/bucket").path == "s3/bucket");
  CHECK(parsed("http://h:1/?parallel=2").kind == StoreLocation::Kind::kHttp);
  CHECK(parsed("http://h:1/?parallel=2").base == "http://h:1/");
  CHECK(parsed("http://h:1/?parallel=2").options.at("parallel") == "2");
  CHECK(parsed("s3://b/p?region=x").kind == StoreLocation::Kind::kS3);
  // Reading a directory store that is not there is an error, and creates nothing.
  Result<std::unique_ptr<ObjectStore>> missing = OpenStore(here + "/nonexistent/x");
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find("does not exist") != std::string::npos);
  CHECK(!std::filesystem::exists(here + "/nonexistent"));
  REQUIRE(OpenStore("file://" + here + "/made", creating).ok());
  CHECK(std::filesystem::is_directory(here + "/made"));
  std::filesystem::current_path(before);
}

TEST_CASE("store URIs: range_size and parallel set how readers fetch blobs; others are refused") {
  auto http = OpenStore("http://127.0.0.1:1?range_size=1MiB&parallel=3");
  REQUIRE(http.ok());
  CHECK((*http)->Describe() == "http://127.0.0.1:1");
  CHECK((*http)->blob_reads().part_bytes == uint64_t{1} << 20);
  CHECK((*http)->blob_reads().parallel == 3);
  const FetchOptions fetch = FetchOptionsFor(**http);
  CHECK(fetch.part_bytes == uint64_t{1} << 20);
  CHECK(fetch.concurrency == 3);
  CHECK(OpenStore("http://127.0.0.1:1").value()->blob_reads().part_bytes == uint64_t{8} << 20);
  CHECK(OpenStore("http://127.0.0.1:1?part=2").status().message() ==
        "store 'http://127.0.0.1:1': unknown option 'part' (known: range_size, parallel)");
  CHECK(OpenStore("http://127.0.0.1:1?parallel=0").status().message() ==
        "store 'http://127.0.0.1:1': parallel must be a number from 1 to 64, not '0'");
  CHECK(OpenStore("http://127.0.0.1:1?range_size=1k").status().message() ==
        "store 'http://127.0.0.1:1': range_size must be at least 4KiB");
  // The same options of an s3:// store.
  Result<s3::Settings> s3 = s3::ResolveSettings("s3://bucket/prefix?range_size=2MiB&parallel=5",
                                                [](const std::string& name) {
                                                  if (name == "AWS_ACCESS_KEY_ID")
                                                    return std::optional<std::string>("id");
                                                  if (name == "AWS_SECRET_ACCESS_KEY")
                                                    return std::optional<std::string>("secret");
                                                  return std::optional<std::string>();
                                                });
  REQUIRE_MESSAGE(s3.ok(), s3.status().ToString());
  const S3Store store(*s3);
  CHECK(store.blob_reads().part_bytes == uint64_t{2} << 20);
  CHECK(store.blob_reads().parallel == 5);
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
  REQUIRE(store->PutImmutable("runs/r/versions/a", TextBytes("1")).ok());
  REQUIRE(store->CompareAndSwap("runs/r/latest", std::nullopt, "0").ok());
  // Under an object: a conflict naming the key.
  Status under = store->PutImmutable("runs/r/versions/a/b", TextBytes("2"));
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
  CHECK(store->PutImmutable("runs/r/versions", TextBytes("x")).code() == StatusCode::kConflict);
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

// A directory store that says it is remote (as an S3 store is), reading ranges alone: a store
// server calls it off its I/O threads, and reads it through ranges.
class RemoteLike : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override {
    return inner().GetRange(key, first, length);
  }
  bool ReadsRanges() const override { return true; }
  Result<std::unique_ptr<ObjectWriter>> NewImmutableWriter(const std::string& key) override {
    return inner().NewImmutableWriter(key);
  }
};

TEST_CASE("HTTP store: the same contract through a store server over a remote backend") {
  const std::string root = TempRoot("remote_backend");
  auto directory = std::move(DirectoryStore::Open(root)).value();
  RemoteLike backend(*directory);
  REQUIRE(!backend.Local());
  StoreServerOptions options;
  options.writer_token = "secret";
  auto server = std::move(StoreServer::Start(backend, options)).value();
  HttpStore store("http://127.0.0.1:" + std::to_string(server->port()), "secret", FastRetries());
  CheckStoreSemantics(store);
  CHECK(*directory->Exists("things/x"));
  CHECK(*directory->Exists("things/pieces"));
  // An object larger than a piece of an answer, read through ranges of the backend.
  const std::vector<uint8_t> big = Pattern(700000, 3);
  const std::string key = BlobKey(Sha256Hex(big));
  REQUIRE(store.PutImmutable(key, big).ok());
  CHECK(*store.Get(key) == big);
  CHECK(store.GetRange(key, 300000, 5)->bytes ==
        std::vector<uint8_t>(big.begin() + 300000, big.begin() + 300005));
  server->Stop();
  std::filesystem::remove_all(root);
}

TEST_CASE("directory store: racing compare-and-swaps, exactly one winner per step") {
  std::string root = TempRoot("race");
  auto store = DirectoryStore::Open(root);
  REQUIRE(store.ok());
  CheckRacingSwaps(**store, 4, 15);  // each step fsyncs twice: keep it short
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace weft::policy_store
