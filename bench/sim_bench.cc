// The simulator's own speed and the invariants over many seeds.
//
//  1. The 1,000-cluster, ten-region scenario (configs/sim/fleet-1t.yaml, as written) for its
//     simulated hour: real time, events per second, and the orchestrator core's cost per event,
//     next to the floor of any discrete-event simulation of the same events measured in the same
//     run (a binary heap's push and pop of as many events).
//  2. Every scenario of configs/sim with each of its variants, shrunk to 40 clusters and twelve
//     simulated minutes (faults moved into them), for SEEDS seeds each: every invariant must hold
//     on every event; the count of runs, events and checks is printed.
//
// Usage: sim_bench [--seeds N (default 200)] [--skip-fleet] [--configs DIR]
#include <cinttypes>
#include <cstring>
#include <queue>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "sim/config.h"
#include "sim/simulator.h"

namespace weft::bench {
namespace {

struct HeapEvent {
  int64_t t;
  uint64_t seq;
  bool operator>(const HeapEvent& other) const {
    return t != other.t ? t > other.t : seq > other.seq;
  }
};

// Seconds to push and pop `events` events through a binary heap holding about `live` at a time.
double HeapFloor(uint64_t events, uint64_t live) {
  std::priority_queue<HeapEvent, std::vector<HeapEvent>, std::greater<>> heap;
  uint64_t state = 1, seq = 0;
  for (uint64_t i = 0; i < live; ++i) heap.push({static_cast<int64_t>(i), seq++});
  const auto start = Clock::now();
  for (uint64_t i = 0; i < events; ++i) {
    const HeapEvent e = heap.top();
    heap.pop();
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    heap.push({e.t + static_cast<int64_t>(state >> 44), seq++});
  }
  const double took = Seconds(start);
  if (heap.size() != live) std::abort();
  return took;
}

}  // namespace
}  // namespace weft::bench

int main(int argc, char** argv) {
  using namespace weft;
  using namespace weft::bench;
  uint64_t seeds = 200;
  bool fleet = true;
  std::string configs = WEFT_SOURCE_DIR "/configs/sim";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seeds") == 0 && i + 1 < argc) {
      seeds = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--skip-fleet") == 0) {
      fleet = false;
    } else if (std::strcmp(argv[i], "--configs") == 0 && i + 1 < argc) {
      configs = argv[++i];
    } else {
      std::fprintf(stderr, "usage: sim_bench [--seeds N] [--skip-fleet] [--configs DIR]\n");
      return 2;
    }
  }
  if (fleet) {
    Result<sim::SimConfig> config = sim::LoadSimConfig(configs + "/fleet-1t.yaml");
    Check(config.status(), "fleet-1t.yaml");
    const auto start = Clock::now();
    const sim::SimResult result = sim::Simulate(*config);
    const double real = Seconds(start);
    Check(result.failure, "fleet-1t");
    uint32_t clusters = 0;
    for (const sim::RegionConfig& region : config->regions) clusters += region.clusters;
    const double floor = HeapFloor(result.events, 4 * clusters);
    std::printf("fleet-1t: %u clusters, %zu regions, %.0f simulated seconds\n", clusters,
                config->regions.size(), result.simulated_seconds);
    std::printf("  real time                      %8.2f s  (%.0fx faster than simulated time)\n",
                real, result.simulated_seconds / real);
    std::printf("  events                         %8" PRIu64 "  (%.0f per second)\n", result.events,
                static_cast<double>(result.events) / real);
    std::printf("  per event, all of it           %8.2f us\n",
                1e6 * real / static_cast<double>(result.events));
    std::printf("  per event, in the core         %8.2f us  (%.0f%% of the time)\n",
                1e6 * result.core_seconds / static_cast<double>(result.events),
                100 * result.core_seconds / real);
    std::printf("  baseline: heap push + pop      %8.3f us  (the floor of any event loop)\n",
                1e6 * floor / static_cast<double>(result.events));
    std::printf("  invariant checks               %8" PRIu64 "\n", result.invariant_checks);
  }
  if (seeds > 0) {
    const auto start = Clock::now();
    uint64_t runs = 0, events = 0, checks = 0;
    for (const char* name :
         {"small.yaml", "fleet-1t.yaml", "preemption-wave.yaml", "region-partition.yaml",
          "orchestrator-crash.yaml", "staleness-sweep.yaml"}) {
      Result<sim::SimConfig> config = sim::LoadSimConfig(configs + "/" + name);
      Check(config.status(), name);
      for (const auto& [variant, scenario] : sim::Runs(*config)) {
        sim::SimConfig run = sim::Shrunk(scenario, 40, 12 * 60 * 1'000'000LL);
        for (uint64_t seed = 1; seed <= seeds; ++seed) {
          run.seed = seed;
          const sim::SimResult result = sim::Simulate(run);
          ++runs;
          events += result.events;
          checks += result.invariant_checks;
          if (!result.failure.ok()) {
            std::fprintf(stderr, "%s %s: %s\n", name, variant.c_str(),
                         result.failure.message().c_str());
            return 1;
          }
        }
      }
    }
    std::printf("seeds: %" PRIu64 " runs (every scenario and variant x %" PRIu64
                " seeds, 40 clusters, 12 simulated minutes): every invariant held; %" PRIu64
                " events, %" PRIu64 " checks, %.1f s\n",
                runs, seeds, events, checks, Seconds(start));
  }
  return 0;
}
