// CachingStore: a pull-through cache in front of another store, for regional relays
// (`weft relay`) and for readers that keep a bounded local cache.
//
// Reads of content-addressed blobs (blobs/<sha256>) are served from a cache directory:
//   - a hit is read and its SHA-256 checked against its name; a corrupted file is reported,
//     deleted and fetched again, so nothing corrupted is ever returned;
//   - concurrent misses for the same blob make one upstream fetch (single flight) that every
//     caller waits for;
//   - a fetched blob is checked against its name before it is cached or returned (a corrupted
//     transfer is fetched again, up to `fetch_attempts` tries, then kDataLoss);
//   - the directory holds at most `max_bytes`; the least recently used blobs are evicted (a blob
//     larger than that is returned without being cached).
// Version manifests (runs/<run>/versions/..., immutable once written) are kept in memory, up to
// `max_manifests`. Everything else (`latest`, listings) and every write goes upstream. The cache
// survives restarts: Open indexes the directory, oldest modification time first. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "policy_store/object_store.h"

namespace weft::policy_store {

struct CacheOptions {
  std::string dir;
  uint64_t max_bytes = uint64_t{10} << 30;
  int fetch_attempts = 3;
  size_t max_manifests = 4096;
};

struct CacheStats {
  uint64_t hits = 0;              // blob reads served from the cache
  uint64_t misses = 0;            // blob reads that waited for an upstream fetch
  uint64_t upstream_fetches = 0;  // upstream GETs of blobs and manifests
  uint64_t upstream_bytes = 0;    // bytes those fetches returned
  uint64_t corrupted = 0;         // cached files or transfers that failed their hash
  uint64_t evicted = 0;           // blobs evicted to stay under max_bytes
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

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  // A range of a blob is read straight from its cached file when the cache has checked that
  // file's hash (when it fetched the blob, or on a whole read since it opened) and the file has
  // not changed on disk since (inode, size, modification and change times); otherwise the whole
  // file is read and checked first (and the blob fetched again if it fails). A reader checks the
  // hash of every blob it assembles too.
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override;
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override;
  bool ReadsRanges() const override { return true; }
  Result<bool> Exists(const std::string& key) override;
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override;
  Result<std::unique_ptr<ObjectWriter>> NewImmutableWriter(const std::string& key) override;
  std::string Describe() const override;

  ObjectStore& upstream() const { return upstream_; }
  CacheStats stats() const;
  std::string StatsJson() const;

 private:
  CachingStore(ObjectStore& upstream, CacheOptions options)
      : upstream_(upstream), options_(std::move(options)) {}
  struct Flight;

  using SharedBytes = std::shared_ptr<const std::vector<uint8_t>>;
  Result<std::vector<uint8_t>> GetBlob(const std::string& key, const std::string& sha256);
  // The single flight of a miss: one upstream fetch (FetchBlob) however many callers ask at once,
  // cached, and shared with them all.
  Result<SharedBytes> FetchShared(const std::string& key, const std::string& sha256);
  Result<std::vector<uint8_t>> GetManifest(const std::string& key);
  // A verified upstream fetch of a blob, retried when its bytes fail their hash.
  Result<std::vector<uint8_t>> FetchBlob(const std::string& key, const std::string& sha256);
  // Reads and checks a cached blob; nullopt on a miss (a corrupted file is removed).
  std::optional<std::vector<uint8_t>> ReadCached(const std::string& sha256);
  void Insert(const std::string& sha256, std::span<const uint8_t> bytes);
  // The size of a cached blob whose file was checked and has not changed on disk since, which a
  // range may be read from as it is; nullopt otherwise.
  std::optional<uint64_t> CheckedSize(const std::string& sha256);
  void CountRangeHit(const std::string& sha256);  // a range read from a checked file
  void Touch(const std::string& sha256);          // with mutex_ held
  std::string PathOf(const std::string& sha256) const;

  std::unique_ptr<ObjectStore> owned_upstream_;
  ObjectStore& upstream_;
  CacheOptions options_;
  mutable std::mutex mutex_;
  // LRU over cached blobs: front is the least recently used.
  std::list<std::string> lru_;
  // What identifies a cached file's state on disk: a write to it (or a new file in its place)
  // changes the stamp.
  struct FileStamp {
    uint64_t inode = 0;
    uint64_t size = 0;
    int64_t modified_ns = 0;
    int64_t changed_ns = 0;
    friend bool operator==(const FileStamp&, const FileStamp&) = default;
  };
  static std::optional<FileStamp> StampOf(const std::string& path);
  struct Entry {
    uint64_t bytes = 0;
    std::list<std::string>::iterator position;
    // The file's stamp when its hash was last checked (since the cache opened), if it was.
    std::optional<FileStamp> checked;
  };
  std::map<std::string, Entry> entries_;
  uint64_t cached_bytes_ = 0;
  std::map<std::string, std::shared_ptr<Flight>> flights_;
  std::list<std::string> manifest_order_;
  std::map<std::string, std::vector<uint8_t>> manifests_;
  CacheStats stats_;
};

}  // namespace weft::policy_store
