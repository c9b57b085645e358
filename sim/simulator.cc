// Simulate() (sim/simulator.h): one Simulation (sim/simulation.h) per run. Here: its
// construction, and the run itself, which builds the fleet, schedules the faults, the ticks and the
// first publication, dispatches the events in (time, sequence) order with the invariant checks
// after each, and does the accounting at the end.
#include "sim/simulator.h"

#include <chrono>

#include "sim/simulation.h"

namespace weft::sim::internal {
namespace {

// Default delta bits per changed element, from bench/codec_bench (synthetic Adam steps at
// lr 1e-6): BF16 9.5, block-scaled FP8 14.3.
constexpr double kDefaultBitsBf16 = 9.5;
constexpr double kDefaultBitsFp8 = 14.3;

}  // namespace

Simulation::Simulation(const SimConfig& config, const SimOptions& options)
    : config_(config), options_(options), core_(config.core), checkpoint_(config.core) {
  model_bits_ = config.model.bits_per_change > 0 ? config.model.bits_per_change
                : config.model.format == "fp8"   ? kDefaultBitsFp8
                                                 : kDefaultBitsBf16;
  keyframe_bytes_ = config.model.ServedBytes();
  trainer_rng_ = Rng(config.seed, 1);
  fault_rng_ = Rng(config.seed, 2);
  job_prompt_ = "\"p\"";
}

SimResult Simulation::Run() {
  for (const RegionConfig& rc : config_.regions) {
    RegionState region;
    region.config = rc;
    if (rc.relay_cache != 0) region.cache = policy_store::CacheIndex<uint64_t>(rc.relay_cache);
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
            if (api_.Deregister(c->id).ok()) WakeParked();
          }
          StopCluster(*c);
        }
        break;
      case Ev::kCrash:
        if (live) {
          StopCluster(*c);
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
  for (const ClusterState& c : clusters_)
    if (c.up) CountSlotTime(c);
  SimResult result;
  result.report = Report();
  result.failure = failure_;
  result.events = events_;
  result.invariant_checks = checks_;
  result.simulated_seconds = Seconds(now_);
  result.core_seconds = std::chrono::duration<double>(core_time_).count();
  return result;
}

}  // namespace weft::sim::internal

namespace weft::sim {

SimResult Simulate(const SimConfig& config, const SimOptions& options) {
  internal::Simulation simulation(config, options);
  return simulation.Run();
}

}  // namespace weft::sim
