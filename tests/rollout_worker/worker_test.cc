// The rollout worker against a real orchestrator (loopback) and a directory store, with the
// embedded engine and the arithmetic task.
#include "rollout_worker/worker.h"

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "common/mem_env.h"
#include "examples/arithmetic_task.h"
#include "examples/embedded_engine.h"
#include "orchestrator/local_cluster_api.h"
#include "orchestrator/service.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/manifest.h"
#include "policy_store/run_objects.h"
#include "tests/orchestrator_test_util.h"
#include "trainer_adapter/batch_client.h"
#include "trainer_adapter/publisher.h"
#include "trainer_adapter/received_group.h"

namespace weft::rollout_worker {
namespace {

using namespace weft::orchestrator;
using Json = nlohmann::json;

// The worker's view of a store: while frozen, the latest version cannot be read (the worker sees
// no new version); reads of some blobs can be damaged (a byte flipped), and are counted.
class GatedStore : public policy_store::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    if (frozen.load() && key == policy_store::LatestKey("r")) return Unavailable("frozen");
    Result<std::vector<uint8_t>> got = inner().Get(key);
    std::lock_guard<std::mutex> lock(mutex_);
    if (damaged_.count(key) != 0 && got.ok() && !got->empty()) {
      ++damaged_reads_;
      if (damage_) (*got)[got->size() / 2] ^= 1;
    }
    return got;
  }
  void Damage(std::set<std::string> keys, bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    damaged_ = std::move(keys);
    damage_ = on;
  }
  int damaged_reads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return damaged_reads_;
  }
  std::atomic<bool> frozen{false};

 private:
  std::mutex mutex_;
  std::set<std::string> damaged_;
  bool damage_ = false;
  int damaged_reads_ = 0;
};

TEST_CASE("group versions: samples end to end, runs tagged, range from the oldest to the newest") {
  Completion a, b, c;
  a.tokens = {1, 2, 3, 4};
  a.segments = {{4, 0}, {5, 2}};
  b.tokens = {1, 2, 3};
  b.segments = {{4, 0}};  // finished before the commit
  c.tokens = {7, 7};
  c.segments = {{5, 0}};
  orchestrator::TrajectoryGroup g;
  SetGroupVersions({a, b, c}, &g);
  CHECK(g.tokens == 9);
  CHECK(g.version_start == 4);
  CHECK(g.version_end == 5);
  CHECK(g.segments == std::vector<std::pair<uint64_t, uint64_t>>{{4, 0}, {5, 2}, {4, 4}, {5, 7}});
  // One version throughout: one run.
  orchestrator::TrajectoryGroup same;
  SetGroupVersions({b, b}, &same);
  CHECK(same.segments == std::vector<std::pair<uint64_t, uint64_t>>{{4, 0}});
  orchestrator::TrajectoryGroup none;
  SetGroupVersions({}, &none);
  CHECK(none.segments.empty());
}

// The example policy at its smallest, for `task`.
examples::TinyLmConfig SmallModel(const examples::ArithmeticTask& task) {
  examples::TinyLmConfig model;
  model.d_model = 16;
  model.layers = 1;
  model.heads = 2;
  model.d_ff = 32;
  model.max_seq = task.max_length();
  return model;
}

std::unique_ptr<policy_store::ObjectStore> NewStore(const std::string& dir) {
  policy_store::OpenOptions create;
  create.create = true;
  return std::move(policy_store::OpenStore(dir, create)).value();
}

// Run r's publisher, with the policy's weights from seed 3 published as version 0.
std::unique_ptr<trainer_adapter::Publisher> PublishPolicy(policy_store::ObjectStore& store,
                                                          const examples::TinyLmLayout& layout) {
  return std::move(trainer_adapter::Publisher::Start(
                       store, "r", layout.Master(layout.Initialize(3)), sync::ServingPlan{}, {}))
      .value();
}

// Cluster c1 in region eu of run r, quick intervals, samples of up to 3 tokens.
WorkerOptions SmallWorker(uint32_t capacity, std::chrono::milliseconds heartbeat,
                          std::chrono::milliseconds lease_wait) {
  WorkerOptions options;
  options.cluster = "c1";
  options.region = "eu";
  options.run_id = "r";
  options.capacity = capacity;
  options.heartbeat_interval = heartbeat;
  options.sync_interval = std::chrono::milliseconds(20);
  options.lease_wait = lease_wait;
  options.sampling.max_tokens = 3;
  options.sampling.stop_token = examples::ArithmeticTask::kEnd;
  return options;
}

bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Run r over HTTP: an orchestrator in a process of its own, the trainer's and the worker's
// clients, and the policy (seed 3) published as version 0, announced, in a fresh directory store.
struct HttpRun {
  explicit HttpRun(const std::string& name)
      : store_dir(testing::TempPath(name)),
        trainer(o.url, "t-token", Quick()),
        worker_client(o.url, "w-token", Quick()),
        model(SmallModel(task)),
        layout(model),
        store(NewStore(store_dir)),
        publisher(PublishPolicy(*store, layout)) {
    REQUIRE(trainer.AnnounceVersion(0).ok());
  }
  ~HttpRun() { std::filesystem::remove_all(store_dir); }
  static HttpClientOptions Quick() {
    HttpClientOptions quick;
    quick.deadline = std::chrono::milliseconds(10000);
    return quick;
  }

  const std::string store_dir;
  testing::RunningOrchestrator o;
  OrchestratorClient trainer, worker_client;
  const examples::ArithmeticTask task{1};
  const examples::TinyLmConfig model;
  const examples::TinyLmLayout layout;
  std::unique_ptr<policy_store::ObjectStore> store;
  std::unique_ptr<trainer_adapter::Publisher> publisher;
};

TEST_CASE("rollout worker: without push, a version announced is heard of from a lease answer") {
  // The worker reads the store's `latest` every 30 s only (push off, as for a store that cannot
  // push), but the answer to its lease poll, the job of the trainer's next step, tells of the
  // version announced before it, and the worker pulls that version at once.
  HttpRun run("worker_hears_announcement");
  std::vector<float> weights = run.layout.Initialize(3);
  examples::EmbeddedEngine engine(run.model, 1);
  const examples::ArithmeticVerifier verifier(run.task);
  WorkerOptions options =
      SmallWorker(1, std::chrono::milliseconds(200), std::chrono::milliseconds(5000));
  options.push = false;
  options.sync_interval = std::chrono::milliseconds(30000);
  RolloutWorker worker(options, run.worker_client, *run.store, engine, verifier);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(0); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the lease poll is parked
  for (float& w : weights) w *= 1.01f;
  REQUIRE(run.publisher->Publish(run.layout.Master(weights)).ok());
  REQUIRE(run.trainer.AnnounceVersion(1).ok());
  const auto announced = std::chrono::steady_clock::now();
  REQUIRE(run.trainer.AddJobs({{Json("1+1="), 1}}).ok());
  REQUIRE(WaitFor([&] { return engine.version() == std::optional<uint64_t>(1); },
                  std::chrono::milliseconds(10000)));
  CHECK(std::chrono::steady_clock::now() - announced < std::chrono::milliseconds(3000));
  worker.Stop();
  running.join();
  CHECK(ran.ok());
}

TEST_CASE("rollout worker: a version served before its announcement is claimed once announced") {
  // The store tells the worker of version 1 (pushed) before the trainer announces it: the worker
  // serves it but cannot claim it, so the cluster is not ready; once announced, the worker claims
  // it within moments, not at its next heartbeat (5 s away here).
  HttpRun run("worker_unannounced");
  std::vector<float> weights = run.layout.Initialize(3);
  examples::EmbeddedEngine engine(run.model, 1);
  const examples::ArithmeticVerifier verifier(run.task);
  RolloutWorker worker(
      SmallWorker(1, std::chrono::milliseconds(5000), std::chrono::milliseconds(200)),
      run.worker_client, *run.store, engine, verifier);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });
  auto claimed = [&] {
    Result<orchestrator::wire::StatusPage> status = run.trainer.GetStatus();
    return status.ok() && !status->clusters.empty() ? status->clusters.at(0).ready_version
                                                    : std::nullopt;
  };
  REQUIRE(WaitFor([&] { return claimed() == std::optional<uint64_t>(0); }));
  for (float& w : weights) w *= 1.01f;
  REQUIRE(run.publisher->Publish(run.layout.Master(weights)).ok());
  REQUIRE(WaitFor([&] { return engine.version() == std::optional<uint64_t>(1); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(!claimed());  // serving an unannounced version: not ready
  REQUIRE(run.trainer.AnnounceVersion(1).ok());
  const auto announced = std::chrono::steady_clock::now();
  REQUIRE(WaitFor([&] { return claimed() == std::optional<uint64_t>(1); },
                  std::chrono::milliseconds(4000)));
  CHECK(std::chrono::steady_clock::now() - announced < std::chrono::milliseconds(2000));
  worker.Stop();
  running.join();
  CHECK(ran.ok());
}

TEST_CASE(
    "rollout worker: syncs, proves its version, generates, submits; re-syncs after a digest "
    "mismatch; drains") {
  // The policy, published as version 0.
  HttpRun run("worker_store");
  std::vector<float> weights = run.layout.Initialize(3);

  examples::EmbeddedEngine engine(run.model, 1);
  const examples::ArithmeticVerifier verifier(run.task);
  WorkerOptions options =
      SmallWorker(2, std::chrono::milliseconds(100), std::chrono::milliseconds(200));
  options.verify_interval = std::chrono::milliseconds(50);
  GatedStore view(*run.store);
  HostWeightSink sink(engine);
  RolloutWorker worker(options, run.worker_client, view, engine, verifier, &sink);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });

  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(0); }));
  CHECK(engine.version() == 0);
  REQUIRE(run.trainer.AddJobs({{Json("1+2="), 3}, {Json("4+4="), 3}}).ok());
  trainer_adapter::BatchClient batches(run.trainer, 2);
  std::vector<orchestrator::Delivered> groups;
  REQUIRE(WaitFor([&] {
    auto more = batches.NextBatch(6, 0, std::chrono::milliseconds(200));
    REQUIRE(more.ok());
    for (auto& g : *more) groups.push_back(std::move(g));
    return groups.size() >= 2;
  }));
  for (const orchestrator::Delivered& d : groups) {
    CHECK(d.group.cluster == "c1");
    CHECK(d.group.version_start == 0);
    CHECK(d.group.segments == std::vector<std::pair<uint64_t, uint64_t>>{{0, 0}});
    const Json trajectories = Json::parse(d.group.trajectories);
    REQUIRE(trajectories["samples"].size() == 3);
    for (const Json& s : trajectories["samples"]) {
      CHECK(s["tokens"].size() == s["logprobs"].size());
      CHECK((s["reward"] == 0.0 || s["reward"] == 1.0));
    }
    CHECK(trajectories["prompt"].is_string());
  }

  // A new version: the worker pulls the delta, proves it and says so.
  for (float& w : weights) w *= 1.01f;
  REQUIRE(run.publisher->Publish(run.layout.Master(weights)).ok());
  REQUIRE(run.trainer.AnnounceVersion(1).ok());
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(1); }));
  SyncReport report = worker.sync_report();
  CHECK(report.pulls == 2);
  CHECK(report.keyframe_pulls == 1);
  CHECK(report.first_version == 0);
  CHECK(report.newest_version == 1);
  CHECK(report.bytes_downloaded > 0);
  CHECK(report.digest_mismatches == 0);

  // A bit flips in the served copy: the next round's digest check catches it; the worker stops
  // claiming the version and comes back from a keyframe.
  sink.CorruptForTest();
  REQUIRE(WaitFor([&] {
    return worker.sync_report().digest_mismatches == 1 &&
           worker.ready_version() == std::optional<uint64_t>(1);
  }));
  CHECK(worker.sync_report().keyframe_pulls == 2);
  // The orchestrator shows the counters it was sent.
  REQUIRE(WaitFor([&] {
    auto status = run.trainer.GetStatus();
    return status.ok() && status->regions["eu"].sync.digest_mismatches == 1;
  }));

  // While the worker cannot see the store, versions 2 and 3 come and version 2's manifest goes:
  // nothing chains from version 1 any more, so the next pull restarts from the keyframe, and the
  // worker drops its copy first. The keyframe arrives damaged on every read: the pull fails, the
  // worker forgets the version it held and its engine goes on serving version 1. Once the
  // keyframe reads whole, the next round pulls version 3 from nothing, and no digest mismatch is
  // counted (a worker that still claimed version 1 would find its empty copy wrong).
  view.frozen = true;
  for (uint64_t v = 2; v <= 3; ++v) {
    for (float& w : weights) w *= 1.01f;
    REQUIRE(run.publisher->Publish(run.layout.Master(weights)).ok());
    REQUIRE(run.trainer.AnnounceVersion(v).ok());
  }
  std::set<std::string> keyframes;  // every keyframe blob a pull of version 3 could start from
  for (uint64_t v = 0; v <= 3; ++v) {
    Result<policy_store::Manifest> manifest = policy_store::ReadManifest(*run.store, "r", v);
    if (!manifest.ok()) continue;
    for (const policy_store::BlobRef& part : manifest->keyframe)
      keyframes.insert(policy_store::BlobKey(part.sha256));
  }
  REQUIRE(!keyframes.empty());
  REQUIRE(run.store->Delete(policy_store::ManifestKey("r", 2)).ok());
  view.Damage(keyframes, true);
  const uint64_t keyframe_pulls = worker.sync_report().keyframe_pulls;
  view.frozen = false;
  REQUIRE(WaitFor([&] { return view.damaged_reads() >= 6; }));  // two pulls of 3 tries each
  CHECK(worker.ready_version() == std::optional<uint64_t>(1));
  CHECK(engine.version() == 1);
  view.Damage(keyframes, false);
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(3); }));
  CHECK(worker.sync_report().keyframe_pulls == keyframe_pulls + 1);
  CHECK(worker.sync_report().digest_mismatches == 1);

  worker.Stop();
  running.join();
  CHECK(ran.ok());
  auto status = run.trainer.GetStatus().value();
  REQUIRE(status.clusters.size() == 1);
  CHECK(status.clusters[0].state == "gone");
  CHECK(status.jobs.leased == 0);
  CHECK(worker.stats().jobs == 2);
  CHECK(worker.stats().samples == 6);
}

// The embedded engine behind two pretend replicas whose readiness the test sets, and which can
// fail every generation as unavailable (an engine that stopped answering).
class SwitchableEngine : public Engine {
 public:
  explicit SwitchableEngine(Engine& inner) : inner_(inner) {}
  Status Stage(const sync::ServedModel& model, uint64_t version) override {
    return inner_.Stage(model, version);
  }
  Result<int64_t> Commit() override { return inner_.Commit(); }
  std::optional<uint64_t> version() const override { return inner_.version(); }
  Result<std::vector<Completion>> Generate(const std::vector<Prompt>& prompts,
                                           const Sampling& sampling) override {
    if (failing) return Unavailable("no replica answers");
    return inner_.Generate(prompts, sampling);
  }
  EngineHealth Health() const override {
    EngineHealth health;
    health.ok = ready > 0;
    health.detail = "pretend replicas";
    health.replicas = 2;
    health.ready_replicas = ready;
    return health;
  }

  std::atomic<int> ready{2};
  std::atomic<bool> failing{false};

 private:
  Engine& inner_;
};

TEST_CASE(
    "rollout worker: capacity per replica; an engine that is down makes it not ready and its jobs "
    "go back at once") {
  HttpRun run("worker_replicas_store");
  examples::EmbeddedEngine embedded(run.model, 1);
  SwitchableEngine engine(embedded);
  const examples::ArithmeticVerifier verifier(run.task);
  const WorkerOptions options =
      SmallWorker(3, std::chrono::milliseconds(100), std::chrono::milliseconds(200));
  RolloutWorker worker(options, run.worker_client, *run.store, engine, verifier);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(0); }));
  // It registered 3 jobs per replica.
  CHECK(run.trainer.GetStatus().value().clusters.at(0).capacity == 6);

  // No replica ready: not ready (the orchestrator hears it), and no lease is taken.
  engine.ready = 0;
  REQUIRE(WaitFor([&] { return !worker.ready_version(); }));
  REQUIRE(WaitFor([&] { return !run.trainer.GetStatus().value().clusters.at(0).ready_version; }));
  // The status shows its replicas, none ready.
  REQUIRE(WaitFor([&] {
    const std::optional<SyncReport> sync = run.trainer.GetStatus().value().clusters.at(0).sync;
    return sync && sync->engine_replicas == 2 && sync->ready_replicas == 0;
  }));
  REQUIRE(run.trainer.AddJobs({{Json("1+2="), 2}}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(run.trainer.GetStatus().value().jobs.leased == 0);

  // Ready again, but generation fails as unavailable: each lease goes back at once.
  engine.failing = true;
  engine.ready = 2;
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(0); }));
  REQUIRE(WaitFor([&] { return run.trainer.GetStatus().value().leases.handed_back >= 1; }));
  // (The worker counts it once the orchestrator's answer is back.)
  CHECK(WaitFor([&] { return worker.stats().handed_back >= 1; }));
  // Backing off, it does not use up the job's attempts meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(run.trainer.GetStatus().value().jobs.given_up == 0);
  CHECK(run.trainer.GetStatus().value().leases.handed_back <= 4);
  // The engine answers again: the job completes.
  engine.failing = false;
  trainer_adapter::BatchClient batches(run.trainer, 2);
  std::vector<orchestrator::Delivered> groups;
  REQUIRE(WaitFor([&] {
    auto more = batches.NextBatch(2, 0, std::chrono::milliseconds(200));
    REQUIRE(more.ok());
    for (auto& g : *more) groups.push_back(std::move(g));
    return !groups.empty();
  }));
  CHECK(Json::parse(groups[0].group.trajectories)["samples"].size() == 2);

  // A job it cannot generate at all (a prompt the task refuses) goes back at once, each attempt,
  // and is given up after the last; held, its lease would be renewed by every heartbeat and the
  // job would never end.
  const uint64_t before = worker.stats().handed_back;
  REQUIRE(run.trainer.AddJobs({{Json(42), 1}}).ok());
  CHECK(WaitFor([&] { return run.trainer.GetStatus().value().jobs.given_up == 1; }));
  // The worker counts a hand-back when the orchestrator's answer reaches it, which can be after
  // the orchestrator has already leased the next attempt to another of its job threads (and, on
  // the last, given the job up): wait for the answers, then check none was counted twice.
  CHECK(WaitFor([&] { return worker.stats().handed_back >= before + 5; }));
  CHECK(worker.stats().handed_back == before + 5);  // max_attempts
  CHECK(run.trainer.GetStatus().value().jobs.leased == 0);
  worker.Stop();
  running.join();
  CHECK(ran.ok());
}

// The pieces of a run in one process, with no HTTP and no journal file: a core that journals to a
// MemEnv, answering the worker through LocalClusterApi (on the machine's clock), run r's store in
// a directory with version 0 published and announced, and an embedded engine of the policy.
struct InProcessRun {
  explicit InProcessRun(const std::string& name)
      : core(OpenCore(disk)),
        api(*core, Env::Default()),
        store_dir(testing::TempPath(name)),
        model(SmallModel(task)),
        layout(model),
        store(NewStore(store_dir)),
        publisher(PublishPolicy(*store, layout)),
        engine(model, 1),
        verifier(task) {
    REQUIRE(core->AnnounceVersion(WallMicros(), 0).ok());
  }
  ~InProcessRun() { std::filesystem::remove_all(store_dir); }
  static std::unique_ptr<DurableCore> OpenCore(MemEnv& disk) {
    DurableCore::Options options;
    options.env = &disk;
    return std::move(DurableCore::Open("/o/journal", CoreConfig{}, options)).value();
  }

  MemEnv disk;
  std::unique_ptr<DurableCore> core;
  LocalClusterApi api;
  const std::string store_dir;
  const examples::ArithmeticTask task{1};
  const examples::TinyLmConfig model;
  const examples::TinyLmLayout layout;
  std::unique_ptr<policy_store::ObjectStore> store;
  std::unique_ptr<trainer_adapter::Publisher> publisher;
  examples::EmbeddedEngine engine;
  const examples::ArithmeticVerifier verifier;
};

// Forwards to another ClusterApi, holding each heartbeat a while and recording how many were in
// flight at once and whether their counters ever went backwards.
class HeartbeatWatch : public ClusterApi {
 public:
  explicit HeartbeatWatch(ClusterApi& inner) : inner_(inner) {}
  using ClusterApi::Register;
  Status Register(const std::string& cluster, const std::string& region, uint32_t capacity,
                  const orchestrator::ModelRef& model) override {
    return inner_.Register(cluster, region, capacity, model);
  }
  Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                   const SyncReport* sync) override {
    const int now = ++in_flight_;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    if (sync != nullptr) {
      const uint64_t pulls = sync->pulls;
      if (pulls < last_pulls_.exchange(pulls)) backwards_ = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    Status status = inner_.Heartbeat(cluster, ready_version, sync);
    --in_flight_;
    return status;
  }
  Result<orchestrator::LeaseAnswer> RequestLeases(const std::string& cluster, uint32_t max,
                                                  std::chrono::milliseconds wait) override {
    return inner_.RequestLeases(cluster, max, wait);
  }
  Result<SubmitResult> Submit(const TrajectoryGroup& group) override {
    return inner_.Submit(group);
  }
  Status Drain(const std::string& cluster, const std::vector<uint64_t>& jobs) override {
    return inner_.Drain(cluster, jobs);
  }
  Status Release(const std::string& cluster, const std::vector<uint64_t>& jobs) override {
    return inner_.Release(cluster, jobs);
  }
  Status Deregister(const std::string& cluster) override { return inner_.Deregister(cluster); }

  int most() const { return most_.load(); }
  bool backwards() const { return backwards_.load(); }

 private:
  ClusterApi& inner_;
  std::atomic<int> in_flight_{0}, most_{0};
  std::atomic<uint64_t> last_pulls_{0};
  std::atomic<bool> backwards_{false};
};

TEST_CASE("rollout worker: one heartbeat at a time, its counters in order") {
  // The heartbeat loop and the sync loop (after each commit) both send heartbeats: were they to
  // overlap, an older report could reach the orchestrator after a newer one and look like a
  // restarted worker, its bytes counted twice.
  InProcessRun run("worker_heartbeat_order");
  HeartbeatWatch api(run.api);
  RolloutWorker worker(SmallWorker(1, std::chrono::milliseconds(10), std::chrono::milliseconds(50)),
                       api, *run.store, run.engine, run.verifier);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });
  std::vector<float> weights = run.layout.Initialize(3);
  for (uint64_t v = 1; v <= 8; ++v) {
    for (float& w : weights) w *= 1.01f;
    REQUIRE(run.publisher->Publish(run.layout.Master(weights)).ok());
    REQUIRE(run.core->AnnounceVersion(WallMicros(), v).ok());
    REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(v); }));
  }
  worker.Stop();
  running.join();
  CHECK(ran.ok());
  CHECK(api.most() == 1);
  CHECK(!api.backwards());
}

TEST_CASE("rollout worker in process: the real worker against a core on an in-memory disk") {
  InProcessRun run("worker_in_process_store");
  DurableCore* core = run.core.get();
  const WorkerOptions options =
      SmallWorker(2, std::chrono::milliseconds(50), std::chrono::milliseconds(100));
  RolloutWorker worker(options, run.api, *run.store, run.engine, run.verifier);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });
  REQUIRE(core->AddJobs(WallMicros(), {{"\"1+2=\"", 2}, {"\"3+4=\"", 2}}).ok());
  std::vector<Delivered> delivered;
  REQUIRE(WaitFor([&] {
    Result<Batch> batch = core->TakeBatch(WallMicros(), 10);
    REQUIRE(batch.ok());
    for (Delivered& d : batch->items) delivered.push_back(std::move(d));
    return delivered.size() == 2;
  }));
  for (const Delivered& d : delivered) {
    Result<trainer_adapter::ReceivedGroup> group = trainer_adapter::ParseGroup(d, 0);
    REQUIRE_MESSAGE(group.ok(), group.status().ToString());
    CHECK(group->samples.size() == 2);
    for (const auto& sample : group->samples) {
      CHECK(sample.versions == std::vector<uint64_t>(sample.tokens.size(), 0));
      CHECK(sample.reward.has_value());
    }
  }
  CHECK(run.api.sync_report("c1").has_value());
  worker.Stop();
  running.join();
  CHECK(ran.ok());
  // Drained and gone from the core.
  CHECK(core->Inspect([](const OrchestratorCore& c) {
    for (const ClusterView& view : c.clusters())
      if (view.id == "c1") return view.gone;
    return false;
  }));
}

// A HostWeightSink that counts its proofs.
class CountingSink : public WeightSink {
 public:
  explicit CountingSink(Engine& engine) : host(engine) {}
  Result<policy_store::PullReport> Pull(policy_store::StoreReader& reader, uint64_t target,
                                        const policy_store::Manifest* held) override {
    return host.Pull(reader, target, held);
  }
  bool empty() const override { return host.empty(); }
  void Drop() override { host.Drop(); }
  Status Prove(const policy_store::Manifest& manifest, int threads) override {
    Status proved = host.Prove(manifest, threads);
    ++proofs;  // once done: a test that saw the count sees the proof's effects
    return proved;
  }
  Status Stage(uint64_t version) override { return host.Stage(version); }
  Result<int64_t> Commit() override { return host.Commit(); }
  std::string StateDigest() const override { return host.StateDigest(); }

  HostWeightSink host;
  std::atomic<int> proofs{0};
};

TEST_CASE(
    "rollout worker on its Env's clock: the copy is proved again once verify_interval passed") {
  InProcessRun run("worker_clock_store");
  MemEnv clock;  // the worker's time; it moves only when told
  WorkerOptions options =
      SmallWorker(1, std::chrono::milliseconds(50), std::chrono::milliseconds(100));
  options.verify_interval = std::chrono::hours(1);
  options.env = &clock;
  CountingSink sink(run.engine);
  RolloutWorker worker(options, run.api, *run.store, run.engine, run.verifier, &sink);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });

  // The round after the first pull proves the copy; then not for an hour of the worker's clock,
  // however many rounds run (20 ms apart in real time).
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(0); }));
  REQUIRE(WaitFor([&] { return sink.proofs.load() == 1; }));
  sink.host.CorruptForTest();  // the next proof finds a flipped bit
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(sink.proofs.load() == 1);
  CHECK(worker.sync_report().digest_mismatches == 0);

  // An hour later on the worker's clock, the next round proves it, finds the bit and re-syncs.
  clock.Advance(std::chrono::hours(1));
  REQUIRE(WaitFor([&] {
    return worker.sync_report().digest_mismatches == 1 &&
           worker.ready_version() == std::optional<uint64_t>(0);
  }));
  CHECK(sink.proofs.load() >= 2);
  CHECK(worker.sync_report().keyframe_pulls == 2);
  worker.Stop();
  running.join();
  CHECK(ran.ok());
}

}  // namespace
}  // namespace weft::rollout_worker

namespace weft::rollout_worker {
namespace {

TEST_CASE(
    "rollout worker: a fixed model's worker registers its digest, keeps its version and answers "
    "score jobs with the engine's log-probabilities") {
  InProcessRun run("worker_fixed_model");
  DurableCore* core = run.core.get();
  // What the scores must be: a second engine serving the same version 0.
  examples::EmbeddedEngine reference(run.model, 1);
  REQUIRE(reference.Stage(run.publisher->served(), 0).ok());
  REQUIRE(reference.Commit().ok());
  const policy_store::Manifest v0 = run.publisher->last();
  WorkerOptions options =
      SmallWorker(1, std::chrono::milliseconds(50), std::chrono::milliseconds(100));
  options.model = "teacher";
  RolloutWorker worker(options, run.api, *run.store, run.engine, run.verifier);
  Status ran = Internal("not finished");
  std::thread running([&] { ran = worker.Run(); });
  REQUIRE(WaitFor([&] { return worker.ready_version() == std::optional<uint64_t>(0); }));
  // A later version of its run is not followed: the model is fixed.
  std::vector<float> weights = run.layout.Initialize(3);
  for (float& w : weights) w *= 1.05f;
  REQUIRE(run.publisher->Publish(run.layout.Master(weights)).ok());
  const std::vector<int> prompt = {examples::ArithmeticTask::kBegin, 1, 2};
  const std::vector<std::vector<int>> targets = {{3, 4}, {5}};
  JobSpec score{"[" + std::to_string(prompt[0]) + ",1,2]", 2};
  score.model = "teacher";
  score.kind = JobKind::kScore;
  score.targets = "[[3,4],[5]]";
  // A job of the policy's waits: no cluster serving the policy is there.
  REQUIRE(core->AddJobs(WallMicros(), {score, {"\"1+2=\"", 1}}).ok());
  std::vector<Delivered> delivered;
  REQUIRE(WaitFor([&] {
    Result<Batch> batch = core->TakeBatch(WallMicros(), 10);
    REQUIRE(batch.ok());
    for (Delivered& d : batch->items) delivered.push_back(std::move(d));
    return !delivered.empty();
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(run.engine.version() == std::optional<uint64_t>(0));
  REQUIRE(delivered.size() == 1);
  CHECK(delivered[0].model == "teacher");
  CHECK(delivered[0].kind == JobKind::kScore);
  Result<trainer_adapter::ReceivedGroup> group = trainer_adapter::ParseGroup(delivered[0], 0);
  REQUIRE_MESSAGE(group.ok(), group.status().ToString());
  Result<Engine::Scores> expected = reference.Score(prompt, targets);
  REQUIRE(expected.ok());
  REQUIRE(group->samples.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(group->samples[i].tokens == targets[i]);
    CHECK(group->samples[i].logprobs == expected->logprobs[i]);
    CHECK(!group->samples[i].reward.has_value());
  }
  CHECK(core->Inspect([&](const OrchestratorCore& c) {
    for (const ModelView& m : c.models()) {
      if (m.name == "teacher") return m.digest == policy_store::StateDigest(v0);
    }
    return false;
  }));
  CHECK(core->Inspect([](const OrchestratorCore& c) { return c.queued_jobs(); }) == 1);
  worker.Stop();
  running.join();
  CHECK(ran.ok());
}

}  // namespace
}  // namespace weft::rollout_worker
