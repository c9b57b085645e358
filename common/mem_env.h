// MemEnv: an Env (common/env.h) whose files live in memory and whose clocks move only when told,
// with the faults of real disks and clocks on demand, in the manner of LevelDB's fault-injection
// tests: what runs on it can be crashed at any point and restarted on what a disk would have kept.
//
//   - Crash(keep): every file goes back to what was synced, plus the first `keep` bytes of what was
//     appended after (a torn write leaves a prefix), and the locks are released;
//     DiskAfterCrash(keep) gives that disk as a copy. Creations, truncations, removals, renames,
//     directories and WriteAtomic are durable when they return, as the interface says; a temporary
//     file a crash finds is kept (torn as any other), as the harder of the two cases for what runs
//     on it.
//   - FailSyncs(n, after): the n syncs (and durable operations) after the next `after` fail,
//     keeping nothing more durable; the ones that fail change nothing.
//   - SetCapacity(bytes): appends and writes that would take the files past `bytes` in all fail
//     with "no space left", writing nothing.
//   - FailLookups(on): TypeOf and ListDirectory fail with an I/O error (a directory that cannot
//     be read), so that what runs on it must not take "cannot tell" for "nothing there".
//   - Advance(d) moves both clocks; JumpWall(d) moves only the wall clock, either way. SleepFor
//     advances them instead of sleeping.
//
// Paths are plain strings: a directory is a path CreateDirectories made, or any path with its name
// and a '/' as a prefix of others, and List() names the entries one level below it. A file cannot
// stand where a directory is, nor under a file. Locks (LockFile) are held within this process.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/env.h"
#include "common/mutex.h"

namespace weft {

class MemEnv : public Env {
 public:
  explicit MemEnv(int64_t wall_start_micros = int64_t{1767225600} * 1000000);  // 2026-01-01

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path, bool create) override;
  Result<std::vector<uint8_t>> ReadFile(const std::string& path) override;
  Status Remove(const std::string& path) override;
  Status WriteAtomic(const std::string& path,
                     std::span<const std::span<const uint8_t>> parts) override;
  Result<std::unique_ptr<ReadableFile>> OpenReadable(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> CreateTemporary(const std::string& path) override;
  Status RenameIfAbsent(const std::string& from, const std::string& to) override;
  Result<PathType> TypeOf(const std::string& path) override;
  Status CreateDirectories(const std::string& path) override;
  Result<std::vector<DirectoryEntry>> ListDirectory(const std::string& dir) override;
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;
  int64_t WallMicros() override;
  int64_t MonotonicMicros() override;
  void SleepFor(std::chrono::microseconds duration) override;

  void Crash(uint64_t keep = 0);
  // The disk a crash now would leave (as Crash(keep) would make this one), as a new MemEnv with
  // the same clocks; this one goes on as if nothing happened. For crashing a process whose threads
  // are still running: they write on here, the restart reads the copy.
  std::unique_ptr<MemEnv> DiskAfterCrash(uint64_t keep = 0) const;
  void FailSyncs(int count, int after = 0);
  void SetCapacity(uint64_t bytes);
  void FailLookups(bool on);
  void Advance(std::chrono::microseconds duration);
  void JumpWall(std::chrono::microseconds duration);

  uint64_t syncs() const;       // syncs that succeeded
  uint64_t used_bytes() const;  // in all files

  struct File;  // (for the files it hands out)

 private:
  Status TakeSync(const std::string& path) REQUIRES(mutex_);  // fails when a failure was asked for
  uint64_t UsedLocked() const REQUIRES(mutex_);
  std::shared_ptr<File> NewFileLocked() REQUIRES(mutex_);
  void ChangedLocked(File& file) REQUIRES(mutex_);  // its bytes or its name changed
  PathType TypeLocked(const std::string& path) const REQUIRES(mutex_);
  bool UnderFileLocked(const std::string& path) const REQUIRES(mutex_);
  // Ok when a file can be made at `path`: nothing but perhaps a file is there, and no file is
  // above.
  Status CheckCreatableLocked(const std::string& path) const REQUIRES(mutex_);

  mutable Mutex mutex_;  // also guards the Files' contents
  std::map<std::string, std::shared_ptr<File>> files_ GUARDED_BY(mutex_);
  std::set<std::string> directories_ GUARDED_BY(mutex_);       // those CreateDirectories made
  std::map<std::string, uint64_t> locked_ GUARDED_BY(mutex_);  // path: the holder's number
  uint64_t next_lock_ GUARDED_BY(mutex_) = 0;
  uint64_t next_identity_ GUARDED_BY(mutex_) = 0;
  uint64_t next_version_ GUARDED_BY(mutex_) = 0;
  std::condition_variable unlocked_;
  int passing_syncs_ GUARDED_BY(mutex_) = 0;
  int failing_syncs_ GUARDED_BY(mutex_) = 0;
  uint64_t capacity_ GUARDED_BY(mutex_) = UINT64_MAX;
  bool fail_lookups_ GUARDED_BY(mutex_) = false;
  uint64_t syncs_ GUARDED_BY(mutex_) = 0;
  int64_t wall_ GUARDED_BY(mutex_);
  int64_t monotonic_ GUARDED_BY(mutex_) = 0;

  friend class MemWritableFile;
  friend class MemReadableFile;
  friend class MemFileLock;
};

}  // namespace weft
