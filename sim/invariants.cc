// The invariant checks of docs/sim.md section 2, run after every event: the core's counters
// against the simulation's own record, and the core's view of each cluster against the cluster.
// The first failure is kept (Fail) and stops the run.
#include "sim/simulation.h"

#include <cstdio>
#include <string>

namespace weft::sim::internal {

void Simulation::Fail(const std::string& invariant, const std::string& detail) {
  if (!failure_.ok()) return;
  char when[64];
  std::snprintf(when, sizeof(when), "%.6f", Seconds(now_));
  failure_ =
      Internal("invariant '" + invariant + "' broken at event " + std::to_string(events_) +
               " (simulated time " + when + " s), seed " + std::to_string(config_.seed) + ": " +
               detail + " (replay: weft sim CONFIG --seed " + std::to_string(config_.seed) + ")");
}

void Simulation::CheckCounters() {
  ++checks_;
  const Counters& k = core_.counters();
  auto expect = [&](bool ok, const char* what) {
    if (!ok) Fail("counters", what);
  };
  expect(k.jobs_added == k.jobs_done + k.jobs_given_up + core_.open_jobs(),
         "jobs added != done + given up + open");
  expect(core_.open_jobs() == core_.queued_jobs() + core_.leased_jobs(),
         "open jobs != queued + leased");
  expect(k.submissions_accepted == k.jobs_done, "submissions accepted != jobs done");
  expect(k.submissions_accepted ==
             k.delivered_fresh + k.delivered_stale + k.dropped_stale + core_.buffered(),
         "accepted != delivered + dropped + buffered");
  expect(core_.leased_jobs() + core_.buffered() + core_.outstanding() <= config_.core.max_in_flight,
         "more in flight than max_in_flight");
  // No acknowledged trajectory lost (across crashes too): the core counts every submission it
  // ever acknowledged.
  if (k.submissions_accepted != accepted_total_) {
    Fail("no acknowledged trajectory lost",
         "the orchestrator counts " + std::to_string(k.submissions_accepted) +
             " accepted submissions, the clusters were told " + std::to_string(accepted_total_));
  }
  if (delivered_items_ > k.delivered_fresh + k.delivered_stale) {
    Fail("delivered once", "the trainer received " + std::to_string(delivered_items_) +
                               " groups, the orchestrator delivered " +
                               std::to_string(k.delivered_fresh + k.delivered_stale));
  }
}

// The core's view of one cluster against the simulated cluster.
void Simulation::CheckCluster(const ClusterState& c) {
  ++checks_;
  const std::optional<orchestrator::ClusterView> view = core_.cluster(c.id);
  if (!view || view->gone) return;
  if (view->leases > view->capacity) {
    Fail("leases within capacity", c.id + " holds " + std::to_string(view->leases) +
                                       " leases with capacity " + std::to_string(view->capacity));
  }
  if (view->ready_version) {
    const uint64_t v = *view->ready_version;
    if (!store_latest_ || v > *store_latest_ || !announced_ || v > *announced_) {
      Fail("ready clusters serve published versions",
           c.id + " is ready at version " + std::to_string(v) + ", which is not published");
    }
    // (A cluster that restarted and has not spoken since is still believed at its old version
    // until it heartbeats or is declared lost; it asks for nothing meanwhile.)
    const std::optional<uint64_t> ready = c.worker.ready();
    if (!c.proven || *c.proven != v || (c.spoken && (!ready || *ready < v))) {
      Fail("ready clusters serve published versions",
           c.id + " is ready at version " + std::to_string(v) + " in the orchestrator, but " +
               (ready ? "serves version " + std::to_string(*ready) : "serves nothing") +
               " and proved " + (c.proven ? std::to_string(*c.proven) : "nothing"));
    }
  }
}

void Simulation::CheckAll() {
  CheckCounters();
  for (const ClusterState& c : clusters_) CheckCluster(c);
}

}  // namespace weft::sim::internal
