// The keys of the orchestrator's YAML section that configure the core (docs/api.md, "Orchestrator
// configuration"): shared by the orchestrator's configuration (config.h) and the simulator's, so
// that a simulated orchestrator is configured exactly as a real one.
#pragma once

#include <yaml-cpp/yaml.h>
#include <string>
#include <vector>

#include "common/status.h"
#include "orchestrator/core.h"

namespace weft::orchestrator {

// max_staleness, stale_policy, dispatch, lease, cluster_timeout, stall_after, max_in_flight,
// max_attempts, remember_done.
const std::vector<std::string>& CoreConfigKeys();

// Reads those keys of `section` (absent keys keep the values in `config`); errors name the file
// (`path`), the key and the line. The caller checks for unknown keys.
Status ParseCoreConfig(const YAML::Node& section, const std::string& where, const std::string& path,
                       CoreConfig* config);

}  // namespace weft::orchestrator
