// Journal: the orchestrator's write-ahead log. What it acknowledges survives a crash.
//
// An append-only file of records (docs/formats.md, "Orchestrator journal"): the magic
// "WEFTJRN1", then per record a u32 little-endian payload length, the u64 little-endian XXH64 of
// the payload (seed 0) and the payload. Open() replays every complete record in order and cuts
// off a torn or corrupted tail (the write a crash interrupted, never acknowledged); a corrupted
// record followed by more data is an error (that is damage, not a crash).
//
// Append() returns once its record is on disk (fdatasync). Concurrent appends share syncs (group
// commit): the first waiting thread writes and syncs every record queued so far, the others wait
// for that sync. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace weft::orchestrator {

class Journal {
 public:
  // Opens (creating) the journal at `path`, calling `replay` on every record already in it.
  static Result<std::unique_ptr<Journal>> Open(const std::string& path,
                                               const std::function<Status(std::string_view)>& replay);
  ~Journal();

  Status Append(std::string record);
  // Append in two steps, for callers that must fix the order of records under their own lock but
  // wait for the disk outside it: Enqueue returns the record's sequence number, Wait returns once
  // that record is durable.
  Result<uint64_t> Enqueue(std::string record);
  Status Wait(uint64_t sequence);

  uint64_t records() const;  // appended since Open
  uint64_t syncs() const;    // fdatasync calls since Open
  const std::string& path() const { return path_; }

 private:
  Journal(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
  mutable std::mutex mutex_;
  std::condition_variable synced_;
  std::vector<std::string> pending_;  // queued, not yet written
  uint64_t queued_ = 0;               // sequence number of the last queued record
  uint64_t durable_ = 0;              // ... of the last record on disk
  bool writing_ = false;              // a leader is writing and syncing
  Status failure_;                    // once a write fails, every later append fails
  uint64_t syncs_ = 0;
};

}  // namespace weft::orchestrator
