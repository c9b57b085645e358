#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "orchestrator/core.h"
#include "policy_store/manifest.h"
#include "policy_store/planner.h"
#include "sim/random.h"

namespace weft::sim {
namespace {

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

constexpr Micros kSecond = 1'000'000;
constexpr Micros kRetry = kSecond;  // a call that could not be made is tried again after this
constexpr Micros kTrainerPoll = 2 * kSecond;  // the trainer's long poll for a batch
// Default delta bits per changed element, from bench/codec_bench (synthetic Adam steps at
// lr 1e-6): BF16 9.5, block-scaled FP8 14.3.
constexpr double kDefaultBitsBf16 = 9.5;
constexpr double kDefaultBitsFp8 = 14.3;
constexpr double kDeltaOverheadBytes = 4096;  // headers and chunk index of one delta file

Micros Duration(double seconds) {
  return static_cast<Micros>(std::ceil(std::max(0.0, seconds) * 1e6));
}
double Seconds(Micros t) { return static_cast<double>(t) / 1e6; }

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
  std::vector<uint64_t> jobs = {};       // drain
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
  bool leaving = false;            // gone for good once it goes
  uint32_t epoch = 0;              // bumped when it goes down: its pending events are void
  std::optional<uint64_t> held;    // the version it serves (committed)
  std::optional<uint64_t> proven;  // the last version a heartbeat told the orchestrator
  uint64_t max_proven = 0;
  bool pulling = false;
  uint64_t pull_target = 0;
  const Plan* pull_plan = nullptr;  // the blobs of the pull in progress
  size_t pull_next = 0;             // the next of them to fetch
  bool sync_scheduled = false;
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
};

struct CacheEntry {
  uint64_t bytes = 0;
  bool ready = false;                                  // fetched (else a fetch is in flight)
  std::vector<std::pair<uint32_t, uint32_t>> waiting;  // (cluster, epoch) waiting for it
  std::list<uint64_t>::iterator lru;
};

// One transfer over a region's WAN link: for the relay (cluster is kRelay) or one cluster.
struct Flow {
  uint64_t blob = 0;
  double remaining = 0;  // bytes
  uint32_t cluster = 0;
  uint32_t epoch = 0;
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
  std::unordered_map<uint64_t, CacheEntry> cache;
  std::list<uint64_t> lru;  // most recent first
  uint64_t cached = 0;
  RegionStats stats;
  uint32_t clusters_made = 0;
};

std::string BlobHash(uint64_t id) {
  char text[65];
  std::snprintf(text, sizeof(text), "%064" PRIx64, id);
  return text;
}
uint64_t BlobId(const std::string& sha) { return std::stoull(sha.substr(48), nullptr, 16); }

class Simulation {
 public:
  Simulation(const SimConfig& config, const SimOptions& options)
      : config_(config), options_(options), core_(config.core), checkpoint_(config.core) {
    model_bits_ = config.model.bits_per_change > 0 ? config.model.bits_per_change
                  : config.model.format == "fp8"   ? kDefaultBitsFp8
                                                   : kDefaultBitsBf16;
    keyframe_bytes_ = config.model.ServedBytes();
    trainer_rng_ = Rng(config.seed, 1);
    fault_rng_ = Rng(config.seed, 2);
    job_prompt_ = "\"p\"";
  }

  SimResult Run();

 private:
  // --- Event queue.
  void At(Micros t, Ev kind, uint32_t entity = 0, uint32_t epoch = 0, uint64_t arg = 0) {
    queue_.push({std::max(t, now_), seq_++, kind, entity, epoch, arg});
  }

  // --- Orchestrator calls (timed, logged for the journal model, checked).
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
  Status CoreRegister(ClusterState& c);
  Status CoreHeartbeat(ClusterState& c);
  void CoreTick();
  void Announce(uint64_t version);

  // --- Entities.
  uint32_t AddCluster(uint32_t region, bool preloaded);
  void StartCluster(uint32_t index);
  void StopCluster(ClusterState& c, bool count_busy);
  void Heartbeat(ClusterState& c, bool reschedule);
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
  void TrainerWake();
  void TrainerCollect();
  void StartPublish(uint64_t version);
  void Published(uint64_t version);
  void FaultStart(size_t index);
  void FaultEnd(size_t index);
  void CrashOrchestrator(Micros duration);
  void OrchestratorUp();

  // --- The store model.
  void BuildManifest(uint64_t version);
  const Plan& PlanFor(std::optional<uint64_t> have, uint64_t target);
  uint64_t NewBlob() { return next_blob_++; }  // a blob's identity (its size is in its BlobRef)
  // The WAN link: flows in, the rates shared, completions out.
  void AdvanceLink(RegionState& region);
  void ScheduleLink(uint32_t region);
  void StartFlow(uint32_t region, uint64_t blob, uint64_t bytes, uint32_t cluster, uint32_t epoch);
  void LinkDone(uint32_t region);
  void BlobArrived(uint32_t region, const Flow& flow);
  // The pull in progress: fetch the next blob (through the relay or over the WAN), or apply.
  void PullNext(ClusterState& c);
  void CacheInsert(RegionState& region, uint64_t blob, uint64_t bytes);

  // --- Invariants.
  void Fail(const std::string& invariant, const std::string& detail);
  void CheckCounters();
  void CheckCluster(const ClusterState& c);
  void CheckAll();

  // --- Report.
  nlohmann::json Report();

  const SimConfig& config_;
  SimOptions options_;
  OrchestratorCore core_;
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

// ---------------------------------------------------------------------------------------------
// Invariants.

void Simulation::Fail(const std::string& invariant, const std::string& detail) {
  if (!failure_.ok()) return;
  char when[64];
  std::snprintf(when, sizeof(when), "%.6f", Seconds(now_));
  failure_ =
      Internal("invariant '" + invariant + "' broken at event " + std::to_string(events_) +
               " (simulated time " + when + " s), seed " + std::to_string(config_.seed) + ": " +
               detail + " (replay: weft sim CONFIG --seed " + std::to_string(config_.seed) + ")");
}

void Simulation::CheckCounters() {
  ++checks_;
  const Counters& k = core_.counters();
  auto expect = [&](bool ok, const char* what) {
    if (!ok) Fail("counters", what);
  };
  expect(k.jobs_added == k.jobs_done + k.jobs_given_up + core_.open_jobs(),
         "jobs added != done + given up + open");
  expect(core_.open_jobs() == core_.queued_jobs() + core_.leased_jobs(),
         "open jobs != queued + leased");
  expect(k.submissions_accepted == k.jobs_done, "submissions accepted != jobs done");
  expect(k.submissions_accepted ==
             k.delivered_fresh + k.delivered_stale + k.dropped_stale + core_.buffered(),
         "accepted != delivered + dropped + buffered");
  expect(core_.leased_jobs() + core_.buffered() + core_.outstanding() <= config_.core.max_in_flight,
         "more in flight than max_in_flight");
  // No acknowledged trajectory lost (across crashes too): the core counts every submission it
  // ever acknowledged.
  if (k.submissions_accepted != accepted_total_) {
    Fail("no acknowledged trajectory lost",
         "the orchestrator counts " + std::to_string(k.submissions_accepted) +
             " accepted submissions, the clusters were told " + std::to_string(accepted_total_));
  }
  if (delivered_items_ > k.delivered_fresh + k.delivered_stale) {
    Fail("delivered once", "the trainer received " + std::to_string(delivered_items_) +
                               " groups, the orchestrator delivered " +
                               std::to_string(k.delivered_fresh + k.delivered_stale));
  }
}

// The core's view of one cluster against the simulated cluster.
void Simulation::CheckCluster(const ClusterState& c) {
  ++checks_;
  const std::optional<orchestrator::ClusterView> view = core_.cluster(c.id);
  if (!view || view->gone) return;
  if (view->leases > view->capacity) {
    Fail("leases within capacity", c.id + " holds " + std::to_string(view->leases) +
                                       " leases with capacity " + std::to_string(view->capacity));
  }
  if (view->ready_version) {
    const uint64_t v = *view->ready_version;
    if (!store_latest_ || v > *store_latest_ || !announced_ || v > *announced_) {
      Fail("ready clusters serve published versions",
           c.id + " is ready at version " + std::to_string(v) + ", which is not published");
    }
    // (A cluster that restarted and has not spoken since is still believed at its old version
    // until it heartbeats or is declared lost; it asks for nothing meanwhile.)
    if (!c.proven || *c.proven != v || (c.spoken && (!c.held || *c.held < v))) {
      Fail("ready clusters serve published versions",
           c.id + " is ready at version " + std::to_string(v) + " in the orchestrator, but " +
               (c.held ? "serves version " + std::to_string(*c.held) : "serves nothing") +
               " and proved " + (c.proven ? std::to_string(*c.proven) : "nothing"));
    }
  }
}

void Simulation::CheckAll() {
  CheckCounters();
  for (const ClusterState& c : clusters_) CheckCluster(c);
}

// ---------------------------------------------------------------------------------------------
// Orchestrator calls.

Status Simulation::CoreRegister(ClusterState& c) {
  Status s =
      Timed([&] { return core_.Register(now_, c.id, regions_[c.region].config.name, c.capacity); });
  if (s.ok()) {
    Log({Call::kRegister, now_, c.index, c.capacity}, true);
    c.registered = true;
    c.draining = false;
  }
  return s;
}

Status Simulation::CoreHeartbeat(ClusterState& c) {
  const uint32_t index = c.index;
  std::optional<uint64_t> ready = c.held;
  Status s = Timed([&] { return core_.Heartbeat(now_, c.id, ready); });
  if (s.code() == StatusCode::kConflict) {  // newer than announced: tell nothing yet
    ready.reset();
    s = Timed([&] { return core_.Heartbeat(now_, c.id, ready); });
  }
  if (s.ok()) {
    Call call{Call::kHeartbeat, now_, index};
    call.version = ready;
    Log(std::move(call), false);
    c.proven = ready;
    c.spoken = true;
    if (ready) c.max_proven = std::max(c.max_proven, *ready);
  }
  return s;
}

void Simulation::CoreTick() {
  const bool changed = Timed([&] { return core_.Tick(now_); });
  if (changed) {
    Log({Call::kTick, now_}, true);
    WakeParked();
  }
}

void Simulation::Announce(uint64_t version) {
  if (!orchestrator_up_) {
    unannounced_ = version;
    return;
  }
  Status s = Timed([&] { return core_.AnnounceVersion(now_, version); });
  if (!s.ok()) return Fail("announce", s.message());
  Log({Call::kAnnounce, now_, 0, version}, true);
  announced_ = version;
  unannounced_.reset();
  WakeParked();
}

// ---------------------------------------------------------------------------------------------
// The store: manifests as the publisher writes them (keyframes, deltas, skip deltas), blob sizes
// from the model's density and the codec's bits per changed element.

void Simulation::BuildManifest(uint64_t v) {
  const ModelConfig& model = config_.model;
  const double elements = model.parameters;
  Manifest m;
  m.run_id = "sim";
  m.version = v;
  double published = 0;
  auto delta_bytes = [&](double changed_fraction) {
    return elements * changed_fraction * model_bits_ / 8 + kDeltaOverheadBytes;
  };
  bool keyframe = v == 0;
  if (v > 0) {
    const Manifest& prev = manifests_[v - 1];
    const double p = model.DensityAt(v);
    const double bytes = delta_bytes(p);
    m.delta_base = v - 1;
    m.delta = BlobRef{BlobHash(NewBlob()), static_cast<uint64_t>(std::round(bytes))};
    published += bytes;
    // Skip deltas: at v divisible by 2^j, one from v - 2^j (the squash of the span: the elements
    // any of its steps changed).
    for (uint32_t j = 1; j <= model.max_skip_level; ++j) {
      const uint64_t span = uint64_t{1} << j;
      if (span > v || v % span != 0) break;
      const double changed = 1 - std::pow(1 - p, static_cast<double>(span));
      const double skip = delta_bytes(changed);
      m.skips.push_back(
          {v - span, BlobRef{BlobHash(NewBlob()), static_cast<uint64_t>(std::round(skip))}});
      published += skip;
    }
    keyframe =
        v - prev.last_keyframe >= model.keyframe_interval ||
        static_cast<double>(prev.delta_bytes_since_keyframe) > model.delta_budget * keyframe_bytes_;
    m.last_keyframe = keyframe ? v : prev.last_keyframe;
    m.delta_bytes_since_keyframe = keyframe ? 0 : prev.delta_bytes_since_keyframe + m.delta->bytes;
  }
  if (keyframe) {
    m.keyframe = {BlobRef{BlobHash(NewBlob()), static_cast<uint64_t>(std::round(keyframe_bytes_))}};
    m.last_keyframe = v;
    published += keyframe_bytes_;
    ++keyframes_published_;
  }
  bytes_published_ += published;
  manifests_.push_back(std::move(m));
}

const Plan& Simulation::PlanFor(std::optional<uint64_t> have, uint64_t target) {
  const std::pair<int64_t, uint64_t> key{have ? static_cast<int64_t>(*have) : -1, target};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  const Manifest& goal = manifests_[target];
  const uint64_t low = policy_store::PlanLow(goal, have, true);
  std::span<const Manifest> between(manifests_.data() + low + 1, target - low);
  Result<policy_store::PullPlan> plan = policy_store::PlanFromManifests(
      goal, have, &manifests_[goal.last_keyframe], between, std::nullopt);
  Plan out;
  if (!plan.ok()) {
    Fail("planner", plan.status().message());
    return plans_[key] = out;
  }
  out.from_keyframe = plan->from_keyframe;
  if (plan->from_keyframe) {
    for (const BlobRef& part : plan->keyframe.keyframe)
      out.blobs.emplace_back(BlobId(part.sha256), part.bytes);
  }
  for (const auto& step : plan->steps)
    out.blobs.emplace_back(BlobId(step.blob.sha256), step.blob.bytes);
  out.deltas = plan->steps.size();
  out.manifests = target - low + (plan->from_keyframe ? 1 : 0);
  return plans_[key] = std::move(out);
}

void Simulation::AdvanceLink(RegionState& region) {
  if (!region.flows.empty() && now_ > region.link_updated) {
    const double each = region.config.bandwidth * Seconds(now_ - region.link_updated) /
                        static_cast<double>(region.flows.size());
    for (auto& [id, flow] : region.flows) flow.remaining = std::max(0.0, flow.remaining - each);
  }
  region.link_updated = now_;
}

// The next completion on the link (the flow with the fewest bytes left, at the shared rate).
void Simulation::ScheduleLink(uint32_t r) {
  RegionState& region = regions_[r];
  ++region.link_epoch;
  if (region.flows.empty()) return;
  double fewest = std::numeric_limits<double>::infinity();
  for (const auto& [id, flow] : region.flows) fewest = std::min(fewest, flow.remaining);
  const double rate = region.config.bandwidth / static_cast<double>(region.flows.size());
  At(now_ + Duration(fewest / rate), Ev::kLinkDone, r, region.link_epoch);
}

void Simulation::StartFlow(uint32_t r, uint64_t blob, uint64_t bytes, uint32_t cluster,
                           uint32_t epoch) {
  RegionState& region = regions_[r];
  AdvanceLink(region);
  region.flows[region.next_flow++] = {blob, static_cast<double>(bytes), cluster, epoch};
  region.stats.wan_bytes += static_cast<double>(bytes);
  ScheduleLink(r);
}

void Simulation::LinkDone(uint32_t r) {
  RegionState& region = regions_[r];
  AdvanceLink(region);
  std::vector<Flow> done;
  for (auto it = region.flows.begin(); it != region.flows.end();) {
    if (it->second.remaining < 1.0) {  // (the rounding of the completion time to 1 us)
      done.push_back(it->second);
      it = region.flows.erase(it);
    } else {
      ++it;
    }
  }
  ScheduleLink(r);
  for (const Flow& flow : done) BlobArrived(r, flow);
}

void Simulation::CacheInsert(RegionState& region, uint64_t blob, uint64_t bytes) {
  region.lru.push_front(blob);
  CacheEntry& entry = region.cache[blob];
  entry.bytes = bytes;
  entry.lru = region.lru.begin();
  region.cached += bytes;
}

// A WAN transfer finished: a blob reached the relay (its waiters get it over the LAN) or the
// cluster that fetched it directly.
void Simulation::BlobArrived(uint32_t r, const Flow& flow) {
  RegionState& region = regions_[r];
  const Micros latency = region.config.latency;  // the last byte's way
  if (flow.cluster != kRelay) {
    At(now_ + latency, Ev::kPullStep, flow.cluster, flow.epoch);
    return;
  }
  auto found = region.cache.find(flow.blob);
  if (found == region.cache.end()) return;
  CacheEntry& entry = found->second;
  entry.ready = true;
  const Micros lan = Duration(static_cast<double>(entry.bytes) / region.config.lan_bandwidth);
  for (const auto& [cluster, epoch] : entry.waiting)
    At(now_ + latency + lan, Ev::kPullStep, cluster, epoch);
  entry.waiting.clear();
  // Over its size, the relay evicts the least recently used blobs it holds.
  const uint64_t limit = region.config.relay_cache;
  for (auto it = region.lru.end();
       limit != 0 && region.cached > limit && it != region.lru.begin();) {
    --it;
    CacheEntry& old = region.cache[*it];
    if (!old.ready || !old.waiting.empty()) continue;
    region.cached -= old.bytes;
    region.cache.erase(*it);
    it = region.lru.erase(it);
    ++region.stats.relay_evictions;
  }
}

void Simulation::PullNext(ClusterState& c) {
  const uint32_t index = c.index;
  RegionState& region = regions_[c.region];
  const Plan& plan = *c.pull_plan;
  if (c.pull_next == plan.blobs.size()) {  // every blob here: apply, then commit
    double apply = 0;
    if (plan.from_keyframe) apply += keyframe_bytes_ / config_.model.load_throughput;
    apply += static_cast<double>(plan.deltas) * config_.model.ServedBytes() /
             config_.model.apply_throughput;
    At(now_ + Duration(apply), Ev::kCommit, index, c.epoch);
    return;
  }
  const auto [blob, bytes] = plan.blobs[c.pull_next++];
  RegionStats& stats = region.stats;
  stats.downloaded_bytes += static_cast<double>(bytes);
  if (stats.blobs_seen.insert(blob).second) stats.unique_blob_bytes += static_cast<double>(bytes);
  if (!region.config.relay) return StartFlow(c.region, blob, bytes, index, c.epoch);
  auto found = region.cache.find(blob);
  if (found != region.cache.end()) {
    CacheEntry& entry = found->second;
    region.lru.splice(region.lru.begin(), region.lru, entry.lru);
    if (entry.ready) {
      ++stats.relay_hits;
      At(now_ + Duration(static_cast<double>(bytes) / region.config.lan_bandwidth), Ev::kPullStep,
         index, c.epoch);
    } else {
      ++stats.relay_misses;  // another cluster's fetch is in flight: wait for it
      entry.waiting.emplace_back(index, c.epoch);
    }
    return;
  }
  ++stats.relay_misses;
  CacheInsert(region, blob, bytes);
  region.cache[blob].waiting.emplace_back(index, c.epoch);
  StartFlow(c.region, blob, bytes, kRelay, 0);
}

// ---------------------------------------------------------------------------------------------
// Clusters.

// A new cluster of the region (down until started); stragglers are picked per cluster.
uint32_t Simulation::AddCluster(uint32_t r, bool preloaded) {
  RegionState& region = regions_[r];
  ClusterState c;
  c.index = static_cast<uint32_t>(clusters_.size());
  c.id = region.config.name + "-" + std::to_string(region.clusters_made++);
  c.region = r;
  c.capacity = region.config.capacity;
  c.rng = Rng(config_.seed, 1000 + clusters_.size());
  c.speed = region.config.speed;
  c.preloaded = preloaded;
  if (c.rng.Chance(config_.generation.straggler_fraction)) {
    c.straggler = true;
    c.speed /= config_.generation.straggler_slowdown;
  }
  cluster_index_[c.id] = c.index;
  clusters_.push_back(std::move(c));
  return clusters_.back().index;
}

void Simulation::StartCluster(uint32_t index) {
  ClusterState& c = clusters_[index];
  c.up = true;
  c.registered = false;
  c.draining = false;
  c.held.reset();
  c.spoken = false;
  c.pulling = false;
  c.sync_scheduled = false;
  c.running.clear();
  c.pending.clear();
  c.up_since = now_;
  c.ready_any = false;
  c.ready_counted = 0;
  c.countable_from = store_latest_ ? *store_latest_ + 1 : 0;
  ++c.epoch;
  Heartbeat(c, false);  // registers first, when the orchestrator is reachable
  At(now_ + config_.cluster.heartbeat, Ev::kHeartbeat, index, c.epoch);
  SyncCheck(c);
  if (config_.cluster.crash_rate > 0) {
    const double mean_hours = 1.0 / config_.cluster.crash_rate;
    At(now_ + Duration(c.rng.Exponential(mean_hours * 3600)), Ev::kCrash, index, c.epoch);
  }
}

// The cluster goes down: its work in progress is lost to it (the orchestrator re-leases it).
void Simulation::StopCluster(ClusterState& c, bool count_busy) {
  RegionStats& stats = regions_[c.region].stats;
  stats.alive_slot_us += static_cast<double>(now_ - c.up_since) * c.capacity;
  for (const auto& [run, r] : c.running)
    if (count_busy) stats.busy_slot_us += static_cast<double>(now_ - r.start);
  c.running.clear();
  c.pending.clear();
  c.up = false;
  c.registered = false;
  c.pulling = false;
  c.sync_scheduled = false;
  c.spoken = false;
  // Versions it was counted for at publication and never reached leave the population.
  const uint64_t from = c.ready_any ? c.ready_counted + 1 : c.countable_from;
  for (uint64_t u = from; u < ready_population_.size(); ++u) --ready_population_[u][c.region];
  c.held.reset();
  c.pull_plan = nullptr;
  Unpark(c);
  // Its own transfers stop (a relay's go on: other clusters may want the blob).
  const uint32_t index = c.index;
  RegionState& region = regions_[c.region];
  AdvanceLink(region);
  const size_t before = region.flows.size();
  std::erase_if(region.flows, [&](const auto& flow) { return flow.second.cluster == index; });
  if (region.flows.size() != before) ScheduleLink(c.region);
  ++c.epoch;
}

void Simulation::Heartbeat(ClusterState& c, bool reschedule) {
  const uint32_t index = c.index;
  if (reschedule) At(now_ + config_.cluster.heartbeat, Ev::kHeartbeat, index, c.epoch);
  if (!OrchestratorReachable(c)) return;
  if (!c.registered && !CoreRegister(c).ok()) return;
  Status s = CoreHeartbeat(c);
  if (s.code() == StatusCode::kNotFound) {  // lost (or the orchestrator forgot it): again
    c.registered = false;
    if (!CoreRegister(c).ok()) return;
    s = CoreHeartbeat(c);
  }
  if (!s.ok()) return;
  CheckCluster(c);
  FlushPending(c);
  AskForLeases(c);
}

void Simulation::SyncCheck(ClusterState& c) {
  const uint32_t index = c.index;
  c.sync_scheduled = false;
  if (!c.up || c.pulling || !store_latest_) return;
  if (c.held && *c.held >= *store_latest_) return;
  RegionState& region = regions_[c.region];
  if (store_down_ || region.partitioned || (region.config.relay && region.relay_down)) {
    ++region.stats.pull_failures;
    c.sync_scheduled = true;
    At(now_ + std::max(config_.cluster.sync_interval, kRetry), Ev::kSyncCheck, index, c.epoch);
    return;
  }
  const uint64_t target = *store_latest_;
  const Plan& plan = PlanFor(c.held, target);
  if (!failure_.ok()) return;
  // `latest`, then the manifests (16 at a time), each a round trip; then the blobs in turn.
  const Micros rtt = 2 * region.config.latency;
  const Micros t = now_ + rtt + rtt * static_cast<Micros>((plan.manifests + 15) / 16);
  c.pull_plan = &plan;
  c.pull_next = 0;
  ++region.stats.pulls;
  if (plan.from_keyframe) ++region.stats.keyframe_pulls;
  region.stats.versions_pulled.insert(target);
  c.pulling = true;
  c.pull_target = target;
  At(t, Ev::kPullStart, index, c.epoch);
}

void Simulation::Commit(ClusterState& c) {
  const uint32_t index = c.index;
  c.pulling = false;
  const uint64_t v = c.pull_target;
  c.held = v;
  // Jobs in progress go on at the new version from the token they reached.
  for (auto& [run, r] : c.running) {
    const double done =
        r.end > r.start ? static_cast<double>(now_ - r.start) / static_cast<double>(r.end - r.start)
                        : 1.0;
    const uint64_t token = std::min<uint64_t>(
        r.tokens - 1, static_cast<uint64_t>(std::floor(done * static_cast<double>(r.tokens))));
    auto& segs = r.segments;
    if (segs.back().first == v) continue;
    if (segs.back().second >= token) {
      segs.back().first = v;  // no token at the previous version past the last boundary
      if (segs.size() >= 2 && segs[segs.size() - 2].first == v) segs.pop_back();
    } else {
      segs.emplace_back(v, token);
    }
  }
  // Publication to ready, per region.
  const uint64_t from = c.ready_any ? c.ready_counted + 1 : c.countable_from;
  for (uint64_t u = std::max(from, c.countable_from); u <= v; ++u) {
    if (u < ready_delays_.size()) ready_delays_[u][c.region].push_back(now_ - published_at_[u]);
  }
  c.ready_any = true;
  c.ready_counted = v;
  Heartbeat(c, false);
  if (store_latest_ && *store_latest_ > v && !c.sync_scheduled) {
    c.sync_scheduled = true;
    At(now_ + config_.cluster.sync_interval, Ev::kSyncCheck, index, c.epoch);
  }
}

void Simulation::Park(ClusterState& c) {
  if (c.parked) return;
  c.parked = true;
  c.park_key = ++park_keys_;
  parked_.insert({c.park_key, c.index});
}

void Simulation::Unpark(ClusterState& c) {
  if (!c.parked) return;
  parked_.erase({c.park_key, c.index});
  c.parked = false;
}

// The parked lease requests, oldest first, while there are jobs to lease (as the service retries
// its parked long polls).
void Simulation::WakeParked() {
  if (parked_.empty() || core_.queued_jobs() == 0) return;
  std::vector<uint32_t> waiting;
  for (const auto& [key, index] : parked_) waiting.push_back(index);
  for (uint32_t index : waiting) {
    if (core_.queued_jobs() == 0 || !failure_.ok()) break;
    ClusterState& c = clusters_[index];
    Unpark(c);
    AskForLeases(c);
  }
}

void Simulation::AskForLeases(ClusterState& c) {
  const uint32_t index = c.index;
  if (!c.up || c.draining || !c.registered || !OrchestratorReachable(c)) return;
  const uint32_t free = c.capacity - std::min<uint32_t>(c.capacity, c.running.size());
  if (free == 0) return Unpark(c);
  const uint64_t admissible = core_.admissible_version();
  Result<std::vector<Lease>> leases = Timed([&] { return core_.RequestLeases(now_, c.id, free); });
  if (!leases.ok()) {
    if (leases.status().code() == StatusCode::kNotFound) c.registered = false;
    return Unpark(c);
  }
  if (!leases->empty()) {
    Call call{Call::kLeases, now_, index, free};
    call.granted = leases->size();
    Log(std::move(call), false);
    // Leases go only to clusters ready at an admissible version, within their capacity.
    if (!c.proven || *c.proven < admissible || !c.held || *c.held < *c.proven) {
      Fail("leases only to ready clusters",
           c.id + " was granted " + std::to_string(leases->size()) + " leases while proven at " +
               (c.proven ? std::to_string(*c.proven) : "nothing") + ", admissible " +
               std::to_string(admissible));
    }
    CheckCluster(c);
  }
  const GenerationConfig& g = config_.generation;
  for (const Lease& lease : *leases) {
    Running r;
    r.job = lease.job;
    r.attempt = lease.attempt;
    r.start = now_;
    r.tokens = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(c.rng.Lognormal(
                                         g.response_tokens.median, g.response_tokens.sigma))));
    const double tps =
        c.rng.Lognormal(g.tokens_per_second.median, g.tokens_per_second.sigma) * c.speed;
    r.end = now_ + Duration(static_cast<double>(r.tokens) / tps);
    r.segments = {{*c.held, 0}};
    const uint64_t run = c.next_run++;
    c.running.emplace(run, std::move(r));
    At(c.running[run].end, Ev::kJobDone, index, c.epoch, run);
  }
  if (leases->size() < free) {
    Park(c);
    if (core_.queued_jobs() > 0 && !c.retry_scheduled) {  // the long poll runs out
      c.retry_scheduled = true;
      At(now_ + config_.cluster.lease_wait, Ev::kLeaseRetry, index, c.epoch);
    }
  } else {
    Unpark(c);
  }
}

void Simulation::JobDone(ClusterState& c, uint64_t run) {
  auto found = c.running.find(run);
  if (found == c.running.end()) return;
  Running r = std::move(found->second);
  c.running.erase(found);
  regions_[c.region].stats.busy_slot_us += static_cast<double>(now_ - r.start);
  TrajectoryGroup g;
  g.job = r.job;
  g.attempt = r.attempt;
  g.cluster = c.id;
  g.segments = std::move(r.segments);
  g.version_start = g.version_end = g.segments[0].first;
  for (const auto& [version, token] : g.segments) {
    g.version_start = std::min(g.version_start, version);
    g.version_end = std::max(g.version_end, version);
  }
  g.tokens = r.tokens;
  g.trajectories = "{}";
  c.pending.push_back(std::move(g));
  FlushPending(c);
  AskForLeases(c);
}

// Submits what the cluster finished, once the orchestrator is reachable and has heard of every
// version the groups used (a worker heartbeats before it submits tokens of a new version).
void Simulation::FlushPending(ClusterState& c) {
  if (c.pending.empty() || !c.registered || !OrchestratorReachable(c)) return;
  std::vector<TrajectoryGroup> waiting;
  for (TrajectoryGroup& g : c.pending) {
    if (g.version_end > c.max_proven || !c.proven) {
      waiting.push_back(std::move(g));
      continue;
    }
    if (!SubmitOne(c, g)) waiting.push_back(std::move(g));
  }
  c.pending = std::move(waiting);
}

// Whether the submission got an answer (accepted, duplicate or refused); false: ask again later.
bool Simulation::SubmitOne(ClusterState& c, const TrajectoryGroup& group) {
  RegionStats& stats = regions_[c.region].stats;
  Result<SubmitResult> result = Timed([&] { return core_.Submit(now_, group); });
  if (!result.ok()) {  // re-leased and done elsewhere, given up, or a lease the journal lost
    ++rejected_;
    ++stats.rejected;
    return true;
  }
  if (*result == SubmitResult::kDuplicate) {
    ++duplicates_;
    return true;
  }
  Call call{Call::kSubmit, now_, c.index};
  call.group = group;
  Log(std::move(call), true);
  if (group.job >= accepted_.size()) accepted_.resize(group.job + 1024, 0);
  if (++accepted_[group.job] > 1) {
    Fail("no trajectory delivered twice",
         "job " + std::to_string(group.job) + " was accepted twice (the second from " + c.id + ")");
  }
  ++accepted_total_;
  ++stats.accepted;
  if (phase_ == Phase::kCollecting && !trainer_wake_pending_ &&
      core_.buffered() >= config_.trainer.prompts_per_step - collected_) {
    trainer_wake_pending_ = true;
    At(now_, Ev::kTrainer, 0, static_cast<uint32_t>(++trainer_wake_epoch_));
  }
  return true;
}

// A graceful leave (a preemption with notice, a scale-down): stop leasing, hand back the jobs that
// cannot finish within the notice, finish the rest, then deregister.
void Simulation::Leave(ClusterState& c, Micros notice) {
  const uint32_t index = c.index;
  if (!c.up) return;
  c.draining = true;
  Unpark(c);
  std::vector<uint64_t> hand_back;
  for (auto it = c.running.begin(); it != c.running.end();) {
    if (it->second.end > now_ + notice) {
      hand_back.push_back(it->second.job);
      regions_[c.region].stats.busy_slot_us += static_cast<double>(now_ - it->second.start);
      it = c.running.erase(it);
    } else {
      ++it;
    }
  }
  if (OrchestratorReachable(c) && c.registered && !hand_back.empty()) {
    Status s = Timed([&] { return core_.Drain(now_, c.id, hand_back, true); });
    if (s.ok()) {
      Call call{Call::kDrain, now_, index};
      call.jobs = hand_back;
      Log(std::move(call), true);
      WakeParked();
    }
  }
  At(now_ + notice, Ev::kLeave, index, c.epoch);
}

// ---------------------------------------------------------------------------------------------
// The trainer: tops up jobs, collects a step's groups, steps, publishes a version, announces it.

void Simulation::TrainerWake() {
  trainer_wake_pending_ = false;
  if (phase_ == Phase::kCollecting) TrainerCollect();
}

void Simulation::TrainerCollect() {
  const TrainerConfig& t = config_.trainer;
  if (!orchestrator_up_) return;  // OrchestratorUp wakes the trainer
  const uint64_t remaining =
      t.steps == 0 ? t.steps_ahead : std::min<uint64_t>(t.steps_ahead, t.steps - step_);
  const uint64_t want = static_cast<uint64_t>(t.prompts_per_step) * remaining;
  const uint64_t have = core_.queued_jobs() + core_.leased_jobs() + core_.buffered();
  if (have < want) {
    const std::vector<JobSpec> jobs(want - have, JobSpec{job_prompt_, t.samples_per_prompt});
    Timed([&] { return core_.AddJobs(now_, jobs); });
    Log({Call::kJobs, now_, 0, jobs.size()}, true);
    WakeParked();
  }
  const uint64_t need = t.prompts_per_step - collected_;
  const uint64_t admissible = core_.admissible_version();
  Batch batch = Timed([&] { return core_.TakeBatch(now_, need, last_batch_); });
  if (batch.id != 0 || batch.acknowledged > 0) {
    Call call{Call::kBatch, now_, 0, need};
    call.version = last_batch_;
    Log(std::move(call), true);
  }
  if (batch.id != 0) {
    last_batch_ = batch.id;
    for (const orchestrator::Delivered& d : batch.items) {
      const TrajectoryGroup& g = d.group;
      if (g.job >= delivered_.size()) delivered_.resize(g.job + 1024, 0);
      if (++delivered_[g.job] > 1) {
        Fail("no trajectory delivered twice",
             "job " + std::to_string(g.job) + " reached the trainer twice");
      }
      if (!d.stale && g.version_start < admissible) {
        Fail("no staleness violation",
             "job " + std::to_string(g.job) + " delivered fresh from version " +
                 std::to_string(g.version_start) + ", admissible " + std::to_string(admissible));
      }
      ++delivered_items_;
      RegionStats& stats = regions_[clusters_[cluster_index_.at(g.cluster)].region].stats;
      ++(d.stale ? stats.delivered_stale : stats.delivered_fresh);
      ++stats.lag[(announced_ ? *announced_ : 0) - g.version_start];
      ++collected_;
    }
    WakeParked();  // room in flight
  }
  CheckCounters();
  if (collected_ >= t.prompts_per_step) {
    idle_us_ += now_ - wait_since_;
    collected_ = 0;
    phase_ = Phase::kStepping;
    const Micros step = Duration(trainer_rng_.Lognormal(Seconds(t.step_time), t.step_jitter));
    step_us_ += step;
    At(now_ + step, Ev::kTrainer, 0, static_cast<uint32_t>(++trainer_wake_epoch_));
    return;
  }
  trainer_wake_pending_ = true;
  At(now_ + kTrainerPoll, Ev::kTrainer, 0, static_cast<uint32_t>(++trainer_wake_epoch_));
}

void Simulation::StartPublish(uint64_t version) {
  if (version >= manifests_.size()) BuildManifest(version);
  const Manifest& m = manifests_[version];
  double bytes = 0;
  for (const BlobRef& blob : m.Blobs()) bytes += static_cast<double>(blob.bytes);
  const double encode =
      version == 0 ? 0 : config_.model.ServedBytes() / config_.model.encode_throughput;
  const Micros took = Duration(encode + bytes / config_.trainer.upload_bandwidth);
  publish_us_ += took;
  phase_ = Phase::kPublishing;
  At(now_ + took, Ev::kPublished, 0, 0, version);
}

void Simulation::Published(uint64_t version) {
  if (store_down_) {  // the manifest and `latest` wait for the store
    At(now_ + kRetry, Ev::kPublished, 0, 0, version);
    return;
  }
  store_latest_ = version;
  published_at_.resize(version + 1, now_);
  published_at_[version] = now_;
  ready_population_.resize(version + 1, std::vector<uint32_t>(regions_.size(), 0));
  ready_delays_.resize(version + 1, std::vector<std::vector<Micros>>(regions_.size()));
  Announce(version);
  for (uint32_t i = 0; i < clusters_.size(); ++i) {
    ClusterState& c = clusters_[i];
    if (!c.up) continue;
    ++ready_population_[version][c.region];
    if (version == 0 && c.preloaded && !c.held && !c.pulling) {  // staged before the run
      c.pulling = true;
      c.pull_target = 0;
      Commit(c);
      continue;
    }
    if (!c.sync_scheduled && !c.pulling) {
      c.sync_scheduled = true;
      const Micros notice =
          static_cast<Micros>(c.rng.Below(static_cast<uint64_t>(config_.cluster.sync_interval))) +
          2 * regions_[c.region].config.latency;
      At(now_ + notice, Ev::kSyncCheck, i, c.epoch);
    }
  }
  if (config_.trainer.steps != 0 && step_ >= config_.trainer.steps) {
    phase_ = Phase::kDone;
    return;
  }
  phase_ = Phase::kCollecting;
  wait_since_ = now_;
  TrainerCollect();
}

// ---------------------------------------------------------------------------------------------
// Faults.

void Simulation::CrashOrchestrator(Micros duration) {
  ++crashes_;
  // The state as the journal on disk has it: the last checkpoint and the calls up to the last one
  // that was waited for; heartbeats and lease grants after it are lost.
  const size_t lost = log_.size() - durable_length_;
  lost_calls_ += lost;
  log_.resize(durable_length_);
  Result<OrchestratorCore> restored =
      OrchestratorCore::Restore(config_.core, checkpoint_.Snapshot());
  if (!restored.ok())
    return Fail("journal replay",
                "the checkpoint does not restore: " + restored.status().message());
  OrchestratorCore core = std::move(*restored);
  for (const Call& call : log_) {
    ++replayed_calls_;
    Status s;
    switch (call.kind) {
      case Call::kRegister:
        s = core.Register(call.now, clusters_[call.cluster].id,
                          regions_[clusters_[call.cluster].region].config.name,
                          static_cast<uint32_t>(call.a));
        break;
      case Call::kHeartbeat:
        s = core.Heartbeat(call.now, clusters_[call.cluster].id, call.version);
        break;
      case Call::kDrain:
        s = core.Drain(call.now, clusters_[call.cluster].id, call.jobs, true);
        break;
      case Call::kDeregister:
        s = core.Deregister(call.now, clusters_[call.cluster].id);
        break;
      case Call::kLeases: {
        auto leases =
            core.RequestLeases(call.now, clusters_[call.cluster].id, static_cast<uint32_t>(call.a));
        if (!leases.ok()) {
          s = leases.status();
        } else if (leases->size() != call.granted) {
          s = Internal("a replayed lease request granted " + std::to_string(leases->size()) +
                       ", not " + std::to_string(call.granted));
        }
        break;
      }
      case Call::kSubmit: {
        auto result = core.Submit(call.now, call.group);
        if (!result.ok()) s = result.status();
        break;
      }
      case Call::kAnnounce:
        s = core.AnnounceVersion(call.now, call.a);
        break;
      case Call::kJobs:
        core.AddJobs(
            call.now,
            std::vector<JobSpec>(call.a, JobSpec{job_prompt_, config_.trainer.samples_per_prompt}));
        break;
      case Call::kBatch:
        core.TakeBatch(call.now, call.a, call.version);
        break;
      case Call::kTick:
        core.Tick(call.now);
        break;
    }
    if (!s.ok()) return Fail("journal replay", "a journaled call failed on replay: " + s.message());
  }
  core_ = std::move(core);
  // What the orchestrator now believes of each cluster (heartbeats in the lost tail are
  // forgotten): a cluster proves its version again before it submits tokens of it.
  for (ClusterState& c : clusters_) {
    const std::optional<orchestrator::ClusterView> view = core_.cluster(c.id);
    c.proven = view ? view->ready_version : std::nullopt;
    c.max_proven = c.proven ? *c.proven : 0;
  }
  checkpoint_ = core_;
  log_.clear();
  durable_length_ = 0;
  orchestrator_up_ = false;
  parked_.clear();
  for (ClusterState& c : clusters_) c.parked = false;
  fault_log_.push_back(
      {{"t", Seconds(now_)}, {"event", "orchestrator state replayed"}, {"calls_lost", lost}});
  At(now_ + duration, Ev::kOrchestratorUp);
}

void Simulation::OrchestratorUp() {
  orchestrator_up_ = true;
  CoreTick();  // clusters silent for longer than cluster_timeout are lost at once
  if (unannounced_) Announce(*unannounced_);
  if (phase_ == Phase::kCollecting) TrainerCollect();
  CheckAll();
}

void Simulation::FaultStart(size_t index) {
  const Fault& f = config_.faults[index];
  nlohmann::json entry = {{"t", Seconds(now_)}, {"event", FaultName(f.kind)}};
  if (!f.region.empty()) entry["region"] = f.region;
  auto region_index = [&]() -> uint32_t {
    for (uint32_t r = 0; r < regions_.size(); ++r)
      if (regions_[r].config.name == f.region) return r;
    return 0;
  };
  switch (f.kind) {
    case Fault::Kind::kOrchestratorCrash:
      CrashOrchestrator(f.duration);
      break;
    case Fault::Kind::kPartition:
      regions_[region_index()].partitioned = true;
      At(now_ + f.duration, Ev::kFaultEnd, static_cast<uint32_t>(index));
      break;
    case Fault::Kind::kRelayDown:
      regions_[region_index()].relay_down = true;
      At(now_ + f.duration, Ev::kFaultEnd, static_cast<uint32_t>(index));
      break;
    case Fault::Kind::kStoreDown:
      store_down_ = true;
      At(now_ + f.duration, Ev::kFaultEnd, static_cast<uint32_t>(index));
      break;
    case Fault::Kind::kPreempt: {
      uint64_t hit = 0;
      for (uint32_t i = 0; i < clusters_.size(); ++i) {
        ClusterState& c = clusters_[i];
        if (!c.up || (!f.region.empty() && regions_[c.region].config.name != f.region)) continue;
        if (!fault_rng_.Chance(f.fraction)) continue;
        ++hit;
        if (f.duration > 0) At(now_ + f.notice + f.duration, Ev::kRestart, i);
        if (f.notice > 0) {
          Leave(c, f.notice);
        } else {
          StopCluster(c, true);  // gone without a word: the orchestrator finds out by timeout
        }
      }
      entry["clusters"] = hit;
      break;
    }
    case Fault::Kind::kJoin: {
      const uint32_t r = region_index();
      for (uint32_t n = 0; n < f.count; ++n) StartCluster(AddCluster(r, false));
      entry["clusters"] = f.count;
      break;
    }
    case Fault::Kind::kLeave: {
      const uint32_t r = region_index();
      uint32_t left = 0;
      for (uint32_t i = static_cast<uint32_t>(clusters_.size()); i-- > 0 && left < f.count;) {
        ClusterState& c = clusters_[i];
        if (c.region != r || !c.up || c.draining) continue;
        c.leaving = true;
        Leave(c, f.notice);
        ++left;
      }
      entry["clusters"] = left;
      break;
    }
  }
  fault_log_.push_back(entry);
}

void Simulation::FaultEnd(size_t index) {
  const Fault& f = config_.faults[index];
  for (RegionState& region : regions_) {
    if (region.config.name != f.region) continue;
    if (f.kind == Fault::Kind::kPartition) region.partitioned = false;
    if (f.kind == Fault::Kind::kRelayDown) region.relay_down = false;
  }
  if (f.kind == Fault::Kind::kStoreDown) store_down_ = false;
  fault_log_.push_back({{"t", Seconds(now_)},
                        {"event", std::string(FaultName(f.kind)) + " over"},
                        {"region", f.region}});
  // Everyone affected catches up at once rather than at its next timer.
  for (uint32_t i = 0; i < clusters_.size(); ++i) {
    ClusterState& c = clusters_[i];
    if (!c.up) continue;
    if (f.kind == Fault::Kind::kPartition && regions_[c.region].config.name == f.region)
      Heartbeat(c, false);
    if (!c.sync_scheduled && !c.pulling) {
      c.sync_scheduled = true;
      At(now_ +
             static_cast<Micros>(c.rng.Below(static_cast<uint64_t>(config_.cluster.sync_interval))),
         Ev::kSyncCheck, i, c.epoch);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The run.

SimResult Simulation::Run() {
  for (const RegionConfig& rc : config_.regions) {
    RegionState region;
    region.config = rc;
    regions_.push_back(std::move(region));
  }
  // The fleet at the start; stragglers are picked per cluster.
  for (uint32_t r = 0; r < regions_.size(); ++r) {
    for (uint32_t n = 0; n < regions_[r].config.clusters; ++n)
      AddCluster(r, config_.cluster.preloaded);
  }
  for (uint32_t i = 0; i < clusters_.size(); ++i) StartCluster(i);
  for (size_t i = 0; i < config_.faults.size(); ++i)
    At(config_.faults[i].at, Ev::kFaultStart, static_cast<uint32_t>(i));
  At(config_.tick, Ev::kTick);
  if (options_.break_invariant_at > 0) At(0, Ev::kBreak);
  StartPublish(0);

  while (!queue_.empty() && failure_.ok()) {
    const Event e = queue_.top();
    if (e.t > config_.duration) break;
    queue_.pop();
    now_ = e.t;
    ++events_;
    ClusterState* c = e.entity < clusters_.size() ? &clusters_[e.entity] : nullptr;
    const bool live = c != nullptr && c->up && c->epoch == e.epoch;
    switch (e.kind) {
      case Ev::kTick:
        if (orchestrator_up_) CoreTick();
        At(now_ + config_.tick, Ev::kTick);
        break;
      case Ev::kTrainer:
        if (e.epoch == static_cast<uint32_t>(trainer_wake_epoch_)) {
          if (phase_ == Phase::kStepping) {
            ++step_;
            StartPublish(step_);
          } else {
            TrainerWake();
          }
        }
        break;
      case Ev::kPublished:
        Published(e.arg);
        break;
      case Ev::kHeartbeat:
        if (live) Heartbeat(*c, true);
        break;
      case Ev::kSyncCheck:
        if (live) SyncCheck(*c);
        break;
      case Ev::kCommit:
        if (live && c->pulling) Commit(*c);
        break;
      case Ev::kJobDone:
        if (live) JobDone(*c, e.arg);
        break;
      case Ev::kLeaseRetry:
        if (live) {
          c->retry_scheduled = false;
          if (c->parked) {
            Unpark(*c);
            AskForLeases(*c);
          }
        }
        break;
      case Ev::kLeave:
        if (live) {
          // Finish what is left, deregister, go.
          if (OrchestratorReachable(*c) && c->registered) {
            FlushPending(*c);
            Status s = Timed([&] { return core_.Deregister(now_, c->id); });
            if (s.ok()) {
              Log({Call::kDeregister, now_, e.entity}, true);
              WakeParked();
            }
          }
          StopCluster(*c, true);
        }
        break;
      case Ev::kCrash:
        if (live) {
          StopCluster(*c, true);
          At(now_ + config_.cluster.restart_after, Ev::kRestart, e.entity);
          fault_log_.push_back(
              {{"t", Seconds(now_)}, {"event", "cluster crash"}, {"cluster", c->id}});
        }
        break;
      case Ev::kRestart:
        if (c != nullptr && !c->up && !c->leaving) StartCluster(e.entity);
        break;
      case Ev::kFaultStart:
        FaultStart(e.entity);
        break;
      case Ev::kFaultEnd:
        FaultEnd(e.entity);
        break;
      case Ev::kOrchestratorUp:
        OrchestratorUp();
        break;
      case Ev::kLinkDone:
        if (e.epoch == regions_[e.entity].link_epoch) LinkDone(e.entity);
        break;
      case Ev::kPullStart:
      case Ev::kPullStep:
        if (live && c->pulling) PullNext(*c);
        break;
      case Ev::kBreak:
        if (events_ >= options_.break_invariant_at) {
          // A cluster that claims to serve a version it never pulled.
          for (ClusterState& x : clusters_) {
            if (x.up && x.proven) {
              x.proven = *x.proven + 1;
              CheckCluster(x);
              break;
            }
          }
        } else {
          At(now_ + kSecond, Ev::kBreak);
        }
        break;
    }
    CheckCounters();
  }
  if (failure_.ok()) {
    now_ = std::max(now_, config_.duration);
    CheckAll();
  }
  if (phase_ == Phase::kCollecting) idle_us_ += now_ - wait_since_;
  for (ClusterState& c : clusters_) {
    if (!c.up) continue;
    RegionStats& stats = regions_[c.region].stats;
    stats.alive_slot_us += static_cast<double>(now_ - c.up_since) * c.capacity;
    for (const auto& [run, r] : c.running)
      stats.busy_slot_us += static_cast<double>(now_ - r.start);
  }
  SimResult result;
  result.report = Report();
  result.failure = failure_;
  result.events = events_;
  result.invariant_checks = checks_;
  result.simulated_seconds = Seconds(now_);
  result.core_seconds = std::chrono::duration<double>(core_time_).count();
  return result;
}

// ---------------------------------------------------------------------------------------------
// The report.

// Seconds from publication until `q` of the `population` clusters were ready (infinity: never).
double ReadyAfter(std::vector<Micros>& sorted, uint32_t population, double q) {
  const size_t needed = std::max<size_t>(1, static_cast<size_t>(std::ceil(q * population)));
  return sorted.size() >= needed ? Seconds(sorted[needed - 1])
                                 : std::numeric_limits<double>::infinity();
}

nlohmann::json Finite(double x) {
  return std::isinf(x) ? nlohmann::json(nullptr) : nlohmann::json(x);
}

// A lag histogram as a JSON object (lags as keys).
nlohmann::json HistogramJson(const std::map<uint64_t, uint64_t>& histogram) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [lag, count] : histogram) out[std::to_string(lag)] = count;
  return out;
}

// The median and the worst over versions, "never" (infinite) counting as the longest.
std::pair<nlohmann::json, nlohmann::json> MedianAndWorst(std::vector<double> values) {
  if (values.empty()) return {nullptr, nullptr};
  std::sort(values.begin(), values.end());
  return {Finite(values[values.size() / 2]), Finite(values.back())};
}

nlohmann::json Simulation::Report() {
  nlohmann::json report;
  const Counters& k = core_.counters();
  const double duration = Seconds(now_);
  report["name"] = config_.name;
  report["seed"] = config_.seed;
  report["simulated_seconds"] = duration;
  report["events"] = events_;
  report["invariant_checks"] = checks_;
  report["failure"] = failure_.ok() ? nlohmann::json(nullptr) : nlohmann::json(failure_.message());
  report["settings"] = {
      {"max_staleness", config_.core.max_staleness},
      {"dispatch", orchestrator::DispatchName(config_.core.dispatch)},
      {"stale_policy",
       config_.core.stale_policy == orchestrator::StalePolicy::kDrop ? "drop" : "deliver_flagged"},
      {"clusters", clusters_.size()},
      {"parameters", config_.model.parameters},
      {"format", config_.model.format},
      {"bits_per_change", model_bits_},
  };
  const double total = static_cast<double>(idle_us_ + step_us_ + publish_us_);
  report["trainer"] = {
      {"steps", step_},
      {"versions_published", store_latest_ ? *store_latest_ + 1 : 0},
      {"idle_seconds", Seconds(idle_us_)},
      {"step_seconds", Seconds(step_us_)},
      {"publish_seconds", Seconds(publish_us_)},
      {"idle_fraction", total > 0 ? static_cast<double>(idle_us_) / total : 0.0},
  };
  uint64_t lag_total = 0, lag_groups = 0;
  std::map<uint64_t, uint64_t> lag_all;
  nlohmann::json regions = nlohmann::json::array();
  for (uint32_t r = 0; r < regions_.size(); ++r) {
    const RegionState& region = regions_[r];
    const RegionStats& s = region.stats;
    for (const auto& [l, n] : s.lag) {
      lag_all[l] += n;
      lag_total += l * n;
      lag_groups += n;
    }
    // Publication to 50/90/100% of the clusters that were up at publication (and did not go down
    // before reaching it) being ready at that version or newer: the median and the worst over
    // versions (null: never reached within the run).
    std::vector<double> after[3];
    uint64_t versions = 0, never_full = 0;
    for (uint64_t v = 0; v < ready_delays_.size(); ++v) {
      const uint32_t population = ready_population_[v][r];
      if (population == 0) continue;
      ++versions;
      std::vector<Micros> sorted = ready_delays_[v][r];
      std::sort(sorted.begin(), sorted.end());
      after[0].push_back(ReadyAfter(sorted, population, 0.5));
      after[1].push_back(ReadyAfter(sorted, population, 0.9));
      after[2].push_back(ReadyAfter(sorted, population, 1.0));
      if (std::isinf(after[2].back())) ++never_full;
    }
    const auto [p50, p50_worst] = MedianAndWorst(after[0]);
    const auto [p90, p90_worst] = MedianAndWorst(after[1]);
    const auto [p100, p100_worst] = MedianAndWorst(after[2]);
    const double full_checkpoints_relay =
        static_cast<double>(s.versions_pulled.size()) * keyframe_bytes_;
    const double full_checkpoints_direct = static_cast<double>(s.pulls) * keyframe_bytes_;
    regions.push_back({
        {"name", region.config.name},
        {"relay", region.config.relay},
        {"clusters_at_end",
         std::count_if(clusters_.begin(), clusters_.end(),
                       [&](const ClusterState& c) { return c.region == r && c.up; })},
        {"rollout_utilisation", s.alive_slot_us > 0 ? s.busy_slot_us / s.alive_slot_us : 0.0},
        {"groups_accepted", s.accepted},
        {"groups_delivered_fresh", s.delivered_fresh},
        {"groups_delivered_stale", s.delivered_stale},
        {"submissions_refused", s.rejected},
        {"staleness", HistogramJson(s.lag)},
        {"ready_after_publication",
         {{"versions", versions},
          {"p50_median", p50},
          {"p90_median", p90},
          {"p100_median", p100},
          {"p50_worst", p50_worst},
          {"p90_worst", p90_worst},
          {"p100_worst", p100_worst},
          {"versions_never_fully_ready", never_full}}},
        {"wan_bytes", s.wan_bytes},
        {"wan_bytes_with_relay", s.unique_blob_bytes},
        {"wan_bytes_without_relay", s.downloaded_bytes},
        {"wan_bytes_full_checkpoints_with_relay", full_checkpoints_relay},
        {"wan_bytes_full_checkpoints_without_relay", full_checkpoints_direct},
        {"pulls", s.pulls},
        {"keyframe_pulls", s.keyframe_pulls},
        {"pulls_deferred", s.pull_failures},
        {"relay",
         {{"hits", s.relay_hits}, {"misses", s.relay_misses}, {"evictions", s.relay_evictions}}},
    });
  }
  report["regions"] = regions;
  report["staleness"] = {
      {"histogram", HistogramJson(lag_all)},
      {"mean", lag_groups > 0 ? static_cast<double>(lag_total) / lag_groups : 0.0}};
  report["trajectories"] = {
      {"accepted", k.submissions_accepted},
      {"delivered_fresh", k.delivered_fresh},
      {"delivered_stale", k.delivered_stale},
      {"dropped_stale", k.dropped_stale},
      {"given_up", k.jobs_given_up},
      {"duplicates", duplicates_},
      {"refused", rejected_},
      {"buffered_at_end", core_.buffered()},
  };
  report["orchestrator"] = {
      {"jobs_added", k.jobs_added},
      {"leases_granted", k.leases_granted},
      {"leases_expired", k.leases_expired},
      {"leases_handed_back", k.leases_handed_back},
      {"leases_cancelled", k.leases_cancelled},
      {"clusters_lost", k.clusters_lost},
      {"crashes", crashes_},
      {"journal_calls_replayed", replayed_calls_},
      {"journal_calls_lost", lost_calls_},
  };
  report["store"] = {
      {"keyframe_bytes", keyframe_bytes_},
      {"keyframes", keyframes_published_},
      {"bytes_published", bytes_published_},
      {"mean_delta_bytes",
       manifests_.size() > 1
           ? [&] {
               double sum = 0;
               for (size_t v = 1; v < manifests_.size(); ++v) sum += manifests_[v].delta->bytes;
               return sum / static_cast<double>(manifests_.size() - 1);
             }()
           : 0.0},
  };
  report["faults"] = fault_log_;
  return report;
}

}  // namespace

SimResult Simulate(const SimConfig& config, const SimOptions& options) {
  Simulation simulation(config, options);
  return simulation.Run();
}

}  // namespace weft::sim
