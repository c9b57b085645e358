// BatchClient: the trainer's side of trajectories (docs/design.md, "The control path").
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
#include <vector>

#include "orchestrator/client.h"

namespace weft::trainer_adapter {

// The samples in a group: the length of its trajectories' "samples" array (docs/api.md,
// "Trajectories"); a group without one counts as one sample. Reads the text without parsing it.
size_t SampleCount(const orchestrator::TrajectoryGroup& group);
// The group's lag for a trainer at `trainer_version`: how many versions behind its oldest token is.
inline uint64_t LagOf(const orchestrator::TrajectoryGroup& group, uint64_t trainer_version) {
  return trainer_version > group.version_start ? trainer_version - group.version_start : 0;
}

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

  // Acknowledgement: a batch is acknowledged by the client's next request for one, which may come
  // within the same call when one request does not fill it; so a call's groups are acknowledged
  // by the time it returns, except those of its last request (acknowledged by the next call). An
  // error after some groups arrived returns those groups (a retry then reports it if it lasts).
  //
  // Groups until they hold at least `samples` samples, or what has arrived when `wait` is over
  // (possibly nothing), each with its samples as the worker sent them (JSON text, for the trainer
  // to parse) and whether it came flagged as stale. `trainer_version` is the version the trainer
  // holds now (its lag baseline).
  Result<std::vector<orchestrator::Delivered>> NextBatch(size_t samples, uint64_t trainer_version,
                                                         std::chrono::milliseconds wait);
  // The same counted in groups: until `groups` groups have arrived, or `wait` is over.
  Result<std::vector<orchestrator::Delivered>> NextGroups(size_t groups, uint64_t trainer_version,
                                                          std::chrono::milliseconds wait);

  const StalenessStats& staleness() const { return stats_; }

 private:
  // Takes groups until `want` units (samples, or groups) are held or `wait` is over.
  Result<std::vector<orchestrator::Delivered>> Take(size_t want, bool in_samples,
                                                    uint64_t trainer_version,
                                                    std::chrono::milliseconds wait);

  orchestrator::OrchestratorClient& client_;
  uint64_t max_staleness_;
  StalenessStats stats_;
};

}  // namespace weft::trainer_adapter
