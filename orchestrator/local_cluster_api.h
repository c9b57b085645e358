// LocalClusterApi: the cluster routes of the orchestrator (ClusterApi, orchestrator/cluster_api.h)
// answered in process from a DurableCore, without HTTP, on an Env's clock: for tests and
// simulations that run a real rollout worker against a real core. A lease request waits for
// leases by asking the core again every `poll` of the Env's clock (the service parks it instead).
// Cluster tokens are not checked. Thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/mutex.h"
#include "orchestrator/cluster_api.h"
#include "orchestrator/durable_core.h"

namespace weft::orchestrator {

class LocalClusterApi : public ClusterApi {
 public:
  // `core` and `env` must outlive it.
  LocalClusterApi(DurableCore& core, Env& env,
                  std::chrono::microseconds poll = std::chrono::milliseconds(2))
      : core_(core), env_(env), poll_(poll) {}

  using ClusterApi::Register;
  Status Register(const std::string& cluster, const std::string& region, uint32_t capacity,
                  const ModelRef& model) override;
  Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                   const SyncReport* sync = nullptr) override;
  Result<LeaseAnswer> RequestLeases(const std::string& cluster, uint32_t max,
                                    std::chrono::milliseconds wait) override;
  Result<SubmitResult> Submit(const TrajectoryGroup& group) override;
  Status Drain(const std::string& cluster, const std::vector<uint64_t>& jobs = {}) override;
  Status Release(const std::string& cluster, const std::vector<uint64_t>& jobs = {}) override;
  Status Deregister(const std::string& cluster) override;

  // The last weight-sync report a cluster's heartbeat carried.
  std::optional<SyncReport> sync_report(const std::string& cluster) const;

 private:
  DurableCore& core_;
  Env& env_;
  const std::chrono::microseconds poll_;
  mutable Mutex mutex_;
  std::map<std::string, SyncReport> reports_ GUARDED_BY(mutex_);
};

}  // namespace weft::orchestrator
