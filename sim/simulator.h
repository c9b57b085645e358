// weft sim: a seeded discrete-event simulation of a whole deployment (docs/sim.md). It drives the
// real orchestrator core (orchestrator/core.h) and the real pull planner
// (policy_store/planner.h), with a simulated trainer, store, regions (WAN links, relays), rollout
// clusters and faults around them, and checks the system's invariants after every event.
//
// Deterministic: one thread, integer microseconds, events ordered by (time, sequence), and every
// random draw from a stream derived from the seed. The same configuration and seed give the same
// report, byte for byte.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "sim/config.h"

namespace weft::sim {

struct SimOptions {
  // Tests only: after this many events, the simulator corrupts its record of one cluster's
  // version, so that the invariant checks must catch it (0: never).
  uint64_t break_invariant_at = 0;
};

struct SimResult {
  // report.json's content (docs/sim.md, "The report"); filled also when the run failed, up to the
  // failure.
  nlohmann::json report;
  Status failure;  // an invariant that broke: names it, the event, the simulated time and the seed
  uint64_t events = 0;
  uint64_t invariant_checks = 0;
  double simulated_seconds = 0;
  double core_seconds = 0;  // real time spent inside the orchestrator core's calls
};

SimResult Simulate(const SimConfig& config, const SimOptions& options = {});

}  // namespace weft::sim
