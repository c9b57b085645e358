// Journal: the orchestrator's write-ahead log. What it acknowledges survives a crash.
//
// An append-only file of records (docs/formats.md, "Orchestrator journal"): the magic
// "WEFTJRN1", then per record a u32 little-endian payload length, the u64 little-endian XXH64 of
// the payload (seed 0) and the payload (a JSON object). Open() replays every intact record in order
// and cuts off a torn tail (a prefix of the write a crash interrupted, never acknowledged); any
// other damage is kDataLoss naming the byte offset, never a silent cut.
//
// A writer thread writes and syncs (fdatasync) whatever is queued, as one batch per sync (group
// commit): the more records arrive while a sync runs, the more the next one carries. Append()
// returns once its record is on disk; EnqueueThen() returns at once and calls back when it is.
// Rotate() moves on to a new file: records queued before it go to the old file, later ones to the
// new one. Files are the Env's (common/env.h): the machine's by default. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/env.h"
#include "common/mutex.h"
#include "common/status.h"

namespace weft::orchestrator {

class Journal {
 public:
  static constexpr uint64_t kMaxRecordBytes = uint64_t{64} << 20;

  // Opens (creating) the journal at `path`, calling `replay` on every record already in it.
  static Result<std::unique_ptr<Journal>> Open(
      const std::string& path, const std::function<Status(std::string_view)>& replay,
      Env& env = Env::Default());
  // Replays a journal file that is not the last one (rotated away from): it must be intact to its
  // end, as its last records were synced before the next file began.
  static Status Replay(const std::string& path,
                       const std::function<Status(std::string_view)>& replay,
                       Env& env = Env::Default());
  ~Journal();

  // Whether a record of `bytes` would be taken: kInvalidArgument when it is too large, the write
  // failure when the journal has failed. Callers check before changing any state for the record.
  Status Admits(uint64_t bytes) const;
  Status Append(std::string record);
  // Append in two steps, for callers that must fix the order of records under their own lock but
  // wait for the disk outside it: Enqueue returns the record's sequence number, Wait returns once
  // that record is durable. EnqueueThen calls `durable` (on the writer thread, with the outcome)
  // instead of waiting; `durable` must be quick and must not call back into the journal.
  Result<uint64_t> Enqueue(std::string record);
  Status EnqueueThen(std::string record, std::function<void(Status)> durable);
  // Calls `durable` once every record queued so far is on disk (at once when they are).
  Status WhenDurable(std::function<void(Status)> durable);
  Status Wait(uint64_t sequence);
  // Queues a switch to a new file at `path` (created, or emptied); returns its sequence number,
  // which Wait() takes: once it is durable, the old file is complete and synced and the new one
  // exists on disk.
  Result<uint64_t> Rotate(std::string path);

  uint64_t records() const;  // sequence number of the last record (or rotation) queued since Open
  uint64_t syncs() const;    // fdatasync calls since Open
  std::string path() const;  // the file written now
  uint64_t size() const;     // bytes in it, as far as written

 private:
  Journal(Env& env, std::string path, std::unique_ptr<WritableFile> file, uint64_t size)
      : env_(env), file_(std::move(file)), path_(std::move(path)), size_(size) {}
  // Queues `record` (with `durable` to call once it is on disk, if given); its sequence number.
  Result<uint64_t> Queue(std::string record, std::function<void(Status)> durable) EXCLUDES(mutex_);
  void Start();
  void WriteLoop();
  struct Pending {
    std::string text;  // a record, or the path of the file to rotate to
    bool rotate = false;
  };

  Env& env_;
  std::unique_ptr<WritableFile> file_;  // the file written now (by the writer thread only)
  mutable Mutex mutex_;
  std::string path_ GUARDED_BY(mutex_);
  std::condition_variable synced_;                   // durable_ moved
  std::condition_variable queued_cv_;                // something to write, or stopping
  std::vector<Pending> pending_ GUARDED_BY(mutex_);  // queued, not yet written
  uint64_t size_ GUARDED_BY(mutex_) = 0;
  // By sequence number.
  std::vector<std::pair<uint64_t, std::function<void(Status)>>> callbacks_ GUARDED_BY(mutex_);
  uint64_t queued_ GUARDED_BY(mutex_) = 0;   // sequence number of the last queued record
  uint64_t durable_ GUARDED_BY(mutex_) = 0;  // ... of the last record on disk
  bool stopping_ GUARDED_BY(mutex_) = false;
  Status failure_ GUARDED_BY(mutex_);  // once a write fails, every later append fails
  uint64_t syncs_ GUARDED_BY(mutex_) = 0;
  std::thread writer_;
};

}  // namespace weft::orchestrator
