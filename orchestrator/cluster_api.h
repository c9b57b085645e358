// ClusterApi: what a rollout cluster asks of the orchestrator (docs/api.md, the cluster routes).
// An interface only, beside the API's types, so that whatever drives a rollout worker's logic
// links no transport.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "orchestrator/types.h"

namespace weft::orchestrator {

// What a rollout cluster asks of the orchestrator (docs/api.md, the cluster routes): the interface
// the rollout worker talks through. OrchestratorClient (orchestrator/client.h) speaks
// it over HTTP; LocalClusterApi (orchestrator/local_cluster_api.h) answers it in process from a
// DurableCore; the simulator answers it from its simulated network and orchestrator.
class ClusterApi {
 public:
  virtual ~ClusterApi() = default;
  // `model`: what the cluster serves (the policy, or a fixed model by name and digest).
  virtual Status Register(const std::string& cluster, const std::string& region, uint32_t capacity,
                          const ModelRef& model) = 0;
  // A cluster serving the run's policy.
  Status Register(const std::string& cluster, const std::string& region, uint32_t capacity) {
    return Register(cluster, region, capacity, ModelRef{});
  }
  // `sync`: the worker's weight-sync counters, shown in /v1/status.
  virtual Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                           const SyncReport* sync = nullptr) = 0;
  // Waits up to `wait` for at least one lease (zero: answer at once). The answer also tells the
  // latest version announced.
  virtual Result<LeaseAnswer> RequestLeases(const std::string& cluster, uint32_t max,
                                            std::chrono::milliseconds wait) = 0;
  // `group.trajectories` is the samples' JSON text (docs/api.md, "Trajectories").
  virtual Result<SubmitResult> Submit(const TrajectoryGroup& group) = 0;
  // Hands the listed leases back (all when empty) and takes no more.
  virtual Status Drain(const std::string& cluster, const std::vector<uint64_t>& jobs = {}) = 0;
  // Hands the listed leases back (all when empty) without draining: the cluster goes on leasing.
  virtual Status Release(const std::string& cluster, const std::vector<uint64_t>& jobs = {}) = 0;
  virtual Status Deregister(const std::string& cluster) = 0;
};

}  // namespace weft::orchestrator
