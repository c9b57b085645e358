// File helpers with Status errors that name the path.
//
// MappedFile maps a file, read-only or (OpenWritable) for writing in place, shared with the file:
// what is written reaches the file's pages, which every reader of the file sees (the bytes stay
// valid while the object lives; movable, not copyable). WriteFileAtomic writes to a temporary file
// beside the target, fsyncs it, renames it over the target and fsyncs the directory, so a reader
// sees either the old file or the whole new one, never a torn write.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace weft {

class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  // The whole of an existing regular file, for reading and writing. The file's blocks must be
  // allocated (a file written in full, not sparse, on a file system that writes in place): a write
  // that needs a block the file system cannot give faults the process.
  static Result<MappedFile> OpenWritable(const std::string& path);
  // Maps `size` bytes of an open file (the descriptor stays the caller's); `what` names it in
  // errors.
  static Result<MappedFile> Map(int fd, uint64_t size, const std::string& what);
  // Lets the pages holding `bytes` (a part of the mapping) go: they leave the process's resident
  // memory and are read from the file again if touched.
  void Release(std::span<const uint8_t> bytes) const;
  // Writes what was changed through the mapping to the file (msync), waiting for it: on one host
  // every reader sees the changes at once, but a reader on another host of a network file system
  // only once they are written back. No-op for a read-only mapping.
  Status Flush() const;

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // The bytes, for writing; empty unless the file was opened with OpenWritable.
  std::span<uint8_t> writable_bytes() const {
    return writable_ ? std::span<uint8_t>(const_cast<uint8_t*>(data_), size_)
                     : std::span<uint8_t>();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool writable_ = false;
};

// Whether the file system holding `path` may be read by other hosts through caches of their own
// (NFS, SMB, Lustre, GPFS, CephFS, BeeGFS, 9p, FUSE, ...), so that a change made through a mapping
// reaches them only once flushed. False for local file systems (ext4, xfs, tmpfs, ...); an error
// when `path` cannot be examined.
Result<bool> OnNetworkFileSystem(const std::string& path);
// The same decision from statfs's f_type.
bool IsNetworkFileSystemType(uint64_t type);
// Whether the file system holding `path` lives in memory (tmpfs, ramfs): the host's own, and gone
// with it. An error when `path` cannot be examined.
Result<bool> OnMemoryFileSystem(const std::string& path);

// A file with no name in `dir` (O_TMPFILE, or a name removed at once where the file system has no
// O_TMPFILE), `size` bytes long, for data that must not sit in memory: nothing is left behind
// whatever happens to the process. Movable, not copyable; the destructor closes it.
class SpillFile {
 public:
  static Result<SpillFile> Create(const std::string& dir, uint64_t size);
  SpillFile() = default;
  SpillFile(SpillFile&& other) noexcept;
  SpillFile& operator=(SpillFile&& other) noexcept;
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;
  ~SpillFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // Writes `bytes` at `offset` (within the size).
  Status WriteAt(uint64_t offset, std::span<const uint8_t> bytes) const;
  Result<MappedFile> Map() const { return MappedFile::Map(fd_, size_, "a spill file"); }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Calls `write(fd)` on a temporary file, then makes the result durable and visible at `path`.
// `write` returns a Status; on any error the temporary file is removed and `path` is untouched.
// `mode` is the file's permissions from its first byte on (0600: never readable by others).
Status WriteFileAtomic(const std::string& path, const std::function<Status(int fd)>& write,
                       mode_t mode = 0644);
// The same for a file holding `text`.
Status WriteTextFileAtomic(const std::string& path, std::string_view text, mode_t mode = 0644);

// The first half of WriteFileAtomic: `write(fd)` into a new temporary file beside `path`, then
// chmod `mode`, fsync and close (until then only its owner can read it: mkstemp makes it 0600).
// Returns the temporary file's name (a hidden ".NAME.tmp-XXXXXX"), which the caller renames or
// links into place, or removes.
Result<std::string> WriteTemporaryFile(const std::string& path,
                                       const std::function<Status(int fd)>& write,
                                       mode_t mode = 0644);

// fsyncs the directory holding `path`, making a rename, link or removal there durable; the error
// names the directory.
Status SyncParentDirectory(const std::string& path);

// The whole file: kNotFound when it does not exist, kUnavailable on I/O errors.
Result<std::vector<uint8_t>> ReadFile(const std::string& path);

// Bytes [first, first + length) of a file (fewer where it ends first, none from past its end),
// and the file's size, read straight into place; errors as ReadFile's.
struct FileRange {
  std::vector<uint8_t> bytes;
  uint64_t file_size = 0;
};
Result<FileRange> ReadFileRange(const std::string& path, uint64_t first, uint64_t length);
// The same into memory the caller holds: up to out.size() bytes from `first` at the start of
// `out`. Returns how many were read and the file's size.
struct FileRead {
  uint64_t read = 0;
  uint64_t file_size = 0;
};
Result<FileRead> ReadFileRangeInto(const std::string& path, uint64_t first, std::span<uint8_t> out);

// A regular file opened for reading (O_CLOEXEC): its descriptor, which the caller owns and closes,
// and its size. kNotFound when it does not exist, kInvalidArgument when it is not a regular file
// (a directory), kUnavailable on other errors.
struct OpenedFile {
  int fd = -1;
  uint64_t size = 0;
};
Result<OpenedFile> OpenForReading(const std::string& path);

// The bounds of a LineReader: the longest line and the most bytes of the whole file.
struct LineLimits {
  uint64_t max_line_bytes = uint64_t{4} << 20;
  uint64_t max_total_bytes = uint64_t{4} << 30;
};

// A text file (a regular file, a pipe or a device: anything readable) read a line at a time
// within LineLimits, holding at most one line and a 64 KiB buffer whatever the file holds: a
// line longer than max_line_bytes, or a file longer than max_total_bytes, is a kInvalidArgument
// naming the path, the line and the limit, found having read no more than the limit. Movable,
// not copyable; the destructor closes the file.
class LineReader {
 public:
  // kNotFound when the file cannot be opened; `what` names the file in errors ("the dataset").
  static Result<LineReader> Open(const std::string& path, const LineLimits& limits,
                                 const std::string& what);
  LineReader(LineReader&& other) noexcept;
  LineReader& operator=(LineReader&& other) = delete;
  LineReader(const LineReader&) = delete;
  ~LineReader();

  // The next line, without its '\n' (a '\r' before it is kept); nullopt at the end.
  Result<std::optional<std::string>> Next();
  // The number of the line Next returned last, from 1.
  uint64_t line() const { return line_; }

 private:
  LineReader(int fd, std::string path, const LineLimits& limits, std::string what);
  int fd_ = -1;
  std::string path_, what_;
  LineLimits limits_;
  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;  // the unread part of buffer_
  uint64_t total_ = 0;          // bytes read from the file
  uint64_t line_ = 0;
  bool eof_ = false;
};

// The whole of a small text file (a config), read from anything readable: kNotFound when it
// cannot be opened, kInvalidArgument naming the path and the limit when it holds more than
// `max_bytes` (found having read no more than that: /dev/zero fails at once).
Result<std::string> ReadTextFile(const std::string& path, uint64_t max_bytes,
                                 const std::string& what);

// The text of errno now (strerror), for messages.
std::string ErrnoText();

// Writes all of `bytes` to `fd`, retrying short writes.
Status WriteAll(int fd, std::span<const uint8_t> bytes, const std::string& what);

}  // namespace weft
