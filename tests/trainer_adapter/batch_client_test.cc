// The trainer's batch side against a real orchestrator over loopback.
#include "trainer_adapter/batch_client.h"

#include <doctest/doctest.h>

#include <filesystem>

#include "orchestrator/service.h"
#include "tests/orchestrator_test_util.h"

namespace weft::trainer_adapter {
namespace {

using namespace weft::orchestrator;

TEST_CASE("batch client: groups until enough samples, with the staleness the trainer sees") {
  CoreConfig config;
  config.max_staleness = 1;
  config.stale_policy = StalePolicy::kDeliverFlagged;
  testing::RunningOrchestrator o(config);
  const std::string url = o.url;
  HttpClientOptions quick;
  quick.deadline = std::chrono::milliseconds(5000);
  OrchestratorClient trainer(url, "t-token", quick), worker(url, "w-token", quick);

  REQUIRE(trainer.AnnounceVersion(0).ok());
  REQUIRE(worker.Register("c", "eu", 8).ok());
  REQUIRE(worker.Heartbeat("c", 0).ok());
  REQUIRE(trainer
              .AddJobs({{nlohmann::json("1+1="), 2},
                        {nlohmann::json("2+2="), 2},
                        {nlohmann::json("3+3="), 2}})
              .ok());
  auto answer = worker.RequestLeases("c", 3, std::chrono::milliseconds(1000));
  REQUIRE(answer.ok());
  const std::vector<Lease>* leases = &answer->leases;
  REQUIRE(leases->size() == 3);
  auto submit = [&](const Lease& lease, uint64_t version) {
    TrajectoryGroup s;
    s.job = lease.job;
    s.attempt = lease.attempt;
    s.cluster = "c";
    s.version_start = s.version_end = version;
    s.segments = {{version, 0}};
    s.tokens = 4;
    nlohmann::json samples = nlohmann::json::array();
    for (int i = 0; i < 2; ++i)
      samples.push_back({{"tokens", {2, 12}}, {"logprobs", {-0.1, -0.2}}, {"reward", 1.0}});
    s.trajectories = nlohmann::json{{"prompt", lease.prompt}, {"samples", samples}}.dump();
    return worker.Submit(s);
  };
  REQUIRE(submit((*leases)[0], 0).ok());
  // The trainer moves on to version 2; the cluster follows.
  REQUIRE(trainer.AnnounceVersion(1).ok());
  REQUIRE(worker.Heartbeat("c", 1).ok());
  REQUIRE(submit((*leases)[1], 1).ok());
  REQUIRE(trainer.AnnounceVersion(2).ok());
  REQUIRE(worker.Heartbeat("c", 2).ok());
  REQUIRE(submit((*leases)[2], 2).ok());

  BatchClient batches(trainer, 1);
  auto first = batches.NextBatch(3, 2, std::chrono::milliseconds(2000));
  REQUIRE_MESSAGE(first.ok(), first.status().ToString());
  size_t samples = 0;
  for (const Delivered& d : *first) samples += SampleCount(d.group);
  CHECK(samples >= 3);
  auto rest = batches.NextBatch(
      10, 2, std::chrono::milliseconds(300));  // only what is left, after the wait
  REQUIRE(rest.ok());
  CHECK(first->size() + rest->size() == 3);
  const StalenessStats& stats = batches.staleness();
  CHECK(stats.groups == 3);
  CHECK(stats.samples == 6);
  CHECK(stats.lag_histogram == std::map<uint64_t, uint64_t>{{0, 1}, {1, 1}, {2, 1}});
  CHECK(stats.stale_delivered == 1);  // version 0 at trainer version 2 with k = 1: flagged
  CHECK(stats.violations == 0);
  CHECK(stats.max_lag == 2);
  CHECK(stats.mean_lag() == doctest::Approx(1.0));
  for (const auto& batch : {*first, *rest}) {
    for (const Delivered& d : batch) {
      CHECK(d.stale == (d.group.version_start == 0));
      const nlohmann::json g = nlohmann::json::parse(d.group.trajectories);
      CHECK(g["samples"][0]["reward"] == 1.0);
    }
  }
  // Counted in groups: exactly the groups asked for, the rest at the next call.
  REQUIRE(trainer.AddJobs({{nlohmann::json("4+4="), 2}, {nlohmann::json("5+5="), 2}}).ok());
  auto more_answer = worker.RequestLeases("c", 2, std::chrono::milliseconds(1000));
  REQUIRE(more_answer.ok());
  const std::vector<Lease>* more = &more_answer->leases;
  REQUIRE(more->size() == 2);
  REQUIRE(submit((*more)[0], 2).ok());
  REQUIRE(submit((*more)[1], 2).ok());
  auto one = batches.NextGroups(1, 2, std::chrono::milliseconds(2000));
  REQUIRE(one.ok());
  CHECK(one->size() == 1);
  auto other = batches.NextGroups(5, 2, std::chrono::milliseconds(300));
  REQUIRE(other.ok());
  CHECK(other->size() == 1);
  CHECK(batches.staleness().groups == 5);
}

}  // namespace
}  // namespace weft::trainer_adapter
