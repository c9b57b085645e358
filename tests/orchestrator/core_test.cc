#include "orchestrator/core.h"

#include <doctest/doctest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

namespace weft::orchestrator {
namespace {

TrajectoryGroup Make(const Lease& lease, const std::string& cluster, uint64_t start, uint64_t end) {
  TrajectoryGroup s;
  s.job = lease.job;
  s.attempt = lease.attempt;
  s.cluster = cluster;
  s.version_start = start;
  s.version_end = end;
  s.segments = {{start, 0}};
  if (end > start) s.segments.push_back({end, 10});
  s.tokens = 20;
  s.trajectories = "trajectory of job " + std::to_string(lease.job);
  return s;
}

TEST_CASE(
    "core: leases only to ready clusters at an admissible version; submissions; staleness at the "
    "trainer") {
  CoreConfig config;
  config.max_staleness = 1;
  OrchestratorCore core(config);
  REQUIRE(core.Register(0, "a", "eu", 2).ok());
  REQUIRE(core.Register(0, "b", "us", 2).ok());
  core.AddJobs(0, {{"p1", 4}, {"p2", 4}, {"p3", 4}});
  // No version yet: nothing to lease, and an alert says why.
  CHECK(core.RequestLeases(1, "a", 2)->empty());
  CHECK(core.Alerts(1).front().find("no policy version") != std::string::npos);
  REQUIRE(core.AnnounceVersion(1, 5).ok());
  CHECK(core.RequestLeases(2, "a", 2)->empty());  // not proven ready at any version
  REQUIRE(core.Heartbeat(2, "a", 3).ok());        // ready, but at 3 < 5 - 1
  CHECK(core.RequestLeases(3, "a", 2)->empty());
  REQUIRE(core.Heartbeat(3, "a", 4).ok());
  auto leases = core.RequestLeases(4, "a", 5);
  REQUIRE(leases.ok());
  REQUIRE(leases->size() == 2);  // capacity
  CHECK((*leases)[0].min_version == 4);
  CHECK((*leases)[0].samples == 4);
  CHECK(core.Submit(5, Make((*leases)[0], "a", 4, 4)).value() == SubmitResult::kAccepted);
  CHECK(core.Submit(6, Make((*leases)[0], "a", 4, 4)).value() == SubmitResult::kDuplicate);
  // Wrong cluster, versions newer than the cluster was ever ready at, bad segments: refused.
  CHECK(core.Submit(6, Make((*leases)[1], "b", 4, 4))
            .status()
            .message()
            .find("was leased to cluster a") != std::string::npos);
  CHECK(core.Submit(6, Make((*leases)[1], "a", 4, 5))
            .status()
            .message()
            .find("newer than any version") != std::string::npos);
  TrajectoryGroup backwards = Make((*leases)[1], "a", 4, 4);
  backwards.segments = {{4, 0}, {4, 3}};
  CHECK(core.Submit(6, backwards).status().code() == StatusCode::kInvalidArgument);
  CHECK(core.Submit(6, Make((*leases)[1], "a", 3, 4))
            .status()
            .message()
            .find("below the lease's minimum") != std::string::npos);
  CHECK(core.counters().submissions_rejected == 4);
  // The version moves on to 6: the trajectory from 4 is now stale and dropped, never fresh.
  REQUIRE(core.AnnounceVersion(7, 6).ok());
  CHECK(core.TakeBatch(8, 10).items.empty());
  CHECK(core.counters().dropped_stale == 1);
  // Cluster a is now below the bound: no more leases until it proves 5 or 6.
  CHECK(core.RequestLeases(9, "a", 1)->empty());
  CHECK(!core.Alerts(9).empty());
  CHECK(core.AnnounceVersion(10, 2).code() ==
        StatusCode::kInvalidArgument);  // versions only move forward
}

TEST_CASE(
    "core: a group's segments lay its samples end to end; versions within the declared range") {
  OrchestratorCore core(CoreConfig{});
  REQUIRE(core.Register(0, "a", "eu", 4).ok());
  REQUIRE(core.AnnounceVersion(0, 5).ok());
  REQUIRE(core.Heartbeat(1, "a", 5).ok());
  core.AddJobs(1, {{"p", 2}});
  auto leases = core.RequestLeases(2, "a", 1).value();
  REQUIRE(leases.size() == 1);
  TrajectoryGroup s = Make(leases[0], "a", 4, 5);
  // Sample 1 switched from 4 to 5 at its token 3; sample 2 (tokens 6..) ran at 4 throughout,
  // then the group continues with a third run at 5.
  s.segments = {{4, 0}, {5, 3}, {4, 6}, {5, 9}};
  s.version_start = 4;
  TrajectoryGroup wrong_start = s;
  wrong_start.version_start = 3;
  CHECK(core.Submit(3, wrong_start).status().message().find("oldest and newest") !=
        std::string::npos);
  TrajectoryGroup late_first = s;
  late_first.segments.front().second = 1;
  CHECK(core.Submit(3, late_first).status().message().find("start at token 0") !=
        std::string::npos);
  TrajectoryGroup same_version = s;
  same_version.segments = {{4, 0}, {4, 6}, {5, 9}};
  CHECK(core.Submit(3, same_version).status().message().find("segment 1 does not change") !=
        std::string::npos);
  TrajectoryGroup past_end = s;
  past_end.tokens = 9;
  CHECK(core.Submit(3, past_end).status().message().find("past the last token") !=
        std::string::npos);
  CHECK(core.Submit(3, s).value() == SubmitResult::kAccepted);
}

TEST_CASE("core: a batch request with max 0 only acknowledges") {
  OrchestratorCore core(CoreConfig{});
  REQUIRE(core.Register(0, "a", "eu", 4).ok());
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  REQUIRE(core.Heartbeat(1, "a", 0).ok());
  core.AddJobs(1, {{"p", 1}, {"q", 1}});
  const std::vector<Lease> leases = core.RequestLeases(2, "a", 2).value();
  for (const Lease& lease : leases) REQUIRE(core.Submit(3, Make(lease, "a", 0, 0)).ok());
  const Batch first = core.TakeBatch(4, 1);
  REQUIRE(first.items.size() == 1);
  CHECK(core.outstanding() == 1);
  const Batch ack = core.TakeBatch(5, 0, first.id);
  CHECK(ack.id == 0);
  CHECK(ack.items.empty());
  CHECK(ack.acknowledged == 1);
  CHECK(core.outstanding() == 0);
  CHECK(core.buffered() == 1);  // the other trajectory waits for the next real request
}

TEST_CASE("core: expired leases and lost clusters re-queue; late submissions count once") {
  CoreConfig config;
  config.lease_duration = 100;
  config.cluster_timeout = 1000;
  OrchestratorCore core(config);
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  REQUIRE(core.Register(0, "a", "eu", 1).ok());
  REQUIRE(core.Register(0, "b", "us", 1).ok());
  REQUIRE(core.Heartbeat(0, "a", 0).ok());
  REQUIRE(core.Heartbeat(0, "b", 0).ok());
  const uint64_t job = core.AddJobs(0, {{"p", 1}})[0];
  Lease first = core.RequestLeases(1, "a", 1)->at(0);
  REQUIRE(core.Heartbeat(50, "a", 0).ok());  // extends the lease to 150
  core.Tick(120);
  CHECK(core.leased_jobs() == 1);
  core.Tick(151);  // expired: back in the queue, for b
  CHECK(core.counters().leases_expired == 1);
  Lease second = core.RequestLeases(152, "b", 1)->at(0);
  CHECK(second.job == job);
  CHECK(second.attempt == 2);
  // The first attempt arrives late: accepted once, b's lease cancelled; b's submission is refused.
  CHECK(core.Submit(160, Make(first, "a", 0, 0)).value() == SubmitResult::kAccepted);
  CHECK(core.counters().leases_cancelled == 1);
  CHECK(core.Submit(161, Make(second, "b", 0, 0))
            .status()
            .message()
            .find("already completed by attempt 1") != std::string::npos);
  CHECK(core.TakeBatch(162, 10).items.size() == 1);
  // A cluster that stops heartbeating is lost and its lease goes to another.
  core.AddJobs(200, {{"q", 1}});
  REQUIRE(core.RequestLeases(200, "a", 1)->size() == 1);
  REQUIRE(core.Heartbeat(1150, "b", 0).ok());
  core.Tick(1300);
  CHECK(core.counters().clusters_lost == 1);
  CHECK(core.RequestLeases(1301, "b", 1)->size() == 1);
  CHECK(core.RequestLeases(1302, "a", 1).status().code() ==
        StatusCode::kNotFound);  // lost: register again
  // Neither a heartbeat nor a drain brings it back without registering.
  CHECK(core.Heartbeat(1303, "a", 0).code() == StatusCode::kNotFound);
  CHECK(core.Drain(1303, "a", {}).code() == StatusCode::kNotFound);
  CHECK(core.clusters().front().gone);
  // Draining hands leases back and takes no more.
  REQUIRE(core.Register(1400, "a", "eu", 1).ok());
  REQUIRE(core.Heartbeat(1400, "a", 0).ok());
  core.AddJobs(1400, {{"r", 1}});
  REQUIRE(core.RequestLeases(1401, "a", 1)->size() == 1);
  REQUIRE(core.Drain(1402, "a", {}).ok());
  CHECK(core.queued_jobs() == 1);
  CHECK(core.RequestLeases(1403, "a", 1)->empty());
}

TEST_CASE("core: admission bounds jobs in flight plus buffered trajectories; a stall is reported") {
  CoreConfig config;
  config.max_in_flight = 3;
  config.stall_after = 1000;
  OrchestratorCore core(config);
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  REQUIRE(core.Register(0, "a", "eu", 10).ok());
  REQUIRE(core.Heartbeat(0, "a", 0).ok());
  core.AddJobs(0, std::vector<JobSpec>(10, {"p", 1}));
  auto leases = core.RequestLeases(1, "a", 10);
  REQUIRE(leases->size() == 3);
  REQUIRE(core.Submit(2, Make((*leases)[0], "a", 0, 0)).ok());
  CHECK(core.RequestLeases(3, "a", 10)->empty());  // 2 leased + 1 buffered
  Batch batch = core.TakeBatch(4, 1);
  CHECK(batch.items.size() == 1);
  CHECK(
      core.RequestLeases(5, "a", 10)->empty());  // handed out but not acknowledged: still in flight
  // The answer was lost: asking again without an acknowledgement hands the same batch out again.
  Batch again = core.TakeBatch(5, 1);
  CHECK(again.id == batch.id);
  CHECK(again.redelivered);
  CHECK(core.TakeBatch(6, 1, batch.id).id == 0);  // acknowledged; nothing new
  CHECK(core.RequestLeases(7, "a", 10)->size() == 1);
  CHECK(core.Alerts(500).empty());
  CHECK(core.Alerts(2000).back().find("stalled") != std::string::npos);
}

TEST_CASE("core: when jobs are scarce, faster clusters at the latest version get more of them") {
  OrchestratorCore core(CoreConfig{});
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  for (const char* id : {"fast", "slow"}) {
    REQUIRE(core.Register(0, id, "eu", 10).ok());
    REQUIRE(core.Heartbeat(0, id, 0).ok());
  }
  // Three completions each: "fast" every 0.25 s, "slow" every second.
  core.AddJobs(0, std::vector<JobSpec>(6, {"p", 1}));
  auto fast = core.RequestLeases(1, "fast", 3).value();
  std::vector<Lease> slow;
  for (int i = 0; i < 3 && slow.size() < 3;
       ++i) {  // shared while jobs are scarce: may take two asks
    const std::vector<Lease> got = core.RequestLeases(1, "slow", 3).value();
    slow.insert(slow.end(), got.begin(), got.end());
  }
  REQUIRE(fast.size() == 3);
  REQUIRE(slow.size() == 3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(core.Submit(1'000'000 + i * 250'000, Make(fast[i], "fast", 0, 0)).ok());
    REQUIRE(core.Submit(1'000'000 + i * 1'000'000, Make(slow[i], "slow", 0, 0)).ok());
  }
  // Four jobs for twenty free slots: the slow cluster, asking first, gets one, not four.
  core.AddJobs(4'000'000, std::vector<JobSpec>(4, {"p", 1}));
  CHECK(core.RequestLeases(4'000'001, "slow", 10)->size() == 1);
  CHECK(core.RequestLeases(4'000'002, "fast", 10)->size() == 3);
  // A cluster behind the latest version (still admissible) counts half.
  REQUIRE(core.AnnounceVersion(5'000'000, 1).ok());
  REQUIRE(core.Heartbeat(5'000'000, "fast", 1).ok());
  REQUIRE(core.Register(5'000'000, "behind", "us", 10).ok());
  REQUIRE(core.Heartbeat(5'000'000, "behind", 0).ok());
  core.AddJobs(5'000'000, std::vector<JobSpec>(2, {"p", 1}));
  CHECK(core.RequestLeases(5'000'001, "behind", 10)->size() == 1);  // its share rounds up to one
}

TEST_CASE("core: first-come dispatch fills the asker's free slots; one cluster's view") {
  CoreConfig config;
  config.dispatch = DispatchPolicy::kFirstCome;
  OrchestratorCore core(config);
  REQUIRE(core.AnnounceVersion(0, 0).ok());
  for (const char* id : {"a", "b"}) {
    REQUIRE(core.Register(0, id, "eu", 10).ok());
    REQUIRE(core.Heartbeat(0, id, 0).ok());
  }
  // Four jobs for twenty free slots: the first to ask takes all four (weighted dispatch would
  // give it its share, two).
  core.AddJobs(1, std::vector<JobSpec>(4, {"p", 1}));
  CHECK(core.RequestLeases(2, "a", 10)->size() == 4);
  CHECK(core.RequestLeases(3, "b", 10)->empty());
  const std::optional<ClusterView> a = core.cluster("a");
  REQUIRE(a);
  CHECK(a->leases == 4);
  CHECK(a->ready_version == std::optional<uint64_t>(0));
  CHECK(!core.cluster("nobody"));
  CHECK(ParseDispatch("first_come").value() == DispatchPolicy::kFirstCome);
  CHECK(ParseDispatch("weighted").value() == DispatchPolicy::kWeighted);
  CHECK(!ParseDispatch("random").ok());
  CHECK(std::string(DispatchName(DispatchPolicy::kFirstCome)) == "first_come");
}

TEST_CASE(
    "core: a repeated lease request (its answer was lost) gets the same leases back, nothing "
    "more") {
  OrchestratorCore core({});
  REQUIRE(core.AnnounceVersion(0, 1).ok());
  REQUIRE(core.Register(0, "a", "eu", 8).ok());
  REQUIRE(core.Heartbeat(0, "a", 1).ok());
  core.AddJobs(0, {{"p", 1}, {"q", 1}, {"r", 1}, {"s", 1}});
  auto first = std::move(core.RequestLeases(1, "a", 2, 77)).value();
  REQUIRE(first.size() == 2);
  auto again = std::move(core.RequestLeases(2, "a", 2, 77)).value();
  REQUIRE(again.size() == 2);
  CHECK(again[0].job == first[0].job);
  CHECK(again[1].attempt == first[1].attempt);
  CHECK(again[1].prompt == first[1].prompt);
  CHECK(core.leased_jobs() == 2);
  CHECK(core.counters().leases_granted == 2);
  // One of them is submitted: a third repeat returns only the other.
  REQUIRE(core.Submit(3, Make(first[0], "a", 1, 1)).ok());
  auto third = std::move(core.RequestLeases(4, "a", 2, 77)).value();
  REQUIRE(third.size() == 1);
  CHECK(third[0].job == first[1].job);
  // A new request id grants new leases; no id never repeats.
  CHECK(std::move(core.RequestLeases(5, "a", 1, 78)).value().size() == 1);
  CHECK(std::move(core.RequestLeases(6, "a", 1)).value().size() == 1);
  CHECK(core.leased_jobs() == 3);
}

TEST_CASE("core: a damaged snapshot is refused with a reason") {
  OrchestratorCore core({});
  REQUIRE(core.AnnounceVersion(0, 1).ok());
  REQUIRE(core.Register(0, "a", "eu", 2).ok());
  REQUIRE(core.Heartbeat(0, "a", 1).ok());
  core.AddJobs(0, {{"p", 1}});
  auto leases = std::move(core.RequestLeases(1, "a", 1)).value();
  REQUIRE(core.Submit(2, Make(leases[0], "a", 1, 1)).ok());
  const std::string snapshot = core.Snapshot();
  CHECK(OrchestratorCore::Restore({}, snapshot).ok());
  CHECK(OrchestratorCore::Restore({}, "garbage").status().message().find("no newline") !=
        std::string::npos);
  CHECK(OrchestratorCore::Restore({}, "{}\n").status().message().find("core snapshot") !=
        std::string::npos);
  CHECK(OrchestratorCore::Restore({}, snapshot.substr(0, snapshot.size() - 3))
            .status()
            .message()
            .find("past the end") != std::string::npos);
  CHECK(OrchestratorCore::Restore({}, snapshot + "xx")
            .status()
            .message()
            .find("2 bytes after the last group's samples") != std::string::npos);
  // A fraction where an integer belongs, a time out of range, a job listed twice: refused.
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string text = snapshot;
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return OrchestratorCore::Restore({}, text.replace(at, from.size(), to)).status();
  };
  CHECK(edited("\"next_job\":2", "\"next_job\":1e19").code() == StatusCode::kDataLoss);
  CHECK(edited("\"last_progress\":2", "\"last_progress\":9223372036854775807").code() ==
        StatusCode::kDataLoss);
  OrchestratorCore two({});
  REQUIRE(two.AnnounceVersion(0, 1).ok());
  two.AddJobs(0, {{"p", 1}, {"q", 1}});
  std::string doubled = two.Snapshot();
  const size_t jobs = doubled.find("\"jobs\":[[1,");
  REQUIRE(jobs != std::string::npos);
  doubled.replace(doubled.find("[2,", jobs), 3, "[1,");
  CHECK(OrchestratorCore::Restore({}, doubled).status().code() == StatusCode::kDataLoss);
}

// Whether the core's state mentions `text` anywhere (a snapshot holds all of it).
bool Holds(const OrchestratorCore& core, const std::string& text) {
  return core.Snapshot().find(text) != std::string::npos;
}

TEST_CASE(
    "core: a job's metadata goes to the trainer with its group, and is forgotten once "
    "acknowledged, "
    "dropped or given up") {
  CoreConfig config;
  config.max_staleness = 0;
  config.max_attempts = 2;
  config.lease_duration = 10;
  config.remember_done = 1;  // completions are forgotten at once; the metadata is not
  OrchestratorCore core(config);
  REQUIRE(core.AnnounceVersion(0, 1).ok());
  REQUIRE(core.Register(0, "a", "eu", 8).ok());
  REQUIRE(core.Heartbeat(0, "a", 1).ok());
  const std::vector<JobSpec> jobs = {{"\"p\"", 1, R"({"answer": "ANSWER-P"})"},
                                     {"\"q\"", 1},
                                     {"\"r\"", 2, "[\"RETRIED\", 2.5e0]"},
                                     {"\"s\"", 1, R"("GIVEN-UP")"},
                                     {"\"t\"", 1, R"("STALE")"}};
  const std::vector<uint64_t> ids = core.AddJobs(0, jobs);
  REQUIRE(ids.size() == 5);
  CHECK(Holds(core, "ANSWER-P"));
  auto leases = std::move(core.RequestLeases(1, "a", 8)).value();
  REQUIRE(leases.size() == 5);
  for (const Lease& lease : leases) CHECK(lease.prompt == jobs[lease.job - ids[0]].prompt);
  // t is done at version 1, p and q at version 2; r's and s's leases expire and are granted again.
  REQUIRE(core.Submit(2, Make(leases[4], "a", 1, 1)).ok());
  REQUIRE(core.AnnounceVersion(2, 2).ok());
  REQUIRE(core.Heartbeat(2, "a", 2).ok());
  REQUIRE(core.Submit(3, Make(leases[0], "a", 2, 2)).ok());
  REQUIRE(core.Submit(3, Make(leases[1], "a", 2, 2)).ok());
  CHECK(core.remembered_done() == 1);
  CHECK(core.Tick(20));
  auto again = std::move(core.RequestLeases(21, "a", 8)).value();
  REQUIRE(again.size() == 2);
  for (const Lease& lease : again) {
    CHECK(lease.attempt == 2);
    if (lease.job == ids[2]) REQUIRE(core.Submit(22, Make(lease, "a", 2, 2)).ok());
  }
  CHECK(core.Tick(40));  // s is given up after its second lease, and its metadata with it
  CHECK(core.counters().jobs_given_up == 1);
  CHECK(!Holds(core, "GIVEN-UP"));
  CHECK(Holds(core, "RETRIED"));
  // The buffered groups survive a snapshot with their metadata.
  Result<OrchestratorCore> restored = OrchestratorCore::Restore(config, core.Snapshot());
  REQUIRE_MESSAGE(restored.ok(), restored.status().ToString());
  CHECK(restored->Snapshot() == core.Snapshot());
  core = std::move(restored).value();
  // t's group is stale at 2 (max_staleness 0): dropped, and its metadata with it.
  Batch batch = core.TakeBatch(42, 10);
  CHECK(core.counters().dropped_stale == 1);
  CHECK(!Holds(core, "STALE"));
  REQUIRE(batch.items.size() == 3);
  std::map<uint64_t, std::string> metadata;
  for (const Delivered& d : batch.items) metadata[d.group.job] = d.metadata;
  CHECK(metadata[ids[0]] == jobs[0].metadata);  // its completion is no longer remembered
  CHECK(metadata[ids[1]].empty());
  CHECK(metadata[ids[2]] == jobs[2].metadata);
  CHECK(Holds(core, "ANSWER-P"));  // outstanding until acknowledged
  CHECK(core.TakeBatch(43, 0, batch.id).acknowledged == 1);
  CHECK(!Holds(core, "ANSWER-P"));
  CHECK(!Holds(core, "RETRIED"));
}

TEST_CASE("core: delivered groups carry their job's metadata, again on redelivery, until acked") {
  OrchestratorCore core({});
  REQUIRE(core.AnnounceVersion(0, 1).ok());
  REQUIRE(core.Register(0, "a", "eu", 8).ok());
  REQUIRE(core.Heartbeat(0, "a", 1).ok());
  const std::vector<uint64_t> ids =
      core.AddJobs(0, {{"\"p\"", 1, "{ \"row\" : 7 }"}, {"\"q\"", 1}, {"\"r\"", 1, "\"R\""}});
  auto leases = std::move(core.RequestLeases(1, "a", 8)).value();
  REQUIRE(leases.size() == 3);
  for (const Lease& lease : leases) REQUIRE(core.Submit(2, Make(lease, "a", 1, 1)).ok());
  auto check = [&](const Batch& batch) {
    REQUIRE(batch.items.size() == 3);
    std::map<uint64_t, std::string> metadata;
    for (const Delivered& d : batch.items) metadata[d.group.job] = d.metadata;
    CHECK(metadata[ids[0]] == "{ \"row\" : 7 }");
    CHECK(metadata[ids[1]].empty());
    CHECK(metadata[ids[2]] == "\"R\"");
  };
  const Batch first = core.TakeBatch(3, 10);
  check(first);
  // Outstanding: held (and snapshotted) until the trainer acknowledges the batch.
  Result<OrchestratorCore> restored = OrchestratorCore::Restore({}, core.Snapshot());
  REQUIRE_MESSAGE(restored.ok(), restored.status().ToString());
  CHECK(restored->Snapshot() == core.Snapshot());
  core = std::move(restored).value();
  const Batch redelivered = core.TakeBatch(4, 10);
  CHECK(redelivered.redelivered);
  check(redelivered);
  CHECK(Holds(core, "row"));
  CHECK(core.TakeBatch(5, 0, first.id).acknowledged == 1);
  CHECK(!Holds(core, "row"));
  CHECK(!Holds(core, "\\\"R\\\""));
}

TEST_CASE("core: a snapshot from before job metadata restores; without metadata none is written") {
  // A snapshot of format 2 as written before jobs had metadata: a queued job, a buffered group.
  std::string counters;  // (in the order a JSON object of them is printed: by name)
  for (const std::string& name : std::set<std::string>{
           "jobs_added", "jobs_done", "jobs_given_up", "leases_granted", "leases_expired",
           "leases_handed_back", "leases_cancelled", "submissions_accepted",
           "submissions_duplicate", "submissions_rejected", "delivered_fresh", "delivered_stale",
           "dropped_stale", "batches", "batches_redelivered", "clusters_lost"}) {
    counters += std::string(counters.empty() ? "" : ",") + "\"" + name + "\":0";
  }
  const std::string old =
      R"({"buffer":[{"attempt":1,"cluster":"a","job":1,"samples_bytes":2,"segments":[[1,0]],)"
      R"("tokens":3,"version_end":1,"version_start":1}],"clusters":[["a","eu",2,1,1,false,false,)"
      R"(0,1,0.0,1,0,[],""]],"counters":{)" +
      counters +
      R"(},"done":[[1,1]],"jobs":[[2,"\"q\"",1,[],[],null,0]],"last_progress":1,"latest":1,)"
      R"("next_batch":1,"next_job":3,"outstanding":[],"queue":[2]})"
      "\n[]";
  Result<OrchestratorCore> core = OrchestratorCore::Restore({}, old);
  REQUIRE_MESSAGE(core.ok(), core.status().ToString());
  CHECK(core->Snapshot() == old);  // the same text: nothing added for what has no metadata
  Batch batch = core->TakeBatch(2, 10);
  REQUIRE(batch.items.size() == 1);
  CHECK(batch.items[0].metadata.empty());
  CHECK(batch.items[0].group.trajectories == "[]");
  auto leases = std::move(core->RequestLeases(3, "a", 1)).value();
  REQUIRE(leases.size() == 1);
  CHECK(leases[0].prompt == "\"q\"");
  // Metadata that is not what the jobs route admits is damage.
  std::string bad = old;
  bad.replace(bad.find("null,0]]"), 8, "null,0,\"{\"]]");
  CHECK(OrchestratorCore::Restore({}, bad).status().message().find(
            "the metadata of job 2 is not valid JSON") != std::string::npos);
}

TEST_CASE("core: a refused drain changes nothing; a job listed twice is handed back once") {
  OrchestratorCore core({});
  REQUIRE(core.AnnounceVersion(0, 1).ok());
  REQUIRE(core.Register(0, "a", "eu", 2).ok());
  REQUIRE(core.Heartbeat(0, "a", 1).ok());
  core.AddJobs(0, {{"p", 1}, {"q", 1}});
  auto leases = std::move(core.RequestLeases(1, "a", 2)).value();
  REQUIRE(leases.size() == 2);
  CHECK(core.Drain(2, "a", {42}).code() == StatusCode::kInvalidArgument);
  CHECK(!core.clusters().front().draining);
  CHECK(core.clusters().front().last_heartbeat == 0);
  REQUIRE(core.Drain(3, "a", {leases[0].job, leases[0].job}).ok());
  CHECK(core.queued_jobs() == 1);
  CHECK(core.leased_jobs() == 1);
}

TEST_CASE("core: a release hands leases back and the cluster goes on leasing") {
  OrchestratorCore core({});
  REQUIRE(core.AnnounceVersion(0, 1).ok());
  REQUIRE(core.Register(0, "a", "eu", 2).ok());
  REQUIRE(core.Heartbeat(0, "a", 1).ok());
  core.AddJobs(0, {{"p", 1, "{\"answer\":1}"}, {"q", 1}});
  auto leases = std::move(core.RequestLeases(1, "a", 2)).value();
  REQUIRE(leases.size() == 2);
  CHECK(leases[0].metadata == "{\"answer\":1}");  // the job's metadata rides with its lease
  CHECK(leases[1].metadata.empty());
  CHECK(core.Drain(2, "a", {42}, false).code() == StatusCode::kInvalidArgument);
  REQUIRE(core.Drain(3, "a", {leases[0].job}, false).ok());
  CHECK(!core.clusters().front().draining);
  CHECK(core.queued_jobs() == 1);
  auto again = std::move(core.RequestLeases(4, "a", 2)).value();
  REQUIRE(again.size() == 1);
  CHECK(again[0].job == leases[0].job);
  CHECK(again[0].attempt == 2);
  CHECK(again[0].metadata == "{\"answer\":1}");
}

// Random interleavings of every event over many seeds; the invariants hold after each one.
TEST_CASE(
    "core: invariants under random events, duplicates, deaths and clock jumps (property test)") {
  Counters total;  // over all seeds: every kind of event must actually have happened
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    auto uniform = [&](uint64_t n) {
      return n == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
    };
    CoreConfig config;
    config.max_staleness = uniform(3);
    config.stale_policy = seed % 2 ? StalePolicy::kDrop : StalePolicy::kDeliverFlagged;
    config.lease_duration = 50 + uniform(200);
    config.cluster_timeout = 300 + uniform(500);
    config.max_in_flight = 2 + uniform(20);
    config.max_attempts = 2 + uniform(4);
    if (seed % 3 == 0) config.remember_done = 8;  // completed jobs are forgotten soon
    OrchestratorCore core(config);
    Micros now = 0;
    uint64_t latest = 0;
    std::map<std::string, std::optional<uint64_t>> ready;  // what each cluster last claimed
    std::map<std::string, uint64_t> max_ready;
    std::vector<std::pair<std::string, Lease>> granted;  // every lease ever granted
    std::vector<TrajectoryGroup> accepted;
    std::map<uint64_t, int> accepted_per_job, delivered_per_job;
    uint64_t delivered = 0, last_batch = 0, added = 0;
    std::map<uint64_t, std::string> metadata_of;  // job id -> its metadata
    int clusters = 0;
    for (int step = 0; step < 1500; ++step) {
      const uint64_t event = uniform(100);
      if (event < 5 || clusters == 0) {
        const std::string id = "c" + std::to_string(clusters++);
        REQUIRE(core.Register(now, id, uniform(2) ? "eu" : "us", 1 + uniform(4)).ok());
        ready[id] = std::nullopt;
      } else if (event < 25) {
        const std::string id = "c" + std::to_string(uniform(clusters));
        std::optional<uint64_t> version;
        if (uniform(5)) version = latest - std::min<uint64_t>(latest, uniform(4));
        Status beat = core.Heartbeat(now, id, version);
        if (beat.code() == StatusCode::kNotFound) {
          // Lost or left: it must register again (as a worker does) before anything else.
          REQUIRE(core.RequestLeases(now, id, 1).status().code() == StatusCode::kNotFound);
          REQUIRE(core.Register(now, id, uniform(2) ? "eu" : "us", 1 + uniform(4)).ok());
          beat = core.Heartbeat(now, id, version);
        }
        if (beat.ok()) {
          ready[id] = version;
          if (version) max_ready[id] = std::max(max_ready[id], *version);
        }
      } else if (event < 45) {
        const std::string id = "c" + std::to_string(uniform(clusters));
        auto leases = core.RequestLeases(now, id, 1 + uniform(4));
        if (leases.ok() && !leases->empty()) {
          // Invariant: leases only to a cluster ready at an admissible version.
          REQUIRE(ready[id].has_value());
          CHECK(*ready[id] >= core.admissible_version());
          for (const Lease& lease : *leases) granted.push_back({id, lease});
        }
      } else if (event < 65 && !granted.empty()) {
        // Submit for a recent lease (sometimes an old, superseded one); sometimes with bad
        // versions.
        const size_t pick =
            granted.size() - 1 -
            std::min<uint64_t>(granted.size() - 1, uniform(uniform(4) ? 4 : granted.size()));
        const auto& [id, lease] = granted[pick];
        const uint64_t top = max_ready.count(id) ? max_ready[id] : 0;
        const uint64_t start =
            lease.min_version + uniform(top >= lease.min_version ? top - lease.min_version + 1 : 1);
        const uint64_t end =
            uniform(8) ? std::max(start, top) : top + 1;  // one in eight claims too new a version
        auto result = core.Submit(now, Make(lease, id, start, end));
        if (result.ok() && *result == SubmitResult::kAccepted) {
          CHECK(++accepted_per_job[lease.job] == 1);
          CHECK(end <= top);
          accepted.push_back(Make(lease, id, start, end));
        }
      } else if (event < 70 && !accepted.empty()) {
        // A duplicate of an accepted submission: acknowledged while the completion is remembered,
        // refused after; never counted again.
        const TrajectoryGroup& again = accepted[uniform(accepted.size())];
        const bool remembered = accepted_per_job.size() - std::min<size_t>(accepted_per_job.size(),
                                                                           config.remember_done) <=
                                static_cast<size_t>(std::distance(
                                    accepted_per_job.begin(), accepted_per_job.find(again.job)));
        auto result = core.Submit(now, again);
        if (remembered) {
          REQUIRE(result.ok());
          CHECK(*result == SubmitResult::kDuplicate);
        } else {
          CHECK(!result.ok());
        }
        CHECK(core.remembered_done() <= config.remember_done);
      } else if (event < 75) {
        REQUIRE(core.AnnounceVersion(now, ++latest).ok());
      } else if (event < 82) {
        // Every other job has metadata of its own, which must come back with its group only.
        JobSpec job{"prompt", 1 + static_cast<uint32_t>(uniform(4))};
        if (added % 2 == 0) job.metadata = "{\"row\": " + std::to_string(added) + "}";
        ++added;
        for (uint64_t id : core.AddJobs(now, {job})) metadata_of[id] = job.metadata;
      } else if (event < 88) {
        // The trainer acknowledges what it processed; one answer in six is lost on the way.
        Batch batch = core.TakeBatch(
            now, 1 + uniform(5), last_batch ? std::optional<uint64_t>(last_batch) : std::nullopt);
        for (const Delivered& d : batch.items) {
          CHECK(d.metadata == metadata_of[d.group.job]);
          // Invariant: nothing over the bound is handed out as fresh, first time or again.
          if (!d.stale) CHECK(d.group.version_start >= core.admissible_version());
          if (d.stale) CHECK(config.stale_policy == StalePolicy::kDeliverFlagged);
        }
        if (batch.id > last_batch && uniform(6) != 0) {
          last_batch = batch.id;
          for (const Delivered& d : batch.items) CHECK(++delivered_per_job[d.group.job] == 1);
          delivered += batch.items.size();
        }
      } else if (event < 90) {
        const std::string id = "c" + std::to_string(uniform(clusters));
        if (uniform(2)) {
          (void)core.Drain(now, id, {});
        } else {
          (void)core.Deregister(now, id);
        }
      } else {
        now += uniform(10) ? uniform(40) : uniform(2000);  // mostly small steps, some clock jumps
        core.Tick(now);
      }
      // Now and then the core goes on from its own snapshot (what a restart after a compaction
      // does): the round trip is exact, and every invariant and later decision must still hold.
      if (step % 100 == 99) {
        const std::string snapshot = core.Snapshot();
        Result<OrchestratorCore> restored = OrchestratorCore::Restore(config, snapshot);
        REQUIRE_MESSAGE(restored.ok(), restored.status().ToString());
        REQUIRE(restored->Snapshot() == snapshot);
        core = std::move(restored).value();
      }
      // Invariants after every event.
      const Counters& c = core.counters();
      REQUIRE(c.jobs_added == c.jobs_done + c.jobs_given_up + core.open_jobs());
      REQUIRE(core.open_jobs() == core.queued_jobs() + core.leased_jobs());
      REQUIRE(c.submissions_accepted == c.jobs_done);
      REQUIRE(c.submissions_accepted ==
              c.delivered_fresh + c.delivered_stale + c.dropped_stale + core.buffered());
      REQUIRE(c.delivered_fresh + c.delivered_stale >= delivered);
      REQUIRE(core.leased_jobs() + core.buffered() + core.outstanding() <= config.max_in_flight);
    }
    // Drain the buffer at the end: every accepted submission is delivered once or counted dropped.
    for (;;) {
      Batch batch =
          core.TakeBatch(now, 100, last_batch ? std::optional<uint64_t>(last_batch) : std::nullopt);
      if (batch.id == 0) break;
      if (batch.id <= last_batch) continue;
      last_batch = batch.id;
      for (const Delivered& d : batch.items) {
        CHECK(++delivered_per_job[d.group.job] == 1);
        CHECK(d.metadata == metadata_of[d.group.job]);
      }
      delivered += batch.items.size();
    }
    CHECK(core.outstanding() == 0);
    // The metadata of every group delivered and acknowledged is forgotten (open jobs keep theirs).
    const std::string state = core.Snapshot();
    for (const auto& [job, count] : delivered_per_job) {
      const std::string& metadata = metadata_of[job];
      if (!metadata.empty())
        CHECK(state.find(nlohmann::json(metadata).dump()) == std::string::npos);
    }
    CHECK(core.counters().delivered_fresh + core.counters().delivered_stale == delivered);
    CHECK(core.counters().submissions_accepted == core.counters().delivered_fresh +
                                                      core.counters().delivered_stale +
                                                      core.counters().dropped_stale);
    const Counters& c = core.counters();
    total.leases_granted += c.leases_granted;
    total.submissions_accepted += c.submissions_accepted;
    total.submissions_duplicate += c.submissions_duplicate;
    total.submissions_rejected += c.submissions_rejected;
    total.leases_expired += c.leases_expired;
    total.leases_cancelled += c.leases_cancelled;
    total.leases_handed_back += c.leases_handed_back;
    total.clusters_lost += c.clusters_lost;
    total.jobs_given_up += c.jobs_given_up;
    total.dropped_stale += c.dropped_stale;
    total.delivered_stale += c.delivered_stale;
    total.delivered_fresh += c.delivered_fresh;
    total.batches_redelivered += c.batches_redelivered;
  }
  INFO("leases " << total.leases_granted << ", accepted " << total.submissions_accepted
                 << ", duplicates " << total.submissions_duplicate << ", rejected "
                 << total.submissions_rejected << ", expired " << total.leases_expired
                 << ", cancelled " << total.leases_cancelled << ", handed back "
                 << total.leases_handed_back << ", clusters lost " << total.clusters_lost
                 << ", given up " << total.jobs_given_up << ", fresh " << total.delivered_fresh
                 << ", stale delivered " << total.delivered_stale << ", stale dropped "
                 << total.dropped_stale);
  for (uint64_t count :
       {total.leases_granted, total.submissions_accepted, total.submissions_duplicate,
        total.submissions_rejected, total.leases_expired, total.leases_cancelled,
        total.leases_handed_back, total.clusters_lost, total.jobs_given_up, total.delivered_fresh,
        total.delivered_stale, total.dropped_stale, total.batches_redelivered}) {
    CHECK(count > 0);
  }
}

TEST_CASE("core: versions are bounded, and never claimed before they are announced") {
  OrchestratorCore core(CoreConfig{});
  REQUIRE(core.Register(0, "a", "eu", 2).ok());
  CHECK(core.Heartbeat(1, "a", 0).code() == StatusCode::kConflict);  // nothing announced
  CHECK(core.AnnounceVersion(1, kMaxVersion + 1).code() == StatusCode::kInvalidArgument);
  CHECK(core.AnnounceVersion(1, ~uint64_t{0}).code() == StatusCode::kInvalidArgument);
  REQUIRE(core.AnnounceVersion(1, 3).ok());
  const Status beyond = core.Heartbeat(2, "a", uint64_t{1} << 63);
  CHECK(beyond.code() == StatusCode::kConflict);
  CHECK(beyond.message().find("was never announced (latest: 3)") != std::string::npos);
  CHECK(core.Heartbeat(2, "a", 4).code() == StatusCode::kConflict);
  REQUIRE(core.Heartbeat(2, "a", 3).ok());
  REQUIRE(core.AnnounceVersion(3, kMaxVersion).ok());  // the largest still moves forward
  CHECK(core.latest_version() == std::optional<uint64_t>(kMaxVersion));
}

TEST_CASE("core: cluster ids and regions follow one strict rule") {
  OrchestratorCore core(CoreConfig{});
  for (const std::string& bad :
       {std::string(""), std::string(129, 'a'), std::string("a/b"), std::string("a b"),
        std::string("a\"b"), std::string("a\nb"), std::string("a\0b", 3),
        std::string("caf\xC3\xA9"), std::string(".hidden"), std::string("-x")}) {
    CAPTURE(bad);
    CHECK(core.Register(0, bad, "eu", 1).code() == StatusCode::kInvalidArgument);
    CHECK(core.Register(0, "ok", bad, 1).code() == StatusCode::kInvalidArgument);
  }
  CHECK(core.clusters().empty());
  CHECK(core.Register(0, "Cluster-1.eu_west", "eu-west-1", 1).ok());
  CHECK(core.Register(0, std::string(128, 'a'), "r", 1).ok());
}

}  // namespace
}  // namespace weft::orchestrator

namespace weft::orchestrator {
namespace {

const std::string kTeacherDigest = "0123456789abcdef0123456789abcdef";

TEST_CASE(
    "core: jobs go only to clusters serving their model; a fixed model needs no announcement and "
    "is never stale") {
  CoreConfig config;
  config.max_staleness = 0;
  OrchestratorCore core(config);
  REQUIRE(core.Register(0, "student", "eu", 2).ok());
  REQUIRE(core.Register(0, "teacher-1", "us", 2, "", {"teacher", kTeacherDigest}).ok());
  // One name, one digest: another digest under the same name is refused and changes nothing.
  Status other = core.Register(0, "teacher-2", "us", 2, "", {"teacher", "ffff" + kTeacherDigest});
  CHECK(other.code() == StatusCode::kConflict);
  CHECK(other.message().find("digest " + kTeacherDigest) != std::string::npos);
  CHECK(!core.cluster("teacher-2"));
  CHECK(core.Register(0, "x", "us", 2, "", {"", kTeacherDigest}).code() ==
        StatusCode::kInvalidArgument);
  CHECK(core.Register(0, "x", "us", 2, "", {"teacher", ""}).code() == StatusCode::kInvalidArgument);

  JobSpec score{"[1,2]", 2};
  score.model = "teacher";
  score.kind = JobKind::kScore;
  score.targets = "[[3],[4]]";
  JobSpec missing{"[1]", 1};
  missing.model = "nobody";
  const std::vector<uint64_t> ids = core.AddJobs(0, {{"p", 1}, score, missing});
  // The fixed model's cluster proves its weights (its own version, never announced) and leases
  // the score job at once; no announcement is needed.
  REQUIRE(core.Heartbeat(1, "teacher-1", 7).ok());
  auto teacher = core.RequestLeases(2, "teacher-1", 5);
  REQUIRE(teacher->size() == 1);
  CHECK((*teacher)[0].job == ids[1]);
  CHECK((*teacher)[0].kind == JobKind::kScore);
  CHECK((*teacher)[0].model == "teacher");
  CHECK((*teacher)[0].targets == "[[3],[4]]");
  // The policy's job waits for the policy's announcement and its clusters.
  CHECK(core.RequestLeases(2, "student", 5)->empty());
  REQUIRE(core.AnnounceVersion(3, 1).ok());
  REQUIRE(core.Heartbeat(3, "student", 1).ok());
  auto student = core.RequestLeases(4, "student", 5);
  REQUIRE(student->size() == 1);
  CHECK((*student)[0].job == ids[0]);
  // The job for a model no cluster serves waits, and an alert names it.
  CHECK(core.queued_jobs() == 1);
  bool named = false;
  for (const std::string& alert : core.Alerts(5))
    named = named || alert.find("model nobody and no cluster serves it") != std::string::npos;
  CHECK(named);
  const std::vector<ModelView> models = core.models();
  REQUIRE(models.size() == 3);
  CHECK(models[0].name.empty());
  CHECK(models[1].name == "nobody");
  CHECK(models[1].queued == 1);
  CHECK(models[2].name == "teacher");
  CHECK(models[2].digest == kTeacherDigest);
  CHECK(models[2].leased == 1);
  CHECK(models[2].ready == 1);

  // A score group is tagged with the fixed model's version, which the policy never announced, and
  // stays fresh however far the policy moves on.
  CHECK(core.Submit(5, Make((*teacher)[0], "teacher-1", 7, 7)).value() == SubmitResult::kAccepted);
  CHECK(core.Submit(5, Make((*student)[0], "student", 1, 1)).value() == SubmitResult::kAccepted);
  REQUIRE(core.AnnounceVersion(6, 9).ok());
  Batch batch = core.TakeBatch(7, 10);
  REQUIRE(batch.items.size() == 1);
  CHECK(batch.items[0].model == "teacher");
  CHECK(batch.items[0].kind == JobKind::kScore);
  CHECK(!batch.items[0].stale);
  CHECK(core.counters().dropped_stale == 1);  // the policy's group, 8 versions behind at k = 0

  // The whole state survives a snapshot, models included.
  Result<OrchestratorCore> restored = OrchestratorCore::Restore(config, core.Snapshot());
  REQUIRE(restored.ok());
  CHECK(restored->Snapshot() == core.Snapshot());
  CHECK(
      restored->Register(8, "teacher-3", "us", 1, "", {"teacher", "ab" + kTeacherDigest}).code() ==
      StatusCode::kConflict);
}

TEST_CASE("core: a cluster registering again with another model hands back what it held") {
  OrchestratorCore core(CoreConfig{});
  REQUIRE(core.Register(0, "c", "eu", 2, "", {"teacher", kTeacherDigest}).ok());
  JobSpec job{"[1]", 1};
  job.model = "teacher";
  core.AddJobs(0, {job});
  REQUIRE(core.Heartbeat(1, "c", 0).ok());
  REQUIRE(core.RequestLeases(2, "c", 1)->size() == 1);
  REQUIRE(core.Register(3, "c", "eu", 2).ok());  // now the policy's
  CHECK(core.leased_jobs() == 0);
  CHECK(core.queued_jobs() == 1);
  CHECK(!core.cluster("c")->ready_version);
  CHECK(core.cluster("c")->model.empty());
}

}  // namespace
}  // namespace weft::orchestrator
