// ObjectStore: the storage a policy store lives in, as byte objects under string keys.
//
// The interface is the subset of object-storage semantics the policy store needs, so that a local
// directory, an HTTP server and S3-compatible storage can all implement it:
//   - Get / GetRange / Exists / List read objects;
//   - PutImmutable writes an object that must never change: writing the same bytes again succeeds,
//     writing different bytes under an existing key is a kConflict;
//   - CompareAndSwap replaces a small mutable object (a run's `latest` pointer) only if it still
//     holds the expected bytes (or is absent, when `expected` is empty);
//   - Delete removes objects nothing needs any more (retention);
//   - NewImmutableWriter writes an immutable object a piece at a time (ObjectWriter), for objects
//     too large to hold in memory (uploads to the store server);
//   - ReadTo streams a range of an object to a BodyTarget, and OpenRead opens an object to be read
//     a piece at a time (ObjectReader), both in bounded memory whatever the object's size; servers
//     use OpenReadAsync, which never waits on a network on the thread that calls it.
// Every write is atomic: a reader sees the whole old object or the whole new one.
//
// Keys are relative paths of segments [A-Za-z0-9._-], separated by '/', without empty, "." or
// ".." segments, at most 512 bytes (ValidateKey). Implementations are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/http_client.h"
#include "common/status.h"

namespace weft::policy_store {

// An immutable object written a piece at a time. Write appends; Commit publishes what was written
// under the writer's key with PutImmutable's rules, and says whether it created the object (false:
// the key already held exactly these bytes; a backend that cannot tell checks Exists first).
// Destroying a writer that has not committed leaves nothing behind. Not thread-safe: one writer
// per object being written.
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;
  virtual Status Write(std::span<const uint8_t> bytes) = 0;
  virtual Result<bool> Commit() = 0;
};

// A part of an object (GetRange).
struct ObjectRange {
  std::vector<uint8_t> bytes;  // fewer than asked for where the object ends first
  uint64_t object_size = 0;    // the whole object's
};

// What GetRangeInto read: `read` bytes at the start of the caller's buffer (fewer than its size
// where the object ends first), and the whole object's size.
struct RangeRead {
  uint64_t read = 0;
  uint64_t object_size = 0;
};

// An object opened for reading a piece at a time (ObjectStore::OpenRead): its size, fixed when it
// was opened, and its bytes. A reader of a directory store reads the file it opened, so the bytes
// it gives are one version of the object even if the key is replaced meanwhile. Not thread-safe.
class ObjectReader {
 public:
  virtual ~ObjectReader() = default;
  uint64_t size() const { return size_; }
  // Up to out.size() bytes from `offset` (< size()) into `out`: how many were read (at least one).
  // Blocks until they can be read (for an object still arriving, until they have).
  virtual Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) = 0;
  // Whether ReadAt may wait on a network (the reader of a remote store): a server then calls it
  // off its I/O threads.
  virtual bool Remote() const { return false; }
  // Calls `ready` exactly once (from any thread, perhaps before returning) when a ReadAt of bytes
  // [offset, offset + length) will not wait for anything but a local disk, or with the error that
  // ended the transfer they were waiting for. The default calls it at once.
  virtual void WhenReady(uint64_t offset, uint64_t length, std::function<void(Status)> ready) {
    ready(Status::Ok());
  }

 protected:
  explicit ObjectReader(uint64_t size) : size_(size) {}

 private:
  uint64_t size_;
};

using OpenDone = std::function<void(Result<std::unique_ptr<ObjectReader>>)>;

// What ObjectStore::WaitForChange found.
struct ObjectWatch {
  std::optional<std::string> value;  // what the object holds (nullopt: it is absent)
  // Whether the store waited for a change (it pushes). False: it answered at once, and the caller
  // asks again when it wants to know (it polls).
  bool waited = false;
};

// A watched object (a run's `latest` pointer) larger than this is refused: it is a pointer, not
// data.
inline constexpr uint64_t kMaxWatchedBytes = 64 * 1024;

// How readers fetch a store's blobs (blob_fetch.h): in parts of `part_bytes`, up to `parallel`
// requests at once. A store's URI can set both (docs/store.md); these are the defaults.
struct BlobReads {
  uint64_t part_bytes = uint64_t{8} << 20;
  int parallel = 16;
};

// A reader of the first `size` bytes of an open file (a cache's checked file, a directory store's
// object); `what` names it in errors, or `explain`, when given, makes the file's errors the
// reader's.
std::unique_ptr<ObjectReader> FileReader(std::unique_ptr<ReadableFile> file, uint64_t size,
                                         std::string what,
                                         std::function<Status(const Status&)> explain = nullptr);
// A reader of bytes in memory (a small object read whole).
std::unique_ptr<ObjectReader> MemoryReader(std::vector<uint8_t> bytes);

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // kNotFound when the key does not exist.
  virtual Result<std::vector<uint8_t>> Get(const std::string& key) = 0;
  // Bytes [first, first + length) of an object (length > 0; none from a `first` past its end),
  // and its size: kNotFound when the key does not exist. The default reads the whole object with
  // Get; the stores override it to read the range only (a cache reads from a blob it has
  // checked, see caching_store.h), which lets a reader fetch parts of one blob at once.
  virtual Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length);
  // GetRange into memory the caller holds: out.size() (> 0) bytes from `first`, at the start of
  // `out`. The default copies GetRange's answer; stores that read into place (a directory, a
  // cache's checked file) override it, so that a part lands where it belongs without a buffer.
  virtual Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                         std::span<uint8_t> out);
  // Whether GetRange reads the range alone (false: it reads the whole object, so fetching a blob
  // in several parts would read it several times).
  virtual bool ReadsRanges() const { return false; }
  // Bytes [first, first + length) of an object (length UINT64_MAX: to its end; none from a
  // `first` past its end), written to `target` in order as they are read, in bounded memory;
  // returns the object's size. kNotFound when the key does not exist. The default reads parts of
  // at most 4 MiB with GetRangeInto; the HTTP and S3 stores stream one request (resumed where it
  // stops), the directory store reads its file.
  virtual Result<uint64_t> ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                  BodyTarget& target);
  // Opens an object to be read a piece at a time (kNotFound when the key does not exist). The
  // default learns the size with a one-byte GetRange and reads with GetRangeInto (a reader that is
  // Remote() unless the store is Local()); a directory store opens the file.
  virtual Result<std::unique_ptr<ObjectReader>> OpenRead(const std::string& key);
  // OpenRead for a server: calls `done` exactly once, from any thread (perhaps before returning),
  // and never waits on a network on the calling thread. The default calls OpenRead there when the
  // store is Local(), and otherwise on a thread of the process's blocking pool (RunBlocking); a
  // cache answers from its files, or when the fetch it joins has said the object's size.
  virtual void OpenReadAsync(const std::string& key, OpenDone done);
  // Whether every call is answered from local storage, never waiting on a network (a directory).
  virtual bool Local() const { return false; }
  // How readers should fetch this store's blobs (its URI's range_size and parallel).
  virtual BlobReads blob_reads() const { return {}; }
  virtual Result<bool> Exists(const std::string& key) = 0;
  // Keys under `prefix` (a key prefix ending in '/'), sorted.
  virtual Result<std::vector<std::string>> List(const std::string& prefix) = 0;
  virtual Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) = 0;
  virtual Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                                const std::string& desired) = 0;
  // Watches an object that changes (a run's `latest` pointer, IsMutableKey): returns what `key`
  // holds as soon as it holds something other than `known` (nullopt: absent), or when `wait` has
  // passed (then `known`, unchanged), or kUnavailable once `cancel` (when given) holds true. A
  // store that pushes (a store server or relay that supports waiting, a directory) waits; the
  // default reads the object once and says it did not wait (ObjectWatch::waited), and the caller
  // polls. An object larger than kMaxWatchedBytes is kInvalidArgument.
  virtual Result<ObjectWatch> WaitForChange(const std::string& key,
                                            const std::optional<std::string>& known,
                                            std::chrono::milliseconds wait,
                                            const std::atomic<bool>* cancel = nullptr);
  // Removes an object; deleting a missing key succeeds (retention may be retried).
  virtual Status Delete(const std::string& key) = 0;
  // Starts writing an immutable object in pieces. The default stages the pieces in a temporary
  // file of the system's temporary directory, removed again whatever happens, and at Commit calls
  // PutImmutable with that file mapped into memory (not read into it); DirectoryStore writes the
  // file beside the object and links it into place.
  virtual Result<std::unique_ptr<ObjectWriter>> NewImmutableWriter(const std::string& key);
  // A short description for messages ("dir:/var/weft").
  virtual std::string Describe() const = 0;

 protected:
  // GetRangeInto through ReadTo, the bytes written straight into `out` as they arrive (for the
  // stores that stream: HTTP, S3).
  Result<RangeRead> ReadInto(const std::string& key, uint64_t first, std::span<uint8_t> out);
};

// A BodyTarget writing into memory the caller holds (a part's place in a tensor or a buffer);
// bytes past its end are an error.
class SpanTarget : public BodyTarget {
 public:
  explicit SpanTarget(std::span<uint8_t> out) : out_(out) {}
  Status Write(std::span<const uint8_t> bytes) override;
  Status Rewind() override {
    written_ = 0;
    return Status::Ok();
  }
  uint64_t written() const { return written_; }

 private:
  std::span<uint8_t> out_;
  uint64_t written_ = 0;
};

Status ValidateKey(const std::string& key);

// What a watched object holds now (nullopt: absent), read with Get; kInvalidArgument when it is
// larger than kMaxWatchedBytes. What ObjectStore::WaitForChange compares.
Result<std::optional<std::string>> ReadWatched(ObjectStore& store, const std::string& key);

// The range_size (at least 4KiB) and parallel (1 to 64) options of a store URI, where given, into
// `reads`; errors name `where` (the store) and the option.
Status ParseBlobReads(const std::map<std::string, std::string>& options, const std::string& where,
                      BlobReads* reads);

// Bytes [first, first + length) of a whole object, as GetRange answers (the first form moves the
// bytes when the range is the whole object).
ObjectRange SliceRange(std::vector<uint8_t> whole, uint64_t first, uint64_t length);
ObjectRange SliceRange(std::span<const uint8_t> whole, uint64_t first, uint64_t length);

// Where a store URI points: the one reading of a store URI, shared by the CLI, the configs and
// Python. Accepted forms: a directory path (absolute, or relative with no ':' in its first
// segment), file:///ABSOLUTE/PATH, http(s)://HOST[:PORT] (options after '?': range_size,
// parallel) and s3://BUCKET[/PREFIX] (options: s3_config.h). Anything else (an unknown scheme, a
// mistyped one such as s3:/b, s3:b, s3//b or http:/h, file:relative, an empty string or one
// holding a NUL or a control character) is refused with a message naming the accepted forms.
struct StoreLocation {
  enum class Kind { kDirectory, kHttp, kS3 };
  Kind kind = Kind::kDirectory;
  std::string path;                            // kDirectory: the directory
  std::string base;                            // kHttp: the URL without options; kS3: the URI
  std::map<std::string, std::string> options;  // kHttp: the options after '?'
};
Result<StoreLocation> ParseStoreUri(const std::string& uri);

// How a store is reached. `shape` and `deadline` apply to HTTP and S3 stores (shaping a directory
// is refused); with a `cache_dir`, blobs are read through a bounded local cache (CachingStore).
struct OpenOptions {
  uint64_t shape_bytes_per_second = 0;         // 0: unlimited
  std::chrono::microseconds shape_latency{0};  // added before each request
  std::chrono::milliseconds deadline{120000};  // per request, retries included
  std::string cache_dir;                       // empty: no local cache
  uint64_t cache_bytes = uint64_t{10} << 30;
  // The writer token of an HTTP store; unset: the environment variable WEFT_STORE_TOKEN.
  std::optional<std::string> writer_token;
  // HTTP and S3 stores: once it holds true, their requests stop (HttpClientOptions::cancel).
  std::shared_ptr<const std::atomic<bool>> cancel;
  // A directory store that does not exist yet is created (for those who write a new store: a
  // publisher, a server taking uploads); otherwise it is an error, and reading creates nothing.
  bool create = false;
};

// Opens a store from a URI (ParseStoreUri): a directory, http(s)://HOST:PORT (a Store API
// server; writes use options.writer_token, or else the environment variable WEFT_STORE_TOKEN), or
// s3://BUCKET/PREFIX (S3 or a compatible service, configured as s3_config.h says). A URI that is
// none of these is refused with kInvalidArgument; a directory that does not exist is kNotFound
// unless options.create.
Result<std::unique_ptr<ObjectStore>> OpenStore(const std::string& uri,
                                               const OpenOptions& options = {});

}  // namespace weft::policy_store
