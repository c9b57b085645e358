#include "policy_store/caching_store.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/byte_io.h"
#include "common/concurrent.h"
#include "common/mem_env.h"
#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

TEST_CASE("cache: concurrent misses for one blob make one upstream fetch") {
  Upstream upstream;
  const auto blob = Pattern(1 << 20, 1);
  const std::string key = upstream.Put(blob);
  upstream.faulty.delay = std::chrono::milliseconds(200);
  const std::string dir = TempRoot("cache_flight");
  auto cache = std::move(CachingStore::Open(upstream.faulty, {dir, 64 << 20})).value();
  std::atomic<int> right{0};
  REQUIRE(ForEachConcurrently(16, 16, [&](size_t) {
            Result<std::vector<uint8_t>> got = cache->Get(key);
            if (got.ok() && *got == blob) right.fetch_add(1);
            return got.status();
          }).ok());
  CHECK(right.load() == 16);
  CHECK(upstream.faulty.gets.load() == 1);
  CHECK(cache->stats().upstream_bytes == blob.size());
  // Later reads are hits, and a restarted cache still has the blob.
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().hits >= 1);
  cache.reset();
  auto reopened = std::move(CachingStore::Open(upstream.faulty, {dir, 64 << 20})).value();
  CHECK(reopened->stats().cached_blobs == 1);
  CHECK(*reopened->Get(key) == blob);
  CHECK(upstream.faulty.gets.load() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "cache: a corrupted file is detected, reported and fetched again; a corrupted transfer is "
    "refused, never cached, and not fetched again while held") {
  Upstream upstream;
  const auto blob = Pattern(100000, 2);
  const std::string key = upstream.Put(blob);
  const std::string dir = TempRoot("cache_corrupt");
  CacheOptions options{dir, 64 << 20};
  options.mismatch_hold = std::chrono::milliseconds(300);
  auto cache = std::move(CachingStore::Open(upstream.faulty, options)).value();
  REQUIRE(*cache->Get(key) == blob);
  // (A file's times tick a few milliseconds at a time: a write in the same tick as the check
  // would leave the file looking unchanged.)
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::fstream file(dir + "/" + key, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(5000);
    file.put('\x7f');
  }
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().corrupted == 1);
  CHECK(upstream.faulty.gets.load() == 2);
  // The refetched copy replaced the corrupted file.
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().hits == 1);

  // A transfer whose bytes are not the blob's: kDataLoss naming both hashes, nothing cached, and
  // every read refused while the mismatch is held, without asking the upstream again.
  const auto second = Pattern(7000, 4);
  const std::string second_key = upstream.Put(second);
  upstream.faulty.corrupt = 1;
  const int gets = upstream.faulty.gets.load();
  Result<std::vector<uint8_t>> bad = cache->Get(second_key);
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK(bad.status().message().find(second_key.substr(6) +
                                    " arrived as 7000 bytes with SHA-256 ") != std::string::npos);
  CHECK(!std::filesystem::exists(dir + "/" + second_key));
  for (int i = 0; i < 5; ++i)
    CHECK(cache->Get(second_key).status().code() == StatusCode::kDataLoss);
  CHECK(upstream.faulty.gets.load() == gets + 1);
  CHECK(cache->stats().upstream_mismatches == 1);
  CHECK(cache->stats().refused == 5);
  // Once the hold is over, it is fetched again (the upstream is whole now).
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK(*cache->Get(second_key) == second);
  CHECK(upstream.faulty.gets.load() == gets + 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "cache: bounded, least recently used first; manifests kept in memory; other keys pass "
    "through") {
  Upstream upstream;
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    blobs.push_back(Pattern(1000, static_cast<uint8_t>(10 + i)));
    keys.push_back(upstream.Put(blobs.back()));
  }
  const std::string dir = TempRoot("cache_lru");
  auto cache = std::move(CachingStore::Open(upstream.faulty, {dir, 3000})).value();
  for (int i = 0; i < 3; ++i) REQUIRE(cache->Get(keys[i]).ok());
  REQUIRE(cache->Get(keys[0]).ok());  // 0 is now the most recent: 1 goes first
  REQUIRE(cache->Get(keys[3]).ok());
  CHECK(cache->stats().cached_bytes == 3000);
  CHECK(cache->stats().evicted == 1);
  CHECK(!std::filesystem::exists(dir + "/" + keys[1]));
  CHECK(std::filesystem::exists(dir + "/" + keys[0]));
  // Larger than the whole cache: returned, not kept.
  const auto big = Pattern(5000, 99);
  const std::string big_key = upstream.Put(big);
  CHECK(*cache->Get(big_key) == big);
  CHECK(!std::filesystem::exists(dir + "/" + big_key));
  // A smaller limit on reopening evicts down to it.
  cache.reset();
  auto smaller = std::move(CachingStore::Open(upstream.faulty, {dir, 1000})).value();
  CHECK(smaller->stats().cached_blobs == 1);

  const std::string manifest_key = ManifestKey("r", 3);
  const std::string text = "{}";
  REQUIRE(upstream.store->PutImmutable(manifest_key, TextBytes(text)).ok());
  const int before = upstream.faulty.gets.load();
  REQUIRE(smaller->Get(manifest_key).ok());
  REQUIRE(smaller->Get(manifest_key).ok());
  CHECK(upstream.faulty.gets.load() == before + 1);
  REQUIRE(smaller->CompareAndSwap(LatestKey("r"), std::nullopt, "3\n").ok());
  REQUIRE(smaller->CompareAndSwap(LatestKey("r"), std::string("3\n"), "4\n").ok());
  CHECK(*smaller->Get(LatestKey("r")) == std::vector<uint8_t>{'4', '\n'});
  CHECK(smaller->Get("blobs/../x").status().code() == StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cache: objects written in pieces go upstream") {
  Upstream upstream;
  const std::string dir = TempRoot("cache_writer");
  auto cache = std::move(CachingStore::Open(*upstream.store, {dir, 64 << 20})).value();
  auto writer = cache->NewImmutableWriter("runs/r/versions/x");
  REQUIRE(writer.ok());
  REQUIRE((*writer)->Write(TextBytes("written ")).ok());
  REQUIRE((*writer)->Write(TextBytes("in pieces")).ok());
  CHECK((*writer)->Commit().value() == true);
  auto stored = upstream.store->Get("runs/r/versions/x");
  REQUIRE(stored.ok());
  CHECK(std::string(stored->begin(), stored->end()) == "written in pieces");
  std::filesystem::remove_all(dir);
}

CacheOptions InMemory(MemEnv& env, uint64_t max_bytes) {
  CacheOptions options{"/cache", max_bytes};
  options.env = &env;
  return options;
}

TEST_CASE(
    "cache on an in-memory Env: a crash that tears a cached blob at any byte is found by the "
    "check after the restart, and the blob is fetched again") {
  Upstream upstream;
  const auto blob = Pattern(200, 6);
  const std::string key = upstream.Put(blob);
  MemEnv env;
  {
    auto cache = std::move(CachingStore::Open(upstream.faulty, InMemory(env, 1 << 20))).value();
    REQUIRE(*cache->Get(key) == blob);
  }
  for (uint64_t keep = 0; keep <= blob.size(); ++keep) {
    CAPTURE(keep);
    // The cache syncs nothing: a crash keeps any prefix of the file.
    std::unique_ptr<MemEnv> disk = env.DiskAfterCrash(keep);
    const int gets = upstream.faulty.gets.load();
    auto cache = std::move(CachingStore::Open(upstream.faulty, InMemory(*disk, 1 << 20))).value();
    CHECK(cache->stats().cached_blobs == 1);
    CHECK(*cache->Get(key) == blob);
    const bool whole = keep == blob.size();
    CHECK(cache->stats().corrupted == (whole ? 0 : 1));
    CHECK(upstream.faulty.gets.load() == gets + (whole ? 0 : 1));
    CHECK(*cache->Get(key) == blob);
    CHECK(cache->stats().hits == 1);
  }
}

TEST_CASE(
    "cache on a full disk: the fetch fails naming the blob and the disk, leaves nothing, and "
    "succeeds once there is room") {
  Upstream upstream;
  const auto blob = Pattern(5000, 8);
  const std::string key = upstream.Put(blob);
  MemEnv env;
  auto cache = std::move(CachingStore::Open(upstream.faulty, InMemory(env, 1 << 20))).value();
  env.SetCapacity(env.used_bytes() + 1000);
  Result<std::vector<uint8_t>> full = cache->Get(key);
  CHECK(full.status().code() == StatusCode::kUnavailable);
  CHECK_MESSAGE(full.status().message().rfind("blob " + key.substr(6) + ": ", 0) == 0,
                full.status().message());
  CHECK_MESSAGE(full.status().message().find("No space left on device") != std::string::npos,
                full.status().message());
  CHECK(env.List("/cache/blobs").value().empty());
  CHECK(cache->stats().cached_blobs == 0);
  env.SetCapacity(UINT64_MAX);
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().cached_blobs == 1);
  CHECK(env.List("/cache/blobs").value() == std::vector<std::string>{key.substr(6)});
}

TEST_CASE(
    "cache on an in-memory Env: a mismatch is held on the Env's clock; a file changed behind the "
    "cache's back is checked again") {
  Upstream upstream;
  const auto blob = Pattern(3000, 9);
  const std::string key = upstream.Put(blob);
  MemEnv env;
  CacheOptions options = InMemory(env, 1 << 20);
  options.mismatch_hold = std::chrono::seconds(30);
  auto cache = std::move(CachingStore::Open(upstream.faulty, options)).value();
  upstream.faulty.corrupt = 1;
  CHECK(cache->Get(key).status().code() == StatusCode::kDataLoss);
  env.Advance(std::chrono::seconds(29));
  CHECK(cache->Get(key).status().code() == StatusCode::kDataLoss);
  CHECK(upstream.faulty.gets.load() == 1);
  CHECK(cache->stats().refused == 1);
  env.Advance(std::chrono::seconds(1));
  CHECK(*cache->Get(key) == blob);
  CHECK(upstream.faulty.gets.load() == 2);
  CHECK(env.List("/cache/blobs").value() == std::vector<std::string>{key.substr(6)});
  // Written to behind the cache's back (no clock need move): its stamp changed, so it is checked,
  // found corrupted, and fetched again (once the fetch that wrote it has ended: until then readers
  // join that fetch).
  while (cache->stats().fetching > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    auto file = std::move(env.OpenWritable("/cache/" + key, false)).value();
    REQUIRE(file->Append(TextBytes("x")).ok());
  }
  CHECK(*cache->Get(key) == blob);
  CHECK(cache->stats().corrupted == 1);
  CHECK(upstream.faulty.gets.load() == 3);
}

}  // namespace
}  // namespace weft::policy_store
