#include "common/env.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
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
      SyncParentDirectory(path);
    } else if (::lseek(fd, 0, SEEK_END) < 0) {
      return Unavailable("cannot seek in " + path + ": " + std::strerror(errno));
    }
    return std::unique_ptr<WritableFile>(std::move(file));
  }

  Result<std::vector<uint8_t>> ReadFile(const std::string& path) override {
    return weft::ReadFile(path);
  }

  bool Exists(const std::string& path) override {
    std::error_code error;
    return std::filesystem::exists(path, error);
  }

  std::vector<std::string> List(const std::string& dir) override {
    std::vector<std::string> names;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error))
      names.push_back(entry.path().filename().string());
    return names;
  }

  Status Remove(const std::string& path) override {
    std::error_code error;
    std::filesystem::remove(path, error);
    if (error) return Unavailable("cannot remove " + path + ": " + error.message());
    SyncParentDirectory(path);
    return Status::Ok();
  }

  Status WriteAtomic(const std::string& path,
                     std::span<const std::span<const uint8_t>> parts) override {
    return WriteFileAtomic(path, [&](int fd) {
      for (std::span<const uint8_t> part : parts) WEFT_RETURN_IF_ERROR(WriteAll(fd, part, path));
      return Status::Ok();
    });
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
};

}  // namespace

Env& Env::Default() {
  static PosixEnv env;
  return env;
}

}  // namespace weft
