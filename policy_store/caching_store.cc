#include "policy_store/caching_store.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/file_util.h"
#include "common/logging.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

bool IsHex64(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The sha256 of a blob key, or empty for other keys.
std::string BlobHash(const std::string& key) {
  if (key.rfind("blobs/", 0) != 0) return "";
  std::string hash = key.substr(6);
  return IsHex64(hash) ? hash : "";
}

bool IsVersionManifest(const std::string& key) {
  return key.rfind("runs/", 0) == 0 && key.find("/versions/") != std::string::npos &&
         key.size() > 5 && key.compare(key.size() - 5, 5, ".json") == 0;
}

}  // namespace

std::optional<CachingStore::FileStamp> CachingStore::StampOf(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return std::nullopt;
  return FileStamp{static_cast<uint64_t>(info.st_ino), static_cast<uint64_t>(info.st_size),
                   static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec,
                   static_cast<int64_t>(info.st_ctim.tv_sec) * 1000000000 + info.st_ctim.tv_nsec};
}

struct CachingStore::Flight {
  bool done = false;
  std::optional<Result<SharedBytes>> result;
  std::condition_variable finished;
};

Result<std::unique_ptr<CachingStore>> CachingStore::Open(ObjectStore& upstream,
                                                         CacheOptions options) {
  if (options.dir.empty()) return InvalidArgument("the cache needs a directory");
  if (options.fetch_attempts < 1) options.fetch_attempts = 1;
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(options.dir) / "blobs", error);
  if (error)
    return Unavailable("cannot create the cache directory " + options.dir + ": " + error.message());
  std::unique_ptr<CachingStore> cache(new CachingStore(upstream, std::move(options)));
  // Index what an earlier run left, least recently used first; stray files (temporaries of a
  // process killed while writing) are removed.
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> found;
  for (const auto& file : std::filesystem::directory_iterator(
           std::filesystem::path(cache->options_.dir) / "blobs", error)) {
    const std::string name = file.path().filename().string();
    if (!IsHex64(name) || !file.is_regular_file()) {
      std::filesystem::remove(file.path(), error);
      continue;
    }
    found.emplace_back(file.last_write_time(error), name);
  }
  std::sort(found.begin(), found.end());
  for (const auto& [time, name] : found) {
    const uint64_t bytes = std::filesystem::file_size(cache->PathOf(name), error);
    if (error) continue;
    cache->lru_.push_back(name);
    cache->entries_[name] = {bytes, std::prev(cache->lru_.end()), std::nullopt};
    cache->cached_bytes_ += bytes;
  }
  // A smaller limit than the last run's takes effect now.
  cache->Insert("", {});
  return cache;
}

Result<std::unique_ptr<CachingStore>> CachingStore::Open(std::unique_ptr<ObjectStore> upstream,
                                                         CacheOptions options) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<CachingStore> cache, Open(*upstream, std::move(options)));
  cache->owned_upstream_ = std::move(upstream);
  return cache;
}

std::string CachingStore::PathOf(const std::string& sha256) const {
  return options_.dir + "/blobs/" + sha256;
}

std::string CachingStore::Describe() const {
  return "cache:" + options_.dir + " in front of " + upstream_.Describe();
}

CacheStats CachingStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CacheStats stats = stats_;
  stats.cached_blobs = entries_.size();
  stats.cached_bytes = cached_bytes_;
  return stats;
}

std::string CachingStore::StatsJson() const {
  const CacheStats s = stats();
  nlohmann::json json = {{"upstream", upstream_.Describe()},
                         {"hits", s.hits},
                         {"misses", s.misses},
                         {"upstream_fetches", s.upstream_fetches},
                         {"upstream_bytes", s.upstream_bytes},
                         {"corrupted", s.corrupted},
                         {"evicted", s.evicted},
                         {"cached_blobs", s.cached_blobs},
                         {"cached_bytes", s.cached_bytes},
                         {"max_bytes", options_.max_bytes}};
  return json.dump();
}

void CachingStore::Touch(const std::string& sha256) {
  auto entry = entries_.find(sha256);
  if (entry == entries_.end()) return;
  lru_.splice(lru_.end(), lru_, entry->second.position);
}

std::optional<std::vector<uint8_t>> CachingStore::ReadCached(const std::string& sha256) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!entries_.count(sha256)) return std::nullopt;
  }
  // The file as it was before the read: if it changes during the read, the next range read sees
  // a different file and checks it again.
  const std::optional<FileStamp> stamp = StampOf(PathOf(sha256));
  Result<std::vector<uint8_t>> bytes = ReadFile(PathOf(sha256));
  if (bytes.ok() && Sha256Hex(*bytes) == sha256) {
    std::lock_guard<std::mutex> lock(mutex_);
    Touch(sha256);
    ++stats_.hits;
    auto entry = entries_.find(sha256);
    if (entry != entries_.end()) entry->second.checked = stamp;
    return std::move(*bytes);
  }
  // Gone (evicted meanwhile, or removed by hand) or corrupted on disk: forget it and refetch.
  std::lock_guard<std::mutex> lock(mutex_);
  auto entry = entries_.find(sha256);
  if (bytes.ok()) {
    ++stats_.corrupted;
    WEFT_LOG(kWarning) << "cache " << options_.dir << ": blob " << sha256
                       << " is corrupted on disk; removing it and fetching it again";
  }
  if (entry != entries_.end()) {
    cached_bytes_ -= entry->second.bytes;
    lru_.erase(entry->second.position);
    entries_.erase(entry);
    std::error_code error;
    std::filesystem::remove(PathOf(sha256), error);
  }
  return std::nullopt;
}

void CachingStore::Insert(const std::string& sha256, std::span<const uint8_t> bytes) {
  if (!sha256.empty() && bytes.size() <= options_.max_bytes) {
    Status written = WriteFileAtomic(PathOf(sha256),
                                     [&](int fd) { return WriteAll(fd, bytes, PathOf(sha256)); });
    if (!written.ok()) {
      WEFT_LOG(kWarning) << "cache " << options_.dir << ": cannot keep blob " << sha256 << ": "
                         << written.message();
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!entries_.count(sha256)) {
        lru_.push_back(sha256);
        entries_[sha256] = {bytes.size(), std::prev(lru_.end()), StampOf(PathOf(sha256))};
        cached_bytes_ += bytes.size();
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  while (cached_bytes_ > options_.max_bytes && !lru_.empty()) {
    const std::string victim = lru_.front();
    lru_.pop_front();
    cached_bytes_ -= entries_[victim].bytes;
    entries_.erase(victim);
    ++stats_.evicted;
    std::error_code error;
    std::filesystem::remove(PathOf(victim), error);
  }
}

Result<std::vector<uint8_t>> CachingStore::FetchBlob(const std::string& key,
                                                     const std::string& sha256) {
  for (int attempt = 1;; ++attempt) {
    Result<std::vector<uint8_t>> bytes = upstream_.Get(key);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.upstream_fetches;
      if (bytes.ok()) stats_.upstream_bytes += bytes->size();
    }
    if (!bytes.ok()) return bytes.status();
    if (Sha256Hex(*bytes) == sha256) return bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.corrupted;
    }
    WEFT_LOG(kWarning) << upstream_.Describe() << ": blob " << sha256 << " arrived corrupted (try "
                       << attempt << " of " << options_.fetch_attempts << ")";
    if (attempt >= options_.fetch_attempts) {
      return DataLoss(upstream_.Describe() + ": blob " + sha256 + " failed its hash on each of " +
                      std::to_string(attempt) + " fetches");
    }
  }
}

Result<std::vector<uint8_t>> CachingStore::GetBlob(const std::string& key,
                                                   const std::string& sha256) {
  if (std::optional<std::vector<uint8_t>> cached = ReadCached(sha256)) return std::move(*cached);
  WEFT_ASSIGN_OR_RETURN(SharedBytes fetched, FetchShared(key, sha256));
  return std::vector<uint8_t>(*fetched);
}

Result<CachingStore::SharedBytes> CachingStore::FetchShared(const std::string& key,
                                                            const std::string& sha256) {
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.misses;
    auto found = flights_.find(sha256);
    if (found == flights_.end()) {
      flight = std::make_shared<Flight>();
      flights_[sha256] = flight;
      leader = true;
    } else {
      flight = found->second;
    }
  }
  if (!leader) {
    std::unique_lock<std::mutex> lock(mutex_);
    flight->finished.wait(lock, [&] { return flight->done; });
    return *flight->result;
  }
  Result<std::vector<uint8_t>> bytes = FetchBlob(key, sha256);
  Result<SharedBytes> shared = bytes.status();
  if (bytes.ok()) {
    shared = std::make_shared<const std::vector<uint8_t>>(std::move(bytes).value());
    Insert(sha256, **shared);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flight->result = shared;
    flight->done = true;
    flights_.erase(sha256);
  }
  flight->finished.notify_all();
  return shared;
}

Result<std::vector<uint8_t>> CachingStore::GetManifest(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = manifests_.find(key);
    if (found != manifests_.end()) return found->second;
  }
  Result<std::vector<uint8_t>> bytes = upstream_.Get(key);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.upstream_fetches;
  if (!bytes.ok()) return bytes;
  stats_.upstream_bytes += bytes->size();
  if (manifests_.emplace(key, *bytes).second) {
    manifest_order_.push_back(key);
    if (manifests_.size() > options_.max_manifests) {
      manifests_.erase(manifest_order_.front());
      manifest_order_.pop_front();
    }
  }
  return bytes;
}

Result<std::vector<uint8_t>> CachingStore::Get(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string sha256 = BlobHash(key);
  if (!sha256.empty()) return GetBlob(key, sha256);
  if (IsVersionManifest(key)) return GetManifest(key);
  return upstream_.Get(key);
}

std::optional<uint64_t> CachingStore::CheckedSize(const std::string& sha256) {
  uint64_t size = 0;
  std::optional<FileStamp> checked;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto entry = entries_.find(sha256);
    if (entry != entries_.end()) {
      size = entry->second.bytes;
      checked = entry->second.checked;
    }
  }
  if (size > 0 && checked && StampOf(PathOf(sha256)) == checked) return size;
  return std::nullopt;
}

void CachingStore::CountRangeHit(const std::string& sha256) {
  std::lock_guard<std::mutex> lock(mutex_);
  Touch(sha256);
  ++stats_.hits;
}

Result<ObjectRange> CachingStore::GetRange(const std::string& key, uint64_t first,
                                           uint64_t length) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string sha256 = BlobHash(key);
  if (sha256.empty() || length == 0) return ObjectStore::GetRange(key, first, length);
  if (std::optional<uint64_t> size = CheckedSize(sha256)) {
    // Checked, and unchanged on disk since: the range straight from the file.
    Result<FileRange> range = ReadFileRange(PathOf(sha256), first, length);
    if (range.ok() && range->file_size == *size) {
      CountRangeHit(sha256);
      return ObjectRange{std::move(range->bytes), *size};
    }
  }
  // Not checked since the cache opened: the whole file, checked.
  if (std::optional<std::vector<uint8_t>> cached = ReadCached(sha256))
    return SliceRange(std::move(*cached), first, length);
  // A miss: fetched (and cached) once, however many parts ask at once; each takes its range of
  // the one copy.
  WEFT_ASSIGN_OR_RETURN(SharedBytes fetched, FetchShared(key, sha256));
  return SliceRange(std::span<const uint8_t>(*fetched), first, length);
}

Result<RangeRead> CachingStore::GetRangeInto(const std::string& key, uint64_t first,
                                             std::span<uint8_t> out) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string sha256 = BlobHash(key);
  if (!sha256.empty() && !out.empty()) {
    if (std::optional<uint64_t> size = CheckedSize(sha256)) {
      Result<FileRead> read = ReadFileRangeInto(PathOf(sha256), first, out);
      if (read.ok() && read->file_size == *size) {
        CountRangeHit(sha256);
        return RangeRead{read->read, *size};
      }
    }
  }
  // Anything else as GetRange does it, copied.
  return ObjectStore::GetRangeInto(key, first, out);
}

Result<bool> CachingStore::Exists(const std::string& key) {
  const std::string sha256 = BlobHash(key);
  if (!sha256.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.count(sha256)) return true;
  }
  return upstream_.Exists(key);
}

Result<std::vector<std::string>> CachingStore::List(const std::string& prefix) {
  return upstream_.List(prefix);
}

Status CachingStore::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  return upstream_.PutImmutable(key, bytes);
}

Result<std::unique_ptr<ObjectWriter>> CachingStore::NewImmutableWriter(const std::string& key) {
  return upstream_.NewImmutableWriter(key);
}

Status CachingStore::CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                                    const std::string& desired) {
  return upstream_.CompareAndSwap(key, std::move(expected), desired);
}

Status CachingStore::Delete(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (manifests_.erase(key)) manifest_order_.remove(key);
  }
  return upstream_.Delete(key);
}

}  // namespace weft::policy_store
