// Measurements: what an operator watches, measured in the orchestrator as events happen
// (docs/operate.md; the metrics are listed in docs/api.md, "Metrics").
//
//   - Publication to ready: for each announced version and region, the time from the announce
//     until 50%, 90% and 100% of the region's clusters that could get ready (registered, neither
//     draining nor gone at the announce) proved it, or a newer version. A cluster of that
//     population that drains, leaves or is lost before proving it leaves the population (as in
//     `weft sim`). Those not ready when the next version is announced are counted as missed.
//   - The staleness of each trajectory group taken for the trainer (latest version minus its
//     version_start), delivered and dropped-stale counts, per region.
//   - What the trainer reports: the time each next_batch call waited for data, and the time
//     each version took to publish.
//   - What the workers report in their heartbeats: weight bytes downloaded and the pauses of
//     their engines for weight loads, per region, and per version while it is the latest.
//   - Throughput: accepted, delivered and leased per second over the last seconds.
//
// It observes the core (CoreObserver, called under the core's lock) and is fed by the service
// (its own lock; never held while calling the core). Figures live in memory: they start afresh
// when the orchestrator restarts, as Prometheus expects of counters. Thread-safe.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/prometheus.h"
#include "orchestrator/core.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {

struct MeasurementsOptions {
  size_t versions = 32;             // versions kept for /v1/status (and open to readiness)
  size_t recent_steps = 64;         // the trainer's latest waits kept for /v1/status
  Micros rate_window = 10'000'000;  // throughput is measured over this much of the recent past
};

// A region's job slots as the core sees them: those of its clusters that neither drain nor are
// gone, and the leases those hold; the groups its clusters had accepted; its clusters by state
// (gone ones not counted). Both /metrics and /v1/status show them.
struct RegionSlots {
  uint64_t capacity = 0, busy = 0, accepted = 0;
  uint64_t states[3] = {0, 0, 0};  // syncing, ready, draining
  // Busy slots over capacity (0 to 1; 0 without capacity).
  double utilisation() const {
    return capacity > 0 ? std::min(1.0, static_cast<double>(busy) / static_cast<double>(capacity))
                        : 0.0;
  }
};
std::map<std::string, RegionSlots> SlotsByRegion(const std::vector<ClusterView>& clusters);

class Measurements : public CoreObserver {
 public:
  // The buckets of each histogram (upper bounds; +Inf is implied).
  static constexpr std::array<double, 13> kReadyBounds = {0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                                          10,   30,  60,   120, 300, 600};
  static constexpr std::array<double, 9> kStalenessBounds = {0, 1, 2, 3, 4, 6, 8, 16, 32};
  static constexpr std::array<double, 13> kTrainerBounds = {
      0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

  explicit Measurements(MeasurementsOptions options = {}) : options_(options) {}

  // CoreObserver.
  void Announced(Micros now, uint64_t version, const OrchestratorCore& core) override;
  void Proved(Micros now, const std::string& cluster, const std::string& region,
              uint64_t version) override;
  void Left(Micros now, const std::string& cluster) override;
  void Taken(Micros now, const std::string& region, uint64_t lag, bool dropped,
             bool redelivered) override;

  // The trainer's reports: one next_batch call's wait; a version's publish time.
  void TrainerWaited(double seconds);
  void Published(uint64_t version, double seconds);
  // A worker's sync report (cumulative since it started: a counter that went down means it
  // restarted, and counts from zero again).
  void Synced(const std::string& cluster, const std::string& region, const SyncReport& report);
  // The core's counters now, for the throughput (the service calls it as it ticks).
  void Sample(Micros now, const Counters& counters);

  // Fills the status page's versions, trainer, rates and staleness, and each region's delivered
  // and dropped counts (the page's regions must be there already).
  void Fill(wire::StatusPage* page) const;
  // Appends the metric families (Prometheus text) of these measurements; `core` gives the
  // regions' clusters and slots.
  void Metrics(std::string& out, const OrchestratorCore& core) const;

 private:
  static constexpr double kFractions[3] = {0.5, 0.9, 1.0};
  struct RegionReadiness {
    std::set<std::string> waiting;                 // of the population, not ready yet
    uint64_t population = 0;                       // clusters that still count
    std::vector<Micros> delays;                    // of those that proved it, in order
    std::array<std::optional<Micros>, 3> reached;  // when each fraction was reached
    std::optional<uint64_t> missed;
    uint64_t sync_bytes = 0;
  };
  struct VersionRecord {
    uint64_t version = 0;
    Micros announced = 0;
    std::optional<double> publish_seconds;
    std::map<std::string, RegionReadiness> regions;
  };
  struct RegionFigures {
    prometheus::Histogram ready[3] = {prometheus::Histogram(kReadyBounds),
                                      prometheus::Histogram(kReadyBounds),
                                      prometheus::Histogram(kReadyBounds)};
    uint64_t unreached[3] = {0, 0, 0};  // versions retired with the fraction never reached
    uint64_t missed = 0;
    prometheus::Histogram staleness{kStalenessBounds};
    uint64_t delivered = 0, dropped_stale = 0;
    prometheus::Histogram pauses{kPauseBoundsSeconds};
    uint64_t sync_bytes = 0;
  };
  struct ClusterReport {
    std::string region;
    uint64_t bytes = 0;
    std::vector<uint64_t> pause_counts;
    double pause_sum_ms = 0;
    double max_pause_ms = 0;
  };

  // Records the fractions `r` reaches now (the population may have shrunk).
  void Reach(const std::string& region, RegionReadiness& r) REQUIRES(mutex_);
  // Counts the fractions `record` never reached, as it is forgotten.
  void Retire(const VersionRecord& record) REQUIRES(mutex_);

  const MeasurementsOptions options_;
  mutable Mutex mutex_;
  std::deque<VersionRecord> versions_ GUARDED_BY(mutex_);      // oldest first
  std::map<std::string, uint64_t> proven_ GUARDED_BY(mutex_);  // cluster -> newest version proved
  std::map<std::string, RegionFigures> regions_ GUARDED_BY(mutex_);
  std::map<uint64_t, uint64_t> staleness_ GUARDED_BY(mutex_);  // lag -> delivered groups
  std::map<std::string, ClusterReport> reports_ GUARDED_BY(mutex_);
  prometheus::Histogram trainer_wait_ GUARDED_BY(mutex_){kTrainerBounds};
  prometheus::Histogram publish_ GUARDED_BY(mutex_){kTrainerBounds};
  std::deque<double> recent_waits_ GUARDED_BY(mutex_);
  std::deque<std::pair<Micros, Counters>> samples_ GUARDED_BY(mutex_);
};

}  // namespace weft::orchestrator
