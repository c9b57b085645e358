// libFuzzer target: OrchestratorCore::Restore, the reader of the core's snapshot text
// (docs/formats.md section 7.1; orchestrator/snapshot.cc).
//
// Restore must refuse or succeed without crashing. When it succeeds, the core's Snapshot() must
// restore again, to a core whose Snapshot() is the same text (the format round-trips). Then both
// cores, the one restored from the input and the one restored from its snapshot, take the same
// events (heartbeats and lease requests from each cluster, jobs added, a batch taken and
// acknowledged, a version announced, ticks past the lease and the cluster timeout) and must give
// the same answers and end in the same state: the snapshot holds the whole state (core.h).
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "orchestrator/core.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/orchestrator_files.h"

namespace weft::fuzz {
namespace {

using orchestrator::CoreConfig;
using orchestrator::Micros;
using orchestrator::OrchestratorCore;

[[noreturn]] void Finding(const std::string& what, const std::string& first,
                          const std::string& second) {
  std::fprintf(stderr, "\n==== weft fuzz finding: %s\n---- first:\n%s\n---- then:\n%s\n----\n",
               what.c_str(), first.substr(0, 8192).c_str(), second.substr(0, 8192).c_str());
  std::abort();
}

// A saturating a + b for times from the input (the harness must not overflow on its own).
Micros Plus(Micros a, Micros b) {
  if (b > 0 && a > std::numeric_limits<Micros>::max() - b)
    return std::numeric_limits<Micros>::max();
  return a + b;
}

std::string Describe(const Status& status) {
  return status.ok() ? "ok"
                     : std::to_string(static_cast<int>(status.code())) + " " + status.message();
}

// Runs the same events on `core`, returning a transcript of its answers.
std::string Drive(OrchestratorCore& core, const CoreConfig& config) {
  std::string transcript;
  Micros now = 0;
  for (const orchestrator::ClusterView& cluster : core.clusters())
    now = std::max(now, cluster.last_heartbeat);
  now = Plus(now, 1);
  const std::optional<uint64_t> latest = core.latest_version();
  size_t count = 0;
  for (const orchestrator::ClusterView& cluster : core.clusters()) {
    if (++count > 4) break;
    transcript += "heartbeat " + Describe(core.Heartbeat(now, cluster.id, latest)) + "\n";
    auto leases = core.RequestLeases(now, cluster.id, 2, 0);
    transcript += "leases " + Describe(leases.status());
    if (leases.ok()) {
      for (const orchestrator::Lease& lease : *leases)
        transcript += " " + std::to_string(lease.job) + "/" + std::to_string(lease.attempt) + "@" +
                      std::to_string(lease.deadline) + ">=" + std::to_string(lease.min_version);
    }
    transcript += "\n";
  }
  for (uint64_t id : core.AddJobs(now, {{R"("p")", 1}}))
    transcript += "job " + std::to_string(id) + "\n";
  const orchestrator::Batch batch = core.TakeBatch(now, 4);
  transcript +=
      "batch " + std::to_string(batch.id) + " of " + std::to_string(batch.items.size()) + "\n";
  const orchestrator::Batch acknowledged = core.TakeBatch(now, 0, batch.id);
  transcript += "acknowledged " + std::to_string(acknowledged.acknowledged) + "\n";
  if (latest && *latest < orchestrator::kMaxVersion)
    transcript += "announce " + Describe(core.AnnounceVersion(now, *latest + 1)) + "\n";
  transcript += "tick " + std::to_string(core.Tick(Plus(now, config.lease_duration))) + "\n";
  transcript +=
      "tick " +
      std::to_string(core.Tick(Plus(now, config.cluster_timeout + config.lease_duration))) + "\n";
  for (const std::string& alert : core.Alerts(now)) transcript += "alert " + alert + "\n";
  return transcript;
}

std::vector<std::string> Seeds() {
  CoreRun run = RunSmallCore(FreshDirectory("snapshot_seeds"));
  run.states.push_back(OrchestratorCore(CoreConfig{}).Snapshot());
  return run.states;
}

}  // namespace
}  // namespace weft::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace weft::fuzz;
  const std::string seeds = SeedDirectoryArgument(*argc, *argv);
  if (!seeds.empty()) WriteSeedsAndExit(seeds, Seeds());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::fuzz;
  const CoreConfig config;
  auto restored = OrchestratorCore::Restore(config, {reinterpret_cast<const char*>(data), size});
  if (!restored.ok()) return 0;
  const std::string first = restored->Snapshot();
  auto again = OrchestratorCore::Restore(config, first);
  if (!again.ok()) Finding("a snapshot does not restore: " + again.status().message(), first, "");
  const std::string second = again->Snapshot();
  if (second != first) Finding("a restored snapshot is not the same snapshot", first, second);
  const std::string from_input = Drive(*restored, config);
  const std::string from_snapshot = Drive(*again, config);
  if (from_input != from_snapshot)
    Finding("the same events get other answers after a snapshot", from_input, from_snapshot);
  if (restored->Snapshot() != again->Snapshot())
    Finding("the same events end in another state after a snapshot", restored->Snapshot(),
            again->Snapshot());
  return 0;
}
