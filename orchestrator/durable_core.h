// DurableCore: the orchestrator core behind a write-ahead journal, for the service.
//
// Every event that changes the core is applied under a lock, queued to the journal in the same
// order (docs/formats.md section 7, with the events' JSON), and acknowledged only once the journal has it on disk; concurrent events share syncs.
// Lease grants and heartbeats are the exception: they are journaled in order but answered without
// waiting for the disk (any later acknowledged event makes them durable too). A crash can lose
// the last of them; the effect is that of a lease never granted (its worker's result is refused
// and the job is leased again) or of a heartbeat never sent, never a lost or doubled trajectory.
// Open() replays the journal into a fresh core, so after a crash the core is exactly as it was
// after the last acknowledged event (the core is deterministic and every event carries its
// time). Events the core refuses change nothing and are not journaled; a Tick is journaled only
// when it expired something. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "orchestrator/core.h"
#include "orchestrator/journal.h"

namespace weft::orchestrator {

class DurableCore {
 public:
  static Result<std::unique_ptr<DurableCore>> Open(const std::string& journal_path, const CoreConfig& config);

  Status Register(Micros now, const std::string& cluster, const std::string& region, uint32_t capacity);
  Status Heartbeat(Micros now, const std::string& cluster, std::optional<uint64_t> ready_version);
  Status Drain(Micros now, const std::string& cluster, const std::vector<uint64_t>& jobs);
  Status Deregister(Micros now, const std::string& cluster);
  Result<std::vector<Lease>> RequestLeases(Micros now, const std::string& cluster, uint32_t max);
  Result<SubmitResult> Submit(Micros now, Submission submission);
  // The same without blocking: `done` is called once the answer is durable (on the journal's
  // thread; it must be quick), or at once when the core refuses the submission.
  void SubmitAsync(Micros now, Submission submission, std::function<void(Result<SubmitResult>)> done);
  Status AnnounceVersion(Micros now, uint64_t version);
  Result<std::vector<uint64_t>> AddJobs(Micros now, const std::vector<std::pair<std::string, uint32_t>>& prompts);
  Result<Batch> TakeBatch(Micros now, size_t max, std::optional<uint64_t> ack = std::nullopt);
  Status Tick(Micros now);

  // Runs `read` on the core under the lock (status pages, metrics, tests).
  template <typename Read>
  auto Inspect(Read read) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return read(static_cast<const OrchestratorCore&>(core_));
  }
  uint64_t events_replayed() const { return replayed_; }
  const Journal& journal() const { return *journal_; }

 private:
  explicit DurableCore(const CoreConfig& config) : core_(config) {}
  // Applies the JSON event to the core (replay and live events alike), filling in its results.
  struct Outcome;
  Status ApplyEvent(const std::string& event, Outcome* outcome);
  // Applies, and when the core accepted it, journals it and (when `wait`) waits for the disk.
  Status Record(const std::string& event, Outcome* outcome, bool wait = true);
  static std::string SubmitEvent(Micros now, const Submission& submission);

  mutable std::mutex mutex_;
  OrchestratorCore core_;
  std::unique_ptr<Journal> journal_;
  uint64_t replayed_ = 0;
};

}  // namespace weft::orchestrator
