#include "policy_store/object_store.h"

#include <algorithm>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/concurrent.h"
#include "common/file_util.h"
#include "common/units.h"
#include "policy_store/caching_store.h"
#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "policy_store/s3_store.h"

namespace weft::policy_store {
namespace {

// ObjectStore's default writer: the pieces go to a temporary file, PutImmutable takes its mapping.
class StagedWriter : public ObjectWriter {
 public:
  StagedWriter(ObjectStore& store, std::string key, std::string file, int fd)
      : store_(store), key_(std::move(key)), file_(std::move(file)), fd_(fd) {}
  ~StagedWriter() override {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(file_.c_str());
  }

  Status Write(std::span<const uint8_t> bytes) override {
    if (fd_ < 0) return Internal(key_ + ": written after it was committed");
    return WriteAll(fd_, bytes, key_);
  }

  Result<bool> Commit() override {
    if (fd_ < 0) return Internal(key_ + ": committed twice");
    ::close(fd_);
    fd_ = -1;
    WEFT_ASSIGN_OR_RETURN(MappedFile staged, MappedFile::Open(file_));
    WEFT_ASSIGN_OR_RETURN(bool existed, store_.Exists(key_));
    WEFT_RETURN_IF_ERROR(store_.PutImmutable(key_, staged.bytes()));
    return !existed;
  }

 private:
  ObjectStore& store_;
  std::string key_;
  std::string file_;
  int fd_;
};

// The default reader: the size from a one-byte range, the bytes from GetRangeInto.
class RangeReader : public ObjectReader {
 public:
  RangeReader(ObjectStore& store, std::string key, uint64_t size, bool remote)
      : ObjectReader(size), store_(store), key_(std::move(key)), remote_(remote) {}
  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    if (offset >= size() || out.empty()) return InvalidArgument(key_ + ": a read past its end");
    out = out.first(std::min<uint64_t>(out.size(), size() - offset));
    WEFT_ASSIGN_OR_RETURN(RangeRead read, store_.GetRangeInto(key_, offset, out));
    if (read.object_size != size() || read.read == 0)
      return Conflict(key_ + ": the object changed while it was read");
    return static_cast<size_t>(read.read);
  }
  bool Remote() const override { return remote_; }

 private:
  ObjectStore& store_;
  std::string key_;
  bool remote_;
};

constexpr uint64_t kReadToPart = uint64_t{4} << 20;

class FileObjectReader : public ObjectReader {
 public:
  FileObjectReader(std::unique_ptr<ReadableFile> file, uint64_t size, std::string what,
                   std::function<Status(const Status&)> explain)
      : ObjectReader(size),
        file_(std::move(file)),
        what_(std::move(what)),
        explain_(std::move(explain)) {}
  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    if (offset >= size() || out.empty()) return InvalidArgument(what_ + ": a read past its end");
    out = out.first(std::min<uint64_t>(out.size(), size() - offset));
    Result<size_t> got = file_->ReadAt(offset, out);
    if (!got.ok()) return explain_ ? explain_(got.status()) : got.status().WithContext(what_);
    if (*got == 0) return DataLoss(what_ + ": shorter than when it was opened");
    return got;
  }

 private:
  std::unique_ptr<ReadableFile> file_;
  std::string what_;
  std::function<Status(const Status&)> explain_;
};

class BytesReader : public ObjectReader {
 public:
  explicit BytesReader(std::vector<uint8_t> bytes)
      : ObjectReader(bytes.size()), bytes_(std::move(bytes)) {}
  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    if (offset >= size() || out.empty()) return InvalidArgument("a read past the object's end");
    const size_t count = std::min<uint64_t>(out.size(), size() - offset);
    std::memcpy(out.data(), bytes_.data() + offset, count);
    return count;
  }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

std::unique_ptr<ObjectReader> MemoryReader(std::vector<uint8_t> bytes) {
  return std::make_unique<BytesReader>(std::move(bytes));
}

std::unique_ptr<ObjectReader> FileReader(std::unique_ptr<ReadableFile> file, uint64_t size,
                                         std::string what,
                                         std::function<Status(const Status&)> explain) {
  return std::make_unique<FileObjectReader>(std::move(file), size, std::move(what),
                                            std::move(explain));
}

Result<uint64_t> ObjectStore::ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                     BodyTarget& target) {
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  if (!ReadsRanges()) {
    // A store that reads whole objects anyway: one read, the range taken from it.
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> whole, Get(key));
    WEFT_RETURN_IF_ERROR(target.ObjectSize(whole.size()));
    if (first < whole.size()) {
      const uint64_t count = std::min<uint64_t>(length, whole.size() - first);
      WEFT_RETURN_IF_ERROR(target.Write(std::span<const uint8_t>(whole).subspan(first, count)));
    }
    return whole.size();
  }
  std::vector<uint8_t> buffer;
  uint64_t at = first;
  const uint64_t end = length > UINT64_MAX - first ? UINT64_MAX : first + length;
  std::optional<uint64_t> size;
  while (!size || at < std::min(end, *size)) {
    const uint64_t want = size ? std::min(end, *size) - at : std::min(end - at, kReadToPart);
    buffer.resize(std::min(want, kReadToPart));
    WEFT_ASSIGN_OR_RETURN(RangeRead read, GetRangeInto(key, at, buffer));
    if (size && read.object_size != *size)
      return Conflict(key + ": the object changed while it was read");
    if (!size) {
      size = read.object_size;
      WEFT_RETURN_IF_ERROR(target.ObjectSize(*size));
    }
    if (read.read == 0) break;  // `first` past the end
    WEFT_RETURN_IF_ERROR(target.Write({buffer.data(), static_cast<size_t>(read.read)}));
    at += read.read;
  }
  return *size;
}

Result<RangeRead> ObjectStore::ReadInto(const std::string& key, uint64_t first,
                                        std::span<uint8_t> out) {
  SpanTarget target(out);
  WEFT_ASSIGN_OR_RETURN(const uint64_t size, ReadTo(key, first, out.size(), target));
  return RangeRead{target.written(), size};
}

Status SpanTarget::Write(std::span<const uint8_t> bytes) {
  if (bytes.size() > out_.size() - written_)
    return DataLoss("more bytes arrived than the " + std::to_string(out_.size()) + " asked for");
  std::memcpy(out_.data() + written_, bytes.data(), bytes.size());
  written_ += bytes.size();
  return Status::Ok();
}

Result<ObjectWatch> ObjectStore::WaitForChange(const std::string& key,
                                               const std::optional<std::string>& known,
                                               std::chrono::milliseconds wait,
                                               const std::atomic<bool>* cancel) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, ReadWatched(*this, key));
  return ObjectWatch{std::move(value), false};
}

Result<std::optional<std::string>> ReadWatched(ObjectStore& store, const std::string& key) {
  Result<std::vector<uint8_t>> bytes = store.Get(key);
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound)
    return std::optional<std::string>();
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() > kMaxWatchedBytes) {
    return InvalidArgument(key + " holds " + std::to_string(bytes->size()) +
                           " bytes: only pointers of at most " + std::to_string(kMaxWatchedBytes) +
                           " bytes are watched for changes");
  }
  return std::optional<std::string>(std::in_place, bytes->begin(), bytes->end());
}

Result<std::unique_ptr<ObjectReader>> ObjectStore::OpenRead(const std::string& key) {
  WEFT_ASSIGN_OR_RETURN(ObjectRange probe, GetRange(key, 0, 1));
  return std::unique_ptr<ObjectReader>(new RangeReader(*this, key, probe.object_size, !Local()));
}

void ObjectStore::OpenReadAsync(const std::string& key, OpenDone done) {
  if (Local()) return done(OpenRead(key));
  RunBlocking([this, key, done = std::move(done)] { done(OpenRead(key)); });
}

Result<ObjectRange> ObjectStore::GetRange(const std::string& key, uint64_t first, uint64_t length) {
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> whole, Get(key));
  return SliceRange(std::move(whole), first, length);
}

Result<RangeRead> ObjectStore::GetRangeInto(const std::string& key, uint64_t first,
                                            std::span<uint8_t> out) {
  WEFT_ASSIGN_OR_RETURN(ObjectRange range, GetRange(key, first, out.size()));
  const uint64_t read = std::min<uint64_t>(range.bytes.size(), out.size());
  if (read > 0) std::memcpy(out.data(), range.bytes.data(), read);
  return RangeRead{read, range.object_size};
}

ObjectRange SliceRange(std::vector<uint8_t> whole, uint64_t first, uint64_t length) {
  if (first == 0 && length >= whole.size()) {
    const uint64_t size = whole.size();
    return ObjectRange{std::move(whole), size};
  }
  return SliceRange(std::span<const uint8_t>(whole), first, length);
}

ObjectRange SliceRange(std::span<const uint8_t> whole, uint64_t first, uint64_t length) {
  ObjectRange range;
  range.object_size = whole.size();
  if (first < whole.size()) {
    const uint64_t count = std::min<uint64_t>(length, whole.size() - first);
    range.bytes.assign(whole.begin() + static_cast<long>(first),
                       whole.begin() + static_cast<long>(first + count));
  }
  return range;
}

Result<std::unique_ptr<ObjectWriter>> ObjectStore::NewImmutableWriter(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  std::error_code error;
  std::string file = (std::filesystem::temp_directory_path(error) / "weft-object-XXXXXX").string();
  if (error) return Unavailable("no temporary directory to stage " + key + ": " + error.message());
  const int fd = ::mkostemp(file.data(), O_CLOEXEC);
  if (fd < 0) {
    return Unavailable("cannot stage " + key + " in a temporary file: " + std::strerror(errno));
  }
  return std::unique_ptr<ObjectWriter>(new StagedWriter(*this, key, std::move(file), fd));
}

Status ParseBlobReads(const std::map<std::string, std::string>& options, const std::string& where,
                      BlobReads* reads) {
  if (auto size = options.find("range_size"); size != options.end()) {
    Result<uint64_t> bytes = ParseByteSize(size->second);
    if (!bytes.ok())
      return InvalidArgument(where + ", option range_size: " + bytes.status().message());
    if (*bytes < 4096) return InvalidArgument(where + ": range_size must be at least 4KiB");
    reads->part_bytes = *bytes;
  }
  if (auto count = options.find("parallel"); count != options.end()) {
    const std::string& text = count->second;
    char* end = nullptr;
    const long value = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value < 1 || value > 64)
      return InvalidArgument(where + ": parallel must be a number from 1 to 64, not '" + text +
                             "'");
    reads->parallel = static_cast<int>(value);
  }
  return Status::Ok();
}

Status ValidateKey(const std::string& key) {
  if (key.empty() || key.size() > 512) return InvalidArgument("object key must be 1 to 512 bytes");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string::npos) end = key.size();
    std::string_view segment(key.data() + start, end - start);
    if (segment.empty() || segment == "." || segment == "..") {
      return InvalidArgument("object key '" + key + "' has an empty, '.' or '..' segment");
    }
    for (char c : segment) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-';
      if (!ok)
        return InvalidArgument("object key '" + key + "' has a character outside [A-Za-z0-9._-/]");
    }
    start = end + 1;
  }
  return Status::Ok();
}

namespace {

constexpr const char* kStoreForms =
    "a store is a directory (an absolute path, or a relative one with no ':' in its first "
    "segment; ./NAME for one that has), file:///ABSOLUTE/PATH, http(s)://HOST:PORT or "
    "s3://BUCKET/PREFIX";

Status BadStore(const std::string& uri, const std::string& why) {
  std::string shown;
  for (char c : uri) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", static_cast<unsigned char>(c));
      shown += escaped;
    } else {
      shown += c;
    }
  }
  return InvalidArgument("store '" + shown + "': " + why + " (" + kStoreForms + ")");
}

}  // namespace

Result<StoreLocation> ParseStoreUri(const std::string& uri) {
  if (uri.empty()) return BadStore(uri, "empty");
  for (char c : uri) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return BadStore(uri, "holds a control character");
  }
  StoreLocation location;
  const size_t scheme_end = uri.find("://");
  const std::string_view first_segment = std::string_view(uri).substr(0, uri.find('/'));
  if (scheme_end != std::string::npos && scheme_end < first_segment.size()) {
    const std::string scheme = uri.substr(0, scheme_end);
    const std::string rest = uri.substr(scheme_end + 3);
    if (scheme == "http" || scheme == "https") {
      const std::string base = uri.substr(0, uri.find('?'));
      const std::string host =
          base.substr(scheme_end + 3, base.find('/', scheme_end + 3) - (scheme_end + 3));
      if (host.empty() || host.front() == ':') return BadStore(uri, "no host");
      location.kind = StoreLocation::Kind::kHttp;
      location.base = base;
      if (const size_t question = uri.find('?'); question != std::string::npos) {
        std::stringstream query(uri.substr(question + 1));
        for (std::string item; std::getline(query, item, '&');) {
          if (item.empty()) continue;
          const size_t equals = item.find('=');
          const std::string name = item.substr(0, equals);
          if (name != "range_size" && name != "parallel") {
            return InvalidArgument("store '" + base + "': unknown option '" + name +
                                   "' (known: range_size, parallel)");
          }
          if (!location.options
                   .emplace(name, equals == std::string::npos ? "" : item.substr(equals + 1))
                   .second) {
            return InvalidArgument("store '" + base + "': option '" + name + "' is given twice");
          }
        }
      }
      return location;
    }
    if (scheme == "s3") {
      if (rest.empty() || rest.front() == '/' || rest.front() == '?')
        return BadStore(uri, "no bucket");
      location.kind = StoreLocation::Kind::kS3;
      location.base = uri;
      return location;
    }
    if (scheme == "file") {
      if (rest.empty() || rest.front() != '/')
        return BadStore(uri, "file:// takes an absolute path (file:///PATH)");
      location.path = rest;
      return location;
    }
    return BadStore(uri, "unknown scheme '" + scheme + "'");
  }
  // A plain path. A ':' in its first segment is a mistyped URI far more often than a directory
  // name (s3:/bucket, s3:bucket, http:/host, file:relative).
  if (first_segment.find(':') != std::string_view::npos)
    return BadStore(uri, "not a URI of a known form, nor a plain path");
  for (const char* scheme : {"s3", "http", "https", "file"}) {
    if (uri.starts_with(std::string(scheme) + "//"))
      return BadStore(uri, "not a URI of a known form ('" + std::string(scheme) + "//...')");
  }
  location.path = uri;
  return location;
}

Result<std::unique_ptr<ObjectStore>> OpenStore(const std::string& uri, const OpenOptions& options) {
  WEFT_ASSIGN_OR_RETURN(const StoreLocation location, ParseStoreUri(uri));
  std::unique_ptr<ObjectStore> store;
  const bool shaped = options.shape_bytes_per_second > 0 || options.shape_latency.count() > 0;
  switch (location.kind) {
    case StoreLocation::Kind::kHttp: {
      const char* environment = std::getenv("WEFT_STORE_TOKEN");
      const std::string token =
          options.writer_token ? *options.writer_token : (environment ? environment : "");
      HttpStoreOptions http;
      http.deadline = options.deadline;
      http.cancel = options.cancel;
      WEFT_RETURN_IF_ERROR(
          ParseBlobReads(location.options, "store '" + location.base + "'", &http.reads));
      if (shaped)
        http.shaper = std::make_shared<LinkShaper>(
            LinkShape{options.shape_bytes_per_second, options.shape_latency});
      store = std::make_unique<HttpStore>(location.base, token, http);
      break;
    }
    case StoreLocation::Kind::kS3: {
      WEFT_ASSIGN_OR_RETURN(s3::Settings settings,
                            s3::ResolveSettings(location.base, s3::ProcessEnvironment()));
      S3StoreOptions s3_options;
      s3_options.deadline = options.deadline;
      s3_options.cancel = options.cancel;
      if (shaped)
        ShapeClient(std::make_shared<LinkShaper>(
                        LinkShape{options.shape_bytes_per_second, options.shape_latency}),
                    &s3_options);
      store = std::make_unique<S3Store>(std::move(settings), s3_options);
      break;
    }
    case StoreLocation::Kind::kDirectory: {
      if (shaped) {
        return InvalidArgument(
            "link shaping applies to http:// and s3:// stores, not to the directory " + uri);
      }
      WEFT_ASSIGN_OR_RETURN(std::unique_ptr<DirectoryStore> directory,
                            DirectoryStore::Open(location.path, options.create));
      store = std::move(directory);
      break;
    }
  }
  if (options.cache_dir.empty()) return store;
  WEFT_ASSIGN_OR_RETURN(
      std::unique_ptr<CachingStore> cache,
      CachingStore::Open(std::move(store), CacheOptions{options.cache_dir, options.cache_bytes}));
  return std::unique_ptr<ObjectStore>(std::move(cache));
}

}  // namespace weft::policy_store
