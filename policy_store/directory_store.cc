#include "policy_store/directory_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>

#include "common/file_util.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

namespace fs = std::filesystem;

bool IsRegularFile(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// A compare-and-swap names the values it compares in its messages: in full when short and
// printable, otherwise by size and SHA-256, so that a conflict never echoes a large object.
constexpr uint64_t kShownValueBytes = 256;

std::string ShownValue(std::string_view value) {
  const bool printable = std::all_of(value.begin(), value.end(),
                                     [](char c) { return (c >= 0x20 && c < 0x7f) || c == '\n'; });
  if (value.size() <= kShownValueBytes && printable) return "'" + std::string(value) + "'";
  return std::to_string(value.size()) + " bytes with SHA-256 " +
         Sha256Hex({reinterpret_cast<const uint8_t*>(value.data()), value.size()});
}

// The object `reader` reads, named as ShownValue names it: from `read` when it was read whole,
// else hashed a piece at a time.
Result<std::string> DescribeValue(ObjectReader& reader, const std::optional<std::string>& read) {
  if (read) return ShownValue(*read);
  Sha256 hash;
  std::vector<uint8_t> buffer(std::min<uint64_t>(reader.size(), 1 << 20));
  for (uint64_t at = 0; at < reader.size();) {
    WEFT_ASSIGN_OR_RETURN(size_t got, reader.ReadAt(at, buffer));
    hash.Update(std::span<const uint8_t>(buffer).first(got));
    at += got;
  }
  return std::to_string(reader.size()) + " bytes with SHA-256 " + hash.HexDigest();
}

// Links the temporary file `temp` into place as the immutable object `key` at `path`, and removes
// `temp`. `bytes` are its contents (to compare with an object already there): true when it
// created the object, false when the key already held the same bytes, kConflict otherwise.
Result<bool> LinkImmutable(const std::string& key, const std::string& path, const std::string& temp,
                           std::span<const uint8_t> bytes) {
  // link(2) refuses to replace an existing file: the first writer wins, atomically.
  const int linked = ::link(temp.c_str(), path.c_str());
  const int link_errno = errno;
  ::unlink(temp.c_str());
  if (linked == 0) {
    SyncParentDirectory(path);
    return true;
  }
  if (link_errno != EEXIST)
    return Unavailable(key + ": cannot publish: " + std::strerror(link_errno));
  if (!IsRegularFile(path)) return Conflict(key + " is a prefix of other keys, not an object");
  Result<MappedFile> existing = MappedFile::Open(path);
  if (!existing.ok()) return Unavailable(key + ": cannot read the object already there");
  const std::span<const uint8_t> held = existing->bytes();
  if (held.size() == bytes.size() && std::equal(held.begin(), held.end(), bytes.begin())) {
    return false;  // the same immutable object, written again
  }
  return Conflict(key + " already exists with different content");
}

// A temporary file beside an object, written a piece at a time, linked into place at Commit.
class DirectoryWriter : public ObjectWriter {
 public:
  DirectoryWriter(std::string key, std::string path, std::string temp, int fd)
      : key_(std::move(key)), path_(std::move(path)), temp_(std::move(temp)), fd_(fd) {}
  ~DirectoryWriter() override {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty()) ::unlink(temp_.c_str());
  }

  Status Write(std::span<const uint8_t> bytes) override {
    if (fd_ < 0) return Internal(key_ + ": written after it was committed");
    return WriteAll(fd_, bytes, key_);
  }

  Result<bool> Commit() override {
    if (fd_ < 0) return Internal(key_ + ": committed twice");
    const bool synced = ::fchmod(fd_, 0644) == 0 && ::fsync(fd_) == 0;
    const std::string error = ErrnoText();
    const bool closed = ::close(fd_) == 0;
    fd_ = -1;
    if (!synced || !closed) return Unavailable(key_ + ": cannot make it durable: " + error);
    // Mapped, not read: the bytes are compared only if the key already holds an object.
    Result<MappedFile> written = MappedFile::Open(temp_);
    if (!written.ok()) return Unavailable(key_ + ": cannot read back what was written");
    Result<bool> created = LinkImmutable(key_, path_, temp_, written->bytes());
    temp_.clear();  // linked into place, or removed
    return created;
  }

 private:
  std::string key_;
  std::string path_;
  std::string temp_;
  int fd_;
};

}  // namespace

Result<std::unique_ptr<DirectoryStore>> DirectoryStore::Open(const std::string& root, bool create) {
  std::error_code error;
  if (create) {
    fs::create_directories(root, error);
    if (error)
      return InvalidArgument(root + ": cannot create the store directory: " + error.message());
  } else if (!fs::exists(root, error)) {
    return NotFound("no store at " + root + ": the directory does not exist");
  }
  if (!fs::is_directory(root)) return InvalidArgument(root + ": not a directory");
  return std::unique_ptr<DirectoryStore>(
      new DirectoryStore(fs::absolute(root).lexically_normal().string()));
}

Status DirectoryStore::Hidden(const Status& status) const {
  std::string message = status.message();
  const std::string prefix = root_ + "/";
  for (size_t at = message.find(prefix); at != std::string::npos; at = message.find(prefix, at))
    message.erase(at, prefix.size());
  for (size_t at = message.find(root_); at != std::string::npos; at = message.find(root_, at))
    message.replace(at, root_.size(), "the store");
  return Status(status.code(), std::move(message));
}

Result<ObjectRange> DirectoryStore::Read(const std::string& key, uint64_t first,
                                         uint64_t length) const {
  const std::string path = PathOf(key);
  Result<FileRange> bytes = ReadFileRange(path, first, length);
  if (bytes.ok()) return ObjectRange{std::move(bytes->bytes), bytes->file_size};
  // Missing, a directory (a prefix of other keys), or under a file: no such object.
  if (bytes.status().code() == StatusCode::kNotFound || !IsRegularFile(path))
    return NotFound(key + ": no such object");
  return Hidden(bytes.status());
}

Result<OpenedFile> DirectoryStore::OpenFile(const std::string& key) const {
  Result<OpenedFile> opened = OpenForReading(PathOf(key));
  if (opened.ok()) return opened;
  // Missing, a directory (a prefix of other keys), or under a file: no such object.
  if (opened.status().code() == StatusCode::kNotFound ||
      opened.status().code() == StatusCode::kInvalidArgument)
    return NotFound(key + ": no such object");
  return Hidden(opened.status());
}

Result<std::unique_ptr<ObjectReader>> DirectoryStore::OpenRead(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(OpenedFile file, OpenFile(key));
  return FileReader(file.fd, file.size, key);
}

Result<uint64_t> DirectoryStore::ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                        BodyTarget& target) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  WEFT_ASSIGN_OR_RETURN(OpenedFile file, OpenFile(key));
  std::unique_ptr<ObjectReader> reader = FileReader(file.fd, file.size, key);
  WEFT_RETURN_IF_ERROR(target.ObjectSize(file.size));
  const uint64_t end = file.size - std::min(file.size, first) < length ? file.size : first + length;
  std::vector<uint8_t> buffer(std::min<uint64_t>(end > first ? end - first : 0, 1 << 20));
  for (uint64_t at = first; at < end;) {
    const std::span<uint8_t> piece =
        std::span<uint8_t>(buffer).first(std::min<uint64_t>(buffer.size(), end - at));
    WEFT_ASSIGN_OR_RETURN(size_t read, reader->ReadAt(at, piece));
    WEFT_RETURN_IF_ERROR(target.Write(piece.first(read)));
    at += read;
  }
  return file.size;
}

Status DirectoryStore::EnsureParent(const std::string& key) const {
  std::error_code error;
  fs::create_directories(fs::path(PathOf(key)).parent_path(), error);
  if (error == std::errc::file_exists || error == std::errc::not_a_directory)
    return Conflict(key + ": a prefix of it is an object");
  if (error) return Unavailable(key + ": cannot create its directory: " + error.message());
  return Status::Ok();
}

Result<std::vector<uint8_t>> DirectoryStore::Get(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(ObjectRange whole, Read(key, 0, UINT64_MAX));
  return std::move(whole.bytes);
}

Result<ObjectRange> DirectoryStore::GetRange(const std::string& key, uint64_t first,
                                             uint64_t length) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  return Read(key, first, length);
}

Result<RangeRead> DirectoryStore::GetRangeInto(const std::string& key, uint64_t first,
                                               std::span<uint8_t> out) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (out.empty()) return InvalidArgument(key + ": a range of no bytes");
  const std::string path = PathOf(key);
  Result<FileRead> read = ReadFileRangeInto(path, first, out);
  if (read.ok()) return RangeRead{read->read, read->file_size};
  if (read.status().code() == StatusCode::kNotFound || !IsRegularFile(path))
    return NotFound(key + ": no such object");
  return Hidden(read.status());
}

Result<bool> DirectoryStore::Exists(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  std::error_code error;
  bool exists = fs::is_regular_file(PathOf(key), error);
  if (error && error != std::errc::no_such_file_or_directory &&
      error != std::errc::not_a_directory) {
    return Unavailable(key + ": " + error.message());
  }
  return exists;
}

Result<std::vector<std::string>> DirectoryStore::List(const std::string& prefix) {
  if (prefix.empty() || prefix.back() != '/') return InvalidArgument("list prefix must end in '/'");
  WEFT_RETURN_IF_ERROR(ValidateKey(prefix.substr(0, prefix.size() - 1)));
  std::vector<std::string> keys;
  std::error_code error;
  fs::path base = PathOf(prefix);
  if (!fs::is_directory(base, error)) return keys;
  for (auto it = fs::recursive_directory_iterator(base, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    // The store's own files (temporaries of writes in progress) and whatever lies under them.
    if (it->path().filename().string().front() == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    keys.push_back(prefix + fs::relative(it->path(), base).string());
  }
  if (error) return Unavailable(prefix + ": cannot list: " + error.message());
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status DirectoryStore::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(key));
  Result<std::string> temp =
      WriteTemporaryFile(path, [&](int fd) { return WriteAll(fd, bytes, key); });
  if (!temp.ok()) return Hidden(temp.status());
  return LinkImmutable(key, path, *temp, bytes).status();
}

Result<std::unique_ptr<ObjectWriter>> DirectoryStore::NewImmutableWriter(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(key));
  // Named as WriteTemporaryFile names its files, so that List skips it.
  const fs::path target(path);
  std::string temp =
      (target.parent_path() / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return Unavailable(key + ": cannot create a temporary file: " + ErrnoText());
  return std::unique_ptr<ObjectWriter>(new DirectoryWriter(key, path, std::move(temp), fd));
}

Status DirectoryStore::CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                                      const std::string& desired) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(key));
  const std::string lock_path = root_ + "/.lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return Unavailable("cannot open the store's lock file: " + ErrnoText());
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno != EINTR) {
      std::string error = ErrnoText();
      ::close(lock);
      return Unavailable("cannot lock the store's lock file: " + error);
    }
  }
  auto finish = [&](Status status) {
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return status;
  };
  std::error_code error;
  if (fs::exists(path, error) && !IsRegularFile(path))
    return finish(Conflict(key + " is a prefix of other keys, not an object"));
  // What the key holds, read only as far as `expected` could match it: an object larger than that
  // (whatever was put there) is named by its size and hash, never read into memory whole.
  std::optional<std::string> actual;
  std::string found = "absent";
  Result<OpenedFile> current = OpenFile(key);
  if (!current.ok() && current.status().code() != StatusCode::kNotFound)
    return finish(current.status());
  if (current.ok()) {
    std::unique_ptr<ObjectReader> reader = FileReader(current->fd, current->size, key);
    const uint64_t limit = expected ? expected->size() : 0;
    if (reader->size() <= std::max<uint64_t>(limit, kShownValueBytes)) {
      std::string bytes(reader->size(), '\0');
      for (uint64_t at = 0; at < bytes.size();) {
        Result<size_t> got =
            reader->ReadAt(at, {reinterpret_cast<uint8_t*>(bytes.data()) + at, bytes.size() - at});
        if (!got.ok()) return finish(got.status());
        at += *got;
      }
      actual = std::move(bytes);
    }
    Result<std::string> described = DescribeValue(*reader, actual);
    if (!described.ok()) return finish(described.status());
    found = std::move(described).value();
  }
  if (actual != expected) {
    return finish(Conflict(key + " changed concurrently (expected " +
                           (expected ? ShownValue(*expected) : "absent") + ", found " + found +
                           ")"));
  }
  Result<std::string> temp = WriteTemporaryFile(path, [&](int fd) {
    return WriteAll(fd, {reinterpret_cast<const uint8_t*>(desired.data()), desired.size()}, key);
  });
  if (!temp.ok()) return finish(Hidden(temp.status()));
  if (::rename(temp->c_str(), path.c_str()) != 0) {
    std::string rename_error = ErrnoText();
    ::unlink(temp->c_str());
    return finish(Unavailable(key + ": rename failed: " + rename_error));
  }
  SyncParentDirectory(path);
  return finish(Status::Ok());
}

Status DirectoryStore::Delete(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  if (::unlink(path.c_str()) != 0) {
    const int unlink_errno = errno;
    // Missing, under a file, or a directory (a prefix of other keys): no such object to delete.
    const bool no_object =
        unlink_errno == ENOENT || unlink_errno == ENOTDIR ||
        ((unlink_errno == EISDIR || unlink_errno == EPERM) && !IsRegularFile(path));
    if (!no_object) return Unavailable(key + ": cannot delete: " + std::strerror(unlink_errno));
    return Status::Ok();
  }
  SyncParentDirectory(path);
  return Status::Ok();
}

}  // namespace weft::policy_store
