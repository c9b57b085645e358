#include "common/env.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "common/file_util.h"

namespace weft {
namespace {

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { ::close(fd_); }

  Status Append(std::span<const uint8_t> bytes) override { return WriteAll(fd_, bytes, path_); }

  Status Sync() override {
    if (::fdatasync(fd_) != 0) return Unavailable("cannot sync " + path_ + ": " + Error());
    return Status::Ok();
  }

  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0 || ::fdatasync(fd_) != 0 ||
        ::lseek(fd_, static_cast<off_t>(size), SEEK_SET) < 0) {
      return Unavailable("cannot cut " + path_ + " to " + std::to_string(size) +
                         " bytes: " + Error());
    }
    return Status::Ok();
  }

 private:
  static std::string Error() { return std::strerror(errno); }

  const std::string path_;
  const int fd_;
};

class PosixReadableFile : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixReadableFile() override { ::close(fd_); }

  Result<uint64_t> Size() override {
    struct stat info {};
    if (::fstat(fd_, &info) != 0) return Unavailable(path_ + ": cannot stat: " + ErrnoText());
    return static_cast<uint64_t>(info.st_size);
  }

  Result<FileStamp> Stamp() override {
    struct stat info {};
    if (::fstat(fd_, &info) != 0) return Unavailable(path_ + ": cannot stat: " + ErrnoText());
    return FileStamp{
        static_cast<uint64_t>(info.st_ino), static_cast<uint64_t>(info.st_size),
        static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000 + info.st_mtim.tv_nsec / 1000,
        static_cast<uint64_t>(info.st_ctim.tv_sec) * 1000000000 +
            static_cast<uint64_t>(info.st_ctim.tv_nsec)};
  }

  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) override {
    while (true) {
      const ssize_t got = ::pread(fd_, out.data(), out.size(), static_cast<off_t>(offset));
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) return Unavailable(path_ + ": read failed: " + ErrnoText());
    }
  }

 private:
  const std::string path_;
  const int fd_;
};

class PosixFileLock : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }

 private:
  const int fd_;
};

class PosixEnv : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     bool create) override {
    // (Not O_APPEND: appends follow the position a Truncate leaves.)
    const int fd =
        ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0644);
    if (fd < 0) {
      if (errno == ENOENT && !create) return NotFound(path + " does not exist");
      return Unavailable("cannot " + std::string(create ? "create " : "open ") + path + ": " +
                         std::strerror(errno));
    }
    auto file = std::make_unique<PosixWritableFile>(path, fd);
    if (create) {
      WEFT_RETURN_IF_ERROR(file->Sync());
      (void)SyncParentDirectory(path);  // (best effort, as ever)
    } else if (::lseek(fd, 0, SEEK_END) < 0) {
      return Unavailable("cannot seek in " + path + ": " + std::strerror(errno));
    }
    return std::unique_ptr<WritableFile>(std::move(file));
  }

  Result<std::vector<uint8_t>> ReadFile(const std::string& path) override {
    return weft::ReadFile(path);
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) {
      const int unlink_errno = errno;
      if (unlink_errno == ENOENT || unlink_errno == ENOTDIR) return Status::Ok();
      // (Linux says EISDIR of a directory, POSIX EPERM.)
      if (unlink_errno == EISDIR || (unlink_errno == EPERM && Is(path, PathType::kDirectory)))
        return InvalidArgument("cannot remove " + path + ": it is a directory");
      return Unavailable("cannot remove " + path + ": " + std::strerror(unlink_errno));
    }
    return SyncParentDirectory(path);
  }

  Status WriteAtomic(const std::string& path,
                     std::span<const std::span<const uint8_t>> parts) override {
    return WriteFileAtomic(path, [&](int fd) {
      for (std::span<const uint8_t> part : parts) WEFT_RETURN_IF_ERROR(WriteAll(fd, part, path));
      return Status::Ok();
    });
  }

  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override {
    WEFT_ASSIGN_OR_RETURN(OpenedFile opened, OpenForReading(path));
    return std::unique_ptr<ReadableFile>(new PosixReadableFile(path, opened.fd));
  }

  Result<std::unique_ptr<WritableFile>> CreateTemporary(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == EEXIST) return Conflict("cannot create " + path + ": it exists");
      return Unavailable("cannot create " + path + ": " + ErrnoText());
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Status RenameIfAbsent(const std::string& from, const std::string& to) override {
    // link(2) refuses to replace anything (rename(2) would), on every file system (unlike
    // renameat2's RENAME_NOREPLACE); `from` goes once `to` holds the file.
    if (::link(from.c_str(), to.c_str()) != 0) {
      const int link_errno = errno;
      if (link_errno == EEXIST)
        return Conflict("cannot move " + from + " to " + to + ": it exists");
      if (link_errno == ENOENT && Is(from, PathType::kNone))
        return NotFound("cannot move " + from + ": it does not exist");
      return Unavailable("cannot move " + from + " to " + to + ": " + std::strerror(link_errno));
    }
    ::unlink(from.c_str());
    WEFT_RETURN_IF_ERROR(SyncParentDirectory(to));
    if (std::filesystem::path(from).parent_path() != std::filesystem::path(to).parent_path())
      WEFT_RETURN_IF_ERROR(SyncParentDirectory(from));
    return Status::Ok();
  }

  Result<PathType> TypeOf(const std::string& path) override {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return PathType::kNone;
      return Unavailable("cannot stat " + path + ": " + ErrnoText());
    }
    if (S_ISREG(info.st_mode)) return PathType::kFile;
    if (S_ISDIR(info.st_mode)) return PathType::kDirectory;
    return PathType::kOther;
  }

  Status CreateDirectories(const std::string& path) override {
    WEFT_ASSIGN_OR_RETURN(PathType type, TypeOf(path));
    if (type == PathType::kDirectory) return Status::Ok();  // (the usual case: one stat)
    // One directory at a time from the top, each new one's entry synced in its parent.
    std::string prefix;
    for (size_t at = 0; at <= path.size();) {
      size_t end = path.find('/', at);
      if (end == std::string::npos) end = path.size();
      prefix = path.substr(0, end);
      at = end + 1;
      if (prefix.empty() || prefix.back() == '/') continue;
      if (::mkdir(prefix.c_str(), 0755) == 0) {
        WEFT_RETURN_IF_ERROR(SyncParentDirectory(prefix));
        continue;
      }
      const int mkdir_errno = errno;
      if (mkdir_errno == EEXIST || mkdir_errno == ENOTDIR) {
        WEFT_ASSIGN_OR_RETURN(PathType type, TypeOf(prefix));
        if (type == PathType::kDirectory) continue;
        return Conflict("cannot create directory " + prefix + ": something else is there");
      }
      return Unavailable("cannot create directory " + prefix + ": " + std::strerror(mkdir_errno));
    }
    return Status::Ok();
  }

  Result<std::vector<DirectoryEntry>> ListDirectory(const std::string& dir) override {
    std::error_code error;
    std::filesystem::directory_iterator it(dir, error);
    if (error == std::errc::no_such_file_or_directory || error == std::errc::not_a_directory)
      return NotFound(dir + " is not a directory");
    std::vector<DirectoryEntry> entries;
    for (; !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
      // (The entry's type as the directory told it: no stat unless it is a symbolic link.)
      std::error_code type_error;
      PathType type = PathType::kOther;
      if (it->is_regular_file(type_error)) {
        type = PathType::kFile;
      } else if (it->is_directory(type_error)) {
        type = PathType::kDirectory;
      }
      entries.push_back({it->path().filename().string(), type});
    }
    if (error) return Unavailable("cannot list " + dir + ": " + error.message());
    std::sort(entries.begin(), entries.end(),
              [](const DirectoryEntry& a, const DirectoryEntry& b) { return a.name < b.name; });
    return entries;
  }

  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Unavailable("cannot open " + path + ": " + ErrnoText());
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const std::string error = ErrnoText();
        ::close(fd);
        return Unavailable("cannot lock " + path + ": " + error);
      }
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(fd));
  }

  int64_t WallMicros() override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  int64_t MonotonicMicros() override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void SleepFor(std::chrono::microseconds duration) override {
    std::this_thread::sleep_for(duration);
  }

 private:
  bool Is(const std::string& path, PathType type) {
    Result<PathType> found = TypeOf(path);
    return found.ok() && *found == type;
  }
};

}  // namespace

Env& Env::Default() {
  static PosixEnv env;
  return env;
}

Result<bool> Env::Exists(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(const PathType type, TypeOf(path));
  return type != PathType::kNone;
}

Result<std::vector<std::string>> Env::List(const std::string& dir) {
  WEFT_ASSIGN_OR_RETURN(std::vector<DirectoryEntry> entries, ListDirectory(dir));
  std::vector<std::string> names;
  for (DirectoryEntry& entry : entries) names.push_back(std::move(entry.name));
  return names;
}

Result<std::unique_ptr<WritableFile>> CreateTemporaryNamed(Env& env, const std::string& prefix,
                                                           std::string* path) {
  // (A name taken already is a collision of random names, or the leftover of a crash.)
  constexpr int kTries = 8;
  thread_local std::mt19937_64 random = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  static constexpr char kLetters[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  Status taken;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    *path = prefix;
    for (int i = 0; i < 12; ++i) *path += kLetters[random() % (sizeof(kLetters) - 1)];
    Result<std::unique_ptr<WritableFile>> file = env.CreateTemporary(*path);
    if (file.ok() || file.status().code() != StatusCode::kConflict) return file;
    taken = file.status();
  }
  return taken;
}

}  // namespace weft
