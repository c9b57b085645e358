// The orchestrator as the simulation runs it: calls into the real core, timed and logged for the
// journal model; the crash that restores the last checkpoint through the real snapshot code and
// replays the journal's durable part; and the restart, which ticks at once as the service does.
#include "sim/simulation.h"

#include <string>
#include <vector>

namespace weft::sim::internal {

Status Simulation::Api::Register(const std::string& cluster, const std::string& region,
                                 uint32_t capacity, const orchestrator::ModelRef&) {
  Simulation& sim = sim_;
  ClusterState& c = Cluster(cluster);
  Status s = sim.Timed([&] { return sim.core_.Register(sim.now_, cluster, region, capacity); });
  if (s.ok()) {
    sim.Log({Call::kRegister, sim.now_, c.index, capacity}, true);
    c.registered = true;
    c.draining = false;
  }
  return s;
}

Status Simulation::Api::Heartbeat(const std::string& cluster, std::optional<uint64_t> ready,
                                  const orchestrator::SyncReport*) {
  Simulation& sim = sim_;
  ClusterState& c = Cluster(cluster);
  Status s = sim.Timed([&] { return sim.core_.Heartbeat(sim.now_, cluster, ready); });
  if (s.ok()) {
    Call call{Call::kHeartbeat, sim.now_, c.index};
    call.version = ready;
    sim.Log(std::move(call), false);
    c.proven = ready;
    c.spoken = true;
  }
  return s;
}

Result<orchestrator::LeaseAnswer> Simulation::Api::RequestLeases(const std::string& cluster,
                                                                 uint32_t max,
                                                                 std::chrono::milliseconds) {
  Simulation& sim = sim_;
  const uint32_t index = Cluster(cluster).index;
  Result<std::vector<Lease>> leases =
      sim.Timed([&] { return sim.core_.RequestLeases(sim.now_, cluster, max); });
  if (!leases.ok()) return leases.status();
  if (!leases->empty()) {
    Call call{Call::kLeases, sim.now_, index, max};
    call.granted = leases->size();
    sim.Log(std::move(call), false);
  }
  return orchestrator::LeaseAnswer{std::move(*leases), sim.core_.latest_version()};
}

Result<SubmitResult> Simulation::Api::Submit(const TrajectoryGroup& group) {
  Simulation& sim = sim_;
  const uint32_t index = Cluster(group.cluster).index;
  Result<SubmitResult> result = sim.Timed([&] { return sim.core_.Submit(sim.now_, group); });
  if (result.ok() && *result != SubmitResult::kDuplicate) {
    Call call{Call::kSubmit, sim.now_, index};
    call.group = group;
    sim.Log(std::move(call), true);
  }
  return result;
}

Status Simulation::Api::HandBack(const std::string& cluster, const std::vector<uint64_t>& jobs,
                                 bool drain) {
  Simulation& sim = sim_;
  const uint32_t index = Cluster(cluster).index;
  Status s = sim.Timed([&] { return sim.core_.Drain(sim.now_, cluster, jobs, drain); });
  if (s.ok()) {
    Call call{drain ? Call::kDrain : Call::kRelease, sim.now_, index};
    call.jobs = jobs;
    sim.Log(std::move(call), true);
  }
  return s;
}

Status Simulation::Api::Deregister(const std::string& cluster) {
  Simulation& sim = sim_;
  const uint32_t index = Cluster(cluster).index;
  Status s = sim.Timed([&] { return sim.core_.Deregister(sim.now_, cluster); });
  if (s.ok()) sim.Log({Call::kDeregister, sim.now_, index}, true);
  return s;
}

Status Simulation::CoreRegister(ClusterState& c) {
  return api_.Register(c.id, regions_[c.region].config.name, c.capacity);
}

Status Simulation::CoreHeartbeat(ClusterState& c) {
  const rollout_worker::HeartbeatOutcome outcome = rollout_worker::SendHeartbeat(
      api_, c.id, regions_[c.region].config.name, c.capacity, c.worker.ready(), nullptr);
  // Unknown to the orchestrator and not registered again (or not heard since): register first
  // next time.
  if (outcome.registered_again && !outcome.status.ok()) c.registered = false;
  if (outcome.status.ok()) c.worker.Acknowledged(outcome.acknowledged);
  return outcome.status;
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
      case Call::kRelease:
        s = core.Drain(call.now, clusters_[call.cluster].id, call.jobs, false);
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

}  // namespace weft::sim::internal
