// DurableCore: the orchestrator core behind a write-ahead journal, for the service.
//
// Every event that changes the core is applied under a lock, queued to the journal in the same
// order (docs/formats.md section 7, with the events' JSON), and acknowledged only once the journal
// has it on disk; concurrent events share syncs. A caller that must not wait (a server thread)
// passes a `Durable` callback and answers from it, on the journal's thread. Lease grants and
// heartbeats are the exception: they are journaled in order but answered without waiting for the
// disk (any later acknowledged event makes them durable too). A crash can lose the last of them;
// the effect is that of a lease never granted (its worker's result is refused and the job is leased
// again) or of a heartbeat never sent, never a lost or doubled trajectory. Open() replays the
// journal into a fresh core, so after a crash the core is exactly as it was after the last
// acknowledged event (the core is deterministic and every event carries its time). Events the core
// refuses change nothing but a counter and are not journaled (so the counts of rejected and
// duplicate submissions start again from the last snapshot after a restart); a Tick is journaled
// only when it expired something.
//
// Compaction keeps the journal from growing without bound: Compact() (called from outside, off
// the request path, when NeedsCompaction()) writes the core's snapshot for a new generation and
// continues the journal in a new file; the previous generation's files are deleted once the
// snapshot is durable. Files (docs/formats.md section 7): the journal of generation 0 is `path`,
// that of generation g is `path.g`, its snapshot `path.snapshot.g`. Open() restores the newest
// intact snapshot and replays the journals from its generation on, so a crash at any moment of a
// compaction loses nothing. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/mutex.h"
#include "orchestrator/core.h"
#include "orchestrator/journal.h"

namespace weft::orchestrator {

class DurableCore {
 public:
  struct Options {
    uint64_t compact_after_bytes = uint64_t{64} << 20;  // journal bytes since the last snapshot
    Env* env = nullptr;  // the files' (common/env.h); null: Env::Default()
  };
  static Result<std::unique_ptr<DurableCore>> Open(const std::string& journal_path,
                                                   const CoreConfig& config);
  static Result<std::unique_ptr<DurableCore>> Open(const std::string& journal_path,
                                                   const CoreConfig& config, Options options);

  // Called once an event is on disk, with the failure that kept it off: on the journal's thread
  // (or at once, on the caller's, when everything queued is durable already). It must be quick and
  // must not call into the core or the journal.
  using Durable = std::function<void(Status)>;

  // Each event returns once the core has applied it and the journal has it on disk, or, given
  // `durable`, as soon as the core has applied it: its result is then the answer to give once
  // `durable` is called with Ok (group commit without a thread waiting on the disk). An event the
  // core refuses returns its error, and `durable` is never called.
  Status Register(Micros now, const std::string& cluster, const std::string& region,
                  uint32_t capacity, const std::string& credential = "", Durable durable = nullptr,
                  const ModelRef& model = {});
  Status Heartbeat(Micros now, const std::string& cluster, std::optional<uint64_t> ready_version);
  Status Drain(Micros now, const std::string& cluster, const std::vector<uint64_t>& jobs,
               bool stop_leasing = true, Durable durable = nullptr);
  Status Deregister(Micros now, const std::string& cluster, Durable durable = nullptr);
  Result<std::vector<Lease>> RequestLeases(Micros now, const std::string& cluster, uint32_t max,
                                           uint64_t request = 0);
  // RequestLeases as a lease request is answered: with the latest version announced.
  Result<LeaseAnswer> AnswerLeaseRequest(Micros now, const std::string& cluster, uint32_t max,
                                         uint64_t request = 0);
  Result<SubmitResult> Submit(Micros now, TrajectoryGroup group);
  // The same without blocking: `done` is called once the answer is durable (on the journal's
  // thread; it must be quick), or at once when the core refuses the submission.
  void SubmitAsync(Micros now, TrajectoryGroup group,
                   std::function<void(Result<SubmitResult>)> done);
  Status AnnounceVersion(Micros now, uint64_t version, Durable durable = nullptr);
  Result<std::vector<uint64_t>> AddJobs(Micros now, const std::vector<JobSpec>& jobs,
                                        Durable durable = nullptr);
  Result<Batch> TakeBatch(Micros now, size_t max, std::optional<uint64_t> ack = std::nullopt,
                          Durable durable = nullptr);
  // Expires what is due. With `wait`, returns once it and every lease grant and heartbeat before
  // it are on disk; without, the journal's thread gets them there (it syncs whatever is queued).
  Status Tick(Micros now, bool wait = true);

  // Runs `read` on the core under the lock (status pages, metrics, tests).
  template <typename Read>
  auto Inspect(Read read) const EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return read(static_cast<const OrchestratorCore&>(core_));
  }
  // Tells `observer` (nullptr: nobody) of the events from now on (OrchestratorCore::set_observer);
  // its calls come under the core's lock. Set after Open: replayed events are not observed.
  void SetObserver(CoreObserver* observer) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    core_.set_observer(observer);
  }
  uint64_t events_replayed() const { return replayed_; }
  // Whether Open() found nothing to restore (no snapshot, no journaled event).
  bool fresh() const { return fresh_; }
  const Journal& journal() const { return *journal_; }

  bool NeedsCompaction() const { return journal_->size() >= options_.compact_after_bytes; }
  // Snapshots the core, moves the journal to the next generation and deletes the files of the
  // earlier ones. Events go on meanwhile (the core is locked only to copy its state). Not to be
  // called concurrently with itself.
  Status Compact();
  uint64_t generation() const { return generation_.load(); }
  uint64_t compactions() const { return compactions_.load(); }

 private:
  DurableCore(std::string base, const CoreConfig& config, Options options)
      : base_(std::move(base)),
        options_(options),
        env_(options.env ? *options.env : Env::Default()),
        core_(config) {}
  // Generation numbers of the files named `prefix` followed by a number, in `prefix`'s directory
  // (none when the directory does not exist; an error when it cannot be read).
  Result<std::vector<uint64_t>> Generations(const std::string& prefix) const;
  // The state in the snapshot of `generation`, or why it is not a complete one.
  Result<std::string> ReadSnapshot(uint64_t generation) const;
  std::string JournalPath(uint64_t generation) const;
  std::string SnapshotPath(uint64_t generation) const;
  // Deletes the journals and snapshots of generations before `generation`.
  void DeleteBefore(uint64_t generation) const;
  // An event of the core with its time, and what applying it gave.
  struct Event;
  struct Outcome;
  // The event as a journal record, and back.
  static std::string EventText(const Event& event);
  static Result<Event> ParseEvent(std::string_view text);
  // Applies the event to the core (replay and live events alike), filling in its results.
  Status Apply(Event event, Outcome* outcome) REQUIRES(mutex_);
  // Applies, and when the core accepted it, journals it and (when `wait`) waits for the disk; given
  // `durable`, calls it once the disk has the event instead of waiting.
  Status Record(Event event, Outcome* outcome, bool wait = true, Durable durable = nullptr);

  const std::string base_;
  const Options options_;
  Env& env_;
  mutable Mutex mutex_;
  std::atomic<uint64_t> generation_{0};  // the journal's (changed under mutex_)
  std::atomic<uint64_t> compactions_{0};
  OrchestratorCore core_ GUARDED_BY(mutex_);
  std::unique_ptr<Journal> journal_;
  uint64_t replayed_ = 0;
  bool fresh_ = true;
};

}  // namespace weft::orchestrator
