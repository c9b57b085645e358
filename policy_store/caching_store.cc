#include "policy_store/caching_store.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <vector>

#include "common/concurrent.h"
#include "common/logging.h"
#include "common/units.h"
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

// Reads [first, first + out.size()) of what `reader` reads into `out` (the whole span: the caller
// has cut it to the object).
Status ReadFully(ObjectReader& reader, uint64_t first, std::span<uint8_t> out) {
  for (uint64_t done = 0; done < out.size();) {
    WEFT_ASSIGN_OR_RETURN(size_t got, reader.ReadAt(first + done, out.subspan(done)));
    done += got;
  }
  return Status::Ok();
}

// An object other than a blob, read whole into memory: refused past kMaxSmallObjectBytes.
class SmallObject : public BodyTarget {
 public:
  explicit SmallObject(std::string key) : key_(std::move(key)) {}
  Status ObjectSize(uint64_t bytes) override {
    if (bytes > kMaxSmallObjectBytes) return TooLarge(bytes);
    return Status::Ok();
  }
  Status Write(std::span<const uint8_t> piece) override {
    if (piece.size() > kMaxSmallObjectBytes - bytes_.size()) return TooLarge(bytes_.size());
    bytes_.insert(bytes_.end(), piece.begin(), piece.end());
    return Status::Ok();
  }
  Status Rewind() override {
    bytes_.clear();
    return Status::Ok();
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  Status TooLarge(uint64_t bytes) const {
    return InvalidArgument(key_ + ": " + std::to_string(bytes) +
                           " bytes or more, and the cache passes objects other than blobs only up "
                           "to " +
                           FormatBytes(kMaxSmallObjectBytes));
  }
  std::string key_;
  std::vector<uint8_t> bytes_;
};

Result<std::vector<uint8_t>> ReadSmall(ObjectStore& store, const std::string& key) {
  SmallObject object(key);
  WEFT_RETURN_IF_ERROR(store.ReadTo(key, 0, UINT64_MAX, object).status());
  return std::move(object.bytes());
}

}  // namespace

// One fetch of a blob (or the check of its cached file), and the readers it serves as it goes.
struct CachingStore::Flight {
  Flight(std::string sha256, bool check) : sha256(std::move(sha256)), check(check) {}
  enum class State { kRunning, kDone, kFailed };
  struct Waiter {
    uint64_t end;  // bytes [0, end) must be readable
    std::function<void(Status)> ready;
  };

  const std::string sha256;
  bool check;  // the cached file is checked first (and fetched only if it fails)

  Mutex mutex;
  // The temporary file being written, or the checked file: set (under `mutex`) once, before any
  // reader is handed out, so its readers read it without the lock.
  std::unique_ptr<ReadableFile> file;
  std::optional<uint64_t> size GUARDED_BY(mutex);
  uint64_t arrived GUARDED_BY(mutex) = 0;
  State state GUARDED_BY(mutex) = State::kRunning;
  Status failure GUARDED_BY(mutex);
  std::optional<uint64_t> oversize GUARDED_BY(mutex);  // the blob is larger than the cache
  std::vector<OpenDone> openers GUARDED_BY(mutex);     // waiting for the size
  std::vector<Waiter> waiters GUARDED_BY(mutex);
  uint64_t next_wake GUARDED_BY(mutex) = UINT64_MAX;  // the smallest end a waiter waits for

  // Whether bytes [0, end) can be read. The blob's last bytes are withheld until its hash has
  // matched.
  bool Readable(uint64_t end) const REQUIRES(mutex) {
    return state == State::kDone ||
           (state == State::kRunning && size && end <= arrived && end < *size);
  }

  // Takes out of `waiters` those that can go on (all of them once the flight has ended) into `go`,
  // and sets `status` to what they are told; false, taking none, while no waiter can go on.
  bool TakeReady(std::vector<std::function<void(Status)>>& go, Status& status) REQUIRES(mutex) {
    if (state == State::kRunning && arrived < next_wake) return false;
    next_wake = UINT64_MAX;
    for (auto waiter = waiters.begin(); waiter != waiters.end();) {
      if (state == State::kFailed || Readable(waiter->end)) {
        go.push_back(std::move(waiter->ready));
        waiter = waiters.erase(waiter);
      } else {
        next_wake = std::min(next_wake, waiter->end);
        ++waiter;
      }
    }
    status = state == State::kFailed ? failure : Status::Ok();
    return true;
  }

  // Calls the waiters that can go on, outside the lock: `lock` holds `mutex`, and holds it again
  // on return. Not analysed: the analysis cannot follow a MutexLock passed by reference (it sees
  // `lock` released without being held); the guarded state is read in TakeReady.
  void Wake(MutexLock& lock) REQUIRES(mutex) NO_THREAD_SAFETY_ANALYSIS {
    std::vector<std::function<void(Status)>> go;
    Status status;
    if (!TakeReady(go, status)) return;
    lock.Unlock();
    for (auto& ready : go) ready(status);
    lock.Lock();
  }
};

namespace {

// A reader of a blob being fetched (or checked): served from the flight's file as it grows.
class FlightReader : public ObjectReader {
 public:
  FlightReader(std::shared_ptr<CachingStore::Flight> flight, uint64_t size)
      : ObjectReader(size), flight_(std::move(flight)) {}

  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    if (offset >= size() || out.empty()) return InvalidArgument("a read past the blob's end");
    out = out.first(std::min<uint64_t>(out.size(), size() - offset));
    std::promise<Status> ready;
    WhenReady(offset, out.size(), [&ready](Status status) { ready.set_value(std::move(status)); });
    WEFT_RETURN_IF_ERROR(ready.get_future().get());
    Result<size_t> got = flight_->file->ReadAt(offset, out);
    if (!got.ok()) return got.status().WithContext("blob " + flight_->sha256);
    if (*got == 0) return DataLoss("blob " + flight_->sha256 + ": its file is shorter than it was");
    return got;
  }

  void WhenReady(uint64_t offset, uint64_t length, std::function<void(Status)> ready) override {
    CachingStore::Flight& flight = *flight_;
    MutexLock lock(flight.mutex);
    const uint64_t end = std::min(size(), offset + length);
    if (flight.state == CachingStore::Flight::State::kFailed) {
      const Status failure = flight.failure;
      lock.Unlock();
      return ready(failure);
    }
    if (flight.Readable(end)) {
      lock.Unlock();
      return ready(Status::Ok());
    }
    flight.waiters.push_back({end, std::move(ready)});
    flight.next_wake = std::min(flight.next_wake, end);
  }

 private:
  std::shared_ptr<CachingStore::Flight> flight_;
};

// A reader of a blob larger than the cache: its bytes read from the upstream as they are asked
// for, a megabyte at a time.
class PassThroughReader : public ObjectReader {
 public:
  PassThroughReader(ObjectStore& upstream, std::string key, uint64_t size,
                    std::function<void()> count)
      : ObjectReader(size), upstream_(upstream), key_(std::move(key)), count_(std::move(count)) {}

  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    if (offset >= size() || out.empty()) return InvalidArgument(key_ + ": a read past its end");
    if (offset < first_ || offset >= first_ + held_) {
      buffer_.resize(std::min<uint64_t>(kAhead, size() - offset));
      count_();
      WEFT_ASSIGN_OR_RETURN(RangeRead read, upstream_.GetRangeInto(key_, offset, buffer_));
      if (read.object_size != size() || read.read == 0) {
        held_ = 0;
        return DataLoss(upstream_.Describe() + ": " + key_ + " changed size while it was read");
      }
      first_ = offset;
      held_ = read.read;
    }
    const size_t count = std::min<uint64_t>(out.size(), first_ + held_ - offset);
    std::memcpy(out.data(), buffer_.data() + (offset - first_), count);
    return count;
  }
  bool Remote() const override { return true; }

 private:
  static constexpr uint64_t kAhead = uint64_t{1} << 20;
  ObjectStore& upstream_;
  std::string key_;
  std::function<void()> count_;
  std::vector<uint8_t> buffer_;
  uint64_t first_ = 0;
  uint64_t held_ = 0;
};

// Where a fetched blob's bytes go: its flight's temporary file, hashed on the way; its readers
// are told as bytes arrive.
class FlightTarget : public BodyTarget {
 public:
  FlightTarget(CachingStore::Flight& flight, std::unique_ptr<WritableFile> file, uint64_t max_bytes,
               const std::atomic<bool>& stopping)
      : flight_(flight), file_(std::move(file)), max_bytes_(max_bytes), stopping_(stopping) {}

  Status ObjectSize(uint64_t bytes) override {
    MutexLock lock(flight_.mutex);
    if (flight_.size) {
      if (*flight_.size == bytes) return Status::Ok();
      return DataLoss("blob " + flight_.sha256 + " changed size from " +
                      std::to_string(*flight_.size) + " to " + std::to_string(bytes) +
                      " bytes while it was fetched");
    }
    if (bytes > max_bytes_) {
      flight_.oversize = bytes;
      return InvalidArgument("blob " + flight_.sha256 + " is larger than the cache");
    }
    flight_.size = bytes;
    std::vector<OpenDone> openers = std::move(flight_.openers);
    flight_.openers.clear();
    lock.Unlock();
    return Serve(openers, bytes);
  }

  Status Write(std::span<const uint8_t> piece) override {
    if (stopping_.load()) return Unavailable("the cache is closing");
    WEFT_RETURN_IF_ERROR(file_->Append(piece));  // (the fetch names the blob)
    hash_.Update(piece);
    written_ += piece.size();
    MutexLock lock(flight_.mutex);
    flight_.arrived = written_;
    flight_.Wake(lock);
    return Status::Ok();
  }

  Status Rewind() override {
    {
      MutexLock lock(flight_.mutex);
      flight_.arrived = 0;  // (before the bytes go: no reader may read them now)
    }
    written_ = 0;
    hash_.Reset();
    return file_->Truncate(0);
  }

  uint64_t written() const { return written_; }
  std::string HexDigest() { return hash_.HexDigest(); }

  // The readers that waited for the size (`size`), each given one.
  Status Serve(std::vector<OpenDone>& openers, uint64_t size);

  std::shared_ptr<CachingStore::Flight> self;  // set by the fetch, for the readers it hands out

 private:
  CachingStore::Flight& flight_;
  std::unique_ptr<WritableFile> file_;
  uint64_t max_bytes_;
  const std::atomic<bool>& stopping_;
  Sha256 hash_;
  uint64_t written_ = 0;
};

Status FlightTarget::Serve(std::vector<OpenDone>& openers, uint64_t size) {
  for (OpenDone& open : openers) open(std::unique_ptr<ObjectReader>(new FlightReader(self, size)));
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CachingStore>> CachingStore::Open(ObjectStore& upstream,
                                                         CacheOptions options) {
  if (options.dir.empty()) return InvalidArgument("the cache needs a directory");
  std::unique_ptr<CachingStore> cache(new CachingStore(upstream, std::move(options)));
  Env& env = cache->env_;
  const std::string blobs = cache->options_.dir + "/blobs";
  const Status made = env.CreateDirectories(blobs);
  if (!made.ok())
    return Unavailable("cannot create the cache directory " + cache->options_.dir + ": " +
                       made.message());
  Result<std::vector<DirectoryEntry>> entries = env.ListDirectory(blobs);
  if (!entries.ok()) return entries.status().WithContext("cannot open the cache");
  // Index what an earlier run left, least recently used first; stray files (temporaries of a
  // process killed while writing) are removed.
  struct Found {
    int64_t modified_micros;
    std::string name;
    uint64_t bytes;
    bool operator<(const Found& other) const {
      return std::tie(modified_micros, name) < std::tie(other.modified_micros, other.name);
    }
  };
  std::vector<Found> found;
  for (const DirectoryEntry& entry : *entries) {
    if (!IsHex64(entry.name) || entry.type != PathType::kFile) {
      (void)env.Remove(blobs + "/" + entry.name);
      continue;
    }
    Result<std::unique_ptr<ReadableFile>> file = env.OpenReadable(blobs + "/" + entry.name);
    if (!file.ok()) continue;
    Result<FileStamp> stamp = (*file)->Stamp();
    if (!stamp.ok()) continue;
    found.push_back({stamp->modified_micros, entry.name, stamp->size});
  }
  std::sort(found.begin(), found.end());
  MutexLock lock(cache->mutex_);
  // Oldest first, each the most recent so far; a smaller limit than the last run's takes effect
  // now.
  for (const auto& [time, name, bytes] : found)
    cache->EvictedLocked(cache->index_.Add(name, bytes));
  cache->EvictedLocked(cache->index_.Shrink());
  return cache;
}

Result<std::unique_ptr<CachingStore>> CachingStore::Open(std::unique_ptr<ObjectStore> upstream,
                                                         CacheOptions options) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<CachingStore> cache, Open(*upstream, std::move(options)));
  cache->owned_upstream_ = std::move(upstream);
  return cache;
}

CachingStore::~CachingStore() {
  MutexLock lock(mutex_);
  stopping_.store(true);
  no_flights_.wait(lock.native(), [this]() REQUIRES(mutex_) { return running_ == 0; });
}

std::string CachingStore::PathOf(const std::string& sha256) const {
  return options_.dir + "/blobs/" + sha256;
}

std::string CachingStore::Describe() const {
  return "cache:" + options_.dir + " in front of " + upstream_.Describe();
}

CacheStats CachingStore::stats() const {
  MutexLock lock(mutex_);
  CacheStats stats = stats_;
  stats.cached_blobs = index_.size();
  stats.cached_bytes = index_.bytes();
  stats.fetching = flights_.size();
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
                         {"upstream_mismatches", s.upstream_mismatches},
                         {"refused", s.refused},
                         {"passed_through", s.passed_through},
                         {"evicted", s.evicted},
                         {"fetching", s.fetching},
                         {"cached_blobs", s.cached_blobs},
                         {"cached_bytes", s.cached_bytes},
                         {"max_bytes", options_.max_bytes}};
  return json.dump();
}

std::string CachingStore::MetricsText(const std::string& prefix) const {
  const CacheStats s = stats();
  std::string text;
  auto add = [&](const std::string& name, const char* type, const char* help, uint64_t value) {
    text += "# HELP " + prefix + name + " " + help + "\n# TYPE " + prefix + name + " " + type +
            "\n" + prefix + name + " " + std::to_string(value) + "\n";
  };
  add("_cache_hits_total", "counter", "Blob reads served from a cached file.", s.hits);
  add("_cache_misses_total", "counter", "Blob reads that waited for a fetch.", s.misses);
  add("_upstream_fetches_total", "counter", "Upstream reads of blobs and manifests.",
      s.upstream_fetches);
  add("_upstream_bytes_total", "counter", "Bytes those upstream reads returned.", s.upstream_bytes);
  add("_upstream_hash_mismatches_total", "counter",
      "Fetched blobs whose bytes did not hash to their name (not cached).", s.upstream_mismatches);
  add("_refused_total", "counter", "Blob reads refused while a hash mismatch was held.", s.refused);
  add("_cache_corrupted_total", "counter", "Cached files that failed their hash.", s.corrupted);
  add("_passed_through_total", "counter", "Upstream range reads of blobs larger than the cache.",
      s.passed_through);
  add("_cache_evictions_total", "counter", "Blobs evicted to stay within the cache's size.",
      s.evicted);
  add("_fetches_in_flight", "gauge", "Blob fetches under way.", s.fetching);
  add("_cached_blobs", "gauge", "Blobs in the cache.", s.cached_blobs);
  add("_cached_bytes", "gauge", "Bytes of blobs in the cache.", s.cached_bytes);
  add("_cache_max_bytes", "gauge", "The cache's size limit.", options_.max_bytes);
  return text;
}

void CachingStore::ForgetLocked(const std::string& sha256) {
  const std::string path = PathOf(sha256);  // (`sha256` may be the entry's own name)
  if (index_.Erase(sha256)) (void)env_.Remove(path);
}

void CachingStore::EvictedLocked(const std::vector<std::string>& evicted) {
  for (const std::string& victim : evicted) {
    (void)env_.Remove(PathOf(victim));
    ++stats_.evicted;
  }
}

void CachingStore::FlightEnds() {
  MutexLock lock(mutex_);
  if (--running_ == 0) no_flights_.notify_all();
}

void CachingStore::OpenReadAsync(const std::string& key, OpenDone done) {
  Status valid = ValidateKey(key);
  if (!valid.ok()) return done(valid);
  const std::string sha256 = BlobHash(key);
  if (!sha256.empty()) return OpenBlob(sha256, std::move(done));
  if (IsVersionManifest(key)) return OpenManifest(key, std::move(done));
  // Anything else (`latest`, pins, records) is read upstream each time, off the calling thread.
  {
    MutexLock lock(mutex_);
    if (stopping_) return done(Unavailable(Describe() + " is closing"));
    ++running_;
  }
  RunBlocking([this, key, done = std::move(done)] {
    Result<std::vector<uint8_t>> bytes = ReadSmall(upstream_, key);
    if (bytes.ok()) {
      done(MemoryReader(std::move(bytes).value()));
    } else {
      done(bytes.status());
    }
    FlightEnds();
  });
}

void CachingStore::OpenBlob(const std::string& sha256, OpenDone done) {
  const std::string key = BlobKey(sha256);
  std::optional<FileStamp> checked;
  std::optional<uint64_t> oversize;
  {
    MutexLock lock(mutex_);
    if (auto held = held_.find(sha256); held != held_.end()) {
      if (env_.MonotonicMicros() < held->second.until_micros) {
        ++stats_.refused;
        const Status error = held->second.error;
        return done(error);
      }
      held_.erase(held);
    }
    if (auto size = oversize_.find(sha256); size != oversize_.end()) oversize = size->second;
    if (const std::optional<FileStamp>* stamp = index_.Find(sha256)) checked = *stamp;
  }
  if (oversize) return done(PassThrough(key, *oversize));
  if (checked) {
    // A hit: the file checked, unchanged since (the file opened is the file checked).
    Result<std::unique_ptr<ReadableFile>> file = env_.OpenReadable(PathOf(sha256));
    Result<FileStamp> stamp = file.ok() ? (*file)->Stamp() : file.status();
    if (stamp.ok() && *stamp == *checked) {
      {
        MutexLock lock(mutex_);
        ++stats_.hits;
        index_.Touch(sha256);
      }
      return done(FileReader(std::move(file).value(), stamp->size, key));
    }
  }
  std::shared_ptr<Flight> flight;
  bool start = false;
  {
    MutexLock lock(mutex_);
    if (stopping_) return done(Unavailable(Describe() + " is closing"));
    ++stats_.misses;
    if (auto found = flights_.find(sha256); found != flights_.end()) {
      flight = found->second;
    } else {
      flight = std::make_shared<Flight>(sha256, index_.Contains(sha256));
      flights_[sha256] = flight;
      ++running_;
      start = true;
    }
  }
  {
    MutexLock lock(flight->mutex);
    if (flight->oversize) {
      const uint64_t size = *flight->oversize;
      lock.Unlock();
      done(PassThrough(key, size));
    } else if (flight->state == Flight::State::kFailed) {
      const Status failure = flight->failure;
      lock.Unlock();
      done(failure);
    } else if (flight->size) {
      const uint64_t size = *flight->size;
      lock.Unlock();
      done(std::unique_ptr<ObjectReader>(new FlightReader(flight, size)));
    } else {
      flight->openers.push_back(std::move(done));
    }
  }
  if (start) RunBlocking([this, flight] { RunFlight(flight); });
}

std::unique_ptr<ObjectReader> CachingStore::PassThrough(const std::string& key, uint64_t size) {
  return std::unique_ptr<ObjectReader>(new PassThroughReader(upstream_, key, size, [this] {
    MutexLock lock(mutex_);
    ++stats_.passed_through;
  }));
}

bool CachingStore::CheckCached(const std::shared_ptr<Flight>& flight) {
  Result<std::unique_ptr<ReadableFile>> file = env_.OpenReadable(PathOf(flight->sha256));
  Result<FileStamp> stamp = file.ok() ? (*file)->Stamp() : file.status();
  if (!stamp.ok()) {
    MutexLock lock(mutex_);
    ForgetLocked(flight->sha256);  // gone from disk (removed by hand)
    return false;
  }
  const uint64_t size = stamp->size;
  Sha256 hash;
  std::vector<uint8_t> buffer(std::min<uint64_t>(size, 1 << 20));
  bool read = true;
  for (uint64_t at = 0; at < size && read;) {
    Result<size_t> got = (*file)->ReadAt(
        at, std::span<uint8_t>(buffer).first(std::min<uint64_t>(buffer.size(), size - at)));
    read = got.ok() && *got > 0;
    if (read) {
      hash.Update(std::span<const uint8_t>(buffer).first(*got));
      at += *got;
    }
  }
  if (!read || hash.HexDigest() != flight->sha256) {
    WEFT_LOG(kWarning) << "cache " << options_.dir << ": blob " << flight->sha256
                       << " is corrupted on disk; removing it and fetching it again";
    MutexLock lock(mutex_);
    ++stats_.corrupted;
    ForgetLocked(flight->sha256);
    return false;
  }
  {
    MutexLock lock(mutex_);
    if (std::optional<FileStamp>* checked = index_.Find(flight->sha256)) *checked = *stamp;
  }
  MutexLock lock(flight->mutex);
  flight->file = std::move(file).value();
  flight->size = size;
  flight->arrived = size;
  flight->state = Flight::State::kDone;
  std::vector<OpenDone> openers = std::move(flight->openers);
  flight->openers.clear();
  flight->Wake(lock);
  lock.Unlock();
  for (OpenDone& open : openers)
    open(std::unique_ptr<ObjectReader>(new FlightReader(flight, size)));
  return true;
}

void CachingStore::RunFlight(const std::shared_ptr<Flight>& flight) {
  if (!flight->check || !CheckCached(flight)) Fetch(flight);
  EndFlight(flight);
  FlightEnds();
}

void CachingStore::EndFlight(const std::shared_ptr<Flight>& flight) {
  MutexLock lock(mutex_);
  // (A flight that failed left already, and another for the same blob may have started since.)
  if (auto found = flights_.find(flight->sha256);
      found != flights_.end() && found->second == flight)
    flights_.erase(found);
}

void CachingStore::Fetch(const std::shared_ptr<Flight>& flight) {
  const std::string key = BlobKey(flight->sha256);
  auto fail = [&](Status status) {
    // Out of the map before its readers hear of it: a reader that comes after them starts a
    // fetch of its own rather than take this failure.
    EndFlight(flight);
    MutexLock lock(flight->mutex);
    flight->state = Flight::State::kFailed;
    flight->failure = status;
    std::vector<OpenDone> openers = std::move(flight->openers);
    flight->openers.clear();
    flight->Wake(lock);
    lock.Unlock();
    for (OpenDone& open : openers) open(status);
  };
  std::string temp;
  Result<std::unique_ptr<WritableFile>> written =
      CreateTemporaryNamed(env_, options_.dir + "/blobs/." + flight->sha256 + ".tmp-", &temp);
  if (!written.ok())
    return fail(written.status().WithContext("cache " + options_.dir + ": cannot create a file"));
  Result<std::unique_ptr<ReadableFile>> readable = env_.OpenReadable(temp);
  if (!readable.ok()) {
    (void)env_.Remove(temp);
    return fail(readable.status().WithContext("cache " + options_.dir));
  }
  {
    MutexLock lock(flight->mutex);
    flight->file = std::move(readable).value();
  }
  FlightTarget target(*flight, std::move(written).value(), options_.max_bytes, stopping_);
  target.self = flight;
  Result<uint64_t> fetched = upstream_.ReadTo(key, 0, UINT64_MAX, target);
  {
    MutexLock lock(mutex_);
    ++stats_.upstream_fetches;
    stats_.upstream_bytes += target.written();
  }
  std::optional<uint64_t> oversize;
  {
    MutexLock lock(flight->mutex);
    oversize = flight->oversize;
  }
  if (oversize) {
    // Larger than the cache: its readers read it upstream, range by range.
    (void)env_.Remove(temp);
    {
      MutexLock lock(mutex_);
      oversize_[flight->sha256] = *oversize;
    }
    MutexLock lock(flight->mutex);
    flight->state = Flight::State::kFailed;
    flight->failure = Unavailable("blob " + flight->sha256 + " is read upstream");
    std::vector<OpenDone> openers = std::move(flight->openers);
    flight->openers.clear();
    lock.Unlock();
    for (OpenDone& open : openers) open(PassThrough(key, *oversize));
    return;
  }
  if (!fetched.ok()) {
    (void)env_.Remove(temp);
    return fail(fetched.status().WithContext("blob " + flight->sha256));
  }
  const std::string actual = target.HexDigest();
  if (target.written() != *fetched || actual != flight->sha256) {
    (void)env_.Remove(temp);
    const Status mismatch = DataLoss(
        upstream_.Describe() + ": blob " + flight->sha256 + " arrived as " +
        std::to_string(target.written()) + " bytes with SHA-256 " + actual +
        ": not the bytes its name is the hash of (nothing cached; the blob is refused for " +
        std::to_string(options_.mismatch_hold.count() / 1000) + " s before it is fetched again)");
    WEFT_LOG(kWarning) << mismatch.message();
    {
      MutexLock lock(mutex_);
      ++stats_.upstream_mismatches;
      const int64_t hold =
          std::chrono::duration_cast<std::chrono::microseconds>(options_.mismatch_hold).count();
      held_[flight->sha256] = {mismatch, env_.MonotonicMicros() + hold};
    }
    return fail(mismatch);
  }
  // Whole and right: the file becomes the cached blob (the file its readers read), stamped once
  // in place (a move changes the file's stamp). A file in the way (put there by hand) goes.
  const std::string path = PathOf(flight->sha256);
  Status moved = env_.RenameIfAbsent(temp, path);
  if (moved.code() == StatusCode::kConflict) {
    (void)env_.Remove(path);
    moved = env_.RenameIfAbsent(temp, path);
  }
  Result<FileStamp> stamp = moved.ok() ? flight->file->Stamp() : moved;
  if (!stamp.ok()) {
    WEFT_LOG(kWarning) << "cache " << options_.dir << ": cannot keep blob " << flight->sha256
                       << ": " << stamp.status().message();
    (void)env_.Remove(moved.ok() ? path : temp);
  } else {
    MutexLock lock(mutex_);
    EvictedLocked(index_.Add(flight->sha256, *fetched));
    *index_.Find(flight->sha256) = *stamp;
  }
  MutexLock lock(flight->mutex);
  flight->state = Flight::State::kDone;
  flight->Wake(lock);
}

void CachingStore::OpenManifest(const std::string& key, OpenDone done) {
  bool start = false;
  {
    MutexLock lock(mutex_);
    if (auto found = manifests_.find(key); found != manifests_.end()) {
      std::vector<uint8_t> bytes = found->second;
      lock.Unlock();
      return done(MemoryReader(std::move(bytes)));
    }
    if (stopping_) return done(Unavailable(Describe() + " is closing"));
    auto [waiting, first] = manifest_flights_.try_emplace(key);
    if (first) {
      ++running_;
      start = true;
    }
    waiting->second.push_back(std::move(done));
  }
  if (start) RunBlocking([this, key] { RunManifestFlight(key); });
}

void CachingStore::RunManifestFlight(const std::string& key) {
  Result<std::vector<uint8_t>> bytes = ReadSmall(upstream_, key);
  std::vector<OpenDone> openers;
  {
    MutexLock lock(mutex_);
    ++stats_.upstream_fetches;
    if (bytes.ok()) {
      stats_.upstream_bytes += bytes->size();
      if (bytes->size() <= options_.max_manifest_bytes && manifests_.emplace(key, *bytes).second) {
        manifest_order_.push_back(key);
        manifest_bytes_ += bytes->size();
        while (manifest_bytes_ > options_.max_manifest_bytes) {
          manifest_bytes_ -= manifests_[manifest_order_.front()].size();
          manifests_.erase(manifest_order_.front());
          manifest_order_.pop_front();
        }
      }
    }
    // (The entry is this fetch's: only this fetch takes it out.)
    if (auto waiting = manifest_flights_.find(key); waiting != manifest_flights_.end()) {
      openers = std::move(waiting->second);
      manifest_flights_.erase(waiting);
    }
  }
  for (OpenDone& open : openers) {
    if (bytes.ok()) {
      open(MemoryReader(*bytes));
    } else {
      open(bytes.status());
    }
  }
  FlightEnds();
}

Result<std::unique_ptr<ObjectReader>> CachingStore::OpenRead(const std::string& key) {
  std::promise<Result<std::unique_ptr<ObjectReader>>> opened;
  OpenReadAsync(key, [&opened](Result<std::unique_ptr<ObjectReader>> reader) {
    opened.set_value(std::move(reader));
  });
  return opened.get_future().get();
}

Result<std::vector<uint8_t>> CachingStore::Get(const std::string& key) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, OpenRead(key));
  std::vector<uint8_t> bytes(reader->size());
  WEFT_RETURN_IF_ERROR(ReadFully(*reader, 0, bytes));
  return bytes;
}

Result<ObjectRange> CachingStore::GetRange(const std::string& key, uint64_t first,
                                           uint64_t length) {
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, OpenRead(key));
  ObjectRange range;
  range.object_size = reader->size();
  if (first < reader->size()) {
    range.bytes.resize(std::min(length, reader->size() - first));
    WEFT_RETURN_IF_ERROR(ReadFully(*reader, first, range.bytes));
  }
  return range;
}

Result<RangeRead> CachingStore::GetRangeInto(const std::string& key, uint64_t first,
                                             std::span<uint8_t> out) {
  if (out.empty()) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, OpenRead(key));
  RangeRead read{0, reader->size()};
  if (first < reader->size()) {
    read.read = std::min<uint64_t>(out.size(), reader->size() - first);
    WEFT_RETURN_IF_ERROR(ReadFully(*reader, first, out.first(read.read)));
  }
  return read;
}

Result<uint64_t> CachingStore::ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                      BodyTarget& target) {
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> reader, OpenRead(key));
  WEFT_RETURN_IF_ERROR(target.ObjectSize(reader->size()));
  const uint64_t end =
      reader->size() - std::min(reader->size(), first) < length ? reader->size() : first + length;
  std::vector<uint8_t> buffer(std::min<uint64_t>(end > first ? end - first : 0, 1 << 20));
  for (uint64_t at = first; at < end;) {
    WEFT_ASSIGN_OR_RETURN(size_t got,
                          reader->ReadAt(at, std::span<uint8_t>(buffer).first(
                                                 std::min<uint64_t>(buffer.size(), end - at))));
    WEFT_RETURN_IF_ERROR(target.Write(std::span<const uint8_t>(buffer).first(got)));
    at += got;
  }
  return reader->size();
}

Result<bool> CachingStore::Exists(const std::string& key) {
  const std::string sha256 = BlobHash(key);
  if (!sha256.empty()) {
    MutexLock lock(mutex_);
    if (index_.Contains(sha256)) return true;
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
    MutexLock lock(mutex_);
    if (auto found = manifests_.find(key); found != manifests_.end()) {
      manifest_bytes_ -= found->second.size();
      manifests_.erase(found);
      manifest_order_.remove(key);
    }
  }
  return upstream_.Delete(key);
}

}  // namespace weft::policy_store
