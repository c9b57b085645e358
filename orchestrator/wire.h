// The orchestrator API on the wire: every request and answer body of docs/api.md ("Orchestrator
// API") mapped to and from the types of orchestrator/types.h, in this one place. The service
// decodes requests and encodes answers; the client encodes requests and decodes answers; the
// journal and snapshots store trajectory groups with GroupFields / ReadGroupFields.
//
// Requests are decoded strictly: a body that is not a JSON object, an unknown or missing field, a
// wrong type or an out-of-range value is kInvalidArgument naming the field
// ("submission.segments[0]"). Answers are decoded leniently (fields a newer orchestrator adds are
// ignored), but for the status page, which is decoded as strictly as a request; what is missing or
// mistyped is kInvalidArgument naming it, which the client reports as kDataLoss.
//
// A trajectory group's samples travel as the text the worker sent, and a job's metadata as the text
// the trainer sent: encoding splices that text into the body, decoding cuts it out of the body
// (after the whole body was checked), so each is parsed once, by whoever consumes it. Pure
// functions; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "orchestrator/types.h"

namespace weft::orchestrator::wire {

// The answer of a cluster route (POST /v1/clusters, DELETE /v1/clusters/<id>, POST .../heartbeat,
// .../drain, .../release): {"cluster": id, "<event>": true}, and a registration's cluster token.
enum class ClusterEvent { kRegistered, kHeartbeat, kDraining, kReleased, kDeregistered };
struct ClusterAnswer {
  std::string cluster;
  ClusterEvent event = ClusterEvent::kHeartbeat;
  std::string cluster_token;  // a registration's (the token for the cluster's later calls)
};
std::string Encode(const ClusterAnswer& answer);
// The answer to a call that expected `event`: kInvalidArgument naming what is missing or mistyped
// (the cluster, the event's flag, a cluster token that is not a string).
Result<ClusterAnswer> DecodeClusterAnswer(std::string_view answer, ClusterEvent event);

// A job kind's name on the wire ("generate", "score"), and back (kInvalidArgument naming the
// value).
const char* JobKindName(JobKind kind);
Result<JobKind> ParseJobKind(const std::string& name);

// A fixed model's digest: 16 to 128 lowercase hex digits (a heartbeat's "sync.digest" is 32).
Status CheckModelDigest(const std::string& digest, const std::string& where);

// POST /v1/clusters
struct Registration {
  std::string cluster;
  std::string region;
  uint32_t capacity = 1;  // 1 to 10^6
  ModelRef model = {};    // "model" and "model_digest", absent for the policy
};
std::string Encode(const Registration& registration);
Result<Registration> DecodeRegistration(std::string_view body);

// POST /v1/clusters/<id>/heartbeat
struct Heartbeat {
  std::optional<uint64_t> ready_version;
  std::optional<SyncReport> sync;
};
std::string Encode(const Heartbeat& heartbeat);
Result<Heartbeat> DecodeHeartbeat(std::string_view body);
// The "sync" object, also shown per cluster and region in /v1/status.
nlohmann::json SyncReportJson(const SyncReport& report);
Result<SyncReport> DecodeSyncReport(const nlohmann::json& json, const std::string& where);

// POST /v1/clusters/<id>/leases, and its answer.
struct LeaseRequest {
  uint32_t max = 1;                   // 1 to 100000
  std::chrono::milliseconds wait{0};  // a long poll (capped at an hour)
  uint64_t request = 0;               // the worker's id for this request (0: none)
};
std::string Encode(const LeaseRequest& request);
Result<LeaseRequest> DecodeLeaseRequest(std::string_view body);
std::string EncodeLeases(const LeaseAnswer& answer);
Result<LeaseAnswer> DecodeLeases(std::string_view answer);

// POST /v1/clusters/<id>/drain: the jobs handed back (empty: all).
std::string EncodeDrain(const std::vector<uint64_t>& jobs);
Result<std::vector<uint64_t>> DecodeDrain(std::string_view body);

// POST /v1/submissions: a trajectory group, and whether it was accepted or a repeat.
std::string EncodeSubmission(const TrajectoryGroup& group);
Result<TrajectoryGroup> DecodeSubmission(std::string_view body);
std::string Encode(SubmitResult result);
Result<SubmitResult> DecodeSubmitResult(std::string_view answer);

// A group's fields but its samples (job, attempt, cluster, version_start, version_end, segments,
// tokens) as a JSON object: what the journal and the snapshots store beside the samples' text.
nlohmann::json GroupFields(const TrajectoryGroup& group);
// Reads them from `object`, which may hold other members (the caller checks those).
Status ReadGroupFields(const nlohmann::json& object, const std::string& where,
                       TrajectoryGroup* group);

// POST /v1/versions
// {"version": v, "publish_seconds": s}: the trainer may say how long publishing it took (a
// non-negative number; absent or null: not said), which the orchestrator measures.
std::string EncodeAnnouncement(uint64_t version,
                               std::optional<double> publish_seconds = std::nullopt);
Result<uint64_t> DecodeAnnouncement(std::string_view body,
                                    std::optional<double>* publish_seconds = nullptr);

// POST /v1/jobs (samples 1 to 4096 each, at most 100000 jobs), and the ids of the jobs added. A
// job may name its "model" (absent: the policy) and "kind" ("generate", the default, or "score",
// whose "prompt" is token ids and whose "targets" are the completions to score, 1 to 4096 arrays of
// 1 to 65536 token ids; "samples", if given, must be their number). A job's "metadata" (optional;
// null is none) is any JSON value of at most kMaxJobMetadataBytes of text: encoding splices
// JobSpec::metadata into the body as it is (it must be JSON text, or empty), decoding cuts the
// value's text out of the body, byte for byte, as it does a submission's samples.
std::string EncodeJobs(const std::vector<JobSpec>& jobs);
Result<std::vector<JobSpec>> DecodeJobs(std::string_view body);
// Checks that `targets` is what a job of `kind` holds as the jobs route admits it: for a score job,
// the JSON text of 1 to 4096 arrays of 1 to 65536 token ids; for a generate job, empty. For text
// read back from the journal or a snapshot.
Status CheckTargets(std::string_view targets, JobKind kind, const std::string& where);
// Checks that `text` is a job's metadata as the jobs route admits it: one JSON value (json_text
// rules) of at most kMaxJobMetadataBytes. For text read back from the journal or a snapshot.
Status CheckMetadata(std::string_view text, const std::string& where);
// How the journal's jobs event and the core snapshot store a job's optional fields after its
// fixed ones: nothing for the policy's generate job without metadata; [metadata] when it has
// metadata; [metadata, model, kind, targets] for any other model or kind (older journals and
// snapshots have only the first two forms).
void AppendJobTail(nlohmann::json& fields, const std::string& metadata, const std::string& model,
                   JobKind kind, const std::string& targets);
std::string EncodeJobIds(const std::vector<uint64_t>& ids);
Result<std::vector<uint64_t>> DecodeJobIds(std::string_view answer);

// POST /v1/batches, and its answer.
struct BatchRequest {
  uint32_t max = 64;  // 0 to 100000; 0 only acknowledges
  std::chrono::milliseconds wait{0};
  std::optional<uint64_t> ack;  // the newest batch the trainer has received
  // How long the trainer's previous next_batch call waited for data, in seconds (a non-negative
  // number; absent or null: not reported), which the orchestrator measures.
  std::optional<double> waited_seconds;
};
std::string Encode(const BatchRequest& request);
Result<BatchRequest> DecodeBatchRequest(std::string_view body);
std::string Encode(const Batch& batch);
Result<Batch> DecodeBatch(std::string_view answer);

// GET /v1/status: the orchestrator's state as its status page shows it (docs/api.md, the
// paragraph on /v1/status). The service builds one and encodes it; the client decodes it.
struct StatusPage {
  struct JobCounts {
    uint64_t queued = 0, leased = 0;  // now
    uint64_t added = 0, done = 0, given_up = 0;
  };
  struct LeaseCounts {
    uint64_t granted = 0, expired = 0, handed_back = 0, cancelled = 0;
  };
  struct TrajectoryCounts {
    uint64_t buffered = 0, outstanding = 0;  // now
    uint64_t accepted = 0, duplicate = 0, rejected = 0;
    uint64_t delivered_fresh = 0, delivered_stale = 0, dropped_stale = 0;
  };
  struct BatchCounts {
    uint64_t delivered = 0, redelivered = 0;
  };
  struct Cluster {
    std::string id, region;
    uint32_t capacity = 0;
    std::optional<uint64_t> ready_version;
    std::string state;  // "syncing", "ready", "draining" or "gone"
    uint32_t leases = 0;
    uint64_t completed = 0;
    double throughput_per_s = 0;
    double seconds_since_heartbeat = 0;
    std::optional<SyncReport> sync;  // its last report, if it sent one since the service started
    std::string model = {};          // a fixed model's name ("model", absent for the policy)
  };
  struct Region {
    uint64_t clusters = 0, ready = 0, leases = 0;
    std::optional<uint64_t> newest_ready_version;
    SyncReport sync;  // its clusters' reports summed (SyncReport::Add; no replicas)
    // Slots of its clusters neither draining nor gone, the leases they hold, and their ratio.
    uint64_t capacity = 0, busy = 0;
    double utilisation = 0;
    // Trajectory groups: accepted from its clusters (all time), and, since the orchestrator
    // started, delivered to the trainer and dropped as stale.
    uint64_t accepted = 0, delivered = 0, dropped_stale = 0;
  };
  // Publication to ready of one version in one region (Measurements, orchestrator/measurements.h).
  struct Readiness {
    uint64_t population = 0;  // clusters that could get ready when it was announced, still there
    uint64_t ready = 0;       // ... of which proved it (or a newer version)
    // Seconds from the announce until half, 90% and all of the population proved it (null: not
    // yet, or never).
    std::optional<double> ready_50_seconds, ready_90_seconds, ready_100_seconds;
    std::optional<uint64_t> missed;  // not ready when the next version came (null: still latest)
    uint64_t sync_bytes = 0;  // weights its clusters downloaded from this announce to the next
  };
  struct Version {
    uint64_t version = 0;
    double announced_at = 0;                   // Unix seconds
    std::optional<double> publish_seconds;     // as the trainer reported it (null: not reported)
    std::map<std::string, Readiness> regions;  // by name
  };
  struct Trainer {
    uint64_t steps_reported = 0;  // next_batch calls whose wait the trainer reported
    double wait_seconds_total = 0;
    std::vector<double> recent_wait_seconds;  // the latest steps', oldest first
    uint64_t publishes_reported = 0;
    double publish_seconds_total = 0;
  };
  struct Rates {
    double window_seconds = 0;  // what the rates are measured over (0: not yet)
    double accepted_per_s = 0, delivered_per_s = 0, leases_per_s = 0;
  };
  // Each model jobs name or clusters serve (OrchestratorCore::models): "name" ("" the policy),
  // "digest" (a fixed model's), "queued", "leased", "clusters" and "ready".
  struct Model {
    std::string name, digest;
    uint64_t queued = 0, leased = 0, clusters = 0, ready = 0;
  };
  struct Journal {
    uint64_t records = 0, syncs = 0, bytes = 0, generation = 0, compactions = 0;
    uint64_t remembered_done = 0;
  };

  std::string run;
  std::optional<uint64_t> latest_version;
  uint64_t admissible_version = 0;
  uint64_t max_staleness = 0;
  JobCounts jobs;
  LeaseCounts leases;
  uint64_t clusters_lost = 0;
  TrajectoryCounts trajectories;
  BatchCounts batches;
  std::map<uint64_t, uint64_t> buffered_by_version_start;  // version_start -> groups buffered
  std::vector<Cluster> clusters;
  std::vector<Model> models;              // "models" (absent from older orchestrators: empty)
  std::map<std::string, Region> regions;  // by name
  std::vector<std::string> alerts;
  Journal journal;
  std::vector<Version> versions;  // the latest announced, oldest first
  Trainer trainer;
  Rates rates;
  std::map<uint64_t, uint64_t> staleness;  // lag -> trajectory groups delivered since the start
};
std::string Encode(const StatusPage& page);
// Checked strictly, as a request is (its readers come with the orchestrator they read): the body an
// object with every field above and no other, each of its type (a version or null where optional;
// `state` one of the four; a sync report as a heartbeat's "sync" is checked). Errors start with
// `where` ("status") and name the field ("status.clusters[1].capacity").
Result<StatusPage> DecodeStatusPage(std::string_view answer, const std::string& where);

// A group's trajectories (docs/api.md, "Trajectories"): the text a worker submits as
// TrajectoryGroup::trajectories and a trainer reads; the orchestrator never does.
struct TrajectorySample {
  std::vector<int> tokens;       // the generated token ids, the prompt not included (one at least)
  std::vector<float> logprobs;   // the behaviour log-probability of each
  std::optional<double> reward;  // none: the trainer computes it
  std::optional<std::string> text;
  // The sample's own (version, first token), counted within the sample; may be empty.
  std::vector<std::pair<uint64_t, uint64_t>> segments;
  nlohmann::json extra = nlohmann::json::object();  // members this format does not name, kept
};
struct Trajectories {
  nlohmann::json prompt;  // the job's prompt as the trainer queued it
  std::vector<TrajectorySample> samples;
};
std::string Encode(const Trajectories& trajectories);
// Checked: the body an object with `prompt` and a `samples` array; each sample an object with at
// least one token id (0 to 2^31-1), a number per token in `logprobs`, and `reward` (a finite number
// or null), `text` (a string or null) and `segments` (pairs of integers within the sample, the
// first at 0, in order) where present. Errors start with `where` ("job 12") and name the sample
// and the member; members not named here are kept in `extra`, as trainers ignore them.
Result<Trajectories> DecodeTrajectories(std::string_view text, const std::string& where);

}  // namespace weft::orchestrator::wire
