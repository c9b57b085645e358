// The simulation behind Simulate() (sim/simulator.h; docs/sim.md), internal to sim/: the event and
// journal records, the simulated world (regions with their links and relay caches, clusters) and
// the Simulation class that owns all of it for one run. One thread; nothing here is thread-safe.
//
// The class's member functions are defined by concern:
//   simulator.cc    the run: the fleet at the start, the event loop, the accounting at the end
//   orchestrator.cc the calls into the core (timed, journaled), the crash that replays the journal
//                   and the restart
//   clusters.cc     a rollout cluster's life: start and stop, heartbeats, syncs and commits,
//                   leases, jobs, submissions, leaving
//   network.cc      the WAN links (processor sharing), the relays' caches, a pull's blobs
//   store.cc        the manifests as the publisher writes them, the pull plans of the real planner
//   trainer.cc      the trainer's steps and publications
//   faults.cc       the configured faults' start and end
//   invariants.cc   the invariant checks and the failure they record
//   report_json.cc  report.json's content
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "orchestrator/cluster_api.h"
#include "orchestrator/core.h"
#include "policy_store/cache_index.h"
#include "policy_store/manifest.h"
#include "rollout_worker/worker_core.h"
#include "sim/config.h"
#include "sim/random.h"
#include "sim/simulator.h"

namespace weft::sim::internal {

using orchestrator::Batch;
using orchestrator::CoreConfig;
using orchestrator::Counters;
using orchestrator::JobSpec;
using orchestrator::Lease;
using orchestrator::OrchestratorCore;
using orchestrator::SubmitResult;
using orchestrator::TrajectoryGroup;
using policy_store::BlobRef;
using policy_store::Manifest;

inline constexpr Micros kSecond = 1'000'000;
inline constexpr Micros kRetry =
    kSecond;  // a call that could not be made is tried again after this

inline Micros Duration(double seconds) {
  return static_cast<Micros>(std::ceil(std::max(0.0, seconds) * 1e6));
}
inline double Seconds(Micros t) { return static_cast<double>(t) / 1e6; }

// ---------------------------------------------------------------------------------------------
// Events.

enum class Ev : uint8_t {
  kTick,
  kTrainer,
  kPublished,
  kHeartbeat,
  kSyncCheck,
  kCommit,
  kJobDone,
  kLeaseRetry,
  kLeave,
  kCrash,
  kRestart,
  kFaultStart,
  kFaultEnd,
  kOrchestratorUp,
  kBreak,
  kLinkDone,   // entity: region; epoch: the link's
  kPullStep,   // a blob reached the cluster: the next one
  kPullStart,  // the manifests are read: the first blob
};

struct Event {
  Micros t = 0;
  uint64_t seq = 0;
  Ev kind = Ev::kTick;
  uint32_t entity = 0;
  uint32_t epoch = 0;
  uint64_t arg = 0;
};

struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return a.t != b.t ? a.t > b.t : a.seq > b.seq;
  }
};

// ---------------------------------------------------------------------------------------------
// The journal model: which core calls the durable core writes, and which of them it waits for
// (orchestrator/durable_core.cc: a call is journaled when it changed the core; heartbeats and
// lease grants are not waited for, so a crash may lose the ones at the end of the journal).

struct Call {
  enum Kind : uint8_t {
    kRegister,
    kHeartbeat,
    kDrain,
    kRelease,
    kDeregister,
    kLeases,
    kSubmit,
    kAnnounce,
    kJobs,
    kBatch,
    kTick
  };
  Kind kind = kTick;
  Micros now = 0;
  uint32_t cluster = 0;
  uint64_t a = 0;  // capacity, max, version, count
  // (Initialised, so that `{kind, now, cluster, a}` stays a complete initialiser.)
  std::optional<uint64_t> version = {};  // heartbeat's ready version, batch's ack
  std::vector<uint64_t> jobs = {};       // drain, release
  TrajectoryGroup group = {};            // submit
  uint64_t granted = 0;                  // leases: how many were granted
};

// ---------------------------------------------------------------------------------------------
// The world.

struct Running {
  uint64_t job = 0;
  uint32_t attempt = 0;
  Micros start = 0, end = 0;
  uint64_t tokens = 0;
  std::vector<std::pair<uint64_t, uint64_t>> segments;
};

struct Plan {
  std::vector<std::pair<uint64_t, uint64_t>> blobs;  // (blob id, bytes) in the order applied
  bool from_keyframe = false;
  size_t manifests = 0;
  size_t deltas = 0;
};

struct ClusterState {
  uint32_t index = 0;  // in Simulation::clusters_
  std::string id;
  uint32_t region = 0;
  uint32_t capacity = 0;
  double speed = 1;
  bool straggler = false;
  bool preloaded = false;  // holds the first version before the run starts (staged in advance)
  bool spoken = false;     // has heartbeated since it (re)started
  Rng rng;
  bool up = false;          // running (not crashed, preempted or gone)
  bool registered = false;  // it believes the orchestrator knows it
  bool draining = false;
  bool leaving = false;  // gone for good once it goes
  uint32_t epoch = 0;    // bumped when it goes down: its pending events are void
  // The rollout worker's own decisions (what it holds and claims, which slots lease, when a group
  // may be submitted, what the orchestrator acknowledged), one engine replica behind it.
  rollout_worker::WorkerCore worker{0};
  std::optional<uint64_t> proven;  // the last version a heartbeat told the orchestrator
  bool pulling = false;
  uint64_t pull_target = 0;
  const Plan* pull_plan = nullptr;  // the blobs of the pull in progress
  size_t pull_next = 0;             // the next of them to fetch
  bool sync_scheduled = false;
  bool latest_pushed = false;           // the scheduled sync check holds `latest` (pushed to it)
  std::map<uint64_t, Running> running;  // by run number
  uint64_t next_run = 1;
  std::vector<TrajectoryGroup> pending;  // finished, not yet answered
  bool parked = false;
  uint64_t park_key = 0;
  bool retry_scheduled = false;
  Micros up_since = 0;
  uint64_t ready_counted = 0;  // publication-to-ready: versions up to this one are counted
  bool ready_any = false;
  uint64_t countable_from = 0;  // versions published while it was up

  // A new worker process: nothing held, one engine replica able to serve.
  void NewWorker() {
    worker = rollout_worker::WorkerCore(capacity);
    worker.EngineHealth(1, std::nullopt);
  }

  // The first version whose publication-to-ready delay it has not been counted for.
  uint64_t first_uncounted_version() const {
    return ready_any ? ready_counted + 1 : countable_from;
  }
};

// One transfer over a region's WAN link: for the relay (cluster is kRelay) or one cluster.
struct Flow {
  uint64_t blob = 0;
  double remaining = 0;  // bytes
  uint32_t cluster = 0;
  uint32_t epoch = 0;
  uint64_t bytes = 0;  // the blob's size
};
constexpr uint32_t kRelay = ~uint32_t{0};

struct RegionStats {
  double alive_slot_us = 0, busy_slot_us = 0;
  uint64_t accepted = 0, delivered_fresh = 0, delivered_stale = 0, rejected = 0;
  std::map<uint64_t, uint64_t> lag;  // trainer version - version_start at delivery -> groups
  double wan_bytes = 0;              // what crossed its WAN link
  double downloaded_bytes = 0;       // what its clusters downloaded (= WAN bytes without a relay)
  double unique_blob_bytes = 0;      // distinct blobs its clusters downloaded (= WAN with a relay)
  std::set<uint64_t> blobs_seen;
  std::set<uint64_t> versions_pulled;
  uint64_t pulls = 0, keyframe_pulls = 0, pull_failures = 0;
  uint64_t relay_hits = 0, relay_misses = 0, relay_evictions = 0;
};

struct RegionState {
  RegionConfig config;
  // The WAN link shares its bandwidth equally among the transfers in flight (processor sharing):
  // each completion or arrival changes every other transfer's rate.
  std::map<uint64_t, Flow> flows;  // by start order
  uint64_t next_flow = 0;
  Micros link_updated = 0;
  uint32_t link_epoch = 0;
  bool partitioned = false;
  bool relay_down = false;
  // The relay's cache, by the relay's own policy (policy_store/cache_index.h; relay_cache 0:
  // unlimited), and the blobs it is fetching, each with the clusters (and their epochs) waiting.
  policy_store::CacheIndex<uint64_t> cache{~uint64_t{0}};
  std::unordered_map<uint64_t, std::vector<std::pair<uint32_t, uint32_t>>> fetching;
  RegionStats stats;
  uint32_t clusters_made = 0;
};

class Simulation {
 public:
  Simulation(const SimConfig& config, const SimOptions& options);

  SimResult Run();

 private:
  // --- The event queue (simulator.cc runs it).
  void At(Micros t, Ev kind, uint32_t entity = 0, uint32_t epoch = 0, uint64_t arg = 0) {
    queue_.push({std::max(t, now_), seq_++, kind, entity, epoch, arg});
  }

  // --- Orchestrator calls (timed, logged for the journal model, checked): orchestrator.cc.
  bool OrchestratorReachable(const ClusterState& c) const {
    return orchestrator_up_ && !regions_[c.region].partitioned;
  }
  template <typename F>
  auto Timed(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    auto result = f();
    core_time_ += std::chrono::steady_clock::now() - start;
    ++core_calls_;
    return result;
  }
  void Log(Call call, bool durable) {
    log_.push_back(std::move(call));
    if (durable) durable_length_ = log_.size();
    if (log_.size() >= config_.checkpoint_every && durable_length_ == log_.size()) {
      checkpoint_ = core_;
      log_.clear();
      durable_length_ = 0;
    }
  }
  // The cluster routes as the simulated clusters reach them (orchestrator::ClusterApi), so that
  // the rollout worker's own procedures (rollout_worker/worker_core.h) run against the core: every
  // call is timed and logged as the durable core journals it. Long polls are answered at once
  // (the simulation parks them itself); whether the orchestrator is reachable is the caller's to
  // check.
  class Api final : public orchestrator::ClusterApi {
   public:
    explicit Api(Simulation& sim) : sim_(sim) {}
    using orchestrator::ClusterApi::Register;
    Status Register(const std::string& cluster, const std::string& region, uint32_t capacity,
                    const orchestrator::ModelRef& model) override;
    Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                     const orchestrator::SyncReport* sync) override;
    Result<orchestrator::LeaseAnswer> RequestLeases(const std::string& cluster, uint32_t max,
                                                    std::chrono::milliseconds wait) override;
    Result<SubmitResult> Submit(const TrajectoryGroup& group) override;
    Status Drain(const std::string& cluster, const std::vector<uint64_t>& jobs) override {
      return HandBack(cluster, jobs, true);
    }
    Status Release(const std::string& cluster, const std::vector<uint64_t>& jobs) override {
      return HandBack(cluster, jobs, false);
    }
    Status Deregister(const std::string& cluster) override;

   private:
    // Drain (`drain`: and take no more) or Release.
    Status HandBack(const std::string& cluster, const std::vector<uint64_t>& jobs, bool drain);
    // A cluster the simulation made (ids come from its own clusters; an unknown one throws).
    ClusterState& Cluster(const std::string& id) {
      return sim_.clusters_[sim_.cluster_index_.at(id)];
    }
    Simulation& sim_;
  };
  Status CoreRegister(ClusterState& c);
  // One heartbeat as the worker sends it (rollout_worker::SendHeartbeat).
  Status CoreHeartbeat(ClusterState& c);
  void CoreTick();
  void Announce(uint64_t version);
  void CrashOrchestrator(Micros duration);
  void OrchestratorUp();

  // --- Clusters: clusters.cc.
  uint32_t AddCluster(uint32_t region, bool preloaded);
  void StartCluster(uint32_t index);
  void StopCluster(ClusterState& c);
  // Adds the cluster's slot time since it came up, and its running jobs' time, to its region's.
  void CountSlotTime(const ClusterState& c);
  void Heartbeat(ClusterState& c, bool reschedule);
  // Unless a sync check is scheduled or a pull is under way: one after `delay`, and with push off
  // at a random point within sync_interval after that. `pushed`: the cluster holds the store's
  // `latest` already (a long poll's answer), so its pull does not read it first.
  void ScheduleSyncCheck(ClusterState& c, Micros delay, bool pushed = false);
  void SyncCheck(ClusterState& c);
  void Commit(ClusterState& c);
  void AskForLeases(ClusterState& c);
  void Park(ClusterState& c);
  void Unpark(ClusterState& c);
  void WakeParked();
  void JobDone(ClusterState& c, uint64_t run);
  void FlushPending(ClusterState& c);
  bool SubmitOne(ClusterState& c, const TrajectoryGroup& group);
  void Leave(ClusterState& c, Micros notice);

  // --- The trainer: trainer.cc.
  void TrainerWake();
  void TrainerCollect();
  void StartPublish(uint64_t version);
  void Published(uint64_t version);

  // --- Faults: faults.cc.
  void FaultStart(size_t index);
  void FaultEnd(size_t index);

  // --- The store model: store.cc.
  void BuildManifest(uint64_t version);
  const Plan& PlanFor(std::optional<uint64_t> have, uint64_t target);
  uint64_t NewBlob() { return next_blob_++; }  // a blob's identity (its size is in its BlobRef)

  // --- The network: network.cc.
  // The WAN link: flows in, the rates shared, completions out.
  void AdvanceLink(RegionState& region);
  void ScheduleLink(uint32_t region);
  void StartFlow(uint32_t region, uint64_t blob, uint64_t bytes, uint32_t cluster, uint32_t epoch);
  void LinkDone(uint32_t region);
  void BlobArrived(uint32_t region, const Flow& flow);
  // The pull in progress: fetch the next blob (through the relay or over the WAN), or apply.
  void PullNext(ClusterState& c);

  // --- Invariants: invariants.cc.
  void Fail(const std::string& invariant, const std::string& detail);
  void CheckCounters();
  void CheckCluster(const ClusterState& c);
  void CheckAll();

  // --- Report: report_json.cc.
  nlohmann::json Report();

  const SimConfig& config_;
  SimOptions options_;
  OrchestratorCore core_;
  Api api_{*this};
  OrchestratorCore checkpoint_;
  std::vector<Call> log_;
  size_t durable_length_ = 0;
  std::chrono::steady_clock::duration core_time_{};
  uint64_t core_calls_ = 0;

  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  uint64_t seq_ = 0;
  Micros now_ = 0;
  uint64_t events_ = 0;
  uint64_t checks_ = 0;
  Status failure_;

  std::vector<RegionState> regions_;
  std::vector<ClusterState> clusters_;
  std::unordered_map<std::string, uint32_t> cluster_index_;
  std::set<std::pair<uint64_t, uint32_t>> parked_;  // (park key, cluster)
  uint64_t park_keys_ = 0;

  // Store.
  std::vector<Manifest> manifests_;
  uint64_t next_blob_ = 0;
  std::map<std::pair<int64_t, uint64_t>, Plan> plans_;
  std::optional<uint64_t> store_latest_;
  bool store_down_ = false;
  double model_bits_ = 0;
  double keyframe_bytes_ = 0;
  double bytes_published_ = 0;
  uint64_t keyframes_published_ = 0;
  std::vector<Micros> published_at_;
  // publication-to-ready, by version: per region, the clusters up at publication and the delays.
  std::vector<std::vector<uint32_t>> ready_population_;
  std::vector<std::vector<std::vector<Micros>>> ready_delays_;

  // Orchestrator.
  bool orchestrator_up_ = true;
  std::optional<uint64_t> announced_;
  std::optional<uint64_t> unannounced_;  // published while the orchestrator was down
  uint64_t crashes_ = 0, replayed_calls_ = 0, lost_calls_ = 0;

  // Trainer.
  enum class Phase { kPublishing, kCollecting, kStepping, kDone };
  Phase phase_ = Phase::kPublishing;
  Rng trainer_rng_, fault_rng_;
  uint64_t step_ = 0;
  uint64_t collected_ = 0;
  std::optional<uint64_t> last_batch_;
  Micros wait_since_ = 0;
  Micros idle_us_ = 0, step_us_ = 0, publish_us_ = 0;
  bool trainer_wake_pending_ = false;
  uint64_t trainer_wake_epoch_ = 0;
  std::string job_prompt_;

  // Sim-side truth for the invariants.
  std::vector<uint8_t> accepted_;   // by job id
  std::vector<uint8_t> delivered_;  // by job id
  uint64_t accepted_total_ = 0;
  uint64_t delivered_items_ = 0;
  uint64_t duplicates_ = 0, rejected_ = 0;
  nlohmann::json fault_log_ = nlohmann::json::array();
};

}  // namespace weft::sim::internal
