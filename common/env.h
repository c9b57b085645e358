// Env: the files and clocks of the parts of weft that keep state (the orchestrator's journal and
// snapshots, the policy store's directory backend), behind one interface. Env::Default() is the
// machine's (POSIX files, the system clocks); MemEnv (common/mem_env.h) keeps files in memory and
// injects faults (torn writes, failed syncs, a full disk, clock jumps), so that tests and the
// simulator can crash what runs on it at any point and check what survives.
//
// Durability: what WritableFile::Sync returned Ok for survives a crash; what was appended after it
// may survive in part (a prefix), or not at all. Creating a file (but not a temporary one),
// truncating it, removing it, moving it into place, creating directories and WriteAtomic are
// durable when they return Ok. Errors name the path. Thread-safe; a WritableFile is used by one
// thread at a time, a ReadableFile by any number at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends at the end; durable only after Sync.
  virtual Status Append(std::span<const uint8_t> bytes) = 0;
  // Makes everything appended so far durable (fdatasync).
  virtual Status Sync() = 0;
  // Cuts the file to its first `size` bytes, durably; appends go on from there.
  virtual Status Truncate(uint64_t size) = 0;
};

// What a file is at a moment (ReadableFile::Stamp): a write to the file, or another file in its
// place, changes its stamp, so that a file checked once can be known unchanged since.
struct FileStamp {
  uint64_t identity = 0;  // the file, not its name (an inode number)
  uint64_t size = 0;
  int64_t modified_micros = 0;  // when its bytes last changed, on the wall clock
  uint64_t version = 0;         // changes whenever the file or its names do (its ctime)
  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

// A file opened for reading (Env::OpenReadable). It reads the file it opened, even once its name
// is replaced or removed, as that file is at the time of each read: a file still being written
// grows.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // The file's size now.
  virtual Result<uint64_t> Size() = 0;
  virtual Result<FileStamp> Stamp() = 0;
  // Up to out.size() bytes from `offset` into the start of `out`: how many were read, 0 only from
  // the end of the file on.
  virtual Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> out) = 0;
};

// An exclusive lock held on a file (Env::LockFile) until it is destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// What a path names (of a symbolic link: what it leads to).
enum class PathType { kNone, kFile, kDirectory, kOther };

struct DirectoryEntry {
  std::string name;
  PathType type = PathType::kNone;
  friend bool operator==(const DirectoryEntry&, const DirectoryEntry&) = default;
};

class Env {
 public:
  virtual ~Env() = default;
  // The machine's files and clocks.
  static Env& Default();

  // `path` opened for appending: when `create`, created empty (emptied if it exists) and its
  // directory entry made durable; otherwise an existing file (kNotFound when there is none),
  // appended to at its end.
  virtual Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                             bool create) = 0;
  // The whole file: kNotFound when it does not exist.
  virtual Result<std::vector<uint8_t>> ReadFile(const std::string& path) = 0;
  // Whether anything is at `path` (TypeOf): an error when that cannot be told, which is not "no"
  // (code that creates what it thinks is missing must not create it over what is there).
  Result<bool> Exists(const std::string& path);
  // The names of the entries of directory `dir` (not their paths), sorted, with ListDirectory's
  // errors (kNotFound when there is no such directory).
  Result<std::vector<std::string>> List(const std::string& dir);
  // Removes the file `path`, durably; Ok when it does not exist, kInvalidArgument when it is a
  // directory.
  virtual Status Remove(const std::string& path) = 0;
  // Replaces `path` with the concatenation of `parts`, atomically and durably: a reader, or a
  // crash, sees the old file or the whole new one.
  virtual Status WriteAtomic(const std::string& path,
                             std::span<const std::span<const uint8_t>> parts) = 0;

  // The file `path` opened for reading: kNotFound when nothing is there, kInvalidArgument when it
  // is not a file (a directory).
  virtual Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) = 0;
  // A new, empty file at `path` for appending: kConflict when something is there already (so
  // that writers who pick names at random never share one). Unlike a file OpenWritable creates,
  // neither its name nor its bytes are durable until it is synced and moved into place with
  // RenameIfAbsent: it is a temporary file, which a crash may leave behind or not.
  virtual Result<std::unique_ptr<WritableFile>> CreateTemporary(const std::string& path) = 0;
  // Moves the file `from` to `to` unless something is at `to` already, atomically and durably: of
  // moves racing to one `to`, exactly one succeeds. kConflict when something is there (`from`
  // then stays where it is), kNotFound when `from` is not there.
  virtual Status RenameIfAbsent(const std::string& from, const std::string& to) = 0;
  // What `path` names: kNone also when a file stands where one of its directories would be.
  virtual Result<PathType> TypeOf(const std::string& path) = 0;
  // Directory `path` and those above it that are missing, durably; Ok when it exists already.
  // kConflict when something other than a directory stands where one of them would be.
  virtual Status CreateDirectories(const std::string& path) = 0;
  // The entries of directory `dir` with their types, sorted by name: kNotFound when it is not a
  // directory (List, with types and errors).
  virtual Result<std::vector<DirectoryEntry>> ListDirectory(const std::string& dir) = 0;
  // An exclusive lock on the file `path` (created, empty, if missing), held until the FileLock is
  // destroyed; waits while another holds it, whether in this process or another. Advisory: it
  // keeps out only other LockFile calls on the same path.
  virtual Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) = 0;

  // The wall clock (microseconds since the Unix epoch; it can jump either way) and a monotonic
  // clock (microseconds from an arbitrary start; it never goes back).
  virtual int64_t WallMicros() = 0;
  virtual int64_t MonotonicMicros() = 0;
  virtual void SleepFor(std::chrono::microseconds duration) = 0;
};

// A new temporary file (Env::CreateTemporary) named `prefix` and 12 random letters, another name
// tried while one is taken: the file, and its path in `*path`.
Result<std::unique_ptr<WritableFile>> CreateTemporaryNamed(Env& env, const std::string& prefix,
                                                           std::string* path);

}  // namespace weft
