// Blobs fetched in parts: whole and checked whatever the part size, concurrency and memory bound;
// damaged parts make their blob be fetched again; ranges are read alone by the stores, the store
// server and the cache; a reader pulls through all of it and keeps its copy on failure.
#include "policy_store/blob_fetch.h"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "common/file_util.h"
#include "common/mem_env.h"
#include "policy_store/caching_store.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
#include "tests/policy_store/store_test_util.h"
#include "tests/policy_store/test_run.h"

namespace weft::policy_store {
namespace {

using testing::SameBytes;
using testing::TestRun;

// Reads ranges alone and counts them; can flip a byte of, or cut the last byte off, the next
// ranges it returns, and can refuse reads of whole objects.
class RangedStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    if (key.rfind("blobs/", 0) == 0) whole_blob_reads.fetch_add(1);
    return inner().Get(key);
  }
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override {
    ranges.fetch_add(1);
    Track(length);
    Result<ObjectRange> range = inner().GetRange(key, first, length);
    if (range.ok() && !range->bytes.empty()) {
      if (corrupt.load() > 0 && corrupt.fetch_sub(1) > 0)
        range->bytes[range->bytes.size() / 2] ^= 4;
      if (cut.load() > 0 && cut.fetch_sub(1) > 0) range->bytes.pop_back();
    }
    return range;
  }
  // Into place, as the directory below reads it, with the same faults.
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override {
    ranges.fetch_add(1);
    in_place.fetch_add(1);
    Track(out.size());
    Result<RangeRead> read = inner().GetRangeInto(key, first, out);
    if (read.ok() && read->read > 0) {
      if (corrupt.load() > 0 && corrupt.fetch_sub(1) > 0) out[read->read / 2] ^= 4;
      if (cut.load() > 0 && cut.fetch_sub(1) > 0) --read->read;
    }
    return read;
  }
  bool ReadsRanges() const override { return true; }
  BlobReads blob_reads() const override { return reads; }
  // The most bytes one read asked for, and the most reads under way at once (each read lasting
  // `hold`, so that reads under way together overlap).
  void Track(uint64_t bytes) {
    uint64_t seen = largest.load();
    while (bytes > seen && !largest.compare_exchange_weak(seen, bytes)) {
    }
    const int now = ++running;
    int most = most_running.load();
    while (now > most && !most_running.compare_exchange_weak(most, now)) {
    }
    if (hold.count() > 0) {
      std::this_thread::sleep_for(hold);
    } else {
      std::this_thread::yield();  // (other reads under way get a turn)
    }
    --running;
  }

  BlobReads reads;
  std::chrono::microseconds hold{0};
  std::atomic<uint64_t> largest{0};
  std::atomic<int> running{0};
  std::atomic<int> most_running{0};
  std::atomic<int> ranges{0};
  std::atomic<int> in_place{0};
  std::atomic<int> whole_blob_reads{0};
  std::atomic<int> corrupt{0};
  std::atomic<int> cut{0};
};

// A blob's bytes in memory, handed over in buffers (no windows).
class BufferedSink : public BytesSink {
 public:
  using BytesSink::BytesSink;
  std::vector<std::span<uint8_t>> Windows(uint64_t, uint64_t) override { return {}; }
};

// Blobs of the given sizes, in a store in memory: a part is a range read, not a file opened.
struct Blobs {
  MemEnv env;
  Upstream upstream{&env};
  std::vector<std::vector<uint8_t>> contents;
  std::vector<BlobRef> refs;

  explicit Blobs(const std::vector<size_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      contents.push_back(Pattern(sizes[i], static_cast<uint8_t>(i + 1)));
      refs.push_back({Sha256Hex(contents.back()), sizes[i]});
      upstream.Put(contents.back());
    }
  }
  // Fetches every blob through `store` (`in_place`: into the sinks' windows; otherwise through
  // buffers handed to Place); checks each one's bytes when it succeeds.
  Status Fetch(ObjectStore& store, const FetchOptions& options, bool in_place = true) {
    std::vector<std::unique_ptr<BytesSink>> sinks;
    std::vector<BlobFetch> fetches;
    for (size_t i = 0; i < refs.size(); ++i) {
      sinks.push_back(in_place ? std::make_unique<BytesSink>(refs[i].bytes)
                               : std::make_unique<BufferedSink>(refs[i].bytes));
      fetches.push_back({refs[i], "blob " + std::to_string(i), sinks.back().get()});
    }
    Status status = FetchBlobs(store, fetches, options);
    if (status.ok()) {
      for (size_t i = 0; i < refs.size(); ++i) CHECK(sinks[i]->bytes() == contents[i]);
    }
    return status;
  }
};

const std::vector<size_t> kSizes = {0, 1, 999, 1000, 1001, 5000, 12345};

TEST_CASE("blob fetch: every part size, concurrency and memory bound gives whole, checked blobs") {
  Blobs blobs(kSizes);
  RangedStore store(*blobs.upstream.store);
  for (bool in_place : {true, false}) {
    for (uint64_t part_bytes : {uint64_t{7}, uint64_t{1000}, uint64_t{1} << 20}) {
      for (int concurrency : {1, 4, 16}) {
        for (uint64_t buffered : {uint64_t{1}, uint64_t{4000}, uint64_t{1} << 30}) {
          CAPTURE(in_place);
          CAPTURE(part_bytes);
          CAPTURE(concurrency);
          CAPTURE(buffered);
          store.ranges = 0;
          store.in_place = 0;
          const Status status = blobs.Fetch(store, {part_bytes, concurrency, buffered}, in_place);
          REQUIRE_MESSAGE(status.ok(), status.ToString());
          int parts = 0;
          for (size_t size : kSizes)
            parts += static_cast<int>(std::max<uint64_t>(1, (size + part_bytes - 1) / part_bytes));
          CHECK(store.ranges.load() == parts);
          // Every part of a blob with bytes lands in place when the sink has windows.
          CHECK(store.in_place.load() == (in_place ? parts - 1 : 0));
        }
      }
    }
  }
  // Straight from the directory: read into place, no buffer.
  REQUIRE(blobs.Fetch(*blobs.upstream.store, {1000, 4, 1}).ok());
  CHECK(store.whole_blob_reads.load() == 0);
  // A store that reads whole objects is asked for each blob once, whatever the part size.
  int before = blobs.upstream.faulty.gets.load();
  REQUIRE(blobs.Fetch(blobs.upstream.faulty, {7, 4, 1 << 20}).ok());
  CHECK(blobs.upstream.faulty.gets.load() - before == static_cast<int>(kSizes.size()));
}

TEST_CASE("blob fetch: a damaged part is fetched again with its blob; three times, kDataLoss") {
  Blobs blobs({30000});
  RangedStore store(*blobs.upstream.store);
  const FetchOptions options{4096, 4, 1 << 20};
  for (bool in_place : {true, false}) {
    CAPTURE(in_place);
    store.ranges = 0;
    store.corrupt = 1;
    REQUIRE(blobs.Fetch(store, options, in_place).ok());
    CHECK(store.ranges.load() == 2 * 8);  // the blob's 8 parts, twice
    store.cut = 2;                        // short parts: a transfer that ended early
    REQUIRE(blobs.Fetch(store, options, in_place).ok());
  }
  store.corrupt = 1000;
  const Status status = blobs.Fetch(store, options);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("blob 0: blob " + blobs.refs[0].sha256 + " is corrupted") !=
        std::string::npos);
  store.corrupt = 0;
  // A blob that is not there: the store's answer, naming the blob.
  BytesSink sink(10);
  const BlobFetch missing{{std::string(64, 'a'), 10}, "the missing blob", &sink};
  const Status absent = FetchBlobs(store, {&missing, 1}, options);
  CHECK(absent.code() == StatusCode::kNotFound);
  CHECK(absent.message().find("the missing blob") != std::string::npos);
}

TEST_CASE("blob fetch: the store server and the cache read ranges of blobs alone") {
  Blobs blobs(kSizes);
  RangedStore backend(*blobs.upstream.store);
  auto server = std::move(StoreServer::Start(backend, {})).value();
  HttpStore http("http://127.0.0.1:" + std::to_string(server->port()), "");
  REQUIRE(blobs.Fetch(http, {1000, 8, 1 << 20}).ok());
  CHECK(backend.whole_blob_reads.load() == 0);
  CHECK(backend.ranges.load() > static_cast<int>(kSizes.size()));
  // Ranges past the end, and of nothing.
  Result<ObjectRange> past = http.GetRange(BlobKey(blobs.refs[5].sha256), 5000, 10);
  REQUIRE(past.ok());
  CHECK(past->bytes.empty());
  CHECK(past->object_size == 5000);
  Result<ObjectRange> tail = http.GetRange(BlobKey(blobs.refs[5].sha256), 4990, 100);
  REQUIRE(tail.ok());
  CHECK(tail->bytes == std::vector<uint8_t>(blobs.contents[5].end() - 10, blobs.contents[5].end()));
  CHECK(http.GetRange(BlobKey(blobs.refs[5].sha256), 0, 0).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(http.GetRange(BlobKey(std::string(64, 'b')), 0, 10).status().code() ==
        StatusCode::kNotFound);

  // A cache fetches a blob whole once, then answers its ranges from the file it checked.
  const std::string dir = TempRoot("range-cache");
  auto cache = std::move(CachingStore::Open(blobs.upstream.faulty, {dir})).value();
  const int gets = blobs.upstream.faulty.gets.load();
  REQUIRE(blobs.Fetch(*cache, {1000, 8, 1 << 20}).ok());
  REQUIRE(blobs.Fetch(*cache, {777, 8, 1 << 20}).ok());
  CHECK(blobs.upstream.faulty.gets.load() - gets == static_cast<int>(kSizes.size()));
  // Reopened over a file damaged at rest: the first range read checks the whole file, finds the
  // damage and fetches the blob again.
  cache.reset();
  const std::string path = dir + "/blobs/" + blobs.refs[6].sha256;
  Result<std::vector<uint8_t>> cached = ReadFile(path);
  REQUIRE_MESSAGE(cached.ok(), cached.status().ToString());
  std::vector<uint8_t> damaged = std::move(cached).value();
  damaged[100] ^= 1;
  const Status rewritten =
      WriteFileAtomic(path, [&](int fd) { return WriteAll(fd, damaged, path); });
  REQUIRE_MESSAGE(rewritten.ok(), rewritten.ToString());
  cache = std::move(CachingStore::Open(blobs.upstream.faulty, {dir})).value();
  REQUIRE(blobs.Fetch(*cache, {1000, 8, 1 << 20}).ok());
  CHECK(cache->stats().corrupted >= 1);  // (each part that read it at once counts it)
  server->Stop();
  cache.reset();
  std::filesystem::remove_all(dir);
}

TEST_CASE("blob fetch: a reader pulls through parts; damaged keyframe parts leave its copy alone") {
  TestStore d("reader-parts");
  TestRun run(*d.store, "run", 4, {{"w", {300, 100}}, {"norm", {100}}});
  run.Start();
  for (int v = 1; v <= 6; ++v) run.Next();
  RangedStore store(*d.store);
  const FetchOptions parts{4096, 6, 64 << 10};
  StoreReader reader(store, "run", 2, parts);
  sync::ServedModel model;
  REQUIRE(reader.Pull(2, std::nullopt, &model).ok());
  CHECK(SameBytes(model, run.published[2]));
  CHECK(store.whole_blob_reads.load() == 0);
  CHECK(store.ranges.load() >= 16);  // a keyframe of about 60 KB in 4 KB parts, and deltas
  // Damaged on every fetch: the pull fails and the copy held is untouched.
  store.corrupt = 1000;
  const Status failed = reader.Pull(6, 2, &model).status();
  CHECK(failed.code() == StatusCode::kDataLoss);
  CHECK(SameBytes(model, run.published[2]));
  sync::ServedModel empty;
  CHECK(reader.Pull(5, std::nullopt, &empty).status().code() == StatusCode::kDataLoss);
  CHECK(empty.tensors().empty());
  // Damaged once: fetched again, and the pull goes through.
  store.corrupt = 1;
  REQUIRE(reader.Pull(5, std::nullopt, &empty).ok());
  CHECK(SameBytes(empty, run.published[5]));
  store.corrupt = 0;
  REQUIRE(reader.Pull(6, 2, &model).ok());
  CHECK(SameBytes(model, run.published[6]));
}

TEST_CASE("blob fetch: a reader fetches in the store's range size, as many at once as it says") {
  TestStore d("reader-reads");
  TestRun run(*d.store, "run", 4, {{"w", {300, 200}}, {"v", {300, 200}}, {"norm", {200}}});
  run.Start();
  for (int v = 1; v <= 3; ++v) run.Next();
  RangedStore store(*d.store);
  for (const BlobReads reads : {BlobReads{4096, 2}, BlobReads{16384, 5}}) {
    CAPTURE(reads.part_bytes);
    store.reads = reads;
    store.largest = 0;
    store.most_running = 0;
    store.hold = std::chrono::microseconds(200);
    StoreReader reader(store, "run", 2);  // the store's own settings
    sync::ServedModel model;
    REQUIRE(reader.Pull(3, std::nullopt, &model).ok());
    CHECK(SameBytes(model, run.published[3]));
    CHECK(store.largest.load() <= reads.part_bytes);
    CHECK(store.largest.load() > reads.part_bytes / 2);
    CHECK(store.most_running.load() <= reads.parallel);
  }
}

TEST_CASE("reader: a copy that must restart from a keyframe is dropped first when asked") {
  TestStore d("reader-drop");
  TestRun run(*d.store, "run", 4, {{"w", {300, 100}}, {"norm", {100}}});
  run.Start();
  for (int v = 1; v <= 6; ++v) run.Next();
  RangedStore store(*d.store);
  StoreReader keeping(store, "run", 2, {4096, 6, 64 << 10});
  StoreReader dropping(store, "run", 2, {4096, 6, 64 << 10});
  dropping.DropCopyForKeyframe(true);
  sync::ServedModel kept, dropped;
  REQUIRE(keeping.Pull(2, std::nullopt, &kept).ok());
  REQUIRE(dropping.Pull(2, std::nullopt, &dropped).ok());
  // A path of deltas from version 2 is still there: the copy is changed in place, not dropped.
  Result<PullReport> in_place = dropping.Pull(3, 2, &dropped);
  REQUIRE(in_place.ok());
  CHECK(!in_place->dropped_copy);
  CHECK(in_place->from == std::optional<uint64_t>(2));
  REQUIRE(keeping.Pull(3, 2, &kept).ok());
  // Version 3's manifest collected: nothing chains from it any more, so the path starts from a
  // keyframe. A keyframe damaged on every fetch fails both pulls; the dropping reader has let its
  // copy go, the other kept its copy as it was.
  REQUIRE(d.store->Delete(ManifestKey("run", 3)).ok());
  store.corrupt = 1000;
  CHECK(keeping.Pull(6, 3, &kept).status().code() == StatusCode::kDataLoss);
  CHECK(SameBytes(kept, run.published[3]));
  CHECK(dropping.Pull(6, 3, &dropped).status().code() == StatusCode::kDataLoss);
  CHECK(dropped.tensors().empty());
  // Undamaged: each pull lands on version 6; the dropping one says it dropped the copy.
  store.corrupt = 0;
  sync::ServedModel second = kept;
  Result<PullReport> kept_pull = keeping.Pull(6, 3, &kept);
  REQUIRE(kept_pull.ok());
  CHECK(!kept_pull->dropped_copy);
  CHECK(SameBytes(kept, run.published[6]));
  Result<PullReport> dropped_pull = dropping.Pull(6, 3, &second);
  REQUIRE(dropped_pull.ok());
  CHECK(dropped_pull->dropped_copy);
  CHECK(!dropped_pull->from);
  CHECK(SameBytes(second, run.published[6]));
}

}  // namespace
}  // namespace weft::policy_store
