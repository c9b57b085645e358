// OrchestratorClient: the orchestrator API (docs/api.md) for rollout workers and trainers, over
// common/http_client, with the bodies of orchestrator/wire.h: every call has a deadline, and is
// retried with backoff when that is safe.
//
// Retried until the deadline: registration, heartbeats, drains, leaving, version announcements,
// lease requests (each call carries a request id, so a retry after a lost answer gets the same
// leases back instead of new ones), submissions (idempotent by job and attempt: a repeat is
// acknowledged as a duplicate, never counted twice) and batches (acknowledged explicitly: a lost
// answer is handed out again). Adding jobs is repeated only when the request never reached the
// orchestrator, since a repeat would add the jobs twice; otherwise the error says so. Errors carry
// the orchestrator's message and map to Status codes (404 kNotFound, 409 kConflict, ...); an answer
// that is not what the API promises is kDataLoss. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/http_client.h"
#include "common/mutex.h"
#include "orchestrator/cluster_api.h"
#include "orchestrator/types.h"
#include "orchestrator/wire.h"

namespace weft::orchestrator {

// A job as a trainer adds it (docs/api.md, POST /v1/jobs).
struct NewJob {
  nlohmann::json prompt;  // text or token ids (any JSON the task understands)
  uint32_t samples = 1;   // 1 to 4096
  // Any JSON value (a reference answer, a dataset row id), at most 64 KiB as text, kept by the
  // orchestrator with the job and handed back with its trajectory group (Delivered::metadata,
  // as the text this client sent); each lease of the job carries it to the worker. Null: none.
  nlohmann::json metadata = nullptr;
  // The model it needs ("" the policy) and its kind; a score job's completions to score (an array
  // of token id arrays; null for a generate job), whose number is then its `samples`.
  std::string model = {};
  JobKind kind = JobKind::kGenerate;
  nlohmann::json targets = nullptr;
};

class OrchestratorClient : public ClusterApi {
 public:
  // `url` like "http://127.0.0.1:8090"; `token` the role's bearer token.
  // `options.deadline` bounds each call, retries included; long polls add their wait to it.
  OrchestratorClient(std::string url, std::string token, HttpClientOptions options = {});

  // Workers. Registration (with the worker token) returns a token for the cluster, which this
  // client then sends with every call naming that cluster.
  using ClusterApi::Register;
  Status Register(const std::string& cluster, const std::string& region, uint32_t capacity,
                  const ModelRef& model) override;
  Status Heartbeat(const std::string& cluster, std::optional<uint64_t> ready_version,
                   const SyncReport* sync = nullptr) override;
  Result<LeaseAnswer> RequestLeases(const std::string& cluster, uint32_t max,
                                    std::chrono::milliseconds wait) override;
  Result<SubmitResult> Submit(const TrajectoryGroup& group) override;
  Status Drain(const std::string& cluster, const std::vector<uint64_t>& jobs = {}) override;
  Status Release(const std::string& cluster, const std::vector<uint64_t>& jobs = {}) override;
  Status Deregister(const std::string& cluster) override;

  // Trainers.
  // `publish_seconds`: how long publishing it took, for the orchestrator's measurements.
  Status AnnounceVersion(uint64_t version, std::optional<double> publish_seconds = std::nullopt);
  // Each prompt is JSON (text or token ids) with its number of samples.
  Result<std::vector<uint64_t>> AddJobs(
      const std::vector<std::pair<nlohmann::json, uint32_t>>& prompts);
  // The same with each job's metadata. (A span, so that a braced list of pairs still means the
  // overload above: pass a std::vector<NewJob>.) A prompt or metadata holding a string that is
  // not UTF-8 is kInvalidArgument, and nothing is sent.
  Result<std::vector<uint64_t>> AddJobs(std::span<const NewJob> jobs);
  // The next batch. Each call acknowledges the last batch this client received, and batches seen
  // already (handed out again after a lost answer) are skipped, so each group is returned once by
  // this client. A new client (a restarted trainer) receives unacknowledged batches again. Each
  // group comes with its job's metadata (Delivered::metadata: JSON text, "" when none).
  Result<std::vector<Delivered>> TakeBatch(uint32_t max, std::chrono::milliseconds wait);
  // Acknowledges the last batch received without taking another (a trainer that is done).
  Status AcknowledgeBatches();
  // How long the trainer's last call for a batch waited for data: sent with the next batch
  // request (or acknowledgement), for the orchestrator's measurements.
  void ReportWait(double seconds);

  // GET /v1/status, decoded (an answer that is not a status page is kDataLoss).
  Result<wire::StatusPage> GetStatus();

 private:
  // Sends `body` to `path` with `method` and the bearer `token`, and returns the answer's text or
  // the error it means.
  Result<std::string> Call(const std::string& method, const std::string& path,
                           const std::string& body, bool idempotent,
                           std::chrono::milliseconds extra_wait = std::chrono::milliseconds(0),
                           const std::string* token = nullptr);
  // Adds jobs whose prompts and metadata are JSON text already.
  Result<std::vector<uint64_t>> SendJobs(const std::vector<JobSpec>& jobs);
  // The token for calls naming `cluster`: the one its registration returned, else the client's.
  std::string TokenFor(const std::string& cluster);

  std::string token_;
  Mutex register_mutex_;  // held through a registration
  Mutex tokens_mutex_;
  // From registrations.
  std::map<std::string, std::string> cluster_tokens_ GUARDED_BY(tokens_mutex_);
  HttpClient client_;
  Mutex batch_mutex_;
  uint64_t last_batch_ GUARDED_BY(batch_mutex_) = 0;       // the newest batch received (0: none)
  std::optional<double> waited_ GUARDED_BY(batch_mutex_);  // a wait not reported yet
};

}  // namespace weft::orchestrator
