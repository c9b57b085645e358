// The processes of a run on one machine, as `weft run` and `weft generate` start them: the store
// server over the run's store directory (unless store.uri names a shared store), the orchestrator
// with its journal in the run directory, one relay per region behind the region's emulated WAN
// link, and the workers of every region (the policy's, and those of each fixed model the region
// runs). The infrastructure (store, orchestrator, relays) is restarted when it dies; a worker that
// dies stays dead and its jobs go to the others.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "cli/run_config.h"
#include "cli/supervisor.h"
#include "common/status.h"

namespace weft::cli {

struct RunProcesses {
  std::vector<Child> children;  // the infrastructure, then the workers
  size_t first_worker = 0;
};

// Writes `dir`/orchestrator.yaml (the orchestrator section, its journal in `dir`) and lists the
// processes (`config_abs`: the config's absolute path, which the workers read).
Result<RunProcesses> PlanRunProcesses(const RunConfig& config, const std::filesystem::path& dir,
                                      const std::string& config_abs);

// Starts the infrastructure, waiting for each to listen (stopping what started on a failure,
// naming the log), then children [first_worker, end).
Status StartRunProcesses(Supervisor& supervisor, std::vector<Child>& children, size_t first_worker,
                         const std::filesystem::path& dir);

// Children that ended since the last call: the infrastructure's are restarted (each at most 5
// times; then `failure` says which keeps dying), a worker's end is told. Returns the children
// that ended, for the caller to look for its own.
std::vector<Child*> ReapRunProcesses(Supervisor& supervisor, std::vector<Child>& children,
                                     const std::filesystem::path& dir, bool tty,
                                     std::string* failure);

// SIGTERM to children [from, end) (workers drain and deregister), then SIGKILL after 20 s.
void StopWorkers(Supervisor& supervisor, std::vector<Child>& children, size_t from);
// The infrastructure, children [0, first_worker), in the reverse of their start.
void StopInfrastructure(Supervisor& supervisor, std::vector<Child>& children, size_t first_worker);

}  // namespace weft::cli
