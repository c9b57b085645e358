// The orchestrator's files under damage: every byte of a journal (and of a snapshot) written under
// load is flipped in turn, and the orchestrator must either refuse to start, saying where, or come
// up with every event it acknowledged. Never silently with fewer. Also: a missing generation, and
// events too large for the journal.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "orchestrator/durable_core.h"
#include "tests/orchestrator/snapshot_of.h"
#include "tests/temp_path.h"

namespace weft::orchestrator {
namespace {

using testing::TempPath;

std::vector<uint8_t> Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

using testing::SnapshotOf;

// Every file of the journal at `path` (all generations) by name.
std::map<std::string, std::vector<uint8_t>> Files(const std::string& path) {
  std::map<std::string, std::vector<uint8_t>> files;
  const std::filesystem::path base(path);
  for (const auto& entry : std::filesystem::directory_iterator(base.parent_path())) {
    if (entry.path().filename().string().rfind(base.filename().string(), 0) == 0)
      files[entry.path().string()] = Read(entry.path().string());
  }
  return files;
}

void Restore(const std::string& path, const std::map<std::string, std::vector<uint8_t>>& files) {
  const std::filesystem::path base(path);
  for (const auto& entry : std::filesystem::directory_iterator(base.parent_path())) {
    if (entry.path().filename().string().rfind(base.filename().string(), 0) == 0 &&
        !files.count(entry.path().string()))
      std::filesystem::remove(entry.path());
  }
  for (const auto& [name, bytes] : files) Write(name, bytes);
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

// Every byte by default. WEFT_SWEEP_STRIDE=N flips one byte in each run of N, at an offset that
// moves from run to run so that every field is still reached (for the sanitizer builds, where a
// full sweep takes minutes and the release build has already flipped every byte).
size_t SweepStride() {
  const char* text = std::getenv("WEFT_SWEEP_STRIDE");
  const long stride = text == nullptr ? 1 : std::strtol(text, nullptr, 10);
  return stride > 1 ? static_cast<size_t>(stride) : 1;
}

bool Flipped(size_t at, size_t stride) { return at % stride == (at / stride) % stride; }

// How many bytes of `size` a sweep flips.
int SweepCount(size_t size) {
  int count = 0;
  for (size_t at = 0; at < size; ++at) count += Flipped(at, SweepStride()) ? 1 : 0;
  return count;
}

// Flips each byte of `file` in turn (the other files as they are) and opens the orchestrator.
void FlipEach(const std::string& path, const std::string& file,
              const std::map<std::string, std::vector<uint8_t>>& files, const std::string& expected,
              bool names_offset, Sweep* sweep) {
  const std::vector<uint8_t>& original = files.at(file);
  const size_t stride = SweepStride();
  for (size_t at = 0; at < original.size(); ++at) {
    if (!Flipped(at, stride)) continue;
    Restore(path, files);
    std::vector<uint8_t> bytes = original;
    bytes[at] ^= 0xFF;
    Write(file, bytes);
    ++sweep->tried;
    auto opened = DurableCore::Open(path, CoreConfig{});
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
  Restore(path, files);
}

TEST_CASE("corruption sweep: every flipped byte of the journal is refused or loses nothing") {
  const std::string path = TempPath("sweep_journal");
  Remove(path);
  std::string expected;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    expected = Load(*durable, 0);
  }
  const auto files = Files(path);
  REQUIRE(files.size() == 1);
  Sweep sweep;
  FlipEach(path, path, files, expected, true, &sweep);
  MESSAGE("journal of " << files.at(path).size() << " bytes: " << sweep.tried << " flips tried, "
                        << sweep.refused << " refused, " << sweep.recovered << " recovered, "
                        << sweep.lost << " lost");
  CHECK(sweep.tried == SweepCount(files.at(path).size()));
  CHECK(sweep.lost == 0);
  CHECK(sweep.refused + sweep.recovered == sweep.tried);
  Remove(path);
}

TEST_CASE("corruption sweep: every flipped byte of a snapshot is refused or loses nothing") {
  const std::string path = TempPath("sweep_snapshot");
  Remove(path);
  std::string expected;
  std::vector<uint8_t> first_journal;
  {
    auto durable = std::move(DurableCore::Open(path, CoreConfig{})).value();
    Load(*durable, 0);
    first_journal = Read(path);
    REQUIRE(durable->Compact().ok());  // the snapshot holds all of it; the new journal nothing
    expected = SnapshotOf(*durable);
  }
  auto files = Files(path);
  const std::string snapshot = path + ".snapshot.1";
  REQUIRE(files.count(snapshot));
  REQUIRE(files.count(path + ".1"));
  REQUIRE(!files.count(path));  // generation 0's journal went once the snapshot was durable
  Sweep sweep;
  FlipEach(path, snapshot, files, expected, false, &sweep);
  MESSAGE("snapshot of " << files.at(snapshot).size() << " bytes: " << sweep.tried
                         << " flips tried, " << sweep.refused << " refused, " << sweep.recovered
                         << " recovered, " << sweep.lost << " lost");
  CHECK(sweep.lost == 0);
  CHECK(sweep.refused + sweep.recovered == sweep.tried);
  // With generation 0's journal still there (a crash before it was deleted), a damaged snapshot
  // is passed over and the journals rebuild everything.
  files[path] = first_journal;
  Sweep fallback;
  FlipEach(path, snapshot, files, expected, false, &fallback);
  MESSAGE("snapshot with the previous generation kept: "
          << fallback.tried << " flips tried, " << fallback.refused << " refused, "
          << fallback.recovered << " recovered, " << fallback.lost << " lost");
  CHECK(fallback.lost == 0);
  CHECK(fallback.recovered == fallback.tried);
  Remove(path);
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
