// HttpEngine: the rollout_worker::Engine over serving engines reached by HTTP (SGLang or vLLM,
// replica_api.h), one or more data-parallel replicas of them.
//
// Weights (docs/engines.md): Stage writes the verified served model once into the served
// checkpoint directory (served_checkpoint.h; the first time it also checks that the engine's own
// model directory holds the same tensor names, shapes and dtypes, and refuses another model), or
// puts in place the file the model already is (NewDirectoryFile), or writes nothing when the model
// is that file changed in place.
// Commit loads that directory into every replica, at most `max_paused` at a time and never all of
// them when there are several, so capacity never drops to zero: per replica pause (in the
// configured mode), load with the version, resume, and check the version the replica reports.
// One download and one write per version serve every replica.
//
// Generation: one request per sample (or one with n samples), sent to the ready replica with the
// fewest requests in flight. Each sample's tokens are tagged with the version that produced them:
//   - a request that no pause overlapped: the replica's version (exact);
//   - the engine reported per-token versions (SGLang's meta_info.weight_versions): those (exact);
//   - the pause aborted it (mode abort): its tokens so far are the old version's, and the sample
//     continues from them, prompt plus tokens, on the new weights (exact; a text prompt continues
//     from the token ids the engine returned for it, or starts over when it returned none);
//   - otherwise (retract, in_place or keep without per-token versions) the token where the weights
//     changed is unknown: the sample is generated again (counted in `regenerated`).
// In `wait` mode (vLLM) a replica gets no new requests and its requests in flight finish before
// the pause, so none overlaps it.
//
// Scoring (score jobs): one request per target (ReplicaApi::Score), on the ready replica with the
// fewest requests in flight. A request that a pause overlapped, or that the engine aborted or
// answered at another version, is sent again, so each target's logprobs are one version's; targets
// scored at an older version than the others are scored again, so that all are the one version
// Score reports (counted in `rescored`).
//
// Health: a monitor checks every replica's health route each `health_interval`. A replica that
// fails it, or a request to it that cannot connect, is down: it gets no requests, and once it
// answers again it is loaded with the current version (if it does not serve it already) before it
// gets any. Health() reports the replicas ready; none ready makes the worker not ready. Generate
// fails with kUnavailable when every replica is down, or none can take a request within
// `request_timeout` (one loading a version is waited for).
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/mutex.h"
#include "rollout_worker/engine.h"
#include "rollout_worker/replica_api.h"
#include "rollout_worker/served_checkpoint.h"

namespace weft::rollout_worker {

struct HttpEngineOptions {
  std::string api;                // an EngineApis() name: "sglang" or "vllm"
  std::vector<std::string> urls;  // the replicas
  // When set, the replicas are the URLs this file lists (one per line; blank lines and lines
  // starting with '#' ignored), read again every health_interval: a replica that appears is loaded
  // with the current version before it gets requests, one that disappears gets no more. For a
  // launcher that restarts engines on new ports. `urls` is then what the file listed at start.
  std::string urls_file;
  std::string checkpoint_dir;      // the served checkpoint directory (shared with the replicas)
  std::string pause_mode;          // one of the API's pause_modes; empty: its default (abort)
  int max_paused = 1;              // replicas reloading at once (capped below the count when >1)
  bool n_per_request = false;      // one request with n samples instead of one per sample
  int max_parallel_requests = 64;  // per Generate call
  std::string api_key;
  std::chrono::milliseconds request_timeout{600000};
  std::chrono::milliseconds control_timeout{600000};  // a pause or a resume
  // A load that has not finished by then failed: the replica is resumed, gets no requests, and
  // the monitor loads it again once it answers.
  std::chrono::milliseconds load_timeout{300000};
  std::chrono::milliseconds health_interval{1000};
  // Where the worker keeps its copy of the weights (engine.copy): true, the served checkpoint
  // file itself, deltas applied to it in place (DirectoryWeightSink: no copy in host memory);
  // false, host memory, the file rewritten by the changed tensors at each version (HostWeightSink).
  bool copy_in_file = true;
  // Whether a weights file changed through a mapping is flushed before the replicas load it
  // (engine.flush): unset, decided by the directory's file system
  // (ServedCheckpoint::set_flush_mapped_writes).
  std::optional<bool> flush_mapped_writes;
};

// What one replica went through, for reports.
struct ReplicaStats {
  std::string url;
  bool ready = false;
  bool retired = false;  // no longer listed in urls_file
  std::optional<uint64_t> version;
  uint64_t loads = 0, failures = 0, requests = 0;
  double last_pause_ms = 0, max_pause_ms = 0, total_pause_ms = 0;
  double failed_pause_ms = 0;  // paused by loads that failed
};

struct HttpEngineStats {
  uint64_t commits = 0;
  uint64_t continued = 0;     // samples continued after an abort at a pause
  uint64_t regenerated = 0;   // samples generated again: their weight switch point was unknown
  uint64_t scored = 0;        // targets scored (score jobs)
  uint64_t rescored = 0;      // targets scored again: across a pause, or at another version
  double last_commit_ms = 0;  // from the start of a commit until every replica served it
  double max_commit_ms = 0;
  // Into the checkpoint directory by the last stage (none when the copy is the directory's file:
  // its pull wrote the changed elements in place).
  uint64_t last_bytes_written = 0;
  std::vector<ReplicaStats> replicas;
};

class HttpEngine : public Engine {
 public:
  // Checks the options (URLs, API, pause mode); reaches no replica yet.
  static Result<std::unique_ptr<HttpEngine>> Create(HttpEngineOptions options);
  ~HttpEngine() override;

  Status Stage(const sync::ServedModel& model, uint64_t version) override;
  Result<int64_t> Commit() override;
  std::optional<uint64_t> version() const override;
  Result<std::vector<Completion>> Generate(const std::vector<Prompt>& prompts,
                                           const Sampling& sampling) override;
  Result<Scores> Score(const std::vector<int>& prompt,
                       const std::vector<std::vector<int>>& targets) override;
  EngineHealth Health() const override;

  HttpEngineStats stats() const;
  const HttpEngineOptions& options() const { return options_; }

  // For a weight sink whose copy is the served checkpoint directory's file (DirectoryWeightSink):
  // a new weights file there for `specs`, for a keyframe to arrive into; the Stage of a model
  // whose tensors are its views puts it in place (ServedCheckpoint::NewFile), and a Stage of that
  // model changed in place writes nothing.
  Result<std::shared_ptr<NewWeightsFile>> NewDirectoryFile(
      const std::vector<sync::TensorSpec>& specs);
  // The directory's file no longer holds the version staged: it is about to be changed in place,
  // or its bytes are in doubt. Until the next Stage no replica loads from it (one that comes back
  // meanwhile waits for the next commit), and that Stage writes it whole unless it is given the
  // mapped model.
  void ForgetDirectory();

 private:
  struct Replica;
  explicit HttpEngine(HttpEngineOptions options);

  // Loads the checkpoint into `r` as `version` (pause, load, resume, check); the pause in us.
  Result<int64_t> Reload(Replica& r, uint64_t version);
  // What one request to a replica answered, with the version that replica served when it began,
  // the pauses that overlapped it, and the replica's URL.
  template <typename T>
  struct Answer {
    T value;
    uint64_t version = 0;
    uint64_t pauses = 0;
    std::string url;
  };
  // Sends `call` to a ready replica (Acquire, within the request timeout). A replica that cannot
  // be reached is marked down, and the request goes to another, `attempts` times in all.
  template <typename T>
  Result<Answer<T>> OnReplica(int attempts, const std::function<Result<T>(ReplicaApi&)>& call);
  // One target's logprobs and the version that scored them all.
  Result<std::pair<uint64_t, std::vector<float>>> ScoreOne(const std::vector<int>& prompt,
                                                           const std::vector<int>& target);
  // One sample, tagged by version, continued or generated again across pauses.
  Result<Completion> GenerateOne(const Prompt& prompt, const Sampling& sampling);
  // Several samples in one request (n_per_request).
  Result<std::vector<Completion>> GenerateMany(const Prompt& prompt, const Sampling& sampling,
                                               int n);
  // A ready replica (fewest in flight), waiting for one until `deadline`; nullptr on timeout, with
  // every replica down, or when stopping. Counts the request in flight on it.
  Replica* Acquire(std::chrono::steady_clock::time_point deadline, uint64_t* epoch,
                   uint64_t* version);
  void Release(Replica& r, bool connection_failed, const Status& status);
  void MonitorLoop();
  void CheckReplica(Replica& r);
  // Whether `r`, saying `info` of itself, can serve weft (EngineApi::check); a logprobs probe that
  // could not tell is said once.
  Status Usable(Replica& r, const ReplicaInfo& info);
  // A replica at `url` (down until it is loaded).
  Result<std::unique_ptr<Replica>> MakeReplica(const std::string& url) const;
  // The replicas in service now (not retired); they live as long as the engine.
  std::vector<Replica*> Serving() const;
  // Brings the replicas in line with urls_file: new URLs added, missing ones retired.
  void ReadUrlsFile();

  HttpEngineOptions options_;
  const EngineApi* kind_ = nullptr;  // options_.api's entry in EngineApis()
  ServedCheckpoint checkpoint_;
  std::vector<std::unique_ptr<Replica>> replicas_;

  Mutex load_mutex_;  // one stage or reload at a time (they read and write the directory)
  std::optional<uint64_t> staged_ GUARDED_BY(load_mutex_);
  // What the checkpoint directory holds, when whole.
  std::optional<uint64_t> dir_version_ GUARDED_BY(load_mutex_);
  bool model_checked_ GUARDED_BY(load_mutex_) = false;
  std::string template_dir_ GUARDED_BY(load_mutex_);  // the engine's own model directory

  // The replicas' states, versions and counters (Replica's fields but its api), and:
  mutable Mutex mutex_;
  std::condition_variable changed_;
  std::optional<uint64_t> committed_ GUARDED_BY(mutex_);
  HttpEngineStats stats_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::string urls_file_error_;  // the last error reading urls_file, said once (monitor thread)
  std::thread monitor_;
};

// The replica URLs a file lists (HttpEngineOptions::urls_file): one per line, trailing '/' dropped;
// blank lines and lines starting with '#' ignored. Errors name the file and the line.
Result<std::vector<std::string>> ReadReplicaUrls(const std::string& path);

// The `engine:` section of a run's configuration for the engine API `api` (docs/run.md,
// "Configuration"): urls, urls_file, checkpoint_dir, copy, flush, pause, max_paused,
// n_per_request, max_parallel_requests, api_key_env, request_timeout, control_timeout,
// load_timeout, health_interval. `{cluster}` in checkpoint_dir becomes `cluster`; `urls`, when not
// empty, replaces engine.urls (a worker's own replicas). Errors name the key.
Result<HttpEngineOptions> ParseEngineSection(const YAML::Node& engine, const std::string& api,
                                             const std::string& cluster,
                                             const std::vector<std::string>& urls);

}  // namespace weft::rollout_worker
