// The network between the store and the clusters: each region's WAN link shared equally by the
// transfers in flight (processor sharing), its relay's cache of blobs (the relay's own policy,
// policy_store/cache_index.h) with the clusters waiting on a fetch, and a cluster's pull in
// progress, one blob after another, then the apply.
#include "sim/simulation.h"

#include <limits>
#include <vector>

namespace weft::sim::internal {

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
  region.flows[region.next_flow++] = {blob, static_cast<double>(bytes), cluster, epoch, bytes};
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

// A WAN transfer finished: a blob reached the relay (its waiters get it over the LAN) or the
// cluster that fetched it directly.
void Simulation::BlobArrived(uint32_t r, const Flow& flow) {
  RegionState& region = regions_[r];
  const Micros latency = region.config.latency;  // the last byte's way
  if (flow.cluster != kRelay) {
    At(now_ + latency, Ev::kPullStep, flow.cluster, flow.epoch);
    return;
  }
  auto found = region.fetching.find(flow.blob);
  if (found == region.fetching.end()) return;
  const std::vector<std::pair<uint32_t, uint32_t>> waiting = std::move(found->second);
  region.fetching.erase(found);
  // Held once all its bytes are there; beyond its size, the relay evicts the least recently used.
  const uint64_t bytes = flow.bytes;
  region.stats.relay_evictions += region.cache.Add(flow.blob, bytes).size();
  const Micros lan = Duration(static_cast<double>(bytes) / region.config.lan_bandwidth);
  for (const auto& [cluster, epoch] : waiting)
    At(now_ + latency + lan, Ev::kPullStep, cluster, epoch);
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
  if (region.cache.Touch(blob) != nullptr) {
    ++stats.relay_hits;
    At(now_ + Duration(static_cast<double>(bytes) / region.config.lan_bandwidth), Ev::kPullStep,
       index, c.epoch);
    return;
  }
  ++stats.relay_misses;
  if (!region.cache.Fits(bytes)) {
    // Larger than the relay's cache: read through it, from the upstream over the WAN.
    return StartFlow(c.region, blob, bytes, index, c.epoch);
  }
  auto [fetch, first] = region.fetching.try_emplace(blob);
  fetch->second.emplace_back(index, c.epoch);  // another cluster's fetch may be under way
  if (first) StartFlow(c.region, blob, bytes, kRelay, 0);
}

}  // namespace weft::sim::internal
