#include "rollout_worker/worker.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "orchestrator/wire.h"
#include "policy_store/manifest.h"
#include "policy_store/reader.h"

namespace weft::rollout_worker {
namespace {

using Json = nlohmann::json;

}  // namespace

void SetGroupVersions(const std::vector<Completion>& completions,
                      orchestrator::TrajectoryGroup* group) {
  group->segments.clear();
  group->tokens = 0;
  for (const Completion& c : completions) AddSampleVersions(c.segments, c.tokens.size(), group);
}

uint32_t RolloutWorker::total_capacity() const {
  return options_.capacity * static_cast<uint32_t>(std::max(1, engine_.Health().replicas));
}

Result<Engine::Scores> Engine::Score(const std::vector<int>&,
                                     const std::vector<std::vector<int>>&) {
  return InvalidArgument("this engine cannot score tokens (score jobs)");
}

bool RolloutWorker::PinFixedModel() {
  policy_store::StoreReader reader(store_, options_.run_id, 1);
  bool told = false;
  while (true) {
    Result<uint64_t> latest = reader.Latest();
    Result<policy_store::Manifest> manifest =
        latest.ok() ? reader.GetManifest(*latest) : Result<policy_store::Manifest>(latest.status());
    if (manifest.ok()) {
      model_ = {options_.model, policy_store::StateDigest(*manifest)};
      pinned_ = manifest->version;
      return true;
    }
    if (!told) {
      WEFT_LOG(kInfo) << "cluster " << options_.cluster << ": waiting for model " << options_.model
                      << " (run " << options_.run_id
                      << ") to be published: " << manifest.status().message();
      told = true;
    }
    if (Sleep(std::chrono::milliseconds(500))) return false;
  }
}

Status RolloutWorker::Run() {
  const uint32_t capacity = total_capacity();
  if (!options_.model.empty() && !PinFixedModel()) return Status::Ok();  // stopped meanwhile
  WEFT_RETURN_IF_ERROR(orchestrator_.Register(options_.cluster, options_.region, capacity, model_)
                           .WithContext("registering cluster " + options_.cluster));
  WEFT_LOG(kInfo) << "cluster " << options_.cluster << " (region " << options_.region
                  << ", capacity " << capacity << ") registered"
                  << (model_.fixed()
                          ? ", serving model " + model_.name + " version " +
                                std::to_string(*pinned_) + " (digest " + model_.digest + ")"
                          : std::string());
  std::vector<std::thread> threads;
  threads.emplace_back([this] { SyncLoop(); });
  threads.emplace_back([this] { HeartbeatLoop(); });
  for (uint32_t i = 0; i < capacity; ++i) threads.emplace_back([this, i] { JobLoop(i); });
  for (std::thread& t : threads) t.join();
  // Drained: every running job was submitted; hand back what arrived after the stop, then leave.
  std::vector<uint64_t> hand_back;
  {
    MutexLock lock(mutex_);
    hand_back.swap(to_hand_back_);
  }
  Status left = Status::Ok();
  if (!hand_back.empty()) {
    left = orchestrator_.Drain(options_.cluster, hand_back);
    if (left.ok()) {
      MutexLock lock(mutex_);
      stats_.handed_back += hand_back.size();
    }
  }
  SendHeartbeat();  // the final counters
  Status gone = orchestrator_.Deregister(options_.cluster);
  if (!left.ok()) return left.WithContext("handing back jobs");
  return gone.WithContext("deregistering cluster " + options_.cluster);
}

void RolloutWorker::Stop() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  WakeSync();
  changed_.notify_all();
}

bool RolloutWorker::Sleep(std::chrono::milliseconds period) {
  MutexLock lock(mutex_);
  changed_.wait_for(lock.native(), period, [this]() REQUIRES(mutex_) { return stop_; });
  return stop_;
}

void RolloutWorker::WakeSync() {
  {
    // Under the lock, so that SleepForSync cannot miss it between its check and its wait.
    MutexLock lock(mutex_);
    wake_sync_.store(true);
  }
  changed_.notify_all();
}

bool RolloutWorker::Heard(uint64_t version) {
  const auto v = static_cast<int64_t>(version);
  int64_t seen = heard_version_.load();
  while (v > seen) {
    if (heard_version_.compare_exchange_weak(seen, v)) return true;
  }
  return false;
}

void RolloutWorker::HintSync() {
  {
    MutexLock lock(mutex_);
    hinted_ = true;
  }
  changed_.notify_all();
}

bool RolloutWorker::SleepForSync(std::chrono::milliseconds period) {
  MutexLock lock(mutex_);
  changed_.wait_for(lock.native(), period,
                    [this]() REQUIRES(mutex_) { return stop_ || hinted_ || wake_sync_.load(); });
  return stop_;
}

orchestrator::SyncReport RolloutWorker::sync_report() const {
  MutexLock lock(mutex_);
  return report_;
}

WorkerStats RolloutWorker::stats() const {
  MutexLock lock(mutex_);
  return stats_;
}

std::optional<uint64_t> RolloutWorker::ready_version() const {
  MutexLock lock(mutex_);
  return core_.ready();
}

namespace {

// The store's latest version read plainly, as a watch that did not wait.
Result<policy_store::StoreReader::LatestWatch> ReadLatest(policy_store::StoreReader& reader) {
  Result<uint64_t> latest = reader.Latest();
  if (!latest.ok() && latest.status().code() == StatusCode::kNotFound)
    return policy_store::StoreReader::LatestWatch{};
  if (!latest.ok()) return latest.status();
  return policy_store::StoreReader::LatestWatch{*latest, false};
}

}  // namespace

void RolloutWorker::SyncLoop() {
  policy_store::StoreReader reader(store_, options_.run_id, options_.sync_threads);
  // The engine keeps its own weights: a copy that must be rebuilt from a keyframe is dropped
  // first, so that a worker back from an outage needs the memory of one copy, not two.
  reader.DropCopyForKeyframe(true);
  reader.SpillDeltas(options_.spill_dir);
  bool watch = false;  // the next round waits for the store's latest to change
  while (pinned_) {
    // A fixed model: its one version, proved again every verify_interval.
    SyncOnce(reader, *pinned_);
    if (SleepForSync(options_.sync_interval)) return;
  }
  while (true) {
    std::chrono::milliseconds wait(0);
    if (watch) {
      // Not past the next full check of the copy.
      wait = options_.push_wait;
      if (held_ && verified_) {
        const WorkerCore::Micros due =
            *verified_ +
            std::chrono::duration_cast<std::chrono::microseconds>(options_.verify_interval).count();
        wait =
            std::min(wait, std::chrono::milliseconds(std::max<int64_t>(0, (due - Now()) / 1000)));
      }
    }
    {
      MutexLock lock(mutex_);
      hinted_ = false;  // this round reads `latest`
    }
    // With push off, a plain read of `latest` (no wait asked for) every sync_interval.
    Result<policy_store::StoreReader::LatestWatch> watched =
        options_.push ? reader.WatchLatest(wait, &wake_sync_) : ReadLatest(reader);
    // A wake from here on cancels the next wait, not a round that has not run yet.
    const bool woken = wake_sync_.exchange(false);
    {
      MutexLock lock(mutex_);
      if (stop_) return;
    }
    if (!watched.ok() && woken) watched = reader.WatchLatest(std::chrono::milliseconds(0));
    Result<uint64_t> latest = NotFound("the run has no published version");
    if (!watched.ok()) {
      latest = watched.status();
    } else if (watched->version) {
      latest = *watched->version;
      Heard(*watched->version);
    }
    SyncOnce(reader, latest);
    {
      MutexLock lock(mutex_);
      watch = options_.push && watched.ok() && watched->waited && core_.CaughtUp(watched->version);
    }
    if (!watch && SleepForSync(options_.sync_interval)) return;
  }
}

void RolloutWorker::CheckEngine() {
  const EngineHealth health = engine_.Health();
  const uint32_t ready_replicas = health.ok ? static_cast<uint32_t>(health.ready_replicas) : 0;
  WorkerCore::Change change;
  {
    MutexLock lock(mutex_);
    change = core_.EngineHealth(ready_replicas, engine_.version());
    report_.engine_replicas = static_cast<uint64_t>(std::max(0, health.replicas));
    report_.ready_replicas = ready_replicas;
    report_.loading_replicas = static_cast<uint64_t>(std::max(0, health.loading_replicas));
    report_.paused_ms_total = health.paused_ms_total;
    report_.replicas = health.each;
  }
  if (change != WorkerCore::Change::kNone) WakeSync();  // a load may be due, or none
  if (change == WorkerCore::Change::kLost) {
    WEFT_LOG(kWarning) << "cluster " << options_.cluster << ": the engine cannot serve ("
                       << health.detail << "); not ready until it can";
    SendHeartbeat();
  }
  if (change == WorkerCore::Change::kRegained) {
    WEFT_LOG(kInfo) << "cluster " << options_.cluster << ": the engine serves again ("
                    << health.detail << ")";
    SendHeartbeat();
  }
}

void RolloutWorker::SyncOnce(policy_store::StoreReader& reader, const Result<uint64_t>& latest) {
  CheckEngine();
  // The proof, every verify_interval: the bytes held hash, recomputed in full, to the digests of
  // the version claimed. (Pulls keep the digests current in O(changed) and check them against
  // each manifest; only a full recomputation notices the bytes changing under them.)
  const WorkerCore::Micros now = Now();
  const WorkerCore::Micros interval =
      std::chrono::duration_cast<std::chrono::microseconds>(options_.verify_interval).count();
  if (held_ && (!verified_ || now - *verified_ >= interval)) {
    verified_ = now;
    Status same = sink_.Prove(*held_, options_.sync_threads);
    if (!same.ok()) {
      WEFT_LOG(kError) << "cluster " << options_.cluster << ": the served copy of version "
                       << held_->version << " disagrees with its manifest: " << same.message()
                       << "; re-syncing from a keyframe";
      MutexLock lock(mutex_);
      ++report_.digest_mismatches;
      core_.CopyCorrupted();
      held_.reset();
      sink_.Drop();
    }
  }
  if (!latest.ok()) {
    if (latest.status().code() != StatusCode::kNotFound) {
      WEFT_LOG(kWarning) << "cluster " << options_.cluster
                         << ": cannot read the latest version: " << latest.status().message();
    }
    return;
  }
  std::optional<uint64_t> target;
  {
    MutexLock lock(mutex_);
    target = core_.PullTarget(*latest);
  }
  if (target) {
    // In place, in O(changed elements): the pull checks every blob and digest and leaves the copy
    // as it was on any error.
    const WorkerCore::Micros pull_started = Now();
    Result<policy_store::PullReport> pulled =
        sink_.Pull(reader, *latest, held_ ? &*held_ : nullptr);
    if (!pulled.ok()) {
      WEFT_LOG(kWarning) << "cluster " << options_.cluster << ": pulling version " << *latest
                         << " failed: " << pulled.status().message();
      if (held_ && sink_.empty()) {
        // The copy was dropped for a keyframe that did not arrive: the next round starts from
        // nothing (the engine goes on serving what it has).
        MutexLock lock(mutex_);
        core_.CopyDropped();
        held_.reset();
        return;
      }
      if (pulled.status().code() == StatusCode::kDataLoss && held_) {
        // A delta did not apply to what we hold (or a blob stayed corrupted): check our own copy
        // in the next round, which re-syncs from a keyframe if it no longer matches its version.
        verified_.reset();
      }
      return;
    }
    WEFT_LOG(kInfo) << "cluster " << options_.cluster << " pulled version " << *latest << " ("
                    << pulled->bytes_downloaded << " bytes in "
                    << static_cast<double>(Now() - pull_started) / 1e6 << " s: " << pulled->path
                    << ", digests verified)";
    MutexLock lock(mutex_);
    held_ = std::move(pulled->manifest);
    core_.Pulled(held_->version);
    report_.bytes_downloaded += pulled->bytes_downloaded;
    ++report_.pulls;
    if (!pulled->from) ++report_.keyframe_pulls;
  }
  // The engine serves the copy held from its next commit on (it stages while generating). After a
  // failure, retries back off (an engine that is down is not asked ten times a second).
  {
    MutexLock lock(mutex_);
    if (!core_.ShouldLoad(Now())) return;
  }
  const uint64_t version = held_->version;
  auto failed = [&](const std::string& what, const Status& status) {
    WorkerCore::Micros backoff;
    {
      MutexLock lock(mutex_);
      backoff = core_.LoadFailed(Now());
    }
    WEFT_LOG(kError) << "cluster " << options_.cluster << ": " << what << " version " << version
                     << " failed: " << status.message() << " (again in " << backoff / 1000
                     << " ms)";
  };
  Status staged = sink_.Stage(version);
  if (!staged.ok()) return failed("staging", staged);
  Result<int64_t> pause = sink_.Commit();
  if (!pause.ok()) return failed("committing", pause.status());
  {
    MutexLock lock(mutex_);
    core_.Loaded();
    ++report_.commits;
    if (!report_.first_version) report_.first_version = version;
    report_.newest_version = version;
    report_.digest = sink_.StateDigest();
    report_.max_pause_ms = std::max(report_.max_pause_ms, static_cast<double>(*pause) / 1000.0);
    // The pause in its bucket (the orchestrator's histogram of pauses per region).
    if (report_.pause_counts.empty())
      report_.pause_counts.assign(orchestrator::kPauseBoundsSeconds.size() + 1, 0);
    size_t bucket = 0;
    while (bucket < orchestrator::kPauseBoundsSeconds.size() &&
           static_cast<double>(*pause) / 1e6 > orchestrator::kPauseBoundsSeconds[bucket])
      ++bucket;
    ++report_.pause_counts[bucket];
    report_.pause_sum_ms += static_cast<double>(*pause) / 1000.0;
  }
  WEFT_LOG(kInfo) << "cluster " << options_.cluster << " serves version " << version << " (pause "
                  << *pause << " us)";
  // The orchestrator learns at once that this cluster is ready at the new version, from the
  // heartbeat thread (ClaimVersion), while this one goes on to the next version: a heartbeat is a
  // round trip to the orchestrator, and claims may take several. Once stopping (the heartbeat
  // thread may be gone), it is claimed from here.
  bool stopping = false;
  {
    MutexLock lock(mutex_);
    stopping = stop_;
    claim_due_ = !stopping;
  }
  if (stopping) {
    SendHeartbeat();
    return;
  }
  changed_.notify_all();
}

void RolloutWorker::ClaimVersion() {
  // A version the store told of before the trainer announced it is claimed again every 20 ms
  // until it is announced (for a heartbeat period at most), not only at the next heartbeat:
  // meanwhile the cluster counts as not ready.
  constexpr std::chrono::milliseconds kClaimAgain(20);
  const auto until = std::chrono::steady_clock::now() + options_.heartbeat_interval;
  bool unannounced = SendHeartbeat();
  while (unannounced && std::chrono::steady_clock::now() < until) {
    if (Sleep(kClaimAgain)) return;
    unannounced = SendHeartbeat(true);
  }
}

bool RolloutWorker::SendHeartbeat(bool quiet) {
  // One at a time, so that the orchestrator receives the cumulative counters in the order they
  // were taken: an older report arriving after a newer one would look like a restarted worker
  // and be counted again.
  MutexLock sending(heartbeat_mutex_);
  std::optional<uint64_t> ready;
  orchestrator::SyncReport report;
  {
    MutexLock lock(mutex_);
    ready = core_.ready();
    report = report_;
  }
  const HeartbeatOutcome outcome = rollout_worker::SendHeartbeat(
      orchestrator_, options_.cluster, options_.region, total_capacity(), ready, &report, model_);
  if (outcome.registered_again) {
    // The orchestrator did not know this cluster (it was lost after a long silence): it joins
    // again (a failure shows below).
    WEFT_LOG(kWarning) << "cluster " << options_.cluster
                       << " is unknown to the orchestrator; registering again";
  }
  if (outcome.unannounced && !quiet) {
    WEFT_LOG(kInfo) << "cluster " << options_.cluster << ": version " << *ready
                    << " is not announced yet; heartbeat without it";
  }
  if (!outcome.status.ok()) {
    WEFT_LOG(kWarning) << "cluster " << options_.cluster
                       << ": heartbeat failed: " << outcome.status.message();
    return false;
  }
  {
    MutexLock lock(mutex_);
    core_.Acknowledged(outcome.acknowledged);
  }
  changed_.notify_all();
  return outcome.unannounced;
}

void RolloutWorker::HeartbeatLoop() {
  while (true) {
    bool claim = false, stopping = false;
    {
      MutexLock lock(mutex_);
      changed_.wait_for(lock.native(), options_.heartbeat_interval,
                        [this]() REQUIRES(mutex_) { return stop_ || claim_due_; });
      claim = std::exchange(claim_due_, false);
      stopping = stop_;
    }
    if (stopping) {
      // A version committed just before the stop is still claimed at once, as the sync loop did
      // when it claimed versions itself.
      if (claim) SendHeartbeat();
      return;
    }
    if (claim) {
      ClaimVersion();
      continue;
    }
    // Readiness follows the engine here too: the sync loop may be busy in a long stage or commit.
    CheckEngine();
    SendHeartbeat();
  }
}

void RolloutWorker::JobLoop(uint32_t slot) {
  while (true) {
    bool idle = false;
    {
      MutexLock lock(mutex_);
      if (stop_) return;
      // Not ready (no version yet, a re-sync in progress, the engine down): the orchestrator would
      // not lease. Slots beyond what the ready replicas can serve wait.
      idle = !core_.MayLease(slot, Now());
    }
    if (idle) {
      if (Sleep(std::chrono::milliseconds(100))) return;
      continue;
    }
    Result<orchestrator::LeaseAnswer> answer =
        orchestrator_.RequestLeases(options_.cluster, 1, options_.lease_wait);
    if (!answer.ok()) {
      WEFT_LOG(kWarning) << "cluster " << options_.cluster
                         << ": lease request failed: " << answer.status().message();
      if (Sleep(std::chrono::milliseconds(500))) return;
      continue;
    }
    // The answer tells of the latest version announced: one newer than any this worker has heard
    // of, and a sync loop that polls the store reads its `latest` at once (HintSync).
    if (answer->latest_version && Heard(*answer->latest_version)) HintSync();
    for (const orchestrator::Lease& lease : answer->leases) {
      {
        MutexLock lock(mutex_);
        if (stop_) {
          to_hand_back_.push_back(lease.job);
          continue;
        }
      }
      RunJob(lease);
    }
  }
}

std::chrono::milliseconds RolloutWorker::BackOffLeasing() {
  MutexLock lock(mutex_);
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::microseconds(core_.BackOffLeasing(Now())));
}

Status RolloutWorker::ScoreJob(const orchestrator::Lease& lease, const Json& prompt,
                               std::vector<Completion>* completions, bool* unavailable) {
  // The job's tokens were checked by the orchestrator when the trainer added it (docs/api.md,
  // jobs); they are checked again here, since any orchestrator may answer.
  auto token_ids = [](const Json& list, std::vector<int>* out) {
    if (!list.is_array() || list.empty()) return false;
    for (const Json& t : list) {
      if (!t.is_number_unsigned() || t.get<uint64_t>() > 0x7FFFFFFF) return false;
      out->push_back(t.get<int>());
    }
    return true;
  };
  std::vector<int> context;
  if (!token_ids(prompt, &context))
    return InvalidArgument("a score job's prompt must be token ids");
  const Json targets = Json::parse(lease.targets, nullptr, false);
  if (!targets.is_array() || targets.empty())
    return InvalidArgument("a score job needs targets: an array of token id arrays");
  std::vector<std::vector<int>> scored(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    if (!token_ids(targets[i], &scored[i]))
      return InvalidArgument("target " + std::to_string(i) + " is not token ids");
  }
  Result<Engine::Scores> scores = engine_.Score(context, scored);
  if (!scores.ok()) {
    *unavailable = scores.status().code() == StatusCode::kUnavailable;
    return scores.status();
  }
  if (scores->logprobs.size() != scored.size())
    return Internal("the engine scored " + std::to_string(scores->logprobs.size()) + " of " +
                    std::to_string(scored.size()) + " targets");
  for (size_t i = 0; i < scored.size(); ++i) {
    if (scores->logprobs[i].size() != scored[i].size())
      return Internal("the engine scored " + std::to_string(scores->logprobs[i].size()) + " of " +
                      std::to_string(scored[i].size()) + " tokens of target " + std::to_string(i));
    Completion c;
    c.tokens = std::move(scored[i]);
    c.logprobs = std::move(scores->logprobs[i]);
    c.version_start = c.version_end = scores->version;
    c.segments = {{scores->version, 0}};
    completions->push_back(std::move(c));
  }
  return Status::Ok();
}

void RolloutWorker::RunJob(const orchestrator::Lease& lease) {
  const std::string what =
      "job " + std::to_string(lease.job) + " attempt " + std::to_string(lease.attempt);
  // A job this worker cannot finish goes back to the queue for another attempt (the orchestrator
  // gives it up after its last): held, its lease would be renewed by every heartbeat and the job
  // would never come back.
  auto give_back = [&]() { return orchestrator_.Release(options_.cluster, {lease.job}); };
  auto fail = [&](const Status& status) {
    WEFT_LOG(kError) << "cluster " << options_.cluster << ": " << what << ": " << status.message();
    const Status released = give_back();
    MutexLock lock(mutex_);
    ++stats_.generation_errors;
    if (released.ok()) ++stats_.handed_back;
  };
  // What cannot be done now (the engine or the reward service is down, unreachable, reloading)
  // goes back to the queue at once rather than when its lease expires, and the worker takes no
  // new leases for a while (backing off up to 10 s while it keeps failing), or the job would come
  // straight back here and use up its attempts.
  auto hand_back = [&](const std::string& why, const Status& status) {
    const std::chrono::milliseconds backoff = BackOffLeasing();
    WEFT_LOG(kWarning) << "cluster " << options_.cluster << ": " << what << ": " << why << " ("
                       << status.message() << "); handing the job back, no leases for "
                       << backoff.count() << " ms";
    const Status released = give_back();
    MutexLock lock(mutex_);
    ++stats_.generation_errors;
    if (released.ok()) ++stats_.handed_back;
  };
  const Json prompt = Json::parse(lease.prompt, nullptr, false);
  if (prompt.is_discarded()) return fail(InvalidArgument("the prompt is not JSON"));
  const Json metadata =
      lease.metadata.empty() ? Json() : Json::parse(lease.metadata, nullptr, false);
  if (metadata.is_discarded()) return fail(InvalidArgument("the job's metadata is not JSON"));
  // A lease that arrived while the engine was failing (a long poll already waiting) waits out the
  // backoff before trying (its lease stays alive with the heartbeats), rather than coming straight
  // back and using up the job's attempts.
  {
    MutexLock lock(mutex_);
    const WorkerCore::Micros wait = core_.leasing_paused_until() - Now();
    if (wait > 0) {
      changed_.wait_for(lock.native(), std::chrono::microseconds(wait),
                        [this]() REQUIRES(mutex_) { return stop_; });
    }
  }
  orchestrator::TrajectoryGroup group;
  group.job = lease.job;
  group.attempt = lease.attempt;
  group.cluster = options_.cluster;
  orchestrator::wire::Trajectories trajectories;
  trajectories.prompt = prompt;
  std::vector<Completion> completions;
  double rewards = 0;
  const bool score = lease.kind == orchestrator::JobKind::kScore;
  if (score) {
    bool unavailable = false;
    Status scored = ScoreJob(lease, prompt, &completions, &unavailable);
    if (unavailable) return hand_back("the engine is unavailable", scored);
    if (!scored.ok()) {
      BackOffLeasing();
      return fail(scored);
    }
  } else {
    Result<Prompt> encoded = task_.Encode(prompt);
    if (!encoded.ok()) return fail(encoded.status());
    Sampling sampling = options_.sampling;
    sampling.seed = lease.job * 0x9E3779B97F4A7C15ull + lease.attempt * 0xBF58476D1CE4E5B9ull;
    Result<std::vector<Completion>> generated =
        engine_.Generate(std::vector<Prompt>(lease.samples, *encoded), sampling);
    if (!generated.ok() && generated.status().code() == StatusCode::kUnavailable)
      return hand_back("the engine is unavailable", generated.status());
    if (!generated.ok()) {
      // A refusal (a bad request, a malformed answer) would fail every job the same way: back off
      // before leasing the next.
      BackOffLeasing();
      return fail(generated.status());
    }
    completions = std::move(*generated);
  }
  SetGroupVersions(completions, &group);
  if (group.segments.empty()) return fail(Internal("the engine returned no completion"));
  for (const Completion& c : completions) {
    orchestrator::wire::TrajectorySample sample;
    sample.tokens = c.tokens;
    sample.logprobs = c.logprobs;
    sample.segments = c.segments;
    if (!c.text.empty()) sample.text = c.text;
    if (!score) {  // a score job's samples have no reward
      Result<std::optional<double>> reward = task_.Reward(prompt, metadata, c);
      // A reward service that is down: the job goes back like one the engine cannot generate.
      if (!reward.ok() && reward.status().code() == StatusCode::kUnavailable)
        return hand_back("the reward is unavailable", reward.status());
      if (!reward.ok()) return fail(reward.status());
      sample.reward = *reward;  // none: the trainer scores it
      if (*reward) rewards += **reward;
    }
    trajectories.samples.push_back(std::move(sample));
  }
  // The orchestrator accepts tokens of a version only once it knows the cluster proved it: wait
  // for the heartbeat that follows a commit landing mid-generation (a rolling load of many
  // replicas takes a while; a stop does not wait).
  {
    MutexLock lock(mutex_);
    changed_.wait_for(lock.native(), std::chrono::minutes(10), [&]() REQUIRES(mutex_) {
      return core_.MaySubmit(group.version_end) || stop_;
    });
  }
  group.trajectories = orchestrator::wire::Encode(trajectories);
  Result<orchestrator::SubmitResult> submitted = orchestrator_.Submit(group);
  if (!submitted.ok()) {
    // Refused (tokens of a version the orchestrator has not seen this cluster prove, after it
    // restarted, say): the job goes back for another attempt.
    const Status released = give_back();
    WEFT_LOG(kWarning) << "cluster " << options_.cluster << ": " << what
                       << " was not accepted: " << submitted.status().message()
                       << (released.ok() ? "; the job goes back to the queue" : "");
    MutexLock lock(mutex_);
    ++stats_.submissions_rejected;
    if (released.ok()) ++stats_.handed_back;
    return;
  }
  MutexLock lock(mutex_);
  core_.Submitted();  // the engine and the rewards work again
  ++stats_.jobs;
  stats_.samples += completions.size();
  stats_.tokens += group.tokens;
  stats_.reward_sum += rewards;
}

}  // namespace weft::rollout_worker
