// The orchestrator API's vocabulary: what rollout workers, trainers and the orchestrator exchange
// (docs/api.md, "Orchestrator API"). Plain data without behaviour: the core (core.h) decides with
// these types, orchestrator/wire.h maps them to and from JSON, and the client (client.h) sends and
// receives them. Nothing here depends on the core, the service or HTTP.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace weft::orchestrator {

// Time in the core: microseconds on any monotonic scale (the service uses the wall clock).
using Micros = int64_t;

// Policy versions are 0 to 2^53 - 1: exact in every JSON implementation (a double's integers), and
// far from wrapping around.
inline constexpr uint64_t kMaxVersion = (uint64_t{1} << 53) - 1;

// A job's metadata (JSON text the trainer attached to it, handed back with its trajectory group)
// is at most 64 KiB of text (docs/api.md, jobs).
inline constexpr size_t kMaxJobMetadataBytes = size_t{64} << 10;

// Times are 0 to 2^62 microseconds (some 146,000 years), so that a time plus any configured
// duration stays far from overflowing.
inline constexpr Micros kMaxMicros = Micros{1} << 62;

// What a job asks of a cluster (docs/api.md, jobs): `generate` samples completions of its prompt;
// `score` computes the log-probability the model gives each token of given completions
// (`JobSpec::targets`) after the prompt, as a teacher does for a student's samples.
enum class JobKind { kGenerate, kScore };

// The model a cluster serves (docs/api.md, clusters): the run's policy, whose versions the trainer
// announces (`name` empty), or a fixed model, which never changes, by its name and the state digest
// of its weights (hex, as a heartbeat's sync report gives it). In one run a name means one digest.
struct ModelRef {
  std::string name;
  std::string digest;
  bool fixed() const { return !name.empty(); }
};

// One trajectory group: every sample of one attempt at one job, with the versions that generated
// its tokens. Workers submit it, the orchestrator buffers and journals it, the trainer receives it.
struct TrajectoryGroup {
  uint64_t job = 0;
  uint32_t attempt = 0;
  std::string cluster;
  uint64_t version_start = 0;  // the oldest version that generated a token of the group
  uint64_t version_end = 0;    // the newest
  // (version, first token index): the tokens of the group's samples counted end to end, each run
  // tagged with the version that generated it (docs/api.md, submissions).
  std::vector<std::pair<uint64_t, uint64_t>> segments;
  uint64_t tokens = 0;
  // The samples (docs/api.md, "Trajectories") as JSON text. The orchestrator passes it on as it
  // came and never parses it; whoever consumes the group does, once.
  std::string trajectories;
};

// A job leased to a cluster.
struct Lease {
  uint64_t job = 0;
  uint32_t attempt = 0;
  Micros deadline = 0;
  uint64_t min_version = 0;  // the cluster must generate at this version or newer
  std::string prompt;        // the job's prompt as JSON text (a string or token ids)
  uint32_t samples = 1;
  std::string metadata = {};  // the job's metadata as JSON text (JobSpec), "" when it has none
  std::string model = {};     // the model it needs ("" the policy), as JobSpec
  JobKind kind = JobKind::kGenerate;
  std::string targets = {};  // a score job's completions (JobSpec)
};

// What a lease request is answered with: the leases granted, and the newest version the trainer
// has announced (nullopt: none yet), so that a worker hears of a new version from the long poll it
// holds anyway.
struct LeaseAnswer {
  std::vector<Lease> leases;
  std::optional<uint64_t> latest_version;
};

// A job as the trainer adds it.
struct JobSpec {
  std::string prompt;    // JSON text: a string or token ids (any JSON the task understands)
  uint32_t samples = 1;  // samples to generate: the group's size
  // Any JSON value as the text the trainer sent (at most kMaxJobMetadataBytes), kept with the job
  // sent to workers with its leases and handed back with its group. Empty: none. (Initialised, like
  // the members of Delivered, so that `{prompt, samples}` stays a complete initialiser.)
  std::string metadata = {};
  // The model whose clusters may take it: "" the run's policy (leased within the staleness bound),
  // or a fixed model's name (leased to any cluster that proved it serves that model).
  std::string model = {};
  JobKind kind = JobKind::kGenerate;
  // A score job's completions as JSON text: an array of arrays of token ids, one per sample, each
  // scored after the prompt (which is then token ids). Empty for a generate job.
  std::string targets = {};
};

// A trajectory group handed to the trainer; `stale` only under the deliver-flagged policy.
struct Delivered {
  TrajectoryGroup group;
  bool stale = false;
  std::string metadata = {};  // the metadata of the group's job (JobSpec), "" when it had none
  std::string model = {};     // the model of the group's job ("" the policy)
  JobKind kind = JobKind::kGenerate;
};

// What the trainer gets: a numbered batch of groups, oldest first (docs/api.md, batches). It stays
// outstanding until the trainer acknowledges it; until then it is handed out again.
struct Batch {
  uint64_t id = 0;           // 0: nothing to deliver
  bool redelivered = false;  // handed out before and not acknowledged
  std::vector<Delivered> items;
  std::optional<uint64_t> latest_version;  // the latest announced version when it was handed out
  uint64_t acknowledged = 0;  // batches this request's acknowledgement retired (not sent)
};

enum class SubmitResult { kAccepted, kDuplicate };

// One engine replica of a cluster, as its worker last saw it ("sync.replicas" in docs/api.md).
struct ReplicaReport {
  std::string url;                  // how the worker reaches it
  std::string state;                // "ready", "loading" (paused for a weight load) or "down"
  std::optional<uint64_t> version;  // the version it serves, once loaded
  uint64_t loads = 0;               // weight loads that succeeded
  uint64_t failures = 0;            // loads that failed, and times it was found down
  double last_pause_ms = 0;         // the pause of its last load
  double paused_ms_total = 0;       // time it spent paused for loads, failed ones included
};

// What a worker reports of its weight sync with each heartbeat ("sync" in docs/api.md): counters
// since the worker started. The service keeps the last report of each cluster for /v1/status (per
// cluster and summed per region) and /metrics.
// The upper bounds, in seconds, of the buckets in which a worker counts its engine's pauses for
// weight loads (SyncReport::pause_counts; one more bucket for longer ones).
inline constexpr std::array<double, 13> kPauseBoundsSeconds = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

struct SyncReport {
  uint64_t bytes_downloaded =
      0;                        // blob bytes fetched from the store or relay, initial load included
  uint64_t pulls = 0;           // versions brought in
  uint64_t keyframe_pulls = 0;  // ... of which started from a keyframe
  uint64_t digest_mismatches = 0;          // served state found not to equal a manifest's digests
  uint64_t commits = 0;                    // versions the engine switched to
  double max_pause_ms = 0;                 // the longest pause a commit caused
  std::optional<uint64_t> first_version;   // the first version it loaded
  std::optional<uint64_t> newest_version;  // the newest version it loaded
  std::string digest;                      // the state digest it serves (docs/api.md), hex
  uint64_t engine_replicas = 0;            // engine replicas the worker drives (0: not reported)
  uint64_t ready_replicas = 0;             // ... of which can serve now
  uint64_t loading_replicas = 0;           // ... of which are paused for a load now
  double paused_ms_total = 0;              // time its replicas spent paused for loads, summed
  // The commits' pauses, counted per bucket of kPauseBoundsSeconds (empty: not reported), and
  // their sum.
  std::vector<uint64_t> pause_counts;
  double pause_sum_ms = 0;
  std::vector<ReplicaReport> replicas;  // each replica (a cluster's own; not in a region's sum)

  // Adds `other`'s counters and replica counts (a region's sum; the per-replica list is not
  // carried); the pause is the larger of the two.
  void Add(const SyncReport& other);
};

inline void SyncReport::Add(const SyncReport& other) {
  bytes_downloaded += other.bytes_downloaded;
  pulls += other.pulls;
  keyframe_pulls += other.keyframe_pulls;
  digest_mismatches += other.digest_mismatches;
  commits += other.commits;
  engine_replicas += other.engine_replicas;
  ready_replicas += other.ready_replicas;
  loading_replicas += other.loading_replicas;
  paused_ms_total += other.paused_ms_total;
  if (pause_counts.size() < other.pause_counts.size())
    pause_counts.resize(other.pause_counts.size());
  for (size_t i = 0; i < other.pause_counts.size(); ++i) pause_counts[i] += other.pause_counts[i];
  pause_sum_ms += other.pause_sum_ms;
  max_pause_ms = max_pause_ms > other.max_pause_ms ? max_pause_ms : other.max_pause_ms;
}

}  // namespace weft::orchestrator
