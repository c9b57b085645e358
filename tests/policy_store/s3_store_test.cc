#include "policy_store/s3_store.h"

#include <doctest/doctest.h>

#include "common/byte_io.h"
#include "tests/policy_store/fake_s3.h"
#include "tests/policy_store/store_contract.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

using testing::FakeS3;

s3::Settings FakeSettings(const FakeS3& fake, const std::string& prefix = "pre/fix") {
  s3::Settings settings;
  settings.bucket = "bucket";
  settings.prefix = prefix;
  settings.endpoint = fake.endpoint();
  settings.path_style = true;
  settings.region = "test-1";
  settings.credentials = {FakeS3::kAccessKey, FakeS3::kSecretKey, ""};
  settings.credentials_from = "the test";
  return settings;
}

S3StoreOptions Quick() {
  S3StoreOptions options;
  options.attempts = 4;
  options.first_backoff = std::chrono::milliseconds(5);
  options.deadline = std::chrono::milliseconds(20000);
  return options;
}

std::vector<uint8_t> Large(size_t size, uint8_t seed) { return Pattern(size, seed); }

TEST_CASE("S3 store: the object store contract against an S3 service") {
  FakeS3 fake;
  S3Store store(FakeSettings(fake), Quick());
  CheckStoreSemantics(store);
  CheckRacingSwaps(store, 3, 5);
  // Everything lives under the prefix; the probe of conditional writes left nothing behind.
  for (const auto& [key, bytes] : fake.Objects()) CHECK(key.rfind("pre/fix/", 0) == 0);
  CHECK(fake.Objects().count("pre/fix/things/x") == 1);
  CHECK(fake.Uploads() == 0);
}

TEST_CASE("S3 store: large objects in parallel parts and parallel ranges, resumed when cut") {
  FakeS3 fake;
  s3::Settings settings = FakeSettings(fake);
  settings.part_size = 5 << 20;
  settings.multipart_threshold = 6 << 20;
  settings.range_size = 1 << 20;
  settings.parallel = 3;
  S3Store store(settings, Quick());
  const std::vector<uint8_t> big = Large((12 << 20) + 12345, 7);
  REQUIRE(store.PutImmutable("blobs/big", big).ok());
  int parts = 0;
  for (const std::string& line : fake.Log()) parts += line.find("partNumber=") != std::string::npos;
  CHECK(parts >= 3);  // 3 parts for the object (the probe's one besides)
  CHECK(store.PutImmutable("blobs/big", big).ok());  // the same bytes again
  std::vector<uint8_t> other = big;
  other[other.size() - 1] ^= 1;
  CHECK(store.PutImmutable("blobs/big", other).code() == StatusCode::kConflict);
  CHECK(fake.Uploads() == 0);  // the refused upload was aborted

  fake.cut_gets = 3;  // three range answers cut mid-body: resumed where they stopped
  Result<std::vector<uint8_t>> read = store.Get("blobs/big");
  REQUIRE(read.ok());
  CHECK(*read == big);
  CHECK(fake.cut_gets.load() == 0);
  // A small object and an empty one read in one request.
  REQUIRE(store.PutImmutable("blobs/small", TextBytes("small")).ok());
  REQUIRE(store.PutImmutable("blobs/none", {}).ok());
  CHECK(*store.Get("blobs/small") == std::vector<uint8_t>{'s', 'm', 'a', 'l', 'l'});
  CHECK(store.Get("blobs/none")->empty());
}

TEST_CASE("S3 store: a failed part aborts the upload; SlowDown and 5xx answers are retried") {
  FakeS3 fake;
  s3::Settings settings = FakeSettings(fake);
  settings.part_size = 5 << 20;
  settings.multipart_threshold = 5 << 20;
  S3StoreOptions options = Quick();
  options.attempts = 2;
  S3Store store(settings, options);
  REQUIRE(store.CheckConditionalWrites().ok());
  fake.fail_parts = 100;
  Status failed = store.PutImmutable("blobs/big", Large(11 << 20, 3));
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK(failed.message().find("InternalError") != std::string::npos);
  CHECK(fake.Uploads() == 0);
  CHECK(!*store.Exists("blobs/big"));
  fake.fail_parts = 0;

  fake.slow_down = 1;
  const uint64_t before = store.retries();
  CHECK(store.PutImmutable("blobs/slow", TextBytes("x")).ok());
  CHECK(store.retries() == before + 1);
  fake.slow_down = 1;
  CHECK(store.CompareAndSwap("runs/r/latest", std::nullopt, "1").ok());
  CHECK(*store.Get("runs/r/latest") == std::vector<uint8_t>{'1'});
  fake.slow_down = 100;
  Status down = store.Get("blobs/slow").status();
  CHECK(down.code() == StatusCode::kUnavailable);
  CHECK(down.message().find("SlowDown") != std::string::npos);
  fake.slow_down = 0;
}

TEST_CASE("S3 store: a compare-and-swap refused with 500 was not applied, whatever it holds") {
  FakeS3 fake;
  S3Store store(FakeSettings(fake), Quick());
  REQUIRE(store.CompareAndSwap("runs/r/latest", std::nullopt, "1").ok());
  REQUIRE(store.PutImmutable("blobs/a", TextBytes("a")).ok());
  fake.condition_failures_as_500 = true;
  // Another writer already wrote these very bytes: the loser is told, not taken for the winner.
  CHECK(store.CompareAndSwap("runs/r/latest", std::nullopt, "1").code() == StatusCode::kConflict);
  REQUIRE(store.CompareAndSwap("runs/r/latest", std::string("1"), "2").ok());
  CHECK(store.CompareAndSwap("runs/r/latest", std::nullopt, "2").code() == StatusCode::kConflict);
  // An immutable write refused with 500 is retried, then compared with what the key holds.
  CHECK(store.PutImmutable("blobs/a", TextBytes("a")).ok());
  CHECK(store.PutImmutable("blobs/a", TextBytes("b")).code() == StatusCode::kConflict);
}

TEST_CASE("S3 store: a service that ignores conditional writes is refused before any write") {
  FakeS3 fake;
  fake.honour_conditions = false;
  S3Store store(FakeSettings(fake), Quick());
  Status refused = store.PutImmutable("blobs/a", TextBytes("a"));
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("does not honour conditional writes") != std::string::npos);
  CHECK(refused.message().find(FakeS3::kSecretKey) == std::string::npos);
  CHECK(store.CompareAndSwap("runs/r/latest", std::nullopt, "1").code() ==
        StatusCode::kInvalidArgument);
  CHECK(fake.Objects().empty());  // the probe cleaned up; nothing else was written
  CHECK(fake.Uploads() == 0);
  // Reading needs no conditional writes.
  CHECK(store.Get("blobs/a").status().code() == StatusCode::kNotFound);
}

TEST_CASE("S3 store: without conditional completion, multipart uploads check before and after") {
  FakeS3 fake;
  fake.honour_multipart_conditions = false;
  s3::Settings settings = FakeSettings(fake);
  settings.part_size = 5 << 20;
  settings.multipart_threshold = 5 << 20;
  S3Store store(settings, Quick());
  CHECK(store.CheckConditionalWrites().value() == false);
  const std::vector<uint8_t> big = Large(6 << 20, 9);
  REQUIRE(store.PutImmutable("blobs/big", big).ok());
  // Checked after completion by its ETag (computed from the parts'), not by reading it back.
  auto reads = [&] {
    int count = 0;
    for (const std::string& line : fake.Log())
      count += line.rfind("GET /bucket/pre/fix/blobs/big", 0) == 0;
    return count;
  };
  CHECK(reads() == 0);
  CHECK(store.PutImmutable("blobs/big", big).ok());
  std::vector<uint8_t> other = big;
  other[0] ^= 1;
  CHECK(store.PutImmutable("blobs/big", other).code() == StatusCode::kConflict);
  CHECK(*store.Get("blobs/big") == big);
  CHECK(fake.Uploads() == 0);
}

TEST_CASE("S3 store: listings page through continuation tokens; stale uploads are aborted") {
  FakeS3 fake;
  s3::Settings settings = FakeSettings(fake, "");
  settings.list_page = 3;
  S3Store store(settings, Quick());
  std::vector<std::string> expected;
  for (int i = 0; i < 10; ++i) {
    const std::string key = "runs/r/versions/" + std::to_string(100 + i);
    REQUIRE(store.PutImmutable(key, TextBytes(key)).ok());
    expected.push_back(key);
  }
  REQUIRE(store.PutImmutable("runs/other/x", TextBytes("x")).ok());
  CHECK(*store.List("runs/r/versions/") == expected);
  CHECK(store.List("runs/")->size() == 11);

  S3Store::Call start;
  start.method = "POST";
  start.key = "blobs/abandoned";
  start.query = {{"uploads", ""}};
  REQUIRE(store.Send(start)->status == 200);
  CHECK(*store.ListUploads() == std::vector<std::string>{"blobs/abandoned"});
  CHECK(*store.AbortUploadsBefore(std::chrono::system_clock::from_time_t(0)) == 0);
  CHECK(*store.AbortUploadsBefore(std::chrono::system_clock::now()) == 1);
  CHECK(fake.Uploads() == 0);
}

TEST_CASE("S3 store: a completion that races another write (409) starts the upload again") {
  FakeS3 fake;
  s3::Settings settings = FakeSettings(fake);
  settings.part_size = 5 << 20;
  settings.multipart_threshold = 5 << 20;
  S3Store store(settings, Quick());
  const std::vector<uint8_t> big = Large(11 << 20, 5);
  REQUIRE(store.CheckConditionalWrites().ok());
  fake.conflict_completions = 2;
  REQUIRE(store.PutImmutable("blobs/raced", big).ok());
  CHECK(store.uploads_restarted() == 2);
  CHECK(*store.Get("blobs/raced") == big);
  CHECK(fake.Uploads() == 0);
  // Conflicts that never end: a clear error, nothing left behind.
  fake.conflict_completions = 100;
  Status failed = store.PutImmutable("blobs/never", big);
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK(failed.message().find("ConditionalRequestConflict") != std::string::npos);
  CHECK(fake.Uploads() == 0);
  CHECK(!*store.Exists("blobs/never"));
  fake.conflict_completions = 0;
}

TEST_CASE("S3 store: gc's leftovers are a run's own uploads, blobs' and write checks'") {
  FakeS3 fake;
  S3Store store(FakeSettings(fake), Quick());
  for (const std::string key :
       {"runs/r/versions/x", "runs/other/versions/y", "blobs/b", ".weft-probe/0011"}) {
    S3Store::Call start;
    start.method = "POST";
    start.key = key;
    start.query = {{"uploads", ""}};
    REQUIRE(store.Send(start)->status == 200);
  }
  const auto later = std::chrono::system_clock::now() + std::chrono::seconds(2);
  CHECK(*store.AbortUploadsBefore(later, [](const std::string& key) {
    return key.starts_with("runs/r/") || key.starts_with("blobs/") ||
           key.starts_with(S3Store::kProbePrefix);
  }) == 3);
  CHECK(*store.ListUploads() == std::vector<std::string>{"runs/other/versions/y"});
  // A write check's object, as a publisher killed during its check leaves it.
  S3Store::Call probe;
  probe.method = "PUT";
  probe.key = ".weft-probe/0011";
  const std::string one = "1";
  probe.body = TextBytes(one);
  REQUIRE(store.Send(probe)->status == 200);
  CHECK(*store.DeleteProbesBefore(std::chrono::system_clock::from_time_t(0)) == 0);  // too young
  CHECK(*store.DeleteProbesBefore(later) == 1);
  CHECK(!*store.Exists(".weft-probe/0011"));
}

TEST_CASE("S3 store: a wrong secret is reported with where the credentials came from, not them") {
  FakeS3 fake;
  s3::Settings settings = FakeSettings(fake);
  settings.credentials.secret_key = "not-the-secret";
  settings.credentials_from = "the environment";
  S3Store store(settings, Quick());
  Status denied = store.Get("runs/r/latest").status();
  CHECK(denied.code() == StatusCode::kInvalidArgument);
  CHECK(denied.message().find("SignatureDoesNotMatch") != std::string::npos);
  CHECK(denied.message().find("check the credentials from the environment") != std::string::npos);
  CHECK(denied.message().find("not-the-secret") == std::string::npos);
  CHECK(store.Describe() == "s3://bucket/pre/fix");
}

}  // namespace
}  // namespace weft::policy_store
