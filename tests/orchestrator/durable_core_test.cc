#include "orchestrator/durable_core.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "tests/orchestrator/snapshot_of.h"
#include "tests/temp_path.h"

namespace weft::orchestrator {
namespace {

using testing::TempPath;

TrajectoryGroup Make(const Lease& lease, const std::string& cluster, uint64_t version) {
  TrajectoryGroup s;
  s.job = lease.job;
  s.attempt = lease.attempt;
  s.cluster = cluster;
  s.version_start = s.version_end = version;
  s.segments = {{version, 0}};
  s.tokens = 16;
  s.trajectories = std::string(256, 'x');
  return s;
}

// A snapshot of everything observable, to compare a replayed core with the original.
std::string Picture(const DurableCore& durable) {
  return durable.Inspect([](const OrchestratorCore& core) {
    std::string text = "queued " + std::to_string(core.queued_jobs()) + " leased " +
                       std::to_string(core.leased_jobs()) + " buffered " +
                       std::to_string(core.buffered()) + " open " +
                       std::to_string(core.open_jobs()) + " latest " +
                       std::to_string(core.latest_version().value_or(999)) + " done " +
                       std::to_string(core.counters().jobs_done) + " expired " +
                       std::to_string(core.counters().leases_expired) + " lost " +
                       std::to_string(core.counters().clusters_lost);
    for (const ClusterView& c : core.clusters()) {
      text += " | " + c.id + " " + c.region + " ready " +
              (c.ready_version ? std::to_string(*c.ready_version) : "-") + " leases " +
              std::to_string(c.leases) + (c.gone ? " gone" : "") + (c.draining ? " draining" : "");
    }
    return text;
  });
}

TEST_CASE("durable core: a reopened journal rebuilds exactly the state that was acknowledged") {
  const std::string path = TempPath("durable");
  std::string before;
  {
    CoreConfig config;
    config.lease_duration = 100;
    auto durable = std::move(DurableCore::Open(path, config)).value();
    REQUIRE(durable->AnnounceVersion(0, 3).ok());
    REQUIRE(durable->Register(0, "a", "eu", 4).ok());
    REQUIRE(durable->Register(0, "b", "us", 4).ok());
    REQUIRE(durable->Heartbeat(1, "a", 3).ok());
    REQUIRE(durable->Heartbeat(1, "b", 2).ok());
    REQUIRE(durable->AddJobs(2, {{"p", 2}, {"q", 2}, {"r", 2}, {"s", 2}, {"t", 2}}).ok());
    auto leases = std::move(durable->RequestLeases(3, "a", 3)).value();
    REQUIRE(leases.size() == 3);
    REQUIRE(durable->Submit(4, Make(leases[0], "a", 3)).ok());
    CHECK(durable->Submit(5, Make(leases[0], "a", 3)).value() == SubmitResult::kDuplicate);
    CHECK(!durable->Submit(5, Make(leases[1], "a", 9)).ok());  // refused: not journaled
    REQUIRE(durable->Tick(200).ok());                          // leases 1 and 2 expire
    REQUIRE(durable->RequestLeases(201, "b", 2).ok());
    REQUIRE(durable->TakeBatch(202, 1).ok());
    auto more = std::move(durable->RequestLeases(202, "a", 1)).value();
    REQUIRE(more.size() == 1);
    REQUIRE(durable->Drain(202, "a", {more[0].job}, false).ok());  // a release: "a" keeps leasing
    REQUIRE(durable->Drain(203, "b", {}).ok());
    before = Picture(*durable);
  }
  CoreConfig config;
  config.lease_duration = 100;
  auto reopened = std::move(DurableCore::Open(path, config)).value();
  CHECK(reopened->events_replayed() > 5);
  CHECK(Picture(*reopened) == before);
  std::filesystem::remove(path);
}

TEST_CASE("durable core: events answered from the journal's thread once durable") {
  const std::string path = TempPath("durable_callbacks");
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    std::mutex mutex;
    std::condition_variable done;
    std::vector<std::string> heard;
    auto note = [&](const std::string& what) {
      return [&, what](Status status) {
        std::lock_guard<std::mutex> lock(mutex);
        heard.push_back(what + (status.ok() ? "" : ": " + status.message()));
        done.notify_all();
      };
    };
    // Each returns its result at once and calls back once its record is on disk.
    REQUIRE(durable->AnnounceVersion(0, 1, note("announce")).ok());
    REQUIRE(durable->Register(0, "a", "eu", 2, "", note("register")).ok());
    REQUIRE(durable->Heartbeat(1, "a", 1).ok());
    Result<std::vector<uint64_t>> jobs = durable->AddJobs(2, {{"p", 1}, {"q", 1}}, note("jobs"));
    REQUIRE(jobs.ok());
    CHECK(jobs->size() == 2);
    auto leases = std::move(durable->RequestLeases(3, "a", 2)).value();
    REQUIRE(leases.size() == 2);
    REQUIRE(durable->Submit(4, Make(leases[0], "a", 1)).ok());
    Result<Batch> batch = durable->TakeBatch(5, 4, std::nullopt, note("batch"));
    REQUIRE(batch.ok());
    CHECK(batch->items.size() == 1);
    REQUIRE(durable->Drain(6, "a", {leases[1].job}, true, note("drain")).ok());
    // A refused event calls nothing back.
    CHECK(!durable->Drain(7, "nobody", {}, true, note("refused")).ok());
    REQUIRE(durable->Deregister(8, "a", note("deregister")).ok());
    {
      std::unique_lock<std::mutex> lock(mutex);
      REQUIRE(done.wait_for(lock, std::chrono::seconds(10), [&] { return heard.size() >= 6; }));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(std::set<std::string>(heard.begin(), heard.end()) ==
          std::set<std::string>{"announce", "register", "jobs", "batch", "drain", "deregister"});
    CHECK(heard.size() == 6);
    before = Picture(*durable);
  }
  // What was called back as durable is in the journal.
  auto reopened = std::move(DurableCore::Open(path, CoreConfig{})).value();
  CHECK(Picture(*reopened) == before);
  std::filesystem::remove(path);
}

// Removes a journal and every file of its generations.
void RemoveJournal(const std::string& path) {
  const std::filesystem::path base(path);
  for (const auto& entry : std::filesystem::directory_iterator(base.parent_path())) {
    if (entry.path().filename().string().rfind(base.filename().string(), 0) == 0)
      std::filesystem::remove(entry.path());
  }
}

// Runs a scripted day on `durable` from time `t`: clusters, jobs, leases, submissions, batches.
void Traffic(DurableCore& durable, Micros t, int rounds) {
  REQUIRE(durable.AnnounceVersion(t, 1 + t / 1000).ok());
  REQUIRE(durable.Register(t, "a", "eu", 8).ok());
  REQUIRE(durable.Heartbeat(t, "a", 1 + t / 1000).ok());
  std::optional<uint64_t> ack;
  for (int i = 0; i < rounds; ++i) {
    const Micros now = t + i + 1;
    REQUIRE(durable.AddJobs(now, {{"prompt " + std::to_string(now), 2}, {"x", 1}}).ok());
    auto leases = std::move(durable.RequestLeases(now, "a", 2)).value();
    for (const Lease& lease : leases) {
      if (lease.job % 3 != 0) REQUIRE(durable.Submit(now, Make(lease, "a", 1 + t / 1000)).ok());
    }
    if (i % 4 == 3) {
      auto batch = std::move(durable.TakeBatch(now, 3, ack)).value();
      if (batch.id != 0 && i % 8 == 3) ack = batch.id;  // some acknowledged, some still outstanding
    }
  }
}

using testing::SnapshotOf;

TEST_CASE(
    "durable core: compaction writes a snapshot, drops old files and restores the same state") {
  const std::string path = TempPath("compact");
  DurableCore::Options options;
  options.compact_after_bytes = 4 << 10;
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{}, options)).value();
    CHECK(durable->fresh());
    Traffic(*durable, 0, 60);
    CHECK(durable->NeedsCompaction());
    REQUIRE(durable->Compact().ok());
    CHECK(durable->generation() == 1);
    CHECK(!durable->NeedsCompaction());
    CHECK(!std::filesystem::exists(path));  // generation 0's journal is gone
    CHECK(std::filesystem::exists(path + ".1"));
    CHECK(std::filesystem::exists(path + ".snapshot.1"));
    Traffic(*durable, 1000, 20);
    REQUIRE(durable->Compact().ok());
    Traffic(*durable, 2000, 20);  // after the last snapshot: replayed from generation 2's journal
    CHECK(!std::filesystem::exists(path + ".snapshot.1"));
    CHECK(!std::filesystem::exists(path + ".1"));
    before = SnapshotOf(*durable);
  }
  auto reopened = std::move(DurableCore::Open(path, CoreConfig{}, options)).value();
  CHECK(!reopened->fresh());
  CHECK(reopened->generation() == 2);
  CHECK(reopened->events_replayed() > 0);
  CHECK(SnapshotOf(*reopened) == before);
  reopened.reset();
  RemoveJournal(path);
}

TEST_CASE(
    "durable core: a crash after the rotation and before the snapshot replays both journals") {
  // Reproduces the files such a crash leaves: generation 0's journal complete, generation 1's
  // journal started, no snapshot of generation 1.
  const std::string path = TempPath("rotation_crash");
  const std::string copy = TempPath("rotation_crash_copy");
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    Traffic(*durable, 0, 30);
    std::filesystem::copy_file(path, copy);  // generation 0's journal as it was at the rotation
    REQUIRE(durable->Compact().ok());
    Traffic(*durable, 1000, 30);
    before = SnapshotOf(*durable);
  }
  std::filesystem::rename(copy, path);
  auto damage = [&](long at) {
    std::FILE* f = std::fopen((path + ".snapshot.1").c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, at, SEEK_SET);
    std::fputc('#', f);
    std::fclose(f);
  };
  SUBCASE("the snapshot is missing") { std::filesystem::remove(path + ".snapshot.1"); }
  SUBCASE("the snapshot is damaged (it is checked, and passed over)") { damage(100); }
  auto reopened = DurableCore::Open(path, CoreConfig{});
  REQUIRE_MESSAGE(reopened.ok(), reopened.status().ToString());
  CHECK((*reopened)->generation() == 1);
  CHECK(SnapshotOf(**reopened) == before);
  reopened->reset();
  // With generation 0's journal gone as well, nothing can rebuild the state: a clear error.
  std::filesystem::remove(path);
  if (std::filesystem::exists(path + ".snapshot.1")) {
    damage(100);
    auto refused = DurableCore::Open(path, CoreConfig{});
    REQUIRE(!refused.ok());
    CHECK(refused.status().message().find("cannot be rebuilt") != std::string::npos);
  }
  RemoveJournal(path);
}

TEST_CASE(
    "durable core: a crash while the rotation created the next journal (before its magic was "
    "durable) restarts that journal and keeps everything") {
  // The files a SIGKILL between creating generation 2's journal and syncing its magic leaves: the
  // journal of generation 1 complete, generation 2's empty or holding part of its magic.
  const std::string path = TempPath("creation_crash");
  RemoveJournal(path);  // (what a failed earlier subcase left)
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    Traffic(*durable, 0, 30);
    REQUIRE(durable->Compact().ok());
    Traffic(*durable, 1000, 30);
    before = SnapshotOf(*durable);
  }
  std::string cut;
  SUBCASE("empty") {}
  SUBCASE("part of the magic") { cut = "WEF"; }
  std::ofstream(path + ".2", std::ios::binary) << cut;
  {
    auto reopened = DurableCore::Open(path, CoreConfig{});
    REQUIRE_MESSAGE(reopened.ok(), reopened.status().ToString());
    CHECK((*reopened)->generation() == 2);
    CHECK(SnapshotOf(**reopened) == before);
    Traffic(**reopened, 2000, 10);  // and it appends to the restarted journal
    before = SnapshotOf(**reopened);
  }
  auto again = DurableCore::Open(path, CoreConfig{});
  REQUIRE_MESSAGE(again.ok(), again.status().ToString());
  CHECK(SnapshotOf(**again) == before);
  again->reset();
  // Bytes that are not a prefix of the magic are another file: refused, not overwritten.
  std::ofstream(path + ".3", std::ios::binary) << "WEX";
  auto refused = DurableCore::Open(path, CoreConfig{});
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().find("bad magic") != std::string::npos);
  CHECK(std::filesystem::file_size(path + ".3") == 3);
  RemoveJournal(path);
}

// The groups of a batch by job, with their jobs' metadata.
std::map<uint64_t, std::string> MetadataByJob(const Batch& batch) {
  std::map<uint64_t, std::string> metadata;
  for (const Delivered& d : batch.items) metadata[d.group.job] = d.metadata;
  return metadata;
}

TEST_CASE(
    "durable core: job metadata survives replay and compaction, as the text the trainer sent") {
  const std::string path = TempPath("metadata");
  // (Line breaks within the text too: the journal's record is one line, then the samples.)
  const std::vector<JobSpec> jobs = {
      {"\"p\"", 1, "{\n  \"answer\" : 4.0E0,\n  \"note\": \"a\\\"b \\u00e9\"\n}"},
      {"\"q\"", 1},
      {"\"r\"", 1, "[\"queued\"]"}};
  std::vector<uint64_t> ids;
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    REQUIRE(durable->AnnounceVersion(0, 1).ok());
    REQUIRE(durable->Register(0, "a", "eu", 2).ok());
    REQUIRE(durable->Heartbeat(0, "a", 1).ok());
    ids = std::move(durable->AddJobs(1, jobs)).value();
    auto leases = std::move(durable->RequestLeases(2, "a", 2)).value();
    REQUIRE(leases.size() == 2);
    for (const Lease& lease : leases) REQUIRE(durable->Submit(3, Make(lease, "a", 1)).ok());
    before = SnapshotOf(*durable);
  }
  // The jobs' record (docs/formats.md section 7): [prompt, samples, metadata as a string] each, the
  // metadata left out for a job without.
  const std::string expected = nlohmann::json{
      {"e", "jobs"},
      {"prompts",
       {{jobs[0].prompt, 1, jobs[0].metadata},
        {jobs[1].prompt, 1},
        {jobs[2].prompt, 1, jobs[2].metadata}}},
      {"t", 1}}.dump();
  CHECK(expected.find('\n') == std::string::npos);
  int found = 0;
  REQUIRE(Journal::Replay(path, [&](std::string_view record) {
            found += record == expected;
            return Status::Ok();
          }).ok());
  CHECK(found == 1);
  {
    auto replayed = std::move(DurableCore::Open(path, CoreConfig{})).value();
    CHECK(SnapshotOf(*replayed) == before);
    REQUIRE(replayed->Compact().ok());
  }
  auto restored = std::move(DurableCore::Open(path, CoreConfig{})).value();
  CHECK(restored->generation() == 1);
  CHECK(restored->events_replayed() == 0);  // all of it from the snapshot
  CHECK(SnapshotOf(*restored) == before);
  auto batch = std::move(restored->TakeBatch(4, 10)).value();
  std::map<uint64_t, std::string> delivered = MetadataByJob(batch);
  REQUIRE(delivered.size() == 2);
  CHECK(delivered[ids[0]] == jobs[0].metadata);
  CHECK(delivered[ids[1]].empty());
  // The queued job's metadata came through the snapshot too.
  auto leases = std::move(restored->RequestLeases(5, "a", 2)).value();
  REQUIRE(leases.size() == 1);
  REQUIRE(restored->Submit(6, Make(leases[0], "a", 1)).ok());
  batch = std::move(restored->TakeBatch(7, 10, batch.id)).value();
  CHECK(MetadataByJob(batch) == std::map<uint64_t, std::string>{{ids[2], jobs[2].metadata}});
  restored.reset();
  RemoveJournal(path);
}

TEST_CASE(
    "durable core: a journal from before job metadata replays exactly; jobs without metadata are "
    "journaled as before") {
  // The records of an older build: announce, register, heartbeat, two jobs, a lease, a group.
  const std::vector<std::string> records = {
      R"({"e":"announce","t":0,"version":1})",
      R"({"capacity":2,"cluster":"a","e":"register","region":"eu","t":0})",
      R"({"cluster":"a","e":"heartbeat","ready":1,"t":0})",
      R"({"e":"jobs","prompts":[["\"p\"",2],["[1,2]",1]],"t":1})",
      R"({"cluster":"a","e":"leases","max":1,"t":2})",
      R"({"attempt":1,"cluster":"a","e":"submit","job":1,"segments":[[1,0]],"t":3,"tokens":4,)"
      R"("version_end":1,"version_start":1})"
      "\n"
      R"({"samples":[]})"};
  const std::string path = TempPath("old_journal");
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    for (const std::string& record : records) REQUIRE(journal->Append(record).ok());
  }
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    CHECK(durable->events_replayed() == records.size());
    auto batch = std::move(durable->TakeBatch(4, 10)).value();
    REQUIRE(batch.items.size() == 1);
    CHECK(batch.items[0].group.job == 1);
    CHECK(batch.items[0].group.trajectories == R"({"samples":[]})");
    CHECK(batch.items[0].metadata.empty());
    auto leases = std::move(durable->RequestLeases(5, "a", 1)).value();
    REQUIRE(leases.size() == 1);
    CHECK(leases[0].prompt == "[1,2]");
    CHECK(leases[0].samples == 1);
  }
  RemoveJournal(path);
  // This build, given the same events, writes the same records.
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    REQUIRE(durable->AnnounceVersion(0, 1).ok());
    REQUIRE(durable->Register(0, "a", "eu", 2).ok());
    REQUIRE(durable->Heartbeat(0, "a", 1).ok());
    REQUIRE(durable->AddJobs(1, {{"\"p\"", 2}, {"[1,2]", 1}}).ok());
    auto leases = std::move(durable->RequestLeases(2, "a", 1)).value();
    REQUIRE(leases.size() == 1);
    TrajectoryGroup group;
    group.job = 1;
    group.attempt = 1;
    group.cluster = "a";
    group.version_start = group.version_end = 1;
    group.segments = {{1, 0}};
    group.tokens = 4;
    group.trajectories = R"({"samples":[]})";
    REQUIRE(durable->Submit(3, group).ok());
  }
  std::vector<std::string> written;
  REQUIRE(Journal::Replay(path, [&](std::string_view record) {
            written.emplace_back(record);
            return Status::Ok();
          }).ok());
  CHECK(written == records);
  RemoveJournal(path);
}

// A child process runs the orchestrator under load and reports each acknowledged submission on a
// pipe; it is killed with SIGKILL at a random moment, and the journal must hold every one it
// acknowledged, exactly once.
TEST_CASE(
    "durable core: kill -9 under load loses no acknowledged trajectory and counts none twice") {
  std::mt19937_64 rng(7);
  int compacted_rounds = 0;
  for (int round = 0; round < 6; ++round) {
    // Odd rounds compact all the time (a 16 KiB journal), so kills land in the middle of
    // compactions too.
    DurableCore::Options options;
    if (round % 2 == 1) options.compact_after_bytes = 16 << 10;
    const std::string path = TempPath("crash" + std::to_string(round));
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(pipe_fds[0]);
      auto durable = std::move(DurableCore::Open(path, CoreConfig{}, options)).value();
      std::thread compactor([&] {
        while (true) {
          if (durable->NeedsCompaction() && !durable->Compact().ok()) _exit(7);
          usleep(1000);
        }
      });
      compactor.detach();
      if (!durable->AnnounceVersion(0, 0).ok() || !durable->Register(0, "w", "eu", 64).ok() ||
          !durable->Heartbeat(0, "w", 0).ok())
        _exit(2);
      std::optional<uint64_t> trainer_ack;
      for (Micros now = 1;; ++now) {
        auto jobs = durable->AddJobs(now, std::vector<JobSpec>(8, {"p", 1}));
        auto leases = durable->RequestLeases(now, "w", 8);
        if (!jobs.ok() || !leases.ok()) _exit(3);
        for (const Lease& lease : *leases) {
          auto result = durable->Submit(now, Make(lease, "w", 0));
          if (!result.ok()) _exit(4);
          const uint64_t job = lease.job;
          if (write(pipe_fds[1], &job, sizeof(job)) != sizeof(job)) _exit(5);  // acknowledged
        }
        if (now % 3 == 0) {
          auto batch = durable->TakeBatch(now, 5, trainer_ack);
          if (!batch.ok()) _exit(6);
          if (batch->id != 0) trainer_ack = batch->id;
        }
      }
    }
    close(pipe_fds[1]);
    // The kill comes after a random number of acknowledgements, not after a time: a slow machine
    // (sanitizers, other load) changes nothing but how long it takes.
    std::set<uint64_t> acknowledged;
    uint64_t job = 0;
    const size_t kill_after = 50 + rng() % 400;
    while (acknowledged.size() < kill_after && read(pipe_fds[0], &job, sizeof(job)) == sizeof(job))
      acknowledged.insert(job);
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status));
    while (read(pipe_fds[0], &job, sizeof(job)) == sizeof(job)) acknowledged.insert(job);
    close(pipe_fds[0]);
    CAPTURE(round);
    CHECK(acknowledged.size() > 10);
    auto recovered = DurableCore::Open(path, CoreConfig{}, options);
    REQUIRE_MESSAGE(recovered.ok(), recovered.status().ToString());
    if ((*recovered)->generation() > 0) ++compacted_rounds;
    // Everything acknowledged is done, and was delivered to the trainer once or is still buffered.
    std::map<uint64_t, int> seen;
    const uint64_t delivered_before = (*recovered)->Inspect([](const OrchestratorCore& core) {
      return core.counters().delivered_fresh + core.counters().delivered_stale;
    });
    const uint64_t accepted = (*recovered)->Inspect([](const OrchestratorCore& core) {
      return core.counters().submissions_accepted;
    });
    CHECK(accepted >= acknowledged.size());
    std::optional<uint64_t> ack;
    for (;;) {
      auto batch = (*recovered)->TakeBatch(1'000'000'000, 1000, ack);
      REQUIRE(batch.ok());
      if (batch->id == 0) break;
      // Batches handed out before the kill and never acknowledged come first, again.
      for (const Delivered& d : batch->items) ++seen[d.group.job];
      ack = batch->id;
    }
    for (const auto& [id, count] : seen) CHECK(count == 1);
    CHECK(seen.size() + delivered_before >= accepted);
    // An acknowledged job no longer buffered was delivered before the crash; either way it is done
    // (a re-submission is a duplicate, not a second trajectory).
    for (uint64_t id : acknowledged) {
      TrajectoryGroup again;
      again.job = id;
      again.attempt = 1;
      again.cluster = "w";
      again.segments = {{0, 0}};
      auto result = (*recovered)->Submit(1'000'000'001, again);
      REQUIRE(result.ok());
      CHECK(*result == SubmitResult::kDuplicate);
    }
    recovered->reset();
    RemoveJournal(path);
  }
  CHECK(compacted_rounds > 0);
}

}  // namespace
}  // namespace weft::orchestrator

namespace weft::orchestrator {
namespace {

TEST_CASE("durable core: models, fixed digests and score jobs come back from the journal") {
  const std::string path = TempPath("durable_models");
  const std::string digest = "00112233445566778899aabbccddeeff";
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    REQUIRE(durable->Register(0, "t", "us", 2, "", nullptr, {"teacher", digest}).ok());
    JobSpec score{"[1,2]", 2, "{\"group\":7}"};
    score.model = "teacher";
    score.kind = JobKind::kScore;
    score.targets = "[[3],[4]]";
    JobSpec plain{"[5]", 1};
    plain.model = "teacher";
    REQUIRE(durable->AddJobs(1, {score, plain, {"\"p\"", 1}}).ok());
    REQUIRE(durable->Heartbeat(2, "t", 0).ok());
    auto leases = std::move(durable->RequestLeases(3, "t", 1)).value();
    REQUIRE(leases.size() == 1);
    CHECK(leases[0].targets == "[[3],[4]]");
    before = durable->Inspect([](const OrchestratorCore& core) { return core.Snapshot(); });
  }
  auto reopened = std::move(DurableCore::Open(path, CoreConfig{})).value();
  CHECK(reopened->Inspect([](const OrchestratorCore& core) { return core.Snapshot(); }) == before);
  CHECK(reopened->Register(4, "u", "us", 2, "", nullptr, {"teacher", "ff" + digest}).code() ==
        StatusCode::kConflict);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace weft::orchestrator
