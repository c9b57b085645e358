// The trainer: tops up jobs, collects a step's groups, steps, publishes a version (encode and
// upload), and on publication sets `latest`, starts counting publication-to-ready, announces the
// version and lets the clusters notice it.
#include "sim/simulation.h"

#include <string>
#include <vector>

namespace weft::sim::internal {
namespace {

constexpr Micros kTrainerPoll = 2 * kSecond;  // the trainer's long poll for a batch

}  // namespace

void Simulation::TrainerWake() {
  trainer_wake_pending_ = false;
  if (phase_ == Phase::kCollecting) TrainerCollect();
}

void Simulation::TrainerCollect() {
  const TrainerConfig& t = config_.trainer;
  if (!orchestrator_up_) return;  // OrchestratorUp wakes the trainer
  const uint64_t remaining =
      t.steps == 0 ? t.steps_ahead : std::min<uint64_t>(t.steps_ahead, t.steps - step_);
  const uint64_t want = static_cast<uint64_t>(t.prompts_per_step) * remaining;
  const uint64_t have = core_.queued_jobs() + core_.leased_jobs() + core_.buffered();
  if (have < want) {
    const std::vector<JobSpec> jobs(want - have, JobSpec{job_prompt_, t.samples_per_prompt});
    Timed([&] { return core_.AddJobs(now_, jobs); });
    Log({Call::kJobs, now_, 0, jobs.size()}, true);
    WakeParked();
  }
  const uint64_t need = t.prompts_per_step - collected_;
  const uint64_t admissible = core_.admissible_version();
  Batch batch = Timed([&] { return core_.TakeBatch(now_, need, last_batch_); });
  if (batch.id != 0 || batch.acknowledged > 0) {
    Call call{Call::kBatch, now_, 0, need};
    call.version = last_batch_;
    Log(std::move(call), true);
  }
  if (batch.id != 0) {
    last_batch_ = batch.id;
    for (const orchestrator::Delivered& d : batch.items) {
      const TrajectoryGroup& g = d.group;
      if (g.job >= delivered_.size()) delivered_.resize(g.job + 1024, 0);
      if (++delivered_[g.job] > 1) {
        Fail("no trajectory delivered twice",
             "job " + std::to_string(g.job) + " reached the trainer twice");
      }
      if (!d.stale && g.version_start < admissible) {
        Fail("no staleness violation",
             "job " + std::to_string(g.job) + " delivered fresh from version " +
                 std::to_string(g.version_start) + ", admissible " + std::to_string(admissible));
      }
      ++delivered_items_;
      RegionStats& stats = regions_[clusters_[cluster_index_.at(g.cluster)].region].stats;
      ++(d.stale ? stats.delivered_stale : stats.delivered_fresh);
      ++stats.lag[(announced_ ? *announced_ : 0) - g.version_start];
      ++collected_;
    }
    WakeParked();  // room in flight
  }
  CheckCounters();
  if (collected_ >= t.prompts_per_step) {
    idle_us_ += now_ - wait_since_;
    collected_ = 0;
    phase_ = Phase::kStepping;
    const Micros step = Duration(trainer_rng_.Lognormal(Seconds(t.step_time), t.step_jitter));
    step_us_ += step;
    At(now_ + step, Ev::kTrainer, 0, static_cast<uint32_t>(++trainer_wake_epoch_));
    return;
  }
  trainer_wake_pending_ = true;
  At(now_ + kTrainerPoll, Ev::kTrainer, 0, static_cast<uint32_t>(++trainer_wake_epoch_));
}

void Simulation::StartPublish(uint64_t version) {
  if (version >= manifests_.size()) BuildManifest(version);
  const Manifest& m = manifests_[version];
  double bytes = 0;
  for (const BlobRef& blob : m.Blobs()) bytes += static_cast<double>(blob.bytes);
  const double encode =
      version == 0 ? 0 : config_.model.ServedBytes() / config_.model.encode_throughput;
  const Micros took = Duration(encode + bytes / config_.trainer.upload_bandwidth);
  publish_us_ += took;
  phase_ = Phase::kPublishing;
  At(now_ + took, Ev::kPublished, 0, 0, version);
}

void Simulation::Published(uint64_t version) {
  if (store_down_) {  // the manifest and `latest` wait for the store
    At(now_ + kRetry, Ev::kPublished, 0, 0, version);
    return;
  }
  store_latest_ = version;
  published_at_.resize(version + 1, now_);
  published_at_[version] = now_;
  ready_population_.resize(version + 1, std::vector<uint32_t>(regions_.size(), 0));
  ready_delays_.resize(version + 1, std::vector<std::vector<Micros>>(regions_.size()));
  Announce(version);
  for (uint32_t i = 0; i < clusters_.size(); ++i) {
    ClusterState& c = clusters_[i];
    if (!c.up) continue;
    ++ready_population_[version][c.region];
    if (version == 0 && c.preloaded && !c.worker.held() && !c.pulling) {  // staged before the run
      c.pulling = true;
      c.pull_target = 0;
      Commit(c);
      continue;
    }
    // Pushed: the store's answer to the long poll crosses the region's link once, `latest` in it.
    // Polled: a round trip to see it.
    const Micros latency = regions_[c.region].config.latency;
    if (config_.cluster.push) {
      ScheduleSyncCheck(c, latency, true);
    } else {
      ScheduleSyncCheck(c, 2 * latency);
    }
  }
  if (config_.trainer.steps != 0 && step_ >= config_.trainer.steps) {
    phase_ = Phase::kDone;
    return;
  }
  phase_ = Phase::kCollecting;
  wait_since_ = now_;
  TrainerCollect();
}

}  // namespace weft::sim::internal
