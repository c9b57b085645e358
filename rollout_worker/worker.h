// RolloutWorker: the agent beside an inference engine (docs/design.md, "The control path").
//
// Three loops share the worker:
//   - sync: checks the store's latest version, brings its own copy of the served tensors there in
//     place along the cheapest path (policy_store::StoreReader: plan, fetch through the region's
//     relay, verify every blob, apply in O(changed elements) with every digest checked against
//     the manifest; on error the copy is as it was, or empty), stages it in the engine while
//     generation goes on, commits it (the short pause), and has the heartbeat thread report the
//     version at once while it goes on to the next. Every `verify_interval` it also recomputes
//     every digest of its copy from the bytes themselves; should they ever disagree with the
//     manifest, it counts a digest mismatch, stops claiming the version and re-syncs from a
//     keyframe.
//   - heartbeats: proof of life with the version proved ready and the sync counters, every
//     `heartbeat_interval`, and at once after each commit (a version not announced yet is claimed
//     again every 20 ms, for a heartbeat period at most).
//   - jobs (`capacity` per engine replica that is ready): lease one job (long poll), generate its
//     samples with the engine, score them with the task (or leave the reward to the trainer), and
//     submit them with token ids, text, behaviour logprobs, rewards, version_start, version_end and
//     the per-token version segments (docs/api.md, "Trajectories"). A submission waits until the
//     orchestrator has heard that the cluster is ready at the newest version it used. A job the
//     engine cannot generate (it is down) is handed back at once, and the worker takes no leases
//     for a while (backing off from 0.5 to 10 s while that goes on).
// An engine none of whose replicas can serve makes the cluster not ready (heartbeats without a
// version) until it serves the version held again; staging and committing retry with backoff.
// Stop() drains: no new leases, running jobs finish and are submitted, leases that arrive after
// the stop are handed back, and the cluster deregisters.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/mutex.h"
#include "orchestrator/client.h"
#include "policy_store/manifest.h"
#include "policy_store/object_store.h"
#include "policy_store/reader.h"
#include "rollout_worker/engine.h"
#include "rollout_worker/task.h"
#include "rollout_worker/weight_sink.h"
#include "rollout_worker/worker_core.h"

namespace weft::rollout_worker {

struct WorkerOptions {
  std::string cluster;
  std::string region;
  std::string run_id;
  // Empty: the worker serves the run's policy, following every version published. Otherwise it
  // serves a fixed model of this name (docs/api.md, clusters): the version of `run_id` that is
  // the latest when it starts (it waits for one), registered with that version's state digest and
  // never left for a later one, and it takes that model's jobs, generate and score.
  std::string model;
  uint32_t capacity = 1;  // jobs generated at once per engine replica
  Sampling sampling;  // temperature, top_p, max_tokens, stop token (the seed comes from the job)
  std::chrono::milliseconds heartbeat_interval{1000};
  // How new versions are learnt: with `push`, the store's latest version is watched with a long
  // poll of up to `push_wait` (ObjectStore::WaitForChange) while the worker has nothing left to
  // do, where the store supports it (a store server, a relay); otherwise, and with push off, it is
  // read every `sync_interval`, and at once when a lease answer tells of a newer version announced.
  bool push = true;
  std::chrono::milliseconds push_wait{10000};
  std::chrono::milliseconds sync_interval{100};
  // How often the served copy's digests are recomputed in full from its bytes (a pull keeps them
  // current incrementally and checks them against the manifest).
  std::chrono::milliseconds verify_interval{5000};
  std::chrono::milliseconds lease_wait{2000};  // long poll for leases
  int sync_threads = 1;                        // for applying deltas and recomputing digests
  // Where the deltas of a catch-up too large to hold beside the copy are kept while applied
  // (StoreReader::SpillDeltas); the temporary directory by default.
  std::string spill_dir = policy_store::StoreReader::DefaultSpillDir();
  // The worker's clock (common/env.h): its decisions (verify_interval, backoffs) read the time
  // from it; null: Env::Default(). Its waits between rounds are real time whatever the Env.
  Env* env = nullptr;
};

// Sets a group's versions in its submission from its completions' segments (AddSampleVersions,
// rollout_worker/worker_core.h). No completions: no segments.
void SetGroupVersions(const std::vector<Completion>& completions,
                      orchestrator::TrajectoryGroup* group);

struct WorkerStats {
  uint64_t jobs = 0, samples = 0, tokens = 0;
  uint64_t submissions_rejected = 0, generation_errors = 0;
  uint64_t handed_back = 0;
  double reward_sum = 0;
};

class RolloutWorker {
 public:
  // Everything passed must outlive the worker. The weights go through `sink` (null: a
  // HostWeightSink over `engine`, the worker's own).
  RolloutWorker(WorkerOptions options, orchestrator::ClusterApi& orchestrator,
                policy_store::ObjectStore& store, Engine& engine, const Task& task,
                WeightSink* sink = nullptr)
      : options_(std::move(options)),
        orchestrator_(orchestrator),
        store_(store),
        engine_(engine),
        task_(task),
        own_sink_(sink == nullptr ? std::make_unique<HostWeightSink>(engine) : nullptr),
        sink_(sink == nullptr ? *own_sink_ : *sink),
        env_(options_.env != nullptr ? *options_.env : Env::Default()),
        core_(options_.capacity) {}

  // Registers, then runs the loops until Stop(); returns once drained and deregistered. Fails
  // only when the cluster cannot register or leave.
  Status Run();
  // Thread-safe; Run() returns soon after.
  void Stop();

  orchestrator::SyncReport sync_report() const;
  WorkerStats stats() const;
  std::optional<uint64_t> ready_version() const;

 private:
  void SyncLoop();
  void HeartbeatLoop();
  // Slot `slot` of capacity x replicas; it leases only while the ready replicas cover it.
  void JobLoop(uint32_t slot);
  // What the cluster registers: `capacity` per engine replica.
  uint32_t total_capacity() const;
  // Readiness follows the engine: none of its replicas able to serve, not ready (and ready again
  // once it serves the version held).
  void CheckEngine();
  // After a job the engine or the reward service could not serve: no new leases for a while
  // (WorkerCore::BackOffLeasing). Returns the wait.
  std::chrono::milliseconds BackOffLeasing();
  // One round of the sync loop.
  void SyncOnce(policy_store::StoreReader& reader, const Result<uint64_t>& latest);
  // Wakes the sync loop from its wait for a new version, a long poll of the store included (the
  // engine's health changed, the stop).
  void WakeSync() EXCLUDES(mutex_);
  // Records a version heard of; true when it is newer than any heard before.
  bool Heard(uint64_t version);
  // A version announced that the worker had not heard of: ends the sync loop's wait between reads
  // of `latest` (push off, or a store that cannot push), not a long poll of a store that pushes:
  // that store tells of it as soon (cancelling the poll to read again was measured to cost 20 to
  // 60 ms).
  void HintSync() EXCLUDES(mutex_);
  // The sync loop's wait between reads of `latest`: until `period` has passed, WakeSync(),
  // HintSync() or the stop. Returns whether stopping.
  bool SleepForSync(std::chrono::milliseconds period) EXCLUDES(mutex_);
  // Returns whether the version claimed was not announced yet (sent without it); quiet: without
  // logging that.
  bool SendHeartbeat(bool quiet = false);
  // On the heartbeat thread, after the sync loop committed a version (claim_due_): claims it.
  void ClaimVersion();
  // Generates, scores and submits one leased job.
  void RunJob(const orchestrator::Lease& lease);
  // A score job's part of RunJob: the engine's log-probabilities of the lease's targets, one
  // completion per target; OK, or why not (`unavailable`: the engine could not serve now).
  Status ScoreJob(const orchestrator::Lease& lease, const nlohmann::json& prompt,
                  std::vector<Completion>* completions, bool* unavailable);
  // For a fixed model: waits until its run has a version and pins it (model_, pinned_); false
  // when stopped first.
  bool PinFixedModel();
  // Waits until `stop_` or `period` has passed; returns whether stopping.
  bool Sleep(std::chrono::milliseconds period);
  // The Env's monotonic clock, in the worker core's unit.
  WorkerCore::Micros Now() const { return env_.MonotonicMicros(); }

  WorkerOptions options_;
  orchestrator::ClusterApi& orchestrator_;
  policy_store::ObjectStore& store_;
  Engine& engine_;
  const Task& task_;
  std::unique_ptr<WeightSink> own_sink_;
  WeightSink& sink_;  // the verified copy; the sync loop's own
  Env& env_;

  mutable Mutex mutex_;
  std::condition_variable changed_;
  // Held while a heartbeat is taken and sent (never while waiting for mutex_ elsewhere).
  Mutex heartbeat_mutex_;
  bool stop_ GUARDED_BY(mutex_) = false;
  bool hinted_ GUARDED_BY(mutex_) = false;     // HintSync() since the sync loop's last round began
  bool claim_due_ GUARDED_BY(mutex_) = false;  // a version committed, not claimed yet
  // The decisions: what is held and ready, engine loads, lease slots and backoffs, what the
  // orchestrator acknowledged.
  WorkerCore core_ GUARDED_BY(mutex_);
  // The sync loop's own:
  std::optional<policy_store::Manifest> held_;  // the manifest of the version the sink holds
  // When the sink's copy was last proved (the Env's monotonic clock); none: in the next round.
  std::optional<WorkerCore::Micros> verified_;
  std::atomic<bool> wake_sync_{false};  // cancels the sync loop's wait for a new version
  // The newest version heard of, from the store's `latest` or from a lease answer (-1: none).
  std::atomic<int64_t> heard_version_{-1};
  // Shared:
  orchestrator::SyncReport report_ GUARDED_BY(mutex_);
  WorkerStats stats_ GUARDED_BY(mutex_);
  std::vector<uint64_t> to_hand_back_ GUARDED_BY(mutex_);
  // What the cluster registers as serving (the policy, or a fixed model with its digest), and a
  // fixed model's pinned version; set before the threads start.
  orchestrator::ModelRef model_;
  std::optional<uint64_t> pinned_;
};

}  // namespace weft::rollout_worker
