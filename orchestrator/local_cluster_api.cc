#include "orchestrator/local_cluster_api.h"

namespace weft::orchestrator {

Status LocalClusterApi::Register(const std::string& cluster, const std::string& region,
                                 uint32_t capacity, const ModelRef& model) {
  return core_.Register(env_.WallMicros(), cluster, region, capacity, "", nullptr, model);
}

Status LocalClusterApi::Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                                  const SyncReport* sync) {
  WEFT_RETURN_IF_ERROR(core_.Heartbeat(env_.WallMicros(), cluster, ready_version));
  if (sync != nullptr) {
    MutexLock lock(mutex_);
    reports_[cluster] = *sync;
  }
  return Status::Ok();
}

Result<LeaseAnswer> LocalClusterApi::RequestLeases(const std::string& cluster, uint32_t max,
                                                   std::chrono::milliseconds wait) {
  const int64_t until = env_.MonotonicMicros() + wait.count() * 1000;
  while (true) {
    WEFT_ASSIGN_OR_RETURN(LeaseAnswer answer,
                          core_.AnswerLeaseRequest(env_.WallMicros(), cluster, max));
    if (!answer.leases.empty() || env_.MonotonicMicros() >= until) return answer;
    env_.SleepFor(poll_);
  }
}

Result<SubmitResult> LocalClusterApi::Submit(const TrajectoryGroup& group) {
  return core_.Submit(env_.WallMicros(), group);
}

Status LocalClusterApi::Drain(const std::string& cluster, const std::vector<uint64_t>& jobs) {
  return core_.Drain(env_.WallMicros(), cluster, jobs, true);
}

Status LocalClusterApi::Release(const std::string& cluster, const std::vector<uint64_t>& jobs) {
  return core_.Drain(env_.WallMicros(), cluster, jobs, false);
}

Status LocalClusterApi::Deregister(const std::string& cluster) {
  return core_.Deregister(env_.WallMicros(), cluster);
}

std::optional<SyncReport> LocalClusterApi::sync_report(const std::string& cluster) const {
  MutexLock lock(mutex_);
  auto found = reports_.find(cluster);
  if (found == reports_.end()) return std::nullopt;
  return found->second;
}

}  // namespace weft::orchestrator
