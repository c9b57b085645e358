#include "rollout_worker/worker_core.h"

#include <algorithm>

namespace weft::rollout_worker {

WorkerCore::Change WorkerCore::EngineHealth(uint32_t ready_replicas,
                                            std::optional<uint64_t> engine_version) {
  ready_replicas_ = ready_replicas;
  if (ready_replicas == 0 && ready_) {
    ready_.reset();  // no replica can generate: stop claiming readiness
    return Change::kLost;
  }
  if (ready_replicas > 0 && !ready_ && engine_current_ && held_ && engine_version == held_) {
    ready_ = held_;  // the engine came back serving what is held
    return Change::kRegained;
  }
  return Change::kNone;
}

std::optional<uint64_t> WorkerCore::PullTarget(uint64_t latest) const {
  if (held_ && *held_ >= latest) return std::nullopt;
  return latest;
}

void WorkerCore::Pulled(uint64_t version) {
  held_ = version;
  engine_current_ = false;
}

void WorkerCore::CopyDropped() { held_.reset(); }

void WorkerCore::CopyCorrupted() {
  held_.reset();
  ready_.reset();
  engine_current_ = false;
}

bool WorkerCore::ShouldLoad(Micros now) const {
  return held_ && !engine_current_ && now >= load_retry_at_;
}

WorkerCore::Micros WorkerCore::LoadFailed(Micros now) {
  load_backoff_ = std::min(std::max(load_backoff_ * 2, kLoadBackoffFirst), kLoadBackoffMax);
  load_retry_at_ = now + load_backoff_;
  return load_backoff_;
}

void WorkerCore::Loaded() {
  load_backoff_ = 0;
  load_retry_at_ = 0;
  engine_current_ = true;
  ready_ = held_;
}

void WorkerCore::Acknowledged(std::optional<uint64_t> ready) {
  if (ready && (!acknowledged_ || *acknowledged_ < *ready)) acknowledged_ = ready;
}

uint32_t WorkerCore::LeasableSlots(Micros now) const {
  if (!ready_ || now < leasing_paused_until_) return 0;
  return capacity_ * ready_replicas_;
}

WorkerCore::Micros WorkerCore::BackOffLeasing(Micros now) {
  lease_backoff_ = std::min(std::max(lease_backoff_ * 2, kLeaseBackoffFirst), kLeaseBackoffMax);
  leasing_paused_until_ = now + lease_backoff_;
  return lease_backoff_;
}

void AddSampleVersions(const VersionSegments& segments, uint64_t tokens,
                       orchestrator::TrajectoryGroup* group) {
  for (const auto& [version, first] : segments) {
    if (!group->segments.empty() && group->segments.back().first == version) continue;
    group->segments.emplace_back(version, group->tokens + first);
  }
  group->tokens += tokens;
  if (group->segments.empty()) return;
  const auto [oldest, newest] = std::minmax_element(group->segments.begin(), group->segments.end());
  group->version_start = oldest->first;
  group->version_end = newest->first;
}

HeartbeatOutcome SendHeartbeat(orchestrator::ClusterApi& api, const std::string& cluster,
                               const std::string& region, uint32_t capacity,
                               std::optional<uint64_t> ready,
                               const orchestrator::SyncReport* report,
                               const orchestrator::ModelRef& model) {
  HeartbeatOutcome outcome;
  outcome.status = api.Heartbeat(cluster, ready, report);
  if (outcome.status.code() == StatusCode::kNotFound) {
    outcome.registered_again = true;
    outcome.status = api.Register(cluster, region, capacity, model);
    if (outcome.status.ok()) outcome.status = api.Heartbeat(cluster, ready, report);
  }
  if (outcome.status.code() == StatusCode::kConflict && ready) {
    outcome.unannounced = true;
    ready.reset();
    outcome.status = api.Heartbeat(cluster, std::nullopt, report);
  }
  if (outcome.status.ok()) outcome.acknowledged = ready;
  return outcome;
}

}  // namespace weft::rollout_worker
