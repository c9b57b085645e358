// OrchestratorClient: the orchestrator API (docs/api.md) for rollout workers and trainers, over
// common/http_client: every call has a deadline, and is retried with backoff when that is safe.
//
// Retried until the deadline: registration, heartbeats, drains, leaving, version announcements,
// lease requests (each call carries a request id, so a retry after a lost answer gets the same
// leases back instead of new ones), submissions (idempotent by job
// and attempt: a repeat is acknowledged as a duplicate, never counted twice) and batches
// (acknowledged explicitly: a lost answer is handed out again). Adding jobs is repeated only when
// the request never reached the orchestrator, since a repeat would add the jobs twice; otherwise
// the error says so. Errors carry the orchestrator's message and map to Status codes (404
// kNotFound, 409 kConflict, ...). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/http_client.h"
#include "orchestrator/core.h"
#include "orchestrator/service.h"

namespace weft::orchestrator {

struct ReceivedTrajectory {
  Submission submission;  // payload: the trajectories' JSON as the worker sent it
  bool stale = false;
};

class OrchestratorClient {
 public:
  // `url` like "http://127.0.0.1:8090"; `token` the role's bearer token.
  // `options.deadline` bounds each call, retries included; long polls add their wait to it.
  OrchestratorClient(std::string url, std::string token, HttpClientOptions options = {});

  // Workers.
  Status Register(const std::string& cluster, const std::string& region, uint32_t capacity);
  // `sync`: the worker's weight-sync counters, shown in /v1/status.
  Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                   const SyncReport* sync = nullptr);
  // Waits up to `wait` for at least one lease (zero: answer at once).
  Result<std::vector<Lease>> RequestLeases(const std::string& cluster, uint32_t max,
                                           std::chrono::milliseconds wait);
  // `trajectories` is any JSON (the samples, their tokens, logprobs, rewards).
  Result<SubmitResult> Submit(const Submission& submission, const nlohmann::json& trajectories);
  Status Drain(const std::string& cluster, const std::vector<uint64_t>& jobs = {});
  Status Deregister(const std::string& cluster);

  // Trainers.
  Status AnnounceVersion(uint64_t version);
  // Each prompt is JSON (text or token ids) with its number of samples.
  Result<std::vector<uint64_t>> AddJobs(
      const std::vector<std::pair<nlohmann::json, uint32_t>>& prompts);
  // The next batch. Each call acknowledges the last batch this client received, and batches seen
  // already (handed out again after a lost answer) are skipped, so each trajectory is returned
  // once by this client. A new client (a restarted trainer) receives unacknowledged batches again.
  Result<std::vector<ReceivedTrajectory>> TakeBatch(uint32_t max, std::chrono::milliseconds wait);
  // Acknowledges the last batch received without taking another (a trainer that is done).
  Status AcknowledgeBatches();

  Result<nlohmann::json> GetStatus();

 private:
  // POSTs (or `method`s) `body` to `path`, returns the JSON answer or the error it means.
  Result<nlohmann::json> Call(const std::string& method, const std::string& path,
                              const nlohmann::json& body, bool idempotent,
                              std::chrono::milliseconds extra_wait = std::chrono::milliseconds(0));

  std::string token_;
  HttpClient client_;
  std::mutex batch_mutex_;
  uint64_t last_batch_ = 0;  // the newest batch received (0: none)
};

}  // namespace weft::orchestrator
