// BatchClient: the trainer's side of trajectories (DESIGN.md section 8, next_batch).
//
// Takes numbered batches from the orchestrator (each trajectory group once, acknowledged by the
// next call: see OrchestratorClient::TakeBatch) until it holds at least the samples asked for, and
// keeps the staleness the trainer actually sees: for every group, the trainer's version when it
// was handed over minus the group's version_start. The orchestrator has already enforced the
// bound (groups over it are dropped, or flagged when the policy says deliver_flagged); a group
// over the bound that arrives unflagged is counted as a violation, which should never happen.
// Not thread-safe (one trainer loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "orchestrator/client.h"

namespace weft::trainer_adapter {

// One trajectory group: every sample of one job, with the versions that generated it (the
// submission's job, attempt, cluster, version_start, version_end and segments; its payload is
// parsed into `trajectories` and not kept as text) and whether it came flagged as stale.
struct TrajectoryGroup : orchestrator::ReceivedTrajectory {
  uint64_t lag = 0;             // trainer version when received - version_start
  nlohmann::json trajectories;  // what the worker submitted (docs/api.md, "Trajectories")
  size_t samples() const {
    return trajectories.contains("samples") ? trajectories["samples"].size() : 1;
  }
};

struct StalenessStats {
  std::map<uint64_t, uint64_t> lag_histogram;  // lag -> groups
  uint64_t groups = 0, samples = 0;
  uint64_t stale_delivered = 0;  // flagged by the orchestrator
  uint64_t violations = 0;       // over the bound and not flagged (should stay 0)
  uint64_t max_lag = 0;
  double mean_lag() const;
};

class BatchClient {
 public:
  // `client` carries the trainer token; `max_staleness` is the bound k the orchestrator enforces.
  BatchClient(orchestrator::OrchestratorClient& client, uint64_t max_staleness)
      : client_(client), max_staleness_(max_staleness) {}

  // Groups until they hold at least `samples` samples, or what has arrived when `wait` is over
  // (possibly nothing). `trainer_version` is the version the trainer holds now (its lag baseline).
  Result<std::vector<TrajectoryGroup>> NextBatch(size_t samples, uint64_t trainer_version,
                                                 std::chrono::milliseconds wait);

  const StalenessStats& staleness() const { return stats_; }

 private:
  orchestrator::OrchestratorClient& client_;
  uint64_t max_staleness_;
  StalenessStats stats_;
};

}  // namespace weft::trainer_adapter
