// The configured faults (docs/sim.md section 4, `faults[]`): what each does when it starts and,
// for those with a duration, when it ends; each goes into the report's fault log.
#include "sim/simulation.h"

#include <string>

namespace weft::sim::internal {

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
          StopCluster(c);  // gone without a word: the orchestrator finds out by timeout
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
    ScheduleSyncCheck(c, 0);
  }
}

}  // namespace weft::sim::internal
