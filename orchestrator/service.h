// OrchestratorService: the orchestrator's HTTP API (docs/api.md, "Orchestrator API") around a
// DurableCore. A thin shell: it authenticates, decodes requests (orchestrator/wire.h) into core
// events stamped with the wall clock, answers with what the core decided once it is journaled,
// parks long polls (leases, trainer batches) until there is something to hand out or their wait is
// over, and ticks the core so leases and silent clusters expire.
//
// Roles: the worker token may register clusters, heartbeat, lease, submit and drain; the trainer
// token may announce versions, add jobs and take batches; the admin token may do everything; the
// optional viewer token may read /v1/status only. /v1/status needs any of them; /metrics, /livez,
// /readyz and the dashboard page /ui (which holds no data: it reads /v1/status with the token
// its user gives it) need none. Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/http_server_options.h"
#include "orchestrator/durable_core.h"
#include "orchestrator/types.h"

namespace weft::orchestrator {

// Request bodies: the largest a server may be configured to take (so that every request it
// takes fits in one journal record, even with its prompts escaped to twice their size), and the
// default. Requests other than submissions and jobs take at most kSmallRequestBytes.
inline constexpr uint64_t kMaxRequestBytes = uint64_t{31} << 20;
inline constexpr uint64_t kDefaultMaxRequestBytes = uint64_t{16} << 20;
inline constexpr uint64_t kSmallRequestBytes = uint64_t{1} << 20;

// The server options an orchestrator starts from: the defaults, with its body limit.
inline http::ServerOptions DefaultServerOptions() {
  http::ServerOptions options;
  options.max_body_bytes = kDefaultMaxRequestBytes;
  return options;
}

struct ServiceOptions {
  http::ServerOptions server = DefaultServerOptions();
  std::string run_id = "run";
  std::string worker_token, trainer_token, admin_token;
  std::string viewer_token;  // optional: reads /v1/status and nothing else (the dashboard's)
  // Per-cluster series on /metrics for at most this many clusters (by id); the regions' series
  // cover every cluster.
  uint64_t metrics_cluster_limit = 256;
  std::chrono::milliseconds tick_interval{100};
  std::chrono::milliseconds max_wait{30000};  // the longest a long poll may wait
  uint64_t max_staleness = 0;                 // for the status page (the core enforces it)
  Env* env = nullptr;  // whose wall clock times the core's events; null: Env::Default()
};

// Ok when the three role tokens are all set and all different (a worker token that is also the
// admin token would make every worker an admin); otherwise says which.
Status CheckTokens(const ServiceOptions& options);

class OrchestratorService {
 public:
  // `core` must outlive the service. Refuses options that CheckTokens refuses, and a body limit
  // outside 1 byte to kMaxRequestBytes.
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

// The machine's wall clock in microseconds since the epoch: the core's time (it keeps counting
// across restarts, so replayed deadlines stay meaningful).
Micros WallMicros();

}  // namespace weft::orchestrator
