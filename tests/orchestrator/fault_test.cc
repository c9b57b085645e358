// The journal and the durable core on a disk that fails: an in-memory Env (common/mem_env.h) torn
// at every byte of an unsynced write, failing its syncs, full, and crashed in the middle of traffic
// and compactions. What was acknowledged is always there after a restart, exactly once.
#include <doctest/doctest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/mem_env.h"
#include "orchestrator/durable_core.h"
#include "orchestrator/journal.h"

namespace weft::orchestrator {
namespace {

std::string Record(int i) { return "{\"event\":" + std::to_string(i) + ",\"pad\":\"xxxxxxxx\"}"; }

// The records of the journal at `path` on `env`, replayed; the journal stays open in `*journal`.
std::vector<std::string> Reopen(MemEnv& env, const std::string& path,
                                std::unique_ptr<Journal>* journal) {
  std::vector<std::string> records;
  auto opened = Journal::Open(
      path,
      [&](std::string_view r) {
        records.emplace_back(r);
        return Status::Ok();
      },
      env);
  REQUIRE_MESSAGE(opened.ok(), opened.status().ToString());
  *journal = std::move(*opened);
  return records;
}

TEST_CASE("journal on a crashing disk: torn at every byte, it keeps what it acknowledged") {
  // Three acknowledged records, then one whose sync fails: its bytes are written but not durable,
  // and a crash keeps any prefix of them.
  size_t tail = 0;
  for (uint64_t keep = 0;; ++keep) {
    CAPTURE(keep);
    MemEnv env;
    {
      std::unique_ptr<Journal> journal;
      REQUIRE(Reopen(env, "/o/journal", &journal).empty());
      for (int i = 0; i < 3; ++i) REQUIRE(journal->Append(Record(i)).ok());
      const uint64_t durable = journal->size();
      env.FailSyncs(1);
      const Status failed = journal->Append(Record(3));
      CHECK(failed.code() == StatusCode::kUnavailable);
      CHECK(failed.message().find("/o/journal") != std::string::npos);
      // Failed once, it takes nothing more: the file's state is unknown until a restart.
      CHECK(!journal->Append(Record(4)).ok());
      tail = env.ReadFile("/o/journal")->size() - durable;
      env.Crash(keep);
    }
    std::unique_ptr<Journal> journal;
    const std::vector<std::string> records = Reopen(env, "/o/journal", &journal);
    // The acknowledged three, and the unacknowledged fourth only when all of it survived.
    std::vector<std::string> expected = {Record(0), Record(1), Record(2)};
    if (keep >= tail) expected.push_back(Record(3));
    CHECK(records == expected);
    // The torn part is cut off; appends go on after the last whole record.
    REQUIRE(journal->Append(Record(5)).ok());
    journal.reset();
    expected.push_back(Record(5));
    CHECK(Reopen(env, "/o/journal", &journal) == expected);
    if (keep > tail) break;
  }
  CHECK(tail > 12);
}

TEST_CASE(
    "journal on a full disk: the append fails, naming the file and the disk; after a restart "
    "with room it goes on") {
  MemEnv env;
  std::unique_ptr<Journal> journal;
  Reopen(env, "/o/journal", &journal);
  REQUIRE(journal->Append(Record(0)).ok());
  env.SetCapacity(env.used_bytes() + 10);
  const Status full = journal->Append(Record(1));
  CHECK(full.message() == "cannot write /o/journal: No space left on device");
  journal.reset();
  env.Crash();
  env.SetCapacity(UINT64_MAX);
  CHECK(Reopen(env, "/o/journal", &journal) == std::vector<std::string>{Record(0)});
  REQUIRE(journal->Append(Record(2)).ok());
}

TEST_CASE(
    "journal and durable core on a disk that cannot be read: an error naming the path, and the "
    "journal there left as it was") {
  MemEnv env;
  DurableCore::Options options;
  options.env = &env;
  {
    auto core = std::move(DurableCore::Open("/o/journal", CoreConfig{}, options)).value();
    REQUIRE(core->AnnounceVersion(1'000'000, 0).ok());
    REQUIRE(core->AddJobs(1'000'000, {{"\"p\"", 1}}).ok());
  }
  const std::vector<uint8_t> before = env.ReadFile("/o/journal").value();
  env.FailLookups(true);
  // Not being able to tell whether the journal is there is not its absence: a journal created in
  // its place would lose what it acknowledged.
  Result<std::unique_ptr<DurableCore>> core =
      DurableCore::Open("/o/journal", CoreConfig{}, options);
  REQUIRE(!core.ok());
  CHECK(core.status().code() == StatusCode::kUnavailable);
  CHECK_MESSAGE(core.status().message().find("/o") != std::string::npos, core.status().message());
  Result<std::unique_ptr<Journal>> journal = Journal::Open(
      "/o/journal", [](std::string_view) { return Status::Ok(); }, env);
  REQUIRE(!journal.ok());
  CHECK(journal.status().message() == "cannot stat /o/journal: Input/output error");
  env.FailLookups(false);
  CHECK(env.ReadFile("/o/journal").value() == before);
  core = DurableCore::Open("/o/journal", CoreConfig{}, options);
  REQUIRE(core.ok());
  CHECK((*core)->Inspect([](const OrchestratorCore& c) { return c.queued_jobs(); }) == 1);
}

TrajectoryGroup Group(const Lease& lease) {
  TrajectoryGroup g;
  g.job = lease.job;
  g.attempt = lease.attempt;
  g.cluster = "a";
  g.version_start = g.version_end = 1;
  g.segments = {{1, 0}};
  g.tokens = 4;
  g.trajectories = "{\"job\":" + std::to_string(lease.job) + "}";
  return g;
}

TEST_CASE(
    "durable core on a crashing disk: acknowledged submissions survive a crash at any "
    "moment of traffic and compactions, exactly once") {
  std::mt19937_64 rng(7);
  size_t total_acknowledged = 0, total_delivered = 0;
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    MemEnv env;
    DurableCore::Options options;
    options.env = &env;
    options.compact_after_bytes = 1024;  // compactions all along
    CoreConfig config;
    config.lease_duration = 1000000000;
    auto durable = std::move(DurableCore::Open("/o/journal", config, options)).value();
    REQUIRE(durable->AnnounceVersion(1, 1).ok());
    REQUIRE(durable->Register(1, "a", "eu", 8).ok());
    REQUIRE(durable->Heartbeat(1, "a", 1).ok());
    std::mutex mutex;
    std::vector<uint64_t> acknowledged;  // jobs whose submission was accepted, in order
    std::atomic<bool> stop{false};
    const bool fail_syncs = rng() % 3 == 0;  // and some rounds lose the disk's syncs first
    std::thread traffic([&] {
      for (Micros now = 2; !stop.load(); ++now) {
        (void)durable->AddJobs(now, {{"\"p\"", 1}, {"\"q\"", 1}});
        Result<std::vector<Lease>> leases = durable->RequestLeases(now, "a", 2);
        if (!leases.ok()) continue;
        for (const Lease& lease : *leases) {
          Result<SubmitResult> submitted = durable->Submit(now, Group(lease));
          if (!submitted.ok() || *submitted != SubmitResult::kAccepted) continue;
          std::lock_guard<std::mutex> lock(mutex);
          acknowledged.push_back(lease.job);
        }
        if (durable->NeedsCompaction()) (void)durable->Compact();
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    if (fail_syncs) {
      env.FailSyncs(1 + static_cast<int>(rng() % 3));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    }
    // The crash: the disk as it is now, every acknowledgement so far on it.
    std::unique_ptr<MemEnv> disk;
    std::vector<uint64_t> before;
    {
      std::lock_guard<std::mutex> lock(mutex);
      disk = env.DiskAfterCrash(rng() % 64);
      before = acknowledged;
    }
    stop = true;
    traffic.join();
    durable.reset();
    options.env = disk.get();
    auto reopened = DurableCore::Open("/o/journal", config, options);
    REQUIRE_MESSAGE(reopened.ok(), reopened.status().ToString());
    std::map<uint64_t, int> delivered;
    for (int i = 0; i < 1000; ++i) {
      Result<Batch> batch = (*reopened)->TakeBatch(1, 1000, std::nullopt);
      REQUIRE_MESSAGE(batch.ok(), batch.status().ToString());
      if (batch->items.empty()) break;
      for (const Delivered& d : batch->items) ++delivered[d.group.job];
      REQUIRE((*reopened)->TakeBatch(1, 0, batch->id).ok());
    }
    for (const auto& [job, count] : delivered) CHECK(count == 1);
    for (uint64_t job : before) CHECK(delivered.count(job) == 1);
    total_acknowledged += before.size();
    total_delivered += delivered.size();
  }
  MESSAGE(total_acknowledged << " submissions acknowledged before 30 crashes, " << total_delivered
                             << " delivered after them");
  CHECK(total_acknowledged > 100);
}

}  // namespace
}  // namespace weft::orchestrator
