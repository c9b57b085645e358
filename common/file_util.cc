#include "common/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/byte_io.h"

namespace weft {

Result<MappedFile> MappedFile::Open(const std::string& path) {
  Result<OpenedFile> opened = OpenForReading(path);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) return opened.status();
    return InvalidArgument(opened.status().message());
  }
  Result<MappedFile> mapped = Map(opened->fd, opened->size, path);
  ::close(opened->fd);
  if (!mapped.ok()) return InvalidArgument(mapped.status().message());
  return mapped;
}

Result<MappedFile> MappedFile::OpenWritable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFound(path + ": no such file");
    return Unavailable(path + ": cannot open for writing: " + ErrnoText());
  }
  struct stat info {};
  const bool stated = ::fstat(fd, &info) == 0;
  if (!stated || !S_ISREG(info.st_mode)) {
    const std::string error = stated ? "not a regular file" : ErrnoText();
    ::close(fd);
    return Unavailable(path + ": cannot map for writing: " + error);
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(info.st_size);
  file.writable_ = true;
  if (file.size_ > 0) {
    void* address = ::mmap(nullptr, file.size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) {
      const std::string error = ErrnoText();
      ::close(fd);
      return Unavailable(path + ": cannot map for writing: " + error);
    }
    file.data_ = static_cast<const uint8_t*>(address);
  }
  ::close(fd);
  return file;
}

Result<MappedFile> MappedFile::Map(int fd, uint64_t size, const std::string& what) {
  MappedFile file;
  file.path_ = what;
  file.size_ = static_cast<size_t>(size);
  if (file.size_ > 0) {
    void* address = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) return Unavailable(what + ": cannot map: " + ErrnoText());
    file.data_ = static_cast<const uint8_t*>(address);
  }
  return file;
}

void MappedFile::Release(std::span<const uint8_t> bytes) const {
  if (data_ == nullptr || bytes.empty()) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t first = std::max(start, reinterpret_cast<uintptr_t>(bytes.data()) / page * page);
  const uintptr_t end =
      std::min(start + size_, reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size());
  const uintptr_t last = (end + page - 1) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Status MappedFile::Flush() const {
  if (!writable_ || data_ == nullptr) return Status::Ok();
  if (::msync(const_cast<uint8_t*>(data_), size_, MS_SYNC) != 0)
    return Unavailable(path_ + ": cannot write the mapped changes back: " + ErrnoText());
  return Status::Ok();
}

bool IsNetworkFileSystemType(uint64_t type) {
  switch (type) {
    case 0x6969:      // NFS
    case 0x517B:      // SMB
    case 0xFE534D42:  // SMB2
    case 0xFF534D42:  // CIFS
    case 0x0BD00BD0:  // Lustre
    case 0x47504653:  // GPFS
    case 0x00C36400:  // CephFS
    case 0x19830326:  // BeeGFS
    case 0x01021997:  // 9p
    case 0x65735546:  // FUSE (s3fs, JuiceFS, ...)
    case 0x5346414F:  // AFS
    case 0x7461636F:  // OCFS2
    case 0x01161970:  // GFS2
    case 0x013111A8:  // IBRIX
    case 0xAAD7AAEA:  // PanFS
      return true;
    default:
      return false;
  }
}

Result<bool> OnNetworkFileSystem(const std::string& path) {
  struct statfs info {};
  if (::statfs(path.c_str(), &info) != 0)
    return Unavailable(path + ": cannot tell which file system holds it: " + ErrnoText());
  return IsNetworkFileSystemType(static_cast<uint64_t>(static_cast<uint32_t>(info.f_type)));
}

Result<bool> OnMemoryFileSystem(const std::string& path) {
  struct statfs info {};
  if (::statfs(path.c_str(), &info) != 0)
    return Unavailable(path + ": cannot tell which file system holds it: " + ErrnoText());
  const auto type = static_cast<uint32_t>(info.f_type);
  return type == 0x01021994 /* tmpfs */ || type == 0x858458F6 /* ramfs */;
}

Result<SpillFile> SpillFile::Create(const std::string& dir, uint64_t size) {
  SpillFile file;
#ifdef O_TMPFILE
  file.fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
  if (file.fd_ < 0) {
    std::string path = dir + "/.weft-spill-XXXXXX";
    file.fd_ = ::mkostemp(path.data(), O_CLOEXEC);
    if (file.fd_ < 0) return Unavailable(dir + ": cannot create a spill file: " + ErrnoText());
    ::unlink(path.c_str());
  }
  if (::ftruncate(file.fd_, static_cast<off_t>(size)) != 0)
    return Unavailable(dir + ": cannot size a spill file of " + std::to_string(size) +
                       " bytes: " + ErrnoText());
  file.size_ = size;
  return file;
}

SpillFile::SpillFile(SpillFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(std::exchange(other.size_, 0)) {}

SpillFile& SpillFile::operator=(SpillFile&& other) noexcept {
  std::swap(fd_, other.fd_);
  std::swap(size_, other.size_);
  return *this;
}

SpillFile::~SpillFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status SpillFile::WriteAt(uint64_t offset, std::span<const uint8_t> bytes) const {
  if (offset > size_ || bytes.size() > size_ - offset)
    return Internal("a write past the end of a spill file");
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t wrote =
        ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return Unavailable("cannot write a spill file: " + ErrnoText());
    }
    done += static_cast<size_t>(wrote);
  }
  return Status::Ok();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      writable_(std::exchange(other.writable_, false)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    writable_ = std::exchange(other.writable_, false);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Status WriteAll(int fd, std::span<const uint8_t> bytes, const std::string& what) {
  while (!bytes.empty()) {
    ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return Unavailable(what + ": write failed: " + ErrnoText());
    }
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
  return Status::Ok();
}

Result<std::string> WriteTemporaryFile(const std::string& path,
                                       const std::function<Status(int fd)>& write, mode_t mode) {
  std::filesystem::path target(path);
  std::filesystem::path directory = target.parent_path();
  if (directory.empty()) directory = ".";
  std::string temp_name = ".";
  temp_name += target.filename().string();
  temp_name += ".tmp-XXXXXX";
  std::string temp = (directory / temp_name).string();
  int fd = ::mkstemp(temp.data());
  if (fd < 0) return Unavailable(path + ": cannot create a temporary file: " + ErrnoText());
  auto fail = [&](Status status) {
    ::close(fd);
    ::unlink(temp.c_str());
    return status;
  };
  Status status = write(fd);
  if (!status.ok()) return fail(status.WithContext(path));
  if (::fchmod(fd, mode) != 0) return fail(Unavailable(path + ": chmod failed: " + ErrnoText()));
  if (::fsync(fd) != 0) return fail(Unavailable(path + ": fsync failed: " + ErrnoText()));
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    return Unavailable(path + ": close failed: " + ErrnoText());
  }
  return temp;
}

Status SyncParentDirectory(const std::string& path) {
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Unavailable("cannot open " + directory + ": " + ErrnoText());
  const bool synced = ::fsync(fd) == 0;
  const std::string error = ErrnoText();
  ::close(fd);
  if (!synced) return Unavailable("cannot sync " + directory + ": " + error);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::function<Status(int fd)>& write,
                       mode_t mode) {
  WEFT_ASSIGN_OR_RETURN(std::string temp, WriteTemporaryFile(path, write, mode));
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    std::string error = ErrnoText();
    ::unlink(temp.c_str());
    return Unavailable(path + ": rename failed: " + error);
  }
  (void)SyncParentDirectory(path);  // (best effort here, as ever: the rename is done)
  return Status::Ok();
}

Result<std::vector<uint8_t>> ReadFile(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(FileRange whole, ReadFileRange(path, 0, UINT64_MAX));
  return std::move(whole.bytes);
}

namespace {

// Opens `path` and reads into the buffer `dest(file_size)` returns (up to its size, from
// `first`); returns the bytes read and the file's size.
Result<FileRead> ReadOpenedRange(const std::string& path, uint64_t first,
                                 const std::function<std::span<uint8_t>(uint64_t)>& dest) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such file");
    return Unavailable(path + ": cannot open: " + ErrnoText());
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    std::string error = ErrnoText();
    ::close(fd);
    return Unavailable(path + ": cannot stat: " + error);
  }
  FileRead result;
  result.file_size = static_cast<uint64_t>(info.st_size);
  const std::span<uint8_t> out = dest(result.file_size);
  const uint64_t count =
      first >= result.file_size ? 0 : std::min<uint64_t>(out.size(), result.file_size - first);
  while (result.read < count) {
    ssize_t n = ::pread(fd, out.data() + result.read, count - result.read,
                        static_cast<off_t>(first + result.read));
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string error = ErrnoText();
      ::close(fd);
      return Unavailable(path + ": read failed: " + error);
    }
    if (n == 0) break;  // it shrank meanwhile
    result.read += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return result;
}

}  // namespace

std::string ErrnoText() { return std::strerror(errno); }

Result<OpenedFile> OpenForReading(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return NotFound(path + ": no such file");
    return Unavailable(path + ": cannot open: " + ErrnoText());
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    std::string error = ErrnoText();
    ::close(fd);
    return Unavailable(path + ": cannot stat: " + error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  return OpenedFile{fd, static_cast<uint64_t>(info.st_size)};
}

Result<FileRange> ReadFileRange(const std::string& path, uint64_t first, uint64_t length) {
  FileRange range;
  WEFT_ASSIGN_OR_RETURN(
      FileRead read, ReadOpenedRange(path, first, [&](uint64_t file_size) {
        range.bytes.resize(first >= file_size ? 0 : std::min(length, file_size - first));
        return std::span<uint8_t>(range.bytes);
      }));
  range.bytes.resize(read.read);
  range.file_size = read.file_size;
  return range;
}

Result<FileRead> ReadFileRangeInto(const std::string& path, uint64_t first,
                                   std::span<uint8_t> out) {
  return ReadOpenedRange(path, first, [&](uint64_t) { return out; });
}

Status WriteTextFileAtomic(const std::string& path, std::string_view text, mode_t mode) {
  return WriteFileAtomic(
      path, [&](int fd) { return WriteAll(fd, TextBytes(text), path); }, mode);
}

LineReader::LineReader(int fd, std::string path, const LineLimits& limits, std::string what)
    : fd_(fd), path_(std::move(path)), what_(std::move(what)), limits_(limits), buffer_(64 << 10) {}

LineReader::LineReader(LineReader&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      limits_(other.limits_),
      buffer_(std::move(other.buffer_)),
      begin_(other.begin_),
      end_(other.end_),
      total_(other.total_),
      line_(other.line_),
      eof_(other.eof_) {}

LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<LineReader> LineReader::Open(const std::string& path, const LineLimits& limits,
                                    const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot read " + what + " " + path + ": " + ErrnoText());
  struct stat info {};
  if (::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    ::close(fd);
    return NotFound("cannot read " + what + " " + path + ": a directory");
  }
  return LineReader(fd, path, limits, what);
}

Result<std::optional<std::string>> LineReader::Next() {
  std::string line;
  const uint64_t number = line_ + 1;
  while (true) {
    if (begin_ < end_) {
      const char* start = buffer_.data() + begin_;
      const char* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
      const size_t take = newline ? static_cast<size_t>(newline - start) : end_ - begin_;
      if (line.size() + take > limits_.max_line_bytes) {
        return InvalidArgument(path_ + ":" + std::to_string(number) + ": a line longer than " +
                               std::to_string(limits_.max_line_bytes) + " bytes, the limit for " +
                               what_);
      }
      line.append(start, take);
      begin_ += take;
      if (newline) {
        ++begin_;
        line_ = number;
        return std::optional<std::string>(std::move(line));
      }
    }
    if (eof_) {
      if (line.empty()) return std::optional<std::string>();
      line_ = number;
      return std::optional<std::string>(std::move(line));
    }
    const ssize_t got = ::read(fd_, buffer_.data(), buffer_.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      return Unavailable("reading " + what_ + " " + path_ + " failed: " + ErrnoText());
    }
    begin_ = 0;
    end_ = static_cast<size_t>(got);
    eof_ = got == 0;
    total_ += static_cast<uint64_t>(got);
    if (total_ > limits_.max_total_bytes) {
      return InvalidArgument(path_ + ": more than " + std::to_string(limits_.max_total_bytes) +
                             " bytes, the limit for " + what_);
    }
  }
}

Result<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes,
                                 const std::string& what) {
  WEFT_ASSIGN_OR_RETURN(LineReader reader,
                        LineReader::Open(path, LineLimits{max_bytes, max_bytes}, what));
  std::string text;
  while (true) {
    Result<std::optional<std::string>> line = reader.Next();
    if (!line.ok()) {
      if (line.status().code() != StatusCode::kInvalidArgument) return line.status();
      return InvalidArgument(path + ": larger than " + std::to_string(max_bytes) +
                             " bytes, the limit for " + what);
    }
    if (!*line) return text;
    text += **line;
    text += '\n';
  }
}

}  // namespace weft
