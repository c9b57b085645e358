// Measurements on the core, on a clock the test sets: publication to ready per region (the
// population at the announce, clusters leaving it, the fractions, missed clusters), staleness of
// what the trainer takes, the trainer's and workers' reports, throughput, and the Prometheus text.
#include "orchestrator/measurements.h"

#include <doctest/doctest.h>

#include "common/prometheus.h"

namespace weft::orchestrator {
namespace {

constexpr Micros kSecond = 1'000'000;

// The value of the sample `series` (name and labels, as written) in `text`, or -1.
double Value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// Cluster a's group for `lease`, generated at version 0.
TrajectoryGroup GroupAtVersion0(const Lease& lease) {
  TrajectoryGroup g;
  g.job = lease.job;
  g.attempt = lease.attempt;
  g.cluster = "a";
  g.segments = {{0, 0}};
  g.tokens = 1;
  g.trajectories = "{}";
  return g;
}

TEST_CASE(
    "measurements: publication to 50/90/100% ready per region, as clusters prove, leave "
    "and miss versions") {
  OrchestratorCore core(CoreConfig{});
  Measurements m;
  core.set_observer(&m);
  for (int i = 0; i < 4; ++i) REQUIRE(core.Register(0, "eu-" + std::to_string(i), "eu", 2).ok());
  REQUIRE(core.Register(0, "us-0", "us", 2).ok());
  REQUIRE(core.AnnounceVersion(10 * kSecond, 0).ok());
  REQUIRE(core.Register(11 * kSecond, "eu-late", "eu", 2).ok());  // not in version 0's population
  REQUIRE(core.Heartbeat(11 * kSecond, "eu-0", 0).ok());
  REQUIRE(core.Heartbeat(12 * kSecond, "eu-1", 0).ok());  // 2 of 4: half
  REQUIRE(core.Heartbeat(12 * kSecond, "eu-1", 0).ok());  // said again: counted once
  REQUIRE(core.Heartbeat(13 * kSecond, "eu-late", 0).ok());
  REQUIRE(core.Heartbeat(14 * kSecond, "eu-2", 0).ok());
  REQUIRE(core.Drain(15 * kSecond, "eu-3", {}).ok());  // leaves the population: 3 of 3
  wire::StatusPage page;
  page.regions["eu"];
  m.Fill(&page);
  REQUIRE(page.versions.size() == 1);
  const wire::StatusPage::Readiness& eu = page.versions[0].regions.at("eu");
  CHECK(eu.population == 3);
  CHECK(eu.ready == 3);
  CHECK(eu.ready_50_seconds == 2.0);
  CHECK(eu.ready_90_seconds == 4.0);  // reached by eu-2's proof, counted when eu-3 left
  CHECK(eu.ready_100_seconds == 4.0);
  CHECK(!eu.missed);
  const wire::StatusPage::Readiness& us = page.versions[0].regions.at("us");
  CHECK(us.population == 1);
  CHECK(!us.ready_50_seconds);
  // Version 1: us-0 never proved 0, and proves 1 (which counts for 0 as well).
  REQUIRE(core.AnnounceVersion(20 * kSecond, 1).ok());
  REQUIRE(core.Heartbeat(23 * kSecond, "us-0", 1).ok());
  page = {};
  m.Fill(&page);
  REQUIRE(page.versions.size() == 2);
  CHECK(page.versions[0].regions.at("us").missed == 1);
  CHECK(page.versions[0].regions.at("us").ready_100_seconds == 13.0);
  CHECK(page.versions[0].regions.at("eu").missed == 0);
  CHECK(page.versions[1].regions.at("us").ready_100_seconds == 3.0);
  CHECK(page.versions[1].regions.at("eu").population == 4);  // eu-late counts now, eu-3 drains

  std::string text;
  m.Metrics(text, core);
  CHECK(Value(text,
              "weft_orchestrator_publication_to_ready_seconds_count{region=\"eu\","
              "fraction=\"0.5\"}") == 1);
  CHECK(Value(text,
              "weft_orchestrator_publication_to_ready_seconds_bucket{region=\"us\","
              "fraction=\"1\",le=\"5\"}") == 1);  // 3 s for version 1
  CHECK(Value(text,
              "weft_orchestrator_publication_to_ready_seconds_bucket{region=\"us\","
              "fraction=\"1\",le=\"+Inf\"}") == 2);
  CHECK(Value(text,
              "weft_orchestrator_publication_to_ready_seconds_sum{region=\"us\","
              "fraction=\"1\"}") == 16);
  CHECK(Value(text, "weft_orchestrator_publication_missed_clusters_total{region=\"us\"}") == 1);
  CHECK(Value(text, "weft_orchestrator_region_clusters{region=\"eu\",state=\"draining\"}") == 1);
  CHECK(Value(text, "weft_orchestrator_region_capacity_slots{region=\"eu\"}") == 8);
}

TEST_CASE("measurements: staleness of what the trainer takes, reports, throughput") {
  CoreConfig config;
  config.max_staleness = 1;
  OrchestratorCore core(config);
  Measurements m;
  core.set_observer(&m);
  REQUIRE(core.Register(0, "a", "eu", 4).ok());
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  REQUIRE(core.Heartbeat(0, "a", 0).ok());
  m.Sample(0, core.counters());
  core.AddJobs(0, {{"\"p\"", 1}, {"\"q\"", 1}});
  auto leases = core.RequestLeases(0, "a", 2);
  REQUIRE(leases.ok());
  REQUIRE(leases->size() == 2);
  for (const Lease& lease : *leases) {
    REQUIRE(core.Submit(kSecond, GroupAtVersion0(lease)).ok());
  }
  REQUIRE(core.AnnounceVersion(kSecond, 1).ok());
  CHECK(core.TakeBatch(kSecond, 1).items.size() == 1);  // lag 1: delivered
  REQUIRE(core.AnnounceVersion(kSecond, 2).ok());
  CHECK(core.TakeBatch(kSecond, 1, 1).items.empty());  // lag 2: dropped
  m.Sample(2 * kSecond, core.counters());
  m.TrainerWaited(0.5);
  m.TrainerWaited(1.5);
  m.Published(2, 0.25);
  SyncReport report;
  report.bytes_downloaded = 1000;
  report.pause_counts.assign(kPauseBoundsSeconds.size() + 1, 0);
  report.pause_counts[3] = 2;  // two pauses of 10-25 ms
  report.pause_sum_ms = 30;
  m.Synced("a", "eu", report);
  report.bytes_downloaded = 1500;
  m.Synced("a", "eu", report);
  report.bytes_downloaded = 200;  // the worker restarted: its counters start again
  report.pause_counts[3] = 0;
  report.pause_sum_ms = 0;
  m.Synced("a", "eu", report);

  wire::StatusPage page;
  page.regions["eu"];
  m.Fill(&page);
  CHECK(page.staleness == std::map<uint64_t, uint64_t>{{1, 1}});
  CHECK(page.regions.at("eu").delivered == 1);
  CHECK(page.regions.at("eu").dropped_stale == 1);
  CHECK(page.trainer.steps_reported == 2);
  CHECK(page.trainer.wait_seconds_total == 2.0);
  CHECK(page.trainer.recent_wait_seconds == std::vector<double>{0.5, 1.5});
  CHECK(page.versions.back().publish_seconds == 0.25);
  CHECK(page.versions.back().regions.at("eu").sync_bytes == 1700);
  CHECK(page.rates.window_seconds == 2.0);
  CHECK(page.rates.accepted_per_s == 1.0);
  CHECK(page.rates.leases_per_s == 1.0);

  std::string text;
  m.Metrics(text, core);
  CHECK(Value(text, "weft_orchestrator_region_sync_bytes_total{region=\"eu\"}") == 1700);
  CHECK(Value(text, "weft_orchestrator_engine_pause_seconds_bucket{region=\"eu\",le=\"0.025\"}") ==
        2);
  CHECK(Value(text, "weft_orchestrator_engine_pause_seconds_sum{region=\"eu\"}") == 0.03);
  CHECK(Value(text,
              "weft_orchestrator_delivered_staleness_versions_bucket{region=\"eu\",le=\"0\"}") ==
        0);
  CHECK(Value(text,
              "weft_orchestrator_delivered_staleness_versions_bucket{region=\"eu\",le=\"1\"}") ==
        1);
  CHECK(Value(text, "weft_orchestrator_region_dropped_stale_total{region=\"eu\"}") == 1);
  CHECK(Value(text, "weft_orchestrator_trainer_wait_seconds_count") == 2);
  CHECK(Value(text, "weft_orchestrator_publish_seconds_bucket{le=\"0.25\"}") == 1);
}

TEST_CASE(
    "measurements: a group delivered, not acknowledged and dropped when handed out again "
    "counts as dropped, not delivered") {
  CoreConfig config;
  config.max_staleness = 1;
  OrchestratorCore core(config);
  Measurements m;
  core.set_observer(&m);
  REQUIRE(core.Register(0, "a", "eu", 4).ok());
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  REQUIRE(core.Heartbeat(0, "a", 0).ok());
  core.AddJobs(0, {{"\"p\"", 1}});
  auto leases = core.RequestLeases(0, "a", 1);
  REQUIRE(leases.ok());
  REQUIRE(leases->size() == 1);
  REQUIRE(core.Submit(1, GroupAtVersion0((*leases)[0])).ok());
  CHECK(core.TakeBatch(1, 1).items.size() == 1);  // delivered at lag 0, never acknowledged
  REQUIRE(core.AnnounceVersion(2, 2).ok());
  const Batch again = core.TakeBatch(2, 1);  // handed out again: now past the bound
  CHECK(again.redelivered);
  CHECK(again.items.empty());
  CHECK(core.counters().delivered_fresh == 0);
  CHECK(core.counters().dropped_stale == 1);
  wire::StatusPage page;
  page.regions["eu"];
  m.Fill(&page);
  CHECK(page.regions.at("eu").delivered == 0);
  CHECK(page.regions.at("eu").dropped_stale == 1);
  CHECK(page.staleness == std::map<uint64_t, uint64_t>{{0, 1}});  // as it was delivered
}

TEST_CASE("prometheus: histogram lines are cumulative and label values escaped") {
  const double bounds[] = {1, 2};
  prometheus::Histogram h(bounds);
  h.Observe(0.5);
  h.Observe(2);
  h.Observe(7, 2);
  std::string text;
  prometheus::HistogramSamples(text, "x_seconds", {{"region", "a\"b\\c\nd"}}, h);
  CHECK(text ==
        "x_seconds_bucket{region=\"a\\\"b\\\\c\\nd\",le=\"1\"} 1\n"
        "x_seconds_bucket{region=\"a\\\"b\\\\c\\nd\",le=\"2\"} 2\n"
        "x_seconds_bucket{region=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 4\n"
        "x_seconds_sum{region=\"a\\\"b\\\\c\\nd\"} 16.5\n"
        "x_seconds_count{region=\"a\\\"b\\\\c\\nd\"} 4\n");
  CHECK(prometheus::Number(0.1) == "0.1");
  CHECK(prometheus::Number(1.0 / 3) == "0.3333333333333333");
  CHECK(prometheus::Number(3) == "3");
}

}  // namespace
}  // namespace weft::orchestrator
