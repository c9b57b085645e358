// The S3 backend against a real S3 service: the store named by WEFT_TEST_STORE (s3://BUCKET/PREFIX
// with its options, credentials in the environment). tests/policy_store/s3_test.sh starts a Ceph
// RADOS Gateway and runs this suite against it.
#include <doctest/doctest.h>

#include <cstdlib>
#include <thread>

#include "policy_store/s3_store.h"
#include "tests/policy_store/store_contract.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

// The settings of the store WEFT_TEST_STORE names, under a fresh prefix.
s3::Settings Service(const std::string& name) {
  std::optional<s3::Settings> settings = TestS3Settings(name);
  REQUIRE_MESSAGE(settings.has_value(), "WEFT_TEST_STORE must name the s3:// store to test");
  return *settings;
}

TEST_CASE("S3 service: the object store contract") {
  TestStore store("contract");
  REQUIRE(store.s3 != nullptr);
  CheckStoreSemantics(*store.store);
  CHECK(store.s3->ListUploads()->empty());
}

TEST_CASE("S3 service: conditional writes as the backend needs them") {
  auto store = std::make_unique<S3Store>(Service("conditions"));
  Result<bool> multipart = store->CheckConditionalWrites();
  REQUIRE_MESSAGE(multipart.ok(), multipart.status().ToString());
  MESSAGE("conditional completion of multipart uploads: "
          << std::string(*multipart ? "honoured" : "ignored (checked before and after instead)"));
}

TEST_CASE("S3 service: racing compare-and-swaps, exactly one winner per step") {
  TestStore store("race");
  CheckRacingSwaps(*store.store, 6, 15);
}

TEST_CASE("S3 service: racing writers of one immutable key, one set of bytes wins") {
  TestStore store("immutable_race");
  for (int round = 0; round < 5; ++round) {
    const std::string key = "blobs/race-" + std::to_string(round);
    std::atomic<int> created{0}, conflicts{0};
    std::vector<std::thread> writers;
    std::vector<std::string> bodies;
    for (int t = 0; t < 8; ++t) bodies.push_back("writer " + std::to_string(t));
    for (int t = 0; t < 8; ++t) {
      writers.emplace_back([&, t] {
        Status put = store.store->PutImmutable(key, TextBytes(bodies[t]));
        if (put.ok()) created++;
        if (put.code() == StatusCode::kConflict) conflicts++;
      });
    }
    for (auto& writer : writers) writer.join();
    CHECK(created.load() == 1);
    CHECK(conflicts.load() == 7);
    Result<std::vector<uint8_t>> stored = store.store->Get(key);
    REQUIRE(stored.ok());
    CHECK(std::string(stored->begin(), stored->end()).rfind("writer ", 0) == 0);
  }
}

TEST_CASE("S3 service: large objects in parallel parts and ranges; nothing left behind") {
  s3::Settings settings = Service("large");
  settings.part_size = settings.multipart_threshold = 5 << 20;
  settings.range_size = 1 << 20;
  settings.parallel = 4;
  auto store = std::make_unique<S3Store>(settings);
  const std::vector<uint8_t> big = Pattern((23 << 20) + 4321, 11);
  REQUIRE(store->PutImmutable("blobs/big", big).ok());
  CHECK(store->PutImmutable("blobs/big", big).ok());
  std::vector<uint8_t> other = big;
  other[1 << 20] ^= 0x80;
  CHECK(store->PutImmutable("blobs/big", other).code() == StatusCode::kConflict);
  Result<std::vector<uint8_t>> read = store->Get("blobs/big");
  REQUIRE(read.ok());
  CHECK(*read == big);
  // In pieces (staged, then uploaded in parts).
  auto writer = store->NewImmutableWriter("blobs/pieces");
  REQUIRE(writer.ok());
  for (size_t at = 0; at < big.size(); at += 3 << 20) {
    const size_t length = std::min<size_t>(3 << 20, big.size() - at);
    REQUIRE((*writer)->Write(std::span<const uint8_t>(big).subspan(at, length)).ok());
  }
  CHECK((*writer)->Commit().value() == true);
  CHECK(*store->Get("blobs/pieces") == big);
  CHECK(store->ListUploads()->empty());
  REQUIRE(store->Delete("blobs/big").ok());
  REQUIRE(store->Delete("blobs/pieces").ok());
}

TEST_CASE("S3 service: listings page through continuation tokens") {
  s3::Settings settings = Service("pages");
  settings.list_page = 7;
  S3Store store(settings);
  std::vector<std::string> keys;
  for (int i = 0; i < 30; ++i) {
    keys.push_back("runs/r/versions/" + std::to_string(1000 + i) + ".json");
    REQUIRE(store.PutImmutable(keys.back(), TextBytes(std::to_string(i))).ok());
  }
  REQUIRE(store.PutImmutable("runs/rr/x", TextBytes("x")).ok());
  CHECK(*store.List("runs/r/versions/") == keys);
  CHECK(store.List("runs/r/")->size() == 30);
  CHECK(store.List("runs/")->size() == 31);
  const std::vector<std::string> all = std::move(store.List("runs/")).value();
  for (const std::string& key : all) REQUIRE(store.Delete(key).ok());
  CHECK(store.List("runs/")->empty());
}

TEST_CASE("S3 service: wrong credentials are refused with a message that holds no secret") {
  s3::Settings settings = Service("denied");
  settings.credentials.secret_key = "certainly-not-the-secret";
  S3Store store(settings);
  Status denied = store.Get("runs/r/latest").status();
  CHECK(denied.code() == StatusCode::kInvalidArgument);
  CHECK(denied.message().find("SignatureDoesNotMatch") != std::string::npos);
  CHECK(denied.message().find("certainly-not-the-secret") == std::string::npos);
}

}  // namespace
}  // namespace weft::policy_store
