// CachingStore: a pull-through cache in front of another store, for regional relays
// (`weft relay`) and for readers that keep a bounded local cache.
//
// Reads of content-addressed blobs (blobs/<sha256>) are served from a cache directory, in bounded
// memory whatever a blob's size:
//   - a hit is a file whose SHA-256 the cache has checked against its name since it opened (when
//     it fetched it, or in a pass over it on its first read after a restart: a corrupted file is
//     reported, deleted and fetched again), and which has not changed on disk since; it is read
//     straight from the file;
//   - a miss starts one fetch of the blob however many readers ask at once (single flight): the
//     upstream's bytes stream into a temporary file, hashed on the way, and every reader of the
//     blob is served from that file as it grows (a reader wanting bytes not yet there waits for
//     them, without holding a thread). The file becomes the cached blob only once its hash
//     matches; the last bytes of the blob are given to no reader before then, so a whole read of
//     a blob that fails its hash is cut off rather than completed;
//   - bytes whose hash is not their name are never cached: the fetch fails with kDataLoss naming
//     the blob, the hash it should have and the hash it had, and the blob is refused with that
//     error for `mismatch_hold` before the upstream is asked again (so a tampered upstream is
//     fetched once per hold, however many readers retry);
//   - a blob larger than `max_bytes` is not cached: its readers' ranges are read from the
//     upstream as they ask for them, a megabyte at a time;
//   - the directory holds at most `max_bytes` of cached blobs (plus the temporary files of fetches
//     under way); the least recently used are evicted first.
// Version manifests (runs/<run>/versions/..., immutable once written) are kept in memory, at most
// `max_manifest_bytes` of them, fetched once however many readers ask at once. Everything else
// (`latest`, listings) and every write goes upstream. Objects other than blobs are read whole, up
// to kMaxSmallObjectBytes. The cache survives restarts: Open indexes the directory, oldest
// modification time first.
//
// OpenReadAsync never waits on the upstream on the calling thread (a relay's I/O thread):
// fetches run on the blocking pool (common/concurrent.h) and answer their readers by callback.
// The destructor waits for the fetches under way (each ends within the upstream's deadline).
// The directory's files and the clock of the hold are an Env's (common/env.h; the machine's unless
// told otherwise). Nothing is synced: a crash may leave any file torn, and the hash check of a
// restart finds it. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/mutex.h"
#include "policy_store/cache_index.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

struct CacheOptions {
  std::string dir;
  uint64_t max_bytes = uint64_t{10} << 30;
  uint64_t max_manifest_bytes = uint64_t{64} << 20;
  // How long a blob whose upstream bytes failed their hash is refused before it is fetched again.
  std::chrono::milliseconds mismatch_hold{std::chrono::seconds(30)};
  // The directory's files and the hold's clock (null: Env::Default()); it must outlive the cache.
  Env* env = nullptr;
};

// Objects other than blobs pass through the cache whole, up to this size.
inline constexpr uint64_t kMaxSmallObjectBytes = uint64_t{64} << 20;

struct CacheStats {
  uint64_t hits = 0;                 // blob reads served from a cached file
  uint64_t misses = 0;               // blob reads that waited for a fetch (their own or another's)
  uint64_t upstream_fetches = 0;     // upstream reads of blobs and manifests
  uint64_t upstream_bytes = 0;       // bytes those reads returned
  uint64_t corrupted = 0;            // cached files that failed their hash, deleted and refetched
  uint64_t upstream_mismatches = 0;  // fetched blobs whose bytes failed their hash: not cached
  uint64_t refused = 0;              // blob reads refused while a mismatch was held
  uint64_t passed_through = 0;       // upstream range reads of blobs larger than the cache
  uint64_t evicted = 0;              // blobs evicted to stay under max_bytes
  uint64_t fetching = 0;             // fetches under way now
  uint64_t cached_blobs = 0;
  uint64_t cached_bytes = 0;
};

class CachingStore : public ObjectStore {
 public:
  // `upstream` must outlive the cache.
  static Result<std::unique_ptr<CachingStore>> Open(ObjectStore& upstream, CacheOptions options);
  // The same, owning its upstream.
  static Result<std::unique_ptr<CachingStore>> Open(std::unique_ptr<ObjectStore> upstream,
                                                    CacheOptions options);
  ~CachingStore() override EXCLUDES(mutex_);

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override;
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override;
  Result<uint64_t> ReadTo(const std::string& key, uint64_t first, uint64_t length,
                          BodyTarget& target) override;
  bool ReadsRanges() const override { return true; }
  // The upstream's: its misses are read from there.
  BlobReads blob_reads() const override { return upstream_.blob_reads(); }
  Result<std::unique_ptr<ObjectReader>> OpenRead(const std::string& key) override EXCLUDES(mutex_);
  void OpenReadAsync(const std::string& key, OpenDone done) override EXCLUDES(mutex_);
  Result<bool> Exists(const std::string& key) override EXCLUDES(mutex_);
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override EXCLUDES(mutex_);
  Result<std::unique_ptr<ObjectWriter>> NewImmutableWriter(const std::string& key) override;
  std::string Describe() const override;
  // The objects that change are never cached: watched upstream.
  Result<ObjectWatch> WaitForChange(const std::string& key, const std::optional<std::string>& known,
                                    std::chrono::milliseconds wait,
                                    const std::atomic<bool>* cancel = nullptr) override {
    return upstream_.WaitForChange(key, known, wait, cancel);
  }

  ObjectStore& upstream() const { return upstream_; }
  CacheStats stats() const EXCLUDES(mutex_);
  std::string StatsJson() const;
  // The counters in the Prometheus text format, each name starting with `prefix`.
  std::string MetricsText(const std::string& prefix) const;

  struct Flight;

 private:
  CachingStore(ObjectStore& upstream, CacheOptions options)
      : upstream_(upstream),
        options_(std::move(options)),
        env_(options_.env ? *options_.env : Env::Default()),
        index_(options_.max_bytes) {}

  void OpenBlob(const std::string& sha256, OpenDone done) EXCLUDES(mutex_);
  // A reader of a blob larger than the cache: range by range from the upstream.
  std::unique_ptr<ObjectReader> PassThrough(const std::string& key, uint64_t size);
  void OpenManifest(const std::string& key, OpenDone done) EXCLUDES(mutex_);
  // A flight's work, on the blocking pool: check the cached file, or fetch the blob.
  void RunFlight(const std::shared_ptr<Flight>& flight) EXCLUDES(mutex_);
  void Fetch(const std::shared_ptr<Flight>& flight) EXCLUDES(mutex_);
  // Takes `flight` out of flights_ (if it is still there): new readers start another.
  void EndFlight(const std::shared_ptr<Flight>& flight) EXCLUDES(mutex_);
  // Whether the cached file of a flight's blob holds its bytes (checked in a pass over it).
  bool CheckCached(const std::shared_ptr<Flight>& flight) EXCLUDES(mutex_);
  // Fetches the manifest `key` and answers the readers waiting for it in manifest_flights_.
  void RunManifestFlight(const std::string& key) EXCLUDES(mutex_);
  // Deletes the files of blobs the index evicted, counting them.
  void EvictedLocked(const std::vector<std::string>& evicted) REQUIRES(mutex_);
  // Drops an entry and deletes its file.
  void ForgetLocked(const std::string& sha256) REQUIRES(mutex_);
  std::string PathOf(const std::string& sha256) const;
  void FlightEnds() EXCLUDES(mutex_);

  std::unique_ptr<ObjectStore> owned_upstream_;
  ObjectStore& upstream_;
  CacheOptions options_;
  Env& env_;
  mutable Mutex mutex_;
  std::condition_variable no_flights_;
  // Flights and manifest fetches under way (the destructor waits for them).
  int running_ GUARDED_BY(mutex_) = 0;
  std::atomic<bool> stopping_{false};
  // The cached blobs, by SHA-256, each with its file's stamp when its hash was last checked (since
  // the cache opened), if it was: a write to it, or another file in its place, changes the stamp.
  CacheIndex<std::string, std::optional<FileStamp>> index_ GUARDED_BY(mutex_);
  std::map<std::string, std::shared_ptr<Flight>> flights_ GUARDED_BY(mutex_);
  // Blobs whose upstream bytes failed their hash: the error, until when it is held.
  struct Held {
    Status error;
    int64_t until_micros;  // on the Env's monotonic clock
  };
  std::map<std::string, Held> held_ GUARDED_BY(mutex_);
  // Blobs larger than the cache, with their sizes.
  std::map<std::string, uint64_t> oversize_ GUARDED_BY(mutex_);
  // The manifests being fetched, each with the readers waiting for it.
  std::map<std::string, std::vector<OpenDone>> manifest_flights_ GUARDED_BY(mutex_);
  std::list<std::string> manifest_order_ GUARDED_BY(mutex_);  // oldest first
  std::map<std::string, std::vector<uint8_t>> manifests_ GUARDED_BY(mutex_);
  uint64_t manifest_bytes_ GUARDED_BY(mutex_) = 0;
  CacheStats stats_ GUARDED_BY(mutex_);
};

}  // namespace weft::policy_store
