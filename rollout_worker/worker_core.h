// WorkerCore: the rollout worker's decisions, apart from its I/O, threads and clocks: the version
// it claims to serve, when it pulls and gives the engine its copy, which job slots may lease, and
// when a finished group may be submitted. Time is an input (microseconds of a monotonic clock).
// RolloutWorker (rollout_worker/worker.h) drives one from its threads, under its mutex; the
// simulator (sim/) drives one per simulated cluster, on simulated time. Not thread-safe.
//
// Beside it, the two procedures both share: tagging a group with the versions that generated its
// tokens (AddSampleVersions), and one heartbeat with its fallbacks (SendHeartbeat).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orchestrator/cluster_api.h"
#include "orchestrator/types.h"

namespace weft::rollout_worker {

// A run of generated tokens: (version, index of its first token in the sample).
using VersionSegments = std::vector<std::pair<uint64_t, uint64_t>>;

class WorkerCore {
 public:
  using Micros = int64_t;

  // Backoffs: failed engine loads retry from 250 ms, doubling up to 10 s; after a job the engine
  // or the reward service could not serve, no leases from 500 ms, doubling up to 10 s.
  static constexpr Micros kLoadBackoffFirst = 250'000, kLoadBackoffMax = 10'000'000;
  static constexpr Micros kLeaseBackoffFirst = 500'000, kLeaseBackoffMax = 10'000'000;

  // `capacity`: jobs generated at once per engine replica.
  explicit WorkerCore(uint32_t capacity) : capacity_(capacity) {}

  // What heartbeats claim: the version proved (held, verified) and committed to an engine that
  // can serve it; none while no replica can.
  std::optional<uint64_t> ready() const { return ready_; }
  // The version of the copy held (verified against its manifest), whether or not the engine
  // serves it yet.
  std::optional<uint64_t> held() const { return held_; }

  // The engine's health, as last seen. Readiness follows it: with no replica able to serve, not
  // ready; ready again once a replica can and the engine serves (`engine_version`) the copy held,
  // as last given to it.
  enum class Change { kNone, kLost, kRegained };
  Change EngineHealth(uint32_t ready_replicas, std::optional<uint64_t> engine_version);
  uint32_t ready_replicas() const { return ready_replicas_; }

  // Sync. The version to pull, given the store's latest: none while the copy is as new.
  std::optional<uint64_t> PullTarget(uint64_t latest) const;
  // The copy now holds `version`, verified; the engine is to be given it.
  void Pulled(uint64_t version);
  // The copy was emptied (a keyframe pull that failed after dropping it): nothing held; the
  // engine goes on serving what it has, and readiness with it.
  void CopyDropped();
  // The copy no longer matches the version claimed (a full digest check failed): nothing held and
  // not ready, until a keyframe is pulled and loaded.
  void CopyCorrupted();
  // Whether the sync has nothing to do until the store's latest version moves on from `latest`
  // (none: the run has none yet): the copy is as new, and the engine was given it as it is. The
  // worker then waits for the store to change rather than reading it again and again.
  bool CaughtUp(std::optional<uint64_t> latest) const {
    if (!latest) return true;
    return !PullTarget(*latest) && engine_current_;
  }
  // Whether to give the engine the copy now: one is held, the engine was not given it as it is,
  // and no failed load is being backed off.
  bool ShouldLoad(Micros now) const;
  // A stage or commit failed: the next try waits (returned, in microseconds).
  Micros LoadFailed(Micros now);
  // The engine committed the copy held: ready at its version.
  void Loaded();

  // Heartbeats. The orchestrator acknowledged a heartbeat that claimed `ready`.
  void Acknowledged(std::optional<uint64_t> ready);
  // The newest version the orchestrator acknowledged this cluster ready at.
  std::optional<uint64_t> acknowledged() const { return acknowledged_; }

  // Leases. Job slots are `capacity` per replica that can serve; slot `slot` may ask for a lease
  // while the cluster is ready, the ready replicas cover it and no backoff holds leasing.
  bool MayLease(uint32_t slot, Micros now) const { return slot < LeasableSlots(now); }
  uint32_t LeasableSlots(Micros now) const;
  // After a job the engine or the reward service could not serve: no new leases for a while.
  // Returns the wait (microseconds); leasing_paused_until() says until when.
  Micros BackOffLeasing(Micros now);
  Micros leasing_paused_until() const { return leasing_paused_until_; }
  // A submission was accepted: the engine and the rewards work again, the backoff resets.
  void Submitted() { lease_backoff_ = 0; }
  // Whether a group whose newest version is `version_end` may be submitted: the orchestrator
  // accepts tokens of a version only once it has acknowledged this cluster ready at it or newer.
  bool MaySubmit(uint64_t version_end) const {
    return acknowledged_ && *acknowledged_ >= version_end;
  }

 private:
  uint32_t capacity_;
  std::optional<uint64_t> ready_, held_, acknowledged_;
  bool engine_current_ = false;  // whether the engine was last given the copy as it is now
  uint32_t ready_replicas_ = 0;
  Micros load_backoff_ = 0, load_retry_at_ = 0;
  Micros lease_backoff_ = 0, leasing_paused_until_ = 0;
};

// Appends one sample's version segments to its group's (docs/api.md, submissions): the samples'
// tokens laid end to end, each run tagged with the version that generated it; version_start and
// version_end become the oldest and newest versions used, tokens the total. Called once per
// sample, in order, on a group whose segments and tokens start empty.
void AddSampleVersions(const VersionSegments& segments, uint64_t tokens,
                       orchestrator::TrajectoryGroup* group);

// How one heartbeat went (SendHeartbeat).
struct HeartbeatOutcome {
  Status status;  // of the last call made
  // On success, the version the orchestrator acknowledged the cluster ready at (none: alive, not
  // ready).
  std::optional<uint64_t> acknowledged;
  bool registered_again = false;  // the orchestrator did not know the cluster; it registered
  bool unannounced = false;       // the version claimed is not announced yet: sent without it
};

// One heartbeat claiming `ready` with the sync counters `report`. A cluster the orchestrator does
// not know (lost after a long silence) registers again with `capacity` and `model` and heartbeats
// again; a version published but not announced yet is left out (alive, not ready, until it is).
HeartbeatOutcome SendHeartbeat(orchestrator::ClusterApi& api, const std::string& cluster,
                               const std::string& region, uint32_t capacity,
                               std::optional<uint64_t> ready,
                               const orchestrator::SyncReport* report,
                               const orchestrator::ModelRef& model = {});

}  // namespace weft::rollout_worker
