// Env: the files and clocks of the parts of weft that keep state (the orchestrator's journal and
// snapshots), behind one interface. Env::Default() is the machine's (POSIX files, the system
// clocks); MemEnv (common/mem_env.h) keeps files in memory and injects faults (torn writes, failed
// syncs, a full disk, clock jumps), so that tests and the simulator can crash what runs on it at
// any point and check what survives.
//
// Durability: what WritableFile::Sync returned Ok for survives a crash; what was appended after it
// may survive in part (a prefix), or not at all. Creating a file, truncating it, removing it and
// WriteAtomic are durable when they return Ok. Errors name the path. Thread-safe; a WritableFile is
// used by one thread at a time.
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
  virtual bool Exists(const std::string& path) = 0;
  // The names of the entries of directory `dir` (not their paths); none when it does not exist.
  virtual std::vector<std::string> List(const std::string& dir) = 0;
  // Removes `path`, durably; Ok when it does not exist.
  virtual Status Remove(const std::string& path) = 0;
  // Replaces `path` with the concatenation of `parts`, atomically and durably: a reader, or a
  // crash, sees the old file or the whole new one.
  virtual Status WriteAtomic(const std::string& path,
                             std::span<const std::span<const uint8_t>> parts) = 0;

  // The wall clock (microseconds since the Unix epoch; it can jump either way) and a monotonic
  // clock (microseconds from an arbitrary start; it never goes back).
  virtual int64_t WallMicros() = 0;
  virtual int64_t MonotonicMicros() = 0;
  virtual void SleepFor(std::chrono::microseconds duration) = 0;
};

}  // namespace weft
