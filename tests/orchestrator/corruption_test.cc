// The orchestrator's files under damage: every byte of a journal (and of a snapshot) written under
// load is flipped in turn, and the orchestrator must either refuse to start, saying where, or come
// up with every event it acknowledged. Never silently with fewer. Also: a missing generation, and
// events too large for the journal.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "common/mem_env.h"
#include "orchestrator/durable_core.h"
#include "tests/orchestrator/snapshot_of.h"
#include "tests/temp_path.h"

namespace weft::orchestrator {
namespace {

using testing::TempPath;

void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

using testing::SnapshotOf;

// The paths of every file of the journal at `path` (all generations).
std::vector<std::string> JournalFiles(Env& env, const std::string& path) {
  const std::filesystem::path base(path);
  std::vector<std::string> paths;
  const std::vector<std::string> names = env.List(base.parent_path().string()).value();
  for (const std::string& name : names) {
    if (name.rfind(base.filename().string(), 0) == 0)
      paths.push_back((base.parent_path() / name).string());
  }
  return paths;
}

// Every file of the journal at `path` by path, with its bytes.
std::map<std::string, std::vector<uint8_t>> Files(const std::string& path,
                                                  Env& env = Env::Default()) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const std::string& file : JournalFiles(env, path)) files[file] = env.ReadFile(file).value();
  return files;
}

void Write(Env& env, const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::span<const uint8_t> part(bytes);
  REQUIRE(env.WriteAtomic(path, std::span<const std::span<const uint8_t>>(&part, 1)).ok());
}

// The journal's files exactly as in `files`.
void Restore(const std::string& path, const std::map<std::string, std::vector<uint8_t>>& files,
             Env& env = Env::Default()) {
  for (const std::string& file : JournalFiles(env, path)) {
    if (!files.count(file)) REQUIRE(env.Remove(file).ok());
  }
  for (const auto& [name, bytes] : files) Write(env, name, bytes);
}

void Remove(const std::string& path) { Restore(path, {}); }

// Four clusters leasing and submitting from their own threads, a trainer taking batches: the
// core's state once every call returned.
std::string Load(DurableCore& durable, Micros t) {
  REQUIRE(durable.AnnounceVersion(t, 1).ok());
  const std::vector<std::string> clusters = {"a", "b", "c", "d"};
  for (const std::string& c : clusters) {
    REQUIRE(durable.Register(t, c, "eu", 4).ok());
    REQUIRE(durable.Heartbeat(t, c, 1).ok());
  }
  REQUIRE(durable.AddJobs(t, std::vector<JobSpec>(16, {"\"prompt\"", 2})).ok());
  std::vector<std::thread> threads;
  for (const std::string& c : clusters) {
    threads.emplace_back([&durable, c, t] {
      for (int round = 0; round < 2; ++round) {
        auto leases = durable.RequestLeases(t + 1 + round, c, 2);
        if (!leases.ok()) continue;
        for (const Lease& lease : *leases) {
          TrajectoryGroup g;
          g.job = lease.job;
          g.attempt = lease.attempt;
          g.cluster = c;
          g.version_start = g.version_end = 1;
          g.segments = {{1, 0}};
          g.tokens = 4;
          g.trajectories = R"({"samples":[{"tokens":[1,2,3,4]}]})";
          CHECK(durable.Submit(t + 2 + round, g).ok());
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  auto batch = durable.TakeBatch(t + 10, 3);
  REQUIRE(batch.ok());
  REQUIRE(durable.TakeBatch(t + 11, 2, batch->id).ok());
  return SnapshotOf(durable);
}

struct Sweep {
  int tried = 0, refused = 0, recovered = 0, lost = 0;
};

// Flips each byte of `file` in turn (the other files as they are) and opens the orchestrator.
// The files are in memory (MemEnv): what replay reads is the same, without a disk's syncs.
void FlipEach(MemEnv& env, const std::string& path, const std::string& file,
              const std::map<std::string, std::vector<uint8_t>>& files, const std::string& expected,
              bool names_offset, Sweep* sweep) {
  const std::vector<uint8_t>& original = files.at(file);
  DurableCore::Options options;
  options.env = &env;
  for (size_t at = 0; at < original.size(); ++at) {
    Restore(path, files, env);
    std::vector<uint8_t> bytes = original;
    bytes[at] ^= 0xFF;
    Write(env, file, bytes);
    ++sweep->tried;
    auto opened = DurableCore::Open(path, CoreConfig{}, options);
    if (!opened.ok()) {
      ++sweep->refused;
      CHECK(opened.status().code() == StatusCode::kDataLoss);
      if (names_offset) {
        CHECK_MESSAGE(opened.status().message().find("at byte ") != std::string::npos,
                      opened.status().message());
      }
      continue;
    }
    if (SnapshotOf(**opened) == expected) {
      ++sweep->recovered;
    } else {
      ++sweep->lost;
      FAIL_CHECK("flipping byte " << at << " of " << file
                                  << " opened with a different state, silently");
    }
  }
  Restore(path, files, env);
}

TEST_CASE("corruption sweep: every flipped byte of the journal is refused or loses nothing") {
  MemEnv env;
  DurableCore::Options options;
  options.env = &env;
  const std::string path = "/orchestrator/sweep_journal";
  std::string expected;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{}, options)).value();
    expected = Load(*durable, 0);
  }
  const auto files = Files(path, env);
  REQUIRE(files.size() == 1);
  Sweep sweep;
  FlipEach(env, path, path, files, expected, true, &sweep);
  MESSAGE("journal of " << files.at(path).size() << " bytes: " << sweep.tried << " flips tried, "
                        << sweep.refused << " refused, " << sweep.recovered << " recovered, "
                        << sweep.lost << " lost");
  CHECK(sweep.tried == static_cast<int>(files.at(path).size()));
  CHECK(sweep.lost == 0);
  CHECK(sweep.refused + sweep.recovered == sweep.tried);
}

TEST_CASE("corruption sweep: every flipped byte of a snapshot is refused or loses nothing") {
  MemEnv env;
  DurableCore::Options options;
  options.env = &env;
  const std::string path = "/orchestrator/sweep_snapshot";
  std::string expected;
  std::vector<uint8_t> first_journal;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{}, options)).value();
    Load(*durable, 0);
    first_journal = env.ReadFile(path).value();
    REQUIRE(durable->Compact().ok());  // the snapshot holds all of it; the new journal nothing
    expected = SnapshotOf(*durable);
  }
  auto files = Files(path, env);
  const std::string snapshot = path + ".snapshot.1";
  REQUIRE(files.count(snapshot));
  REQUIRE(files.count(path + ".1"));
  REQUIRE(!files.count(path));  // generation 0's journal went once the snapshot was durable
  Sweep sweep;
  FlipEach(env, path, snapshot, files, expected, false, &sweep);
  MESSAGE("snapshot of " << files.at(snapshot).size() << " bytes: " << sweep.tried
                         << " flips tried, " << sweep.refused << " refused, " << sweep.recovered
                         << " recovered, " << sweep.lost << " lost");
  CHECK(sweep.lost == 0);
  CHECK(sweep.refused + sweep.recovered == sweep.tried);
  // With generation 0's journal still there (a crash before it was deleted), a damaged snapshot
  // is passed over and the journals rebuild everything.
  files[path] = first_journal;
  Sweep fallback;
  FlipEach(env, path, snapshot, files, expected, false, &fallback);
  MESSAGE("snapshot with the previous generation kept: "
          << fallback.tried << " flips tried, " << fallback.refused << " refused, "
          << fallback.recovered << " recovered, " << fallback.lost << " lost");
  CHECK(fallback.lost == 0);
  CHECK(fallback.recovered == fallback.tried);
}

TEST_CASE("durable core: a journal generation that should exist and does not is refused") {
  const std::string path = TempPath("missing_generation");
  Remove(path);
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    Load(*durable, 0);
    REQUIRE(durable->Compact().ok());
    REQUIRE(durable->AnnounceVersion(100, 2).ok());  // acknowledged after the snapshot
  }
  const auto files = Files(path);
  SUBCASE("the snapshot's own journal") {
    std::filesystem::remove(path + ".1");
    auto opened = DurableCore::Open(path, CoreConfig{});
    REQUIRE(!opened.ok());
    CHECK(opened.status().code() == StatusCode::kDataLoss);
    CHECK(opened.status().message().find(path + ".1 of generation 1 is missing") !=
          std::string::npos);
    CHECK(!std::filesystem::exists(path + ".1"));  // not created empty behind the refusal
  }
  SUBCASE("a journal between the snapshot and the newest") {
    {
      auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
      // A rotation whose snapshot never came: generation 2's journal, no snapshot 2.
      const std::vector<uint8_t> magic = {'W', 'E', 'F', 'T', 'J', 'R', 'N', '1'};
      Write(path + ".2", magic);
    }
    std::filesystem::remove(path + ".1");
    auto opened = DurableCore::Open(path, CoreConfig{});
    REQUIRE(!opened.ok());
    CHECK(opened.status().message().find("generation 1 is missing") != std::string::npos);
  }
  SUBCASE("whole, it opens with everything") {
    auto opened = DurableCore::Open(path, CoreConfig{});
    REQUIRE(opened.ok());
    CHECK((*opened)->Inspect([](const OrchestratorCore& c) { return c.latest_version(); }) ==
          std::optional<uint64_t>(2));
  }
  Remove(path);
}

TEST_CASE("durable core: an event too large for the journal is refused and changes nothing") {
  const std::string path = TempPath("too_large");
  Remove(path);
  std::string before;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    REQUIRE(durable->AnnounceVersion(0, 1).ok());
    REQUIRE(durable->Register(0, "a", "eu", 4).ok());
    REQUIRE(durable->Heartbeat(0, "a", 1).ok());
    REQUIRE(durable->AddJobs(0, {{"\"p\"", 1}}).ok());
    auto leases = std::move(durable->RequestLeases(1, "a", 1)).value();
    REQUIRE(leases.size() == 1);
    before = SnapshotOf(*durable);
    TrajectoryGroup g;
    g.job = leases[0].job;
    g.attempt = leases[0].attempt;
    g.cluster = "a";
    g.version_start = g.version_end = 1;
    g.segments = {{1, 0}};
    g.tokens = 1;
    g.trajectories = "[\"" + std::string(Journal::kMaxRecordBytes, 'x') + "\"]";
    auto refused = durable->Submit(2, g);
    REQUIRE(!refused.ok());
    CHECK(refused.status().code() == StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("more than the limit") != std::string::npos);
    CHECK(SnapshotOf(*durable) == before);  // the job is not done, nothing is buffered
    bool answered = false;
    durable->SubmitAsync(2, g, [&](Result<SubmitResult> result) {
      answered = true;
      CHECK(!result.ok());
    });
    CHECK(answered);
    CHECK(SnapshotOf(*durable) == before);
    // The same submission at a size the journal takes is accepted.
    g.trajectories = "[]";
    CHECK(durable->Submit(3, g).ok());
  }
  Remove(path);
}

TEST_CASE("durable core: a journal event with a fraction or a time out of range is refused") {
  const std::string path = TempPath("odd_numbers");
  for (const std::string record : {R"({"e":"tick","t":1e19})", R"({"e":"tick","t":-5})",
                                   R"({"e":"announce","version":1.5,"t":1})"}) {
    CAPTURE(record);
    Remove(path);
    {
      auto journal =
          std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
      REQUIRE(journal->Append(record).ok());
    }
    auto opened = DurableCore::Open(path, CoreConfig{});
    REQUIRE(!opened.ok());
    CHECK(opened.status().message().find("replaying record 0") != std::string::npos);
  }
  Remove(path);
}

}  // namespace
}  // namespace weft::orchestrator
