// OrchestratorService: the orchestrator's HTTP API (docs/api.md, "Orchestrator API") around a
// DurableCore. A thin shell: it authenticates, decodes requests (orchestrator/wire.h) into core
// events stamped with the wall clock, answers with what the core decided once it is journaled,
// parks long polls (leases, trainer batches) until there is something to hand out or their wait is
// over, and ticks the core so leases and silent clusters expire.
//
// Roles: the worker token may register clusters, heartbeat, lease, submit and drain; the trainer
// token may announce versions, add jobs and take batches; the admin token may do everything.
// /v1/status needs any of them; /metrics, /livez and /readyz need none. Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/http_server_options.h"
#include "orchestrator/durable_core.h"
#include "orchestrator/types.h"

namespace weft::orchestrator {

struct ServiceOptions {
  http::ServerOptions server;
  std::string run_id = "run";
  std::string worker_token, trainer_token, admin_token;
  std::chrono::milliseconds tick_interval{100};
  std::chrono::milliseconds max_wait{30000};  // the longest a long poll may wait
  uint64_t max_staleness = 0;                 // for the status page (the core enforces it)
};

class OrchestratorService {
 public:
  // `core` must outlive the service.
  static Result<std::unique_ptr<OrchestratorService>> Start(DurableCore& core,
                                                            ServiceOptions options);
  ~OrchestratorService();

  uint16_t port() const;
  void Stop();

  struct Impl;

 private:
  explicit OrchestratorService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The wall clock in microseconds since the epoch: the core's time in the service (it keeps
// counting across restarts, so replayed deadlines stay meaningful).
Micros WallMicros();

}  // namespace weft::orchestrator
