#include "tests/fuzz/orchestrator_files.h"

#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "common/byte_io.h"
#include "orchestrator/durable_core.h"

namespace weft::fuzz {
namespace {

using orchestrator::DurableCore;
using orchestrator::Micros;
using orchestrator::OrchestratorCore;

constexpr char kJournalMagic[] = "WEFTJRN1";
constexpr char kSnapshotMagic[] = "WEFTSNP2";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "the small orchestrator run failed: %s\n", what.c_str());
  std::abort();
}

void Check(const Status& status, const std::string& step) {
  if (!status.ok()) Die(step + ": " + status.message());
}

template <typename T>
T Value(Result<T> result, const std::string& step) {
  Check(result.status(), step);
  return std::move(result).value();
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The payloads of an intact journal file.
std::vector<std::string> RecordsOf(const std::string& journal) {
  std::vector<std::string> records;
  size_t at = sizeof(kJournalMagic) - 1;
  while (at + 12 <= journal.size()) {
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i)
      length |= uint32_t{static_cast<uint8_t>(journal[at + i])} << (8 * i);
    records.push_back(journal.substr(at + 12, length));
    at += 12 + length;
  }
  return records;
}

std::string StateOf(const DurableCore& core) {
  return core.Inspect([](const OrchestratorCore& c) { return c.Snapshot(); });
}

}  // namespace

std::string JournalOf(const std::vector<std::string_view>& payloads) {
  std::vector<uint8_t> bytes(kJournalMagic, kJournalMagic + sizeof(kJournalMagic) - 1);
  ByteWriter writer(&bytes);
  for (std::string_view payload : payloads) {
    writer.U32(static_cast<uint32_t>(payload.size()));
    writer.U64(XXH64(payload.data(), payload.size(), 0));
    writer.Bytes(TextBytes(payload));
  }
  return std::string(bytes.begin(), bytes.end());
}

std::string SnapshotFileOf(uint64_t generation, std::string_view state) {
  std::vector<uint8_t> bytes(kSnapshotMagic, kSnapshotMagic + sizeof(kSnapshotMagic) - 1);
  ByteWriter writer(&bytes);
  writer.U64(generation);
  writer.U64(state.size());
  writer.U64(XXH64(state.data(), state.size(), 0));
  writer.Bytes(TextBytes(state));
  return std::string(bytes.begin(), bytes.end());
}

std::vector<std::string_view> SplitAtFF(std::string_view bytes) {
  std::vector<std::string_view> pieces;
  if (bytes.empty()) return pieces;
  size_t at = 0;
  while (true) {
    const size_t end = bytes.find('\xff', at);
    pieces.push_back(bytes.substr(at, end == std::string_view::npos ? end : end - at));
    if (end == std::string_view::npos) return pieces;
    at = end + 1;
  }
}

std::string JoinWithFF(const std::vector<std::string>& pieces) {
  std::string joined;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) joined += '\xff';
    joined += pieces[i];
  }
  return joined;
}

void WriteFileOrDie(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

CoreRun RunSmallCore(const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/journal";
  CoreRun run;
  auto core = Value(DurableCore::Open(path, {}), "open");
  const std::string samples =
      R"({"prompt": "1+1=", "samples": [{"tokens": [1, 2, 3], "logprobs": [-0.5, -0.25, -1], )"
      R"("reward": 1.0}]})";
  auto submit = [&](Micros now, const orchestrator::Lease& lease, const std::string& cluster,
                    uint64_t version) {
    orchestrator::TrajectoryGroup group;
    group.job = lease.job;
    group.attempt = lease.attempt;
    group.cluster = cluster;
    group.version_start = group.version_end = version;
    group.segments = {{version, 0}};
    group.tokens = 3;
    group.trajectories = samples;
    return core->Submit(now, group);
  };
  Micros t = 1'000'000'000;
  Check(core->AnnounceVersion(t, 0), "announce 0");
  Check(core->Register(t, "c0", "r0", 4, "credential-0"), "register c0");
  Check(core->Register(t, "c1", "r1", 2), "register c1");
  Check(core->Heartbeat(t, "c0", 0), "heartbeat c0");
  Check(core->Heartbeat(t, "c1", 0), "heartbeat c1");
  Value(core->AddJobs(t, {{R"("1+1=")", 2}, {"[1, 2, 3]", 1}, {R"("x")", 1}, {R"("y")", 3}}),
        "add jobs");
  std::vector<orchestrator::Lease> leases = Value(core->RequestLeases(t + 1, "c0", 2, 7), "lease");
  std::vector<orchestrator::Lease> others = Value(core->RequestLeases(t + 1, "c1", 2), "lease");
  if (leases.size() != 2 || others.empty()) Die("the jobs were not leased");
  Value(submit(t + 2, leases[0], "c0", 0), "submit");
  Value(submit(t + 3, leases[0], "c0", 0), "submit again");
  Check(core->AnnounceVersion(t + 4, 1), "announce 1");
  Check(core->Heartbeat(t + 4, "c0", 1), "heartbeat c0 at 1");
  Value(submit(t + 5, leases[1], "c0", 1), "submit at 1");
  const orchestrator::Batch batch = Value(core->TakeBatch(t + 6, 1), "take a batch");
  run.states.push_back(StateOf(*core));
  Value(core->TakeBatch(t + 7, 4, batch.id), "acknowledge and take");
  Check(core->Drain(t + 8, "c1", {}), "drain c1");
  Check(core->Heartbeat(t + 99'000'000, "c0", 1), "heartbeat c0 before the tick");
  Check(core->Tick(t + 100'000'000), "tick");
  Check(core->Register(t + 100'000'001, "c1", "r1", 2), "register c1 again");
  Check(core->Deregister(t + 100'000'002, "c1"), "deregister c1");
  run.states.push_back(StateOf(*core));
  run.journal = ReadFileOrDie(path);
  run.records = RecordsOf(run.journal);
  Check(core->Compact(), "compact");
  run.snapshot_file = ReadFileOrDie(path + ".snapshot.1");
  t += 200'000'000;
  Check(core->Register(t, "c0", "r0", 4, "credential-0b"), "register c0 again");
  Check(core->Heartbeat(t, "c0", 1), "heartbeat c0 after the compaction");
  Value(core->AddJobs(t, {{R"("z")", 1}}), "add a job");
  leases = Value(core->RequestLeases(t + 1, "c0", 1), "lease after the compaction");
  if (leases.empty()) Die("no lease after the compaction");
  Value(submit(t + 2, leases[0], "c0", 1), "submit after the compaction");
  Check(core->AnnounceVersion(t + 3, 4), "announce 4");
  Value(core->TakeBatch(t + 4, 8), "take a stale batch");
  run.states.push_back(StateOf(*core));
  core.reset();
  run.records1 = RecordsOf(ReadFileOrDie(path + ".1"));
  std::filesystem::remove_all(dir);
  return run;
}

}  // namespace weft::fuzz
