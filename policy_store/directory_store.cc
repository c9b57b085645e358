#include "policy_store/directory_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/file_util.h"

namespace weft::policy_store {
namespace {

namespace fs = std::filesystem;

std::string ErrnoText() { return std::strerror(errno); }

Status EnsureParent(const std::string& path) {
  std::error_code error;
  fs::create_directories(fs::path(path).parent_path(), error);
  if (error) return Unavailable(path + ": cannot create its directory: " + error.message());
  return Status::Ok();
}

Result<std::vector<uint8_t>> ReadWhole(const std::string& path) {
  Result<std::vector<uint8_t>> bytes = ReadFile(path);
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound)
    return NotFound(path + ": no such object");
  return bytes;
}

Result<std::string> WriteTemporary(const std::string& path, std::span<const uint8_t> bytes) {
  return WriteTemporaryFile(path, [&](int fd) { return WriteAll(fd, bytes, path); });
}

}  // namespace

Result<std::unique_ptr<DirectoryStore>> DirectoryStore::Open(const std::string& root) {
  std::error_code error;
  fs::create_directories(root, error);
  if (error)
    return InvalidArgument(root + ": cannot create the store directory: " + error.message());
  if (!fs::is_directory(root)) return InvalidArgument(root + ": not a directory");
  return std::unique_ptr<DirectoryStore>(
      new DirectoryStore(fs::absolute(root).lexically_normal().string()));
}

Result<std::vector<uint8_t>> DirectoryStore::Get(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  return ReadWhole(PathOf(key));
}

Result<bool> DirectoryStore::Exists(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  std::error_code error;
  bool exists = fs::is_regular_file(PathOf(key), error);
  if (error && error != std::errc::no_such_file_or_directory) {
    return Unavailable(PathOf(key) + ": " + error.message());
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
    if (!it->is_regular_file()) continue;
    std::string name = it->path().filename().string();
    if (name.find(".tmp-") != std::string::npos) continue;  // a write in progress
    keys.push_back(prefix + fs::relative(it->path(), base).string());
  }
  if (error) return Unavailable(base.string() + ": cannot list: " + error.message());
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status DirectoryStore::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(path));
  WEFT_ASSIGN_OR_RETURN(std::string temp, WriteTemporary(path, bytes));
  // link(2) refuses to replace an existing file: the first writer wins, atomically.
  int linked = ::link(temp.c_str(), path.c_str());
  int link_errno = errno;
  ::unlink(temp.c_str());
  if (linked == 0) {
    SyncParentDirectory(path);
    return Status::Ok();
  }
  if (link_errno != EEXIST)
    return Unavailable(path + ": cannot publish: " + std::strerror(link_errno));
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> existing, ReadWhole(path));
  if (existing.size() == bytes.size() &&
      std::equal(existing.begin(), existing.end(), bytes.begin())) {
    return Status::Ok();  // the same immutable object, written again
  }
  return Conflict(key + " already exists with different content");
}

Status DirectoryStore::CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                                      const std::string& desired) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  WEFT_RETURN_IF_ERROR(EnsureParent(path));
  const std::string lock_path = root_ + "/.lock";
  int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return Unavailable(lock_path + ": cannot open: " + ErrnoText());
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno != EINTR) {
      std::string error = ErrnoText();
      ::close(lock);
      return Unavailable(lock_path + ": cannot lock: " + error);
    }
  }
  auto finish = [&](Status status) {
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return status;
  };
  Result<std::vector<uint8_t>> current = ReadWhole(path);
  if (!current.ok() && current.status().code() != StatusCode::kNotFound)
    return finish(current.status());
  std::optional<std::string> actual;
  if (current.ok()) actual = std::string(current->begin(), current->end());
  if (actual != expected) {
    return finish(Conflict(key + " changed concurrently (expected " +
                           (expected ? "'" + *expected + "'" : "absent") + ", found " +
                           (actual ? "'" + *actual + "'" : "absent") + ")"));
  }
  Result<std::string> temp =
      WriteTemporary(path, {reinterpret_cast<const uint8_t*>(desired.data()), desired.size()});
  if (!temp.ok()) return finish(temp.status());
  if (::rename(temp->c_str(), path.c_str()) != 0) {
    std::string error = ErrnoText();
    ::unlink(temp->c_str());
    return finish(Unavailable(path + ": rename failed: " + error));
  }
  SyncParentDirectory(path);
  return finish(Status::Ok());
}

Status DirectoryStore::Delete(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = PathOf(key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return Unavailable(path + ": cannot delete: " + ErrnoText());
  SyncParentDirectory(path);
  return Status::Ok();
}

}  // namespace weft::policy_store
