// A rollout cluster's life: it is added and started, heartbeats (registering when it must),
// notices new versions, pulls and commits them, asks for leases (parked when it got fewer than it
// asked for), runs and finishes jobs, submits the groups once the orchestrator has heard it prove
// their versions, leaves with notice, and stops.
#include "sim/simulation.h"

#include <string>
#include <vector>

namespace weft::sim::internal {

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
  c.NewWorker();
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

void Simulation::CountSlotTime(const ClusterState& c) {
  RegionStats& stats = regions_[c.region].stats;
  stats.alive_slot_us += static_cast<double>(now_ - c.up_since) * c.capacity;
  for (const auto& [run, r] : c.running) stats.busy_slot_us += static_cast<double>(now_ - r.start);
}

// The cluster goes down: its work in progress is lost to it (the orchestrator re-leases it).
void Simulation::StopCluster(ClusterState& c) {
  CountSlotTime(c);
  c.running.clear();
  c.pending.clear();
  c.up = false;
  c.registered = false;
  c.pulling = false;
  c.sync_scheduled = false;
  c.spoken = false;
  // Versions it was counted for at publication and never reached leave the population.
  for (uint64_t u = c.first_uncounted_version(); u < ready_population_.size(); ++u)
    --ready_population_[u][c.region];
  c.NewWorker();
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

void Simulation::ScheduleSyncCheck(ClusterState& c, Micros delay, bool pushed) {
  if (c.sync_scheduled || c.pulling) return;
  c.sync_scheduled = true;
  c.latest_pushed = pushed;
  const Micros within =
      config_.cluster.push
          ? 0
          : static_cast<Micros>(c.rng.Below(static_cast<uint64_t>(config_.cluster.sync_interval)));
  At(now_ + within + delay, Ev::kSyncCheck, c.index, c.epoch);
}

void Simulation::SyncCheck(ClusterState& c) {
  const uint32_t index = c.index;
  c.sync_scheduled = false;
  const bool pushed = c.latest_pushed;
  c.latest_pushed = false;
  if (!c.up || c.pulling || !store_latest_) return;
  if (!c.worker.PullTarget(*store_latest_)) return;
  RegionState& region = regions_[c.region];
  if (store_down_ || region.partitioned || (region.config.relay && region.relay_down)) {
    ++region.stats.pull_failures;
    c.sync_scheduled = true;
    At(now_ + std::max(config_.cluster.sync_interval, kRetry), Ev::kSyncCheck, index, c.epoch);
    return;
  }
  const uint64_t target = *store_latest_;
  const Plan& plan = PlanFor(c.worker.held(), target);
  if (!failure_.ok()) return;
  // `latest` (unless pushed), then the manifests (16 at a time), each a round trip; then the blobs
  // in turn.
  const Micros rtt = 2 * region.config.latency;
  const Micros t =
      now_ + (pushed ? 0 : rtt) + rtt * static_cast<Micros>((plan.manifests + 15) / 16);
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
  c.worker.Pulled(v);
  if (c.worker.ShouldLoad(now_)) c.worker.Loaded();  // the engine loads it as the pull ends
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
  for (uint64_t u = std::max(c.first_uncounted_version(), c.countable_from); u <= v; ++u) {
    if (u < ready_delays_.size()) ready_delays_[u][c.region].push_back(now_ - published_at_[u]);
  }
  c.ready_any = true;
  c.ready_counted = v;
  Heartbeat(c, false);
  if (store_latest_ && *store_latest_ > v && !c.sync_scheduled) {
    // Pushed: the long poll the worker makes next is answered at once, `latest` having changed.
    c.sync_scheduled = true;
    c.latest_pushed = config_.cluster.push;
    At(now_ + (config_.cluster.push ? 0 : config_.cluster.sync_interval), Ev::kSyncCheck, index,
       c.epoch);
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
  // The slots the worker leases with (none while it is not ready), less those running.
  const uint32_t leasable = c.worker.LeasableSlots(now_);
  const uint32_t free = leasable - std::min<uint32_t>(leasable, c.running.size());
  if (free == 0) return Unpark(c);
  const uint64_t admissible = core_.admissible_version();
  Result<orchestrator::LeaseAnswer> answer =
      api_.RequestLeases(c.id, free, std::chrono::milliseconds(0));
  if (!answer.ok()) {
    if (answer.status().code() == StatusCode::kNotFound) c.registered = false;
    return Unpark(c);
  }
  const std::vector<Lease>* leases = &answer->leases;
  if (!leases->empty()) {
    // Leases go only to clusters ready at an admissible version, within their capacity.
    const std::optional<uint64_t> ready = c.worker.ready();
    if (!c.proven || *c.proven < admissible || !ready || *ready < *c.proven) {
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
    r.segments = {{*c.worker.ready(), 0}};
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
  rollout_worker::AddSampleVersions(r.segments, r.tokens, &g);
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
  const uint64_t rejected = rejected_;
  for (TrajectoryGroup& g : c.pending) {
    if (!c.worker.MaySubmit(g.version_end)) {
      waiting.push_back(std::move(g));
      continue;
    }
    if (!SubmitOne(c, g)) waiting.push_back(std::move(g));
  }
  c.pending = std::move(waiting);
  if (rejected_ != rejected) WakeParked();  // the jobs handed back are queued again
}

// Whether the submission got an answer (accepted, duplicate or refused); false: ask again later.
bool Simulation::SubmitOne(ClusterState& c, const TrajectoryGroup& group) {
  RegionStats& stats = regions_[c.region].stats;
  Result<SubmitResult> result = api_.Submit(group);
  if (!result.ok()) {
    // Re-leased and done elsewhere, given up, a lease the journal lost, or tokens of a version the
    // orchestrator has not heard this cluster prove since it restarted: as the worker does, the
    // job goes back to the queue for another attempt.
    ++rejected_;
    ++stats.rejected;
    // (Refused when the lease is no longer this cluster's, which changes nothing.)
    (void)api_.Release(c.id, {group.job});
    return true;
  }
  if (*result == SubmitResult::kDuplicate) {
    ++duplicates_;
    return true;
  }
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
    if (api_.Drain(c.id, hand_back).ok()) WakeParked();
  }
  At(now_ + notice, Ev::kLeave, index, c.epoch);
}

}  // namespace weft::sim::internal
