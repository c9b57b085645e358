// report.json's content (docs/sim.md section 5) from the simulation's state at the end of the run
// or at its failure; sim/report.h renders it.
#include "sim/simulation.h"

#include "sim/report.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace weft::sim::internal {
namespace {

// Seconds from publication until `q` of the `population` clusters were ready (infinity: never).
double ReadyAfter(std::vector<Micros>& sorted, uint32_t population, double q) {
  const size_t needed = std::max<size_t>(1, static_cast<size_t>(std::ceil(q * population)));
  return sorted.size() >= needed ? Seconds(sorted[needed - 1])
                                 : std::numeric_limits<double>::infinity();
}

// A lag histogram as a JSON object (lags as keys).
nlohmann::json HistogramJson(const std::map<uint64_t, uint64_t>& histogram) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [lag, count] : histogram) out[std::to_string(lag)] = count;
  return out;
}

}  // namespace

nlohmann::json Simulation::Report() {
  nlohmann::json report;
  const Counters& k = core_.counters();
  const double duration = Seconds(now_);
  report["name"] = config_.name;
  report["seed"] = config_.seed;
  report["simulated_seconds"] = duration;
  report["events"] = events_;
  report["invariant_checks"] = checks_;
  report["failure"] = failure_.ok() ? nlohmann::json(nullptr) : nlohmann::json(failure_.message());
  report["settings"] = {
      {"max_staleness", config_.core.max_staleness},
      {"dispatch", orchestrator::DispatchName(config_.core.dispatch)},
      {"stale_policy",
       config_.core.stale_policy == orchestrator::StalePolicy::kDrop ? "drop" : "deliver_flagged"},
      {"clusters", clusters_.size()},
      {"parameters", config_.model.parameters},
      {"format", config_.model.format},
      {"bits_per_change", model_bits_},
  };
  const double total = static_cast<double>(idle_us_ + step_us_ + publish_us_);
  report["trainer"] = {
      {"steps", step_},
      {"versions_published", store_latest_ ? *store_latest_ + 1 : 0},
      {"idle_seconds", Seconds(idle_us_)},
      {"step_seconds", Seconds(step_us_)},
      {"publish_seconds", Seconds(publish_us_)},
      {"idle_fraction", total > 0 ? static_cast<double>(idle_us_) / total : 0.0},
  };
  uint64_t lag_total = 0, lag_groups = 0;
  std::map<uint64_t, uint64_t> lag_all;
  nlohmann::json regions = nlohmann::json::array();
  for (uint32_t r = 0; r < regions_.size(); ++r) {
    const RegionState& region = regions_[r];
    const RegionStats& s = region.stats;
    for (const auto& [l, n] : s.lag) {
      lag_all[l] += n;
      lag_total += l * n;
      lag_groups += n;
    }
    // Publication to 50/90/100% of the clusters that were up at publication (and did not go down
    // before reaching it) being ready at that version or newer: the median and the worst over
    // versions (null: never reached within the run).
    std::vector<double> after[3];
    for (uint64_t v = 0; v < ready_delays_.size(); ++v) {
      const uint32_t population = ready_population_[v][r];
      if (population == 0) continue;
      std::vector<Micros> sorted = ready_delays_[v][r];
      std::sort(sorted.begin(), sorted.end());
      after[0].push_back(ReadyAfter(sorted, population, 0.5));
      after[1].push_back(ReadyAfter(sorted, population, 0.9));
      after[2].push_back(ReadyAfter(sorted, population, 1.0));
    }
    const double full_checkpoints_relay =
        static_cast<double>(s.versions_pulled.size()) * keyframe_bytes_;
    const double full_checkpoints_direct = static_cast<double>(s.pulls) * keyframe_bytes_;
    regions.push_back({
        {"name", region.config.name},
        {"relay", region.config.relay},
        {"clusters_at_end",
         std::count_if(clusters_.begin(), clusters_.end(),
                       [&](const ClusterState& c) { return c.region == r && c.up; })},
        {"rollout_utilisation", s.alive_slot_us > 0 ? s.busy_slot_us / s.alive_slot_us : 0.0},
        {"groups_accepted", s.accepted},
        {"groups_delivered_fresh", s.delivered_fresh},
        {"groups_delivered_stale", s.delivered_stale},
        {"submissions_refused", s.rejected},
        {"staleness", HistogramJson(s.lag)},
        {"ready_after_publication", ReadyAfterPublication(after)},
        {"wan_bytes", s.wan_bytes},
        {"wan_bytes_with_relay", s.unique_blob_bytes},
        {"wan_bytes_without_relay", s.downloaded_bytes},
        {"wan_bytes_full_checkpoints_with_relay", full_checkpoints_relay},
        {"wan_bytes_full_checkpoints_without_relay", full_checkpoints_direct},
        {"pulls", s.pulls},
        {"keyframe_pulls", s.keyframe_pulls},
        {"pulls_deferred", s.pull_failures},
        {"relay_cache",
         {{"hits", s.relay_hits}, {"misses", s.relay_misses}, {"evictions", s.relay_evictions}}},
    });
  }
  report["regions"] = regions;
  report["staleness"] = {
      {"histogram", HistogramJson(lag_all)},
      {"mean", lag_groups > 0 ? static_cast<double>(lag_total) / lag_groups : 0.0}};
  report["trajectories"] = {
      {"accepted", k.submissions_accepted},
      {"delivered_fresh", k.delivered_fresh},
      {"delivered_stale", k.delivered_stale},
      {"dropped_stale", k.dropped_stale},
      {"given_up", k.jobs_given_up},
      {"duplicates", duplicates_},
      {"refused", rejected_},
      {"buffered_at_end", core_.buffered()},
  };
  report["orchestrator"] = {
      {"jobs_added", k.jobs_added},
      {"leases_granted", k.leases_granted},
      {"leases_expired", k.leases_expired},
      {"leases_handed_back", k.leases_handed_back},
      {"leases_cancelled", k.leases_cancelled},
      {"clusters_lost", k.clusters_lost},
      {"crashes", crashes_},
      {"journal_calls_replayed", replayed_calls_},
      {"journal_calls_lost", lost_calls_},
  };
  report["store"] = {
      {"keyframe_bytes", keyframe_bytes_},
      {"keyframes", keyframes_published_},
      {"bytes_published", bytes_published_},
      {"mean_delta_bytes",
       manifests_.size() > 1
           ? [&] {
               double sum = 0;
               for (size_t v = 1; v < manifests_.size(); ++v) sum += manifests_[v].delta->bytes;
               return sum / static_cast<double>(manifests_.size() - 1);
             }()
           : 0.0},
  };
  report["faults"] = fault_log_;
  return report;
}

}  // namespace weft::sim::internal
