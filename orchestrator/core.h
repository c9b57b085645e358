// OrchestratorCore: the orchestrator's decisions, as a deterministic state machine.
//
// Events go in (a cluster registers, heartbeats, asks for leases, submits trajectories, drains or
// leaves; the trainer announces a version, adds jobs, takes a batch; the clock ticks) and
// decisions come out (leases, acceptances with reasons, batches, alerts). There is no I/O, no
// thread and no wall clock inside: every event carries `now` (microseconds on any monotonic
// scale), so the same core runs under the HTTP service, under a simulator with thousands of
// virtual clusters, and under journal replay after a crash, and gives the same answers.
//
// The guarantees (docs/design.md, "Versions and the guarantees around them"):
//   - Staleness: with latest version t and bound k, a job is leased only to a cluster proven
//     ready (its digests matched the manifest) at a version v >= t - k; a trajectory whose
//     version_start < t - k when the trainer takes it is never delivered as fresh (dropped, or
//     delivered flagged, per config, and counted either way).
//   - Admission: jobs leased plus trajectories buffered for the trainer stay within
//     `max_in_flight`, so fast clusters cannot run far ahead only to have their work discarded.
//   - Leases have deadlines that heartbeats extend; an expired lease, a dead cluster (no heartbeat
//     within `cluster_timeout`) or a draining cluster's hand-back re-queues the job for another
//     attempt. Submissions are idempotent by (job, attempt): a repeat is acknowledged and not
//     counted again; a late submission of an earlier attempt is accepted if the job is not done
//     yet (and the newer lease is cancelled), otherwise rejected with the reason.
//   - Every job ends done or stays queued or leased; every accepted submission is delivered to
//     the trainer once or counted dropped.
//   - Models: each cluster serves one model, the run's policy or a fixed model (name and digest,
//     one digest per name in a run), and a job is leased only to clusters serving the model it
//     names. Versions, readiness against the latest and the staleness bound are the policy's: a
//     fixed model never changes, so its clusters are eligible once they proved the version they
//     serve, and its groups are never stale. A job for a model no cluster serves waits, and an
//     alert says so.
//   - A job's metadata (JobSpec) stays with it while it is open (each lease carries it to the
//     worker), moves to its group when the group
//     is accepted and is delivered with it; it is forgotten when the job is given up, its group is
//     dropped as stale, or the batch that delivered it is acknowledged. So it costs memory only
//     while its job or group does, whatever `remember_done` is.
//
// Not thread-safe: the service serialises events (and journals them before acknowledging).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "orchestrator/types.h"

namespace weft::orchestrator {

enum class StalePolicy { kDrop, kDeliverFlagged };

// How free jobs are shared when fewer are queued than there are free slots (docs/design.md,
// "Dispatch"). kWeighted: each request gets at most its share, weighted by free slots, readiness
// at the latest version and recent throughput. kFirstCome: whoever asks first fills its free
// slots (no sharing).
enum class DispatchPolicy { kWeighted, kFirstCome };
const char* DispatchName(DispatchPolicy policy);
Result<DispatchPolicy> ParseDispatch(const std::string& name);

struct CoreConfig {
  uint64_t max_staleness = 2;  // k
  StalePolicy stale_policy = StalePolicy::kDrop;
  Micros lease_duration = 60'000'000;   // a lease lasts this long past its last heartbeat
  Micros cluster_timeout = 30'000'000;  // a cluster silent this long is dead
  uint64_t max_in_flight = 1024;        // jobs leased + submissions buffered for the trainer
  uint32_t max_attempts = 5;            // a job that failed this many leases is given up (counted)
  Micros stall_after = 120'000'000;     // no progress this long with work pending: a stall
  // Completed jobs remembered (newest ids kept) so that a repeated or late submission is answered
  // precisely; one older than that is refused as unknown, never counted again.
  uint64_t remember_done = 100'000;
  DispatchPolicy dispatch = DispatchPolicy::kWeighted;
};

struct ClusterView {
  std::string id, region;
  uint32_t capacity = 0;
  std::optional<uint64_t> ready_version;  // digests proven at this version
  bool draining = false;
  bool gone = false;  // left, or lost (no heartbeat within cluster_timeout)
  uint32_t leases = 0;
  uint64_t completed = 0;
  double throughput = 0;  // accepted submissions per second, smoothed
  Micros last_heartbeat = 0;
  std::string model = {};  // "" the policy
};

struct Counters {
  uint64_t jobs_added = 0, jobs_done = 0, jobs_given_up = 0;
  uint64_t leases_granted = 0, leases_expired = 0, leases_handed_back = 0, leases_cancelled = 0;
  uint64_t submissions_accepted = 0, submissions_duplicate = 0, submissions_rejected = 0;
  uint64_t delivered_fresh = 0, delivered_stale = 0, dropped_stale = 0;
  uint64_t batches = 0, batches_redelivered = 0;
  uint64_t clusters_lost = 0;
};

// One model of the run, as /v1/status shows it: every model jobs name or clusters serve.
struct ModelView {
  std::string name;    // "" the policy
  std::string digest;  // a fixed model's, as registered ("" the policy, or none registered yet)
  uint64_t queued = 0, leased = 0;
  uint64_t clusters = 0;  // serving it, neither draining nor gone
  uint64_t ready = 0;     // ... of which may take its jobs now
};

class OrchestratorCore;

// Told of the core's events as it decides them, for measurements (orchestrator/measurements.h).
// Called inside the event: it must not call back into the core but through the view it is given.
// An observer is not part of the core's state: snapshots and journal replay do not carry it.
class CoreObserver {
 public:
  virtual ~CoreObserver() = default;
  // A newer version was announced (not a repeat of the latest).
  virtual void Announced(Micros now, uint64_t version, const OrchestratorCore& core) = 0;
  // The cluster proved it is ready at `version` (every heartbeat that says so).
  virtual void Proved(Micros now, const std::string& cluster, const std::string& region,
                      uint64_t version) = 0;
  // The cluster stopped counting for readiness: it drained, left or was lost.
  virtual void Left(Micros now, const std::string& cluster) = 0;
  // A buffered trajectory group from `region` was taken for the trainer with this lag (latest
  // version minus its version_start): delivered, or dropped as stale (`redelivered`: when a batch
  // the trainer did not acknowledge is handed out again, so it no longer counts as delivered).
  virtual void Taken(Micros now, const std::string& region, uint64_t lag, bool dropped,
                     bool redelivered) = 0;
};

class OrchestratorCore {
 public:
  explicit OrchestratorCore(CoreConfig config) : config_(config) {}

  // The observer of the events from now on (nullptr: none); it must outlive the core's use of it.
  void set_observer(CoreObserver* observer) { observer_ = observer; }

  // --- Clusters ---
  // Registers (or re-registers after a restart: leases it held stay until they expire).
  // `credential` identifies the token the registration handed out (the service stores a hash of
  // it and checks it on every call naming the cluster); registering again replaces it. `model`:
  // what it serves; a fixed model's name registered before with another digest is kConflict.
  // Registering again with another model hands back the leases it held.
  Status Register(Micros now, const std::string& cluster, const std::string& region,
                  uint32_t capacity, const std::string& credential = "",
                  const ModelRef& model = {});
  // Proof of life; `ready_version` is the version whose digests the cluster has matched (nullopt
  // while it has none; for the policy, never above the latest announced: kConflict). Extends the
  // deadline of every lease the cluster holds. A cluster that left or was lost gets kNotFound (as
  // for Drain and RequestLeases) until it registers again.
  Status Heartbeat(Micros now, const std::string& cluster, std::optional<uint64_t> ready_version);
  // Re-queues the listed jobs the cluster hands back (all of its leases when `jobs` is empty) and,
  // with `stop_leasing`, stops leasing to it (a drain; without it, a release: a worker whose engine
  // failed gives its jobs back and goes on). Its other leases may still be submitted.
  Status Drain(Micros now, const std::string& cluster, const std::vector<uint64_t>& jobs,
               bool stop_leasing = true);
  // The cluster leaves; its leases are re-queued.
  Status Deregister(Micros now, const std::string& cluster);

  // --- Work ---
  // `request` (non-zero) makes the call idempotent: asked again with the same id (its answer was
  // lost and the worker retries), the cluster gets back the leases that request granted and
  // still holds, and nothing new.
  Result<std::vector<Lease>> RequestLeases(Micros now, const std::string& cluster, uint32_t max,
                                           uint64_t request = 0);
  Result<SubmitResult> Submit(Micros now, TrajectoryGroup group);

  // --- Trainer ---
  // The latest published version (announcements only move forward; at most kMaxVersion).
  Status AnnounceVersion(Micros now, uint64_t version);
  // Queues jobs; returns their ids. A job's metadata is taken as it is (the wire layer checks it).
  std::vector<uint64_t> AddJobs(Micros now, const std::vector<JobSpec>& jobs);
  // Retires the outstanding batches with ids up to `ack`, then hands out the oldest batch still
  // outstanding, or else a new one: up to `max` buffered submissions, oldest first, within the
  // staleness bound at the latest version (stale ones are dropped or flagged per config, and
  // counted). Outstanding trajectories count against max_in_flight. With `max` 0 it only
  // acknowledges.
  Batch TakeBatch(Micros now, size_t max, std::optional<uint64_t> ack = std::nullopt);

  // --- Time ---
  // Expires leases and silent clusters; returns whether anything changed.
  bool Tick(Micros now);

  // --- Views ---
  std::optional<uint64_t> latest_version() const { return latest_; }
  // The oldest version a lease or a fresh trajectory may have.
  uint64_t admissible_version() const;
  const Counters& counters() const { return counters_; }
  std::vector<ClusterView> clusters() const;
  // One cluster's view (nullopt when it never registered); O(log clusters).
  std::optional<ClusterView> cluster(const std::string& id) const;
  // The credential of the cluster's registration; nullopt for an unknown cluster ("" when it
  // registered without one).
  std::optional<std::string> credential(const std::string& cluster) const;
  size_t queued_jobs() const;
  // Every model jobs were added for or clusters registered with, by name (the policy's first).
  std::vector<ModelView> models() const;
  size_t leased_jobs() const { return leases_.size(); }
  size_t buffered() const { return buffer_.size(); }
  // Delivered in batches the trainer has not acknowledged yet.
  size_t outstanding() const { return outstanding_items_; }
  // Jobs neither done nor given up: queued or leased.
  size_t open_jobs() const { return jobs_.size(); }
  // version_start of the buffered submissions -> count (the staleness picture).
  std::map<uint64_t, uint64_t> buffered_versions() const;
  // Human-readable alerts: a stall (work pending, no progress for stall_after), no cluster ready.
  std::vector<std::string> Alerts(Micros now) const;

  // --- Snapshots (orchestrator/snapshot.cc; docs/formats.md section 7) ---
  // The whole state, such that a core restored from it gives the same answers to the same events
  // as this one. The configuration is not part of it.
  std::string Snapshot() const;
  static Result<OrchestratorCore> Restore(CoreConfig config, std::string_view snapshot);
  size_t remembered_done() const { return done_.size(); }

 private:
  struct Job {
    std::string prompt;
    uint32_t samples = 1;
    std::string metadata;  // JSON text, "" when none (JobSpec)
    std::string model;     // "" the policy (JobSpec)
    JobKind kind = JobKind::kGenerate;
    std::string targets;                   // a score job's completions (JobSpec)
    std::vector<std::string> holders;      // the cluster of each attempt (attempt i at i - 1)
    std::vector<uint64_t> min_versions;    // the minimum version of each attempt's lease
    std::optional<std::string> leased_to;  // cluster of the current lease
    Micros deadline = 0;
  };
  struct Cluster {
    std::string region;
    std::string model;  // "" the policy; else a fixed model (its digest: fixed_models_)
    uint32_t capacity = 0;
    std::optional<uint64_t> ready_version;
    uint64_t max_ready_version = 0;  // the newest version it was ever ready at
    bool draining = false;
    bool gone = false;
    Micros last_heartbeat = 0;
    std::set<uint64_t> jobs;  // leased to it
    uint64_t completed = 0;
    double throughput = 0;  // completions per second, smoothed
    Micros last_completion = 0;
    uint64_t last_request = 0;  // the id of the last lease request that granted something
    std::vector<std::pair<uint64_t, uint32_t>> last_granted;  // its (job, attempt)s
    std::string credential;                                   // from its registration
  };

  Cluster* FindCluster(const std::string& id);
  static ClusterView ViewOf(const std::string& id, const Cluster& c);
  // The lease of `job`'s attempt `attempt` (1-based), as handed to its cluster.
  static Lease LeaseOf(uint64_t job, const Job& j, uint32_t attempt) {
    return {job,      attempt,   j.deadline, j.min_versions[attempt - 1],
            j.prompt, j.samples, j.metadata, j.model,
            j.kind,   j.targets};
  }
  // Whether `c` may take jobs of its model now: proved a version (for the policy, one within the
  // staleness bound), neither draining nor gone.
  bool Eligible(const Cluster& c) const;
  // Ends the current lease of `job` (if any) and puts the job back at the front of the queue, or
  // gives it up after max_attempts.
  void Requeue(uint64_t job);
  void Progress(Micros now) { last_progress_ = now; }
  // Tells the observer (if any) that `group` was taken for the trainer.
  void Observe(Micros now, const Delivered& d, bool dropped, bool redelivered = false) const;

  CoreConfig config_;
  std::optional<uint64_t> latest_;
  uint64_t next_job_ = 1;
  std::map<uint64_t, Job> jobs_;  // open jobs (queued or leased)
  // Queued jobs per model ("" the policy), each in dispatch order.
  std::map<std::string, std::deque<uint64_t>> queues_;
  std::map<std::string, std::string> fixed_models_;  // name -> digest, as first registered
  std::set<uint64_t> leases_;                        // leased jobs
  std::map<uint64_t, uint32_t> done_;                // job -> the attempt that completed it
  // Accepted, not yet taken by the trainer, each with its job's metadata (`stale` is decided when
  // it is taken).
  std::deque<Delivered> buffer_;
  std::map<uint64_t, std::vector<Delivered>> outstanding_;  // batches handed out, not acknowledged
  size_t outstanding_items_ = 0;
  uint64_t next_batch_ = 1;
  std::map<std::string, Cluster> clusters_;
  std::map<std::string, uint64_t> capacity_sum_;  // per model, of every cluster in clusters_
  Counters counters_;
  Micros last_progress_ = 0;
  CoreObserver* observer_ = nullptr;
};

}  // namespace weft::orchestrator
