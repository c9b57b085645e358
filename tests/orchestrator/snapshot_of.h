// The snapshot of a durable core's state, for tests that compare states.
#pragma once

#include <string>

#include "orchestrator/durable_core.h"

namespace weft::testing {

inline std::string SnapshotOf(const orchestrator::DurableCore& durable) {
  return durable.Inspect(
      [](const orchestrator::OrchestratorCore& core) { return core.Snapshot(); });
}

}  // namespace weft::testing
