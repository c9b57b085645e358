// The rollout worker's decisions (rollout_worker/worker_core.h), on given times.
#include "rollout_worker/worker_core.h"

#include <doctest/doctest.h>

#include <deque>

namespace weft::rollout_worker {
namespace {

using Change = WorkerCore::Change;

// A core holding and serving `version` on `replicas` replicas.
WorkerCore Serving(uint64_t version, uint32_t capacity = 2, uint32_t replicas = 1) {
  WorkerCore core(capacity);
  core.EngineHealth(replicas, std::nullopt);
  core.Pulled(version);
  REQUIRE(core.ShouldLoad(0));
  core.Loaded();
  return core;
}

TEST_CASE("worker core: ready only once a pulled copy is loaded, and only what is loaded") {
  WorkerCore core(2);
  CHECK(core.EngineHealth(1, std::nullopt) == Change::kNone);
  CHECK(core.PullTarget(3) == 3u);
  CHECK_FALSE(core.ShouldLoad(0));  // nothing held
  core.Pulled(3);
  CHECK(core.held() == 3u);
  CHECK_FALSE(core.ready());  // held, not loaded
  CHECK(core.LeasableSlots(0) == 0);
  CHECK(core.PullTarget(3) == std::nullopt);
  CHECK(core.PullTarget(2) == std::nullopt);
  CHECK(core.ShouldLoad(0));
  core.Loaded();
  CHECK(core.ready() == 3u);
  CHECK_FALSE(core.ShouldLoad(0));  // the engine has it as it is
  CHECK(core.PullTarget(5) == 5u);
  core.Pulled(5);
  CHECK(core.ready() == 3u);  // until version 5 is loaded, heartbeats claim 3
  CHECK(core.ShouldLoad(0));
}

TEST_CASE("worker core: readiness follows the engine's replicas") {
  WorkerCore core = Serving(4, 2, 3);
  CHECK(core.LeasableSlots(0) == 6);
  CHECK(core.MayLease(5, 0));
  CHECK_FALSE(core.MayLease(6, 0));
  CHECK(core.EngineHealth(1, 4) == Change::kNone);
  CHECK(core.LeasableSlots(0) == 2);  // slots beyond what the ready replicas serve wait
  CHECK(core.EngineHealth(0, 4) == Change::kLost);
  CHECK_FALSE(core.ready());
  CHECK(core.LeasableSlots(0) == 0);
  CHECK(core.EngineHealth(0, 4) == Change::kNone);
  // Back, but serving something else (a replica restarted empty): not ready until loaded again.
  CHECK(core.EngineHealth(1, std::nullopt) == Change::kNone);
  CHECK(core.EngineHealth(1, 3) == Change::kNone);
  CHECK(core.EngineHealth(2, 4) == Change::kRegained);
  CHECK(core.ready() == 4u);
  // A newer copy pulled but not loaded: an engine coming back with the old version is not ready
  // at the new one.
  core.Pulled(5);
  CHECK(core.EngineHealth(0, 4) == Change::kLost);
  CHECK(core.EngineHealth(1, 4) == Change::kNone);
  CHECK(core.EngineHealth(1, 5) == Change::kNone);  // the copy was never given to it
  core.Loaded();
  CHECK(core.ready() == 5u);
}

TEST_CASE("worker core: a dropped copy keeps the engine's readiness, a corrupted one does not") {
  WorkerCore dropped = Serving(7);
  dropped.CopyDropped();
  CHECK_FALSE(dropped.held());
  CHECK(dropped.ready() == 7u);  // the engine goes on serving version 7
  CHECK(dropped.PullTarget(7) == 7u);
  CHECK_FALSE(dropped.ShouldLoad(0));

  WorkerCore corrupted = Serving(7);
  corrupted.CopyCorrupted();
  CHECK_FALSE(corrupted.held());
  CHECK_FALSE(corrupted.ready());
  CHECK(corrupted.PullTarget(7) == 7u);
  corrupted.Pulled(7);
  CHECK(corrupted.ShouldLoad(0));  // the keyframe is loaded again even at the same version
  corrupted.Loaded();
  CHECK(corrupted.ready() == 7u);
}

TEST_CASE("worker core: failed loads back off from 250 ms doubling to 10 s; a load resets") {
  WorkerCore core(1);
  core.EngineHealth(1, std::nullopt);
  core.Pulled(1);
  WorkerCore::Micros now = 1'000'000;
  std::vector<WorkerCore::Micros> waits;
  for (int i = 0; i < 8; ++i) {
    REQUIRE(core.ShouldLoad(now));
    waits.push_back(core.LoadFailed(now));
    CHECK_FALSE(core.ShouldLoad(now + waits.back() - 1));
    now += waits.back();
  }
  CHECK(waits == std::vector<WorkerCore::Micros>{250'000, 500'000, 1'000'000, 2'000'000, 4'000'000,
                                                 8'000'000, 10'000'000, 10'000'000});
  core.Loaded();
  core.Pulled(2);
  CHECK(core.ShouldLoad(now));
  CHECK(core.LoadFailed(now) == 250'000);
}

TEST_CASE("worker core: leasing backs off after failed jobs until a submission is accepted") {
  WorkerCore core = Serving(1, 2, 1);
  const WorkerCore::Micros now = 5'000'000;
  CHECK(core.BackOffLeasing(now) == 500'000);
  CHECK(core.leasing_paused_until() == now + 500'000);
  CHECK(core.LeasableSlots(now + 499'999) == 0);
  CHECK(core.LeasableSlots(now + 500'000) == 2);
  CHECK(core.BackOffLeasing(now) == 1'000'000);
  for (int i = 0; i < 10; ++i) core.BackOffLeasing(now);
  CHECK(core.BackOffLeasing(now) == 10'000'000);
  core.Submitted();
  CHECK(core.BackOffLeasing(now) == 500'000);
}

TEST_CASE(
    "worker core: a group is submitted only once the orchestrator acknowledged its newest "
    "version") {
  WorkerCore core = Serving(3);
  CHECK_FALSE(core.MaySubmit(3));
  core.Acknowledged(std::nullopt);
  CHECK_FALSE(core.MaySubmit(0));
  core.Acknowledged(3);
  CHECK(core.MaySubmit(2));
  CHECK(core.MaySubmit(3));
  CHECK_FALSE(core.MaySubmit(4));
  core.Acknowledged(2);  // an older answer arriving late does not take it back
  core.Acknowledged(std::nullopt);
  CHECK(core.acknowledged() == 3u);
  CHECK(core.MaySubmit(3));
}

TEST_CASE("worker core: a group's versions are its samples' segments end to end") {
  orchestrator::TrajectoryGroup group;
  AddSampleVersions({{2, 0}, {3, 4}}, 6, &group);
  AddSampleVersions({{3, 0}, {5, 1}}, 3, &group);
  AddSampleVersions({{5, 0}}, 2, &group);
  CHECK(group.segments == VersionSegments{{2, 0}, {3, 4}, {5, 7}});
  CHECK(group.tokens == 11);
  CHECK(group.version_start == 2);
  CHECK(group.version_end == 5);
}

// Answers heartbeats and registrations from a script, recording the calls.
class ScriptedApi : public orchestrator::ClusterApi {
 public:
  std::deque<Status> heartbeats, registrations;
  std::vector<std::string> calls;

  using orchestrator::ClusterApi::Register;
  Status Register(const std::string& cluster, const std::string& region, uint32_t capacity,
                  const orchestrator::ModelRef&) override {
    calls.push_back("register " + cluster + " " + region + " " + std::to_string(capacity));
    return Next(registrations);
  }
  Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready,
                   const orchestrator::SyncReport*) override {
    calls.push_back("heartbeat " + cluster + " " + (ready ? std::to_string(*ready) : "-"));
    return Next(heartbeats);
  }
  Result<orchestrator::LeaseAnswer> RequestLeases(const std::string&, uint32_t,
                                                  std::chrono::milliseconds) override {
    return Internal("not scripted");
  }
  Result<orchestrator::SubmitResult> Submit(const orchestrator::TrajectoryGroup&) override {
    return Internal("not scripted");
  }
  Status Drain(const std::string&, const std::vector<uint64_t>&) override {
    return Internal("not scripted");
  }
  Status Release(const std::string&, const std::vector<uint64_t>&) override {
    return Internal("not scripted");
  }
  Status Deregister(const std::string&) override { return Internal("not scripted"); }

 private:
  static Status Next(std::deque<Status>& script) {
    if (script.empty()) return Status::Ok();
    Status next = script.front();
    script.pop_front();
    return next;
  }
};

TEST_CASE("worker heartbeat: registers again when unknown, leaves out an unannounced version") {
  ScriptedApi plain;
  HeartbeatOutcome out = SendHeartbeat(plain, "c", "eu", 4, 7, nullptr);
  CHECK(out.status.ok());
  CHECK(out.acknowledged == 7u);
  CHECK(plain.calls == std::vector<std::string>{"heartbeat c 7"});

  ScriptedApi lost;
  lost.heartbeats = {NotFound("no cluster c")};
  out = SendHeartbeat(lost, "c", "eu", 4, 7, nullptr);
  CHECK(out.status.ok());
  CHECK(out.registered_again);
  CHECK(out.acknowledged == 7u);
  CHECK(lost.calls ==
        std::vector<std::string>{"heartbeat c 7", "register c eu 4", "heartbeat c 7"});

  ScriptedApi early;
  early.heartbeats = {Conflict("version 7 is not announced")};
  out = SendHeartbeat(early, "c", "eu", 4, 7, nullptr);
  CHECK(out.status.ok());
  CHECK(out.unannounced);
  CHECK(out.acknowledged == std::nullopt);
  CHECK(early.calls == std::vector<std::string>{"heartbeat c 7", "heartbeat c -"});

  ScriptedApi down;
  down.heartbeats = {Unavailable("connection refused")};
  out = SendHeartbeat(down, "c", "eu", 4, 7, nullptr);
  CHECK(out.status.code() == StatusCode::kUnavailable);
  CHECK(out.acknowledged == std::nullopt);

  ScriptedApi refused;
  refused.heartbeats = {NotFound("no cluster c")};
  refused.registrations = {Unavailable("draining")};
  out = SendHeartbeat(refused, "c", "eu", 4, std::nullopt, nullptr);
  CHECK(out.status.code() == StatusCode::kUnavailable);
  CHECK(refused.calls == std::vector<std::string>{"heartbeat c -", "register c eu 4"});
}

}  // namespace
}  // namespace weft::rollout_worker
