#include "orchestrator/core.h"

#include <algorithm>
#include <cmath>

#include "common/names.h"

namespace weft::orchestrator {
namespace {

std::string JobName(uint64_t job) { return "job " + std::to_string(job); }

std::string Gone(const std::string& cluster) {
  return "cluster " + cluster + " was lost (no heartbeat in time) or left; register again";
}

}  // namespace

OrchestratorCore::Cluster* OrchestratorCore::FindCluster(const std::string& id) {
  auto found = clusters_.find(id);
  return found == clusters_.end() ? nullptr : &found->second;
}

uint64_t OrchestratorCore::admissible_version() const {
  if (!latest_) return 0;
  return *latest_ >= config_.max_staleness ? *latest_ - config_.max_staleness : 0;
}

bool OrchestratorCore::Eligible(const Cluster& c) const {
  if (c.gone || c.draining || !c.ready_version) return false;
  return !c.model.empty() || (latest_ && *c.ready_version >= admissible_version());
}

Status OrchestratorCore::Register(Micros now, const std::string& cluster, const std::string& region,
                                  uint32_t capacity, const std::string& credential,
                                  const ModelRef& model) {
  WEFT_RETURN_IF_ERROR(CheckName(cluster, "cluster id"));
  WEFT_RETURN_IF_ERROR(CheckName(region, "cluster " + cluster + ": region"));
  if (capacity == 0 || capacity > 1'000'000)
    return InvalidArgument("cluster " + cluster + ": capacity must be 1 to 1000000");
  if (model.fixed()) {
    WEFT_RETURN_IF_ERROR(CheckName(model.name, "cluster " + cluster + ": model"));
    if (model.digest.empty())
      return InvalidArgument("cluster " + cluster + ": fixed model " + model.name +
                             " needs the digest of its weights");
    auto known = fixed_models_.find(model.name);
    if (known != fixed_models_.end() && known->second != model.digest) {
      return Conflict("cluster " + cluster + ": model " + model.name +
                      " is served in this run with digest " + known->second + ", not " +
                      model.digest);
    }
  } else if (!model.digest.empty()) {
    return InvalidArgument("cluster " + cluster +
                           ": a digest is given for fixed models only, not for the policy");
  }
  if (model.fixed()) fixed_models_.emplace(model.name, model.digest);
  Cluster& c = clusters_[cluster];
  if (c.model != model.name) {
    // Another model now: what it held was leased for the old one.
    std::vector<uint64_t> held(c.jobs.begin(), c.jobs.end());
    for (uint64_t job : held) {
      Requeue(job);
      ++counters_.leases_handed_back;
    }
    capacity_sum_[c.model] -= c.capacity;
    c.capacity = 0;
    c.ready_version.reset();
    c.max_ready_version = 0;
    c.model = model.name;
  }
  c.region = region;
  capacity_sum_[c.model] = capacity_sum_[c.model] - c.capacity + capacity;
  c.capacity = capacity;
  c.draining = false;
  c.gone = false;
  c.last_heartbeat = now;
  c.credential = credential;
  return Status::Ok();
}

Status OrchestratorCore::Heartbeat(Micros now, const std::string& cluster,
                                   std::optional<uint64_t> ready_version) {
  Cluster* c = FindCluster(cluster);
  if (c == nullptr) return NotFound("cluster " + cluster + " is not registered");
  if (c->gone) return NotFound(Gone(cluster));
  if (ready_version && c->model.empty() && (!latest_ || *ready_version > *latest_)) {
    // A conflict, not a malformed request: the store can be ahead of the announcements for a
    // moment (a version published and not yet announced); the worker then says it is alive
    // without claiming a version.
    return Conflict("cluster " + cluster + ": ready_version " + std::to_string(*ready_version) +
                    " was never announced (latest: " +
                    (latest_ ? std::to_string(*latest_) : std::string("none")) + ")");
  }
  c->last_heartbeat = now;
  c->ready_version = ready_version;
  if (ready_version && c->model.empty() && observer_ != nullptr)
    observer_->Proved(now, cluster, c->region, *ready_version);
  if (ready_version) c->max_ready_version = std::max(c->max_ready_version, *ready_version);
  for (uint64_t job : c->jobs) jobs_[job].deadline = now + config_.lease_duration;
  return Status::Ok();
}

Status OrchestratorCore::Drain(Micros now, const std::string& cluster,
                               const std::vector<uint64_t>& jobs, bool stop_leasing) {
  Cluster* c = FindCluster(cluster);
  if (c == nullptr) return NotFound("cluster " + cluster + " is not registered");
  if (c->gone) return NotFound(Gone(cluster));
  std::vector<uint64_t> handed =
      jobs.empty() ? std::vector<uint64_t>(c->jobs.begin(), c->jobs.end()) : jobs;
  std::sort(handed.begin(), handed.end());  // a job listed twice is handed back once
  handed.erase(std::unique(handed.begin(), handed.end()), handed.end());
  for (uint64_t job : handed) {  // a refused drain changes nothing
    if (!c->jobs.count(job))
      return InvalidArgument("cluster " + cluster + " does not hold a lease on " + JobName(job));
  }
  if (stop_leasing && !c->draining && observer_ != nullptr) observer_->Left(now, cluster);
  if (stop_leasing) c->draining = true;
  c->last_heartbeat = now;
  for (uint64_t job : handed) {
    Requeue(job);
    ++counters_.leases_handed_back;
  }
  return Status::Ok();
}

Status OrchestratorCore::Deregister(Micros now, const std::string& cluster) {
  Cluster* c = FindCluster(cluster);
  if (c == nullptr) return NotFound("cluster " + cluster + " is not registered");
  std::vector<uint64_t> held(c->jobs.begin(), c->jobs.end());
  for (uint64_t job : held) {
    Requeue(job);
    ++counters_.leases_handed_back;
  }
  if (!c->gone && observer_ != nullptr) observer_->Left(now, cluster);
  c->gone = true;
  c->ready_version.reset();
  c->last_heartbeat = now;
  return Status::Ok();
}

void OrchestratorCore::Requeue(uint64_t job) {
  auto found = jobs_.find(job);
  if (found == jobs_.end()) return;
  Job& j = found->second;
  if (j.leased_to) {
    if (Cluster* c = FindCluster(*j.leased_to)) c->jobs.erase(job);
    j.leased_to.reset();
    leases_.erase(job);
  }
  if (j.holders.size() >= config_.max_attempts) {
    jobs_.erase(found);
    ++counters_.jobs_given_up;
    return;
  }
  queues_[j.model].push_front(job);  // it waited already: first in line
}

Result<std::vector<Lease>> OrchestratorCore::RequestLeases(Micros now, const std::string& cluster,
                                                           uint32_t max, uint64_t request) {
  Cluster* c = FindCluster(cluster);
  if (c == nullptr) return NotFound("cluster " + cluster + " is not registered");
  if (c->gone) return NotFound(Gone(cluster));
  // (Liveness comes from heartbeats only: a request that grants nothing changes no state, so it
  // need not be journaled.)
  std::vector<Lease> leases;
  if (request != 0 && request == c->last_request) {
    for (const auto& [job, attempt] : c->last_granted) {
      auto found = jobs_.find(job);
      if (found == jobs_.end() || found->second.leased_to != cluster ||
          found->second.holders.size() != attempt)
        continue;
      leases.push_back(LeaseOf(job, found->second, attempt));
    }
    return leases;
  }
  if (!Eligible(*c)) return leases;
  auto queue_of = queues_.find(c->model);
  if (queue_of == queues_.end()) return leases;
  std::deque<uint64_t>& queue = queue_of->second;
  const uint64_t in_flight = leases_.size() + buffer_.size() + outstanding_items_;
  uint64_t grant = std::min<uint64_t>(
      {max, c->capacity - std::min<uint64_t>(c->capacity, c->jobs.size()), queue.size(),
       config_.max_in_flight - std::min(config_.max_in_flight, in_flight)});
  if (grant == 0) return leases;  // (the sharing below can only lower it)
  // Sharing matters only when fewer jobs are queued than there are free slots. With at least as
  // many queued as the capacity of the model's clusters together it cannot, and the walks over
  // every cluster (a thousand clusters asking at once would make them quadratic) are skipped.
  if (config_.dispatch == DispatchPolicy::kWeighted && queue.size() < capacity_sum_[c->model]) {
    // When there are fewer queued jobs than free slots, share them by free slots, counting clusters
    // at the latest version twice (they waste nothing when the bound moves on) and weighing each by
    // its recent throughput against the others' (4 at the mean, from 1 to 8): work goes where it
    // will be done soonest. Only the clusters serving the same model share.
    auto eligible = [&](const Cluster& x) { return x.model == c->model && Eligible(x); };
    double throughput_sum = 0;
    int measured = 0;
    for (const auto& [id, other] : clusters_) {
      if (eligible(other) && other.throughput > 0) {
        throughput_sum += other.throughput;
        ++measured;
      }
    }
    const double mean_throughput = measured > 0 ? throughput_sum / measured : 0;
    uint64_t total_weight = 0;
    auto weight = [&](const Cluster& x) -> uint64_t {
      if (!eligible(x)) return 0;
      const uint64_t free = x.capacity - std::min<uint64_t>(x.capacity, x.jobs.size());
      uint64_t speed = 4;
      if (mean_throughput > 0 && x.throughput > 0) {
        speed = static_cast<uint64_t>(
            std::clamp(std::llround(4 * x.throughput / mean_throughput), 1LL, 8LL));
      }
      return free * (!x.model.empty() || *x.ready_version >= *latest_ ? 2 : 1) * speed;
    };
    uint64_t total_free = 0;
    for (const auto& [id, other] : clusters_) {
      if (other.model != c->model) continue;
      total_weight += weight(other);
      total_free += other.capacity - std::min<uint64_t>(other.capacity, other.jobs.size());
    }
    if (queue.size() < total_free && total_weight > 0) {
      const uint64_t share = (queue.size() * weight(*c) + total_weight - 1) / total_weight;
      grant = std::min(grant, std::max<uint64_t>(share, 1));
    }
  }
  for (uint64_t i = 0; i < grant; ++i) {
    const uint64_t job = queue.front();
    queue.pop_front();
    Job& j = jobs_[job];
    j.holders.push_back(cluster);
    j.min_versions.push_back(j.model.empty() ? admissible_version() : 0);
    j.leased_to = cluster;
    j.deadline = now + config_.lease_duration;
    c->jobs.insert(job);
    leases_.insert(job);
    ++counters_.leases_granted;
    leases.push_back(LeaseOf(job, j, static_cast<uint32_t>(j.holders.size())));
  }
  if (!leases.empty()) {
    Progress(now);
    c->last_request = request;
    c->last_granted.clear();
    for (const Lease& lease : leases) c->last_granted.emplace_back(lease.job, lease.attempt);
  }
  return leases;
}

Result<SubmitResult> OrchestratorCore::Submit(Micros now, TrajectoryGroup s) {
  auto reject = [&](Status status) -> Result<SubmitResult> {
    ++counters_.submissions_rejected;
    return status;
  };
  const std::string what = JobName(s.job) + " attempt " + std::to_string(s.attempt);
  auto done = done_.find(s.job);
  if (done != done_.end()) {
    if (done->second == s.attempt) {
      ++counters_.submissions_duplicate;
      return SubmitResult::kDuplicate;
    }
    return reject(Conflict(what + ": the job was already completed by attempt " +
                           std::to_string(done->second)));
  }
  auto found = jobs_.find(s.job);
  if (found == jobs_.end()) {
    if (s.job == 0 || s.job >= next_job_)
      return reject(NotFound(what + ": no such job was ever added"));
    return reject(NotFound(what + ": the job is closed (given up after " +
                           std::to_string(config_.max_attempts) +
                           " attempts, or completed before the last " +
                           std::to_string(done_.size()) + " remembered completions)"));
  }
  Job& j = found->second;
  if (s.attempt == 0 || s.attempt > j.holders.size()) {
    return reject(InvalidArgument(what + ": the job has had " + std::to_string(j.holders.size()) +
                                  " leases"));
  }
  if (j.holders[s.attempt - 1] != s.cluster) {
    return reject(InvalidArgument(what + " was leased to cluster " + j.holders[s.attempt - 1] +
                                  ", not " + s.cluster));
  }
  const Cluster* c = FindCluster(s.cluster);
  // Versions: token runs, each tagged with the version that generated it, from a version the lease
  // admitted to one the cluster was ready at. A group's samples are laid end to end, so versions
  // need not increase from one run to the next (each sample's own runs do).
  if (s.segments.empty() || s.segments.front().second != 0) {
    return reject(InvalidArgument(what + ": segments must start at token 0"));
  }
  uint64_t lowest = s.segments.front().first, highest = lowest;
  for (size_t i = 1; i < s.segments.size(); ++i) {
    if (s.segments[i].first == s.segments[i - 1].first ||
        s.segments[i].second <= s.segments[i - 1].second) {
      return reject(InvalidArgument(what + ": segment " + std::to_string(i) +
                                    " does not change the version at a later token"));
    }
    lowest = std::min(lowest, s.segments[i].first);
    highest = std::max(highest, s.segments[i].first);
  }
  if (lowest != s.version_start || highest != s.version_end) {
    return reject(InvalidArgument(
        what +
        ": version_start and version_end must be the oldest and newest versions of the segments"));
  }
  if (s.tokens > 0 && s.segments.back().second >= s.tokens) {
    return reject(InvalidArgument(what + ": a segment starts past the last token"));
  }
  const bool policy = j.model.empty();  // a fixed model's versions are its own, never announced
  if (s.version_start < j.min_versions[s.attempt - 1]) {
    return reject(InvalidArgument(what + ": version_start " + std::to_string(s.version_start) +
                                  " is below the lease's minimum " +
                                  std::to_string(j.min_versions[s.attempt - 1])));
  }
  if (policy && (!latest_ || s.version_end > *latest_)) {
    return reject(InvalidArgument(what + ": version_end " + std::to_string(s.version_end) +
                                  " was never announced"));
  }
  if (c == nullptr || c->model != j.model || s.version_end > c->max_ready_version) {
    return reject(InvalidArgument(what + ": version_end " + std::to_string(s.version_end) +
                                  " is newer than any version cluster " + s.cluster +
                                  " proved it was ready at"));
  }
  // Accepted: the job is done, whichever lease it holds now is cancelled.
  if (j.leased_to) {
    if (*j.leased_to != s.cluster || j.holders.size() != s.attempt) ++counters_.leases_cancelled;
    if (Cluster* holder = FindCluster(*j.leased_to)) holder->jobs.erase(s.job);
    leases_.erase(s.job);
  } else {
    std::deque<uint64_t>& queue = queues_[j.model];
    queue.erase(std::remove(queue.begin(), queue.end(), s.job), queue.end());
  }
  // The job is forgotten but for its completing attempt (done_); its metadata goes with the group.
  std::string metadata = std::move(j.metadata);
  std::string model = std::move(j.model);
  const JobKind kind = j.kind;
  jobs_.erase(found);
  done_[s.job] = s.attempt;
  while (done_.size() > std::max<uint64_t>(1, config_.remember_done)) done_.erase(done_.begin());
  if (Cluster* submitter = FindCluster(s.cluster)) {
    ++submitter->completed;
    if (submitter->last_completion > 0 && now > submitter->last_completion) {
      const double rate = 1e6 / static_cast<double>(now - submitter->last_completion);
      submitter->throughput = 0.8 * submitter->throughput + 0.2 * rate;
    }
    submitter->last_completion = now;
  }
  ++counters_.submissions_accepted;
  ++counters_.jobs_done;
  buffer_.push_back({std::move(s), false, std::move(metadata), std::move(model), kind});
  Progress(now);
  return SubmitResult::kAccepted;
}

Status OrchestratorCore::AnnounceVersion(Micros now, uint64_t version) {
  if (version > kMaxVersion) {
    return InvalidArgument("version " + std::to_string(version) + " is above the largest, " +
                           std::to_string(kMaxVersion));
  }
  if (latest_ && version < *latest_) {
    return InvalidArgument("version " + std::to_string(version) + " is older than the announced " +
                           std::to_string(*latest_));
  }
  const bool newer = !latest_ || version > *latest_;
  latest_ = version;
  Progress(now);
  if (newer && observer_ != nullptr) observer_->Announced(now, version, *this);
  return Status::Ok();
}

std::vector<uint64_t> OrchestratorCore::AddJobs(Micros now, const std::vector<JobSpec>& jobs) {
  std::vector<uint64_t> ids;
  for (const JobSpec& job : jobs) {
    const uint64_t id = next_job_++;
    Job& j = jobs_[id];
    j.prompt = job.prompt;
    j.samples = std::max<uint32_t>(1, job.samples);
    j.metadata = job.metadata;
    j.model = job.model;
    j.kind = job.kind;
    j.targets = job.targets;
    queues_[j.model].push_back(id);
    ids.push_back(id);
    ++counters_.jobs_added;
  }
  if (!ids.empty() && queued_jobs() == ids.size() && leases_.empty())
    Progress(now);  // work arrives after idling
  return ids;
}

Batch OrchestratorCore::TakeBatch(Micros now, size_t max, std::optional<uint64_t> ack) {
  Batch batch;
  batch.latest_version = latest_;
  if (ack) {
    while (!outstanding_.empty() && outstanding_.begin()->first <= *ack) {
      outstanding_items_ -= outstanding_.begin()->second.size();
      outstanding_.erase(outstanding_.begin());
      ++batch.acknowledged;
    }
  }
  if (max == 0) return batch;  // an acknowledgement only
  if (!outstanding_.empty()) {
    // Handed out again, judged again: what the bound has passed since is no longer fresh.
    std::vector<Delivered>& items = outstanding_.begin()->second;
    std::vector<Delivered> kept;
    for (Delivered& d : items) {
      if (!d.stale && d.model.empty() && d.group.version_start < admissible_version()) {
        --counters_.delivered_fresh;
        if (config_.stale_policy == StalePolicy::kDrop) {
          ++counters_.dropped_stale;
          --outstanding_items_;
          Observe(now, d, true, true);
          continue;
        }
        ++counters_.delivered_stale;
        d.stale = true;
      }
      kept.push_back(std::move(d));
    }
    items = std::move(kept);
    batch.id = outstanding_.begin()->first;
    batch.redelivered = true;
    batch.items = items;
    ++counters_.batches_redelivered;
    return batch;
  }
  while (!buffer_.empty() && batch.items.size() < max) {
    Delivered d = std::move(buffer_.front());
    buffer_.pop_front();
    d.stale = d.model.empty() && d.group.version_start < admissible_version();
    if (d.stale && config_.stale_policy == StalePolicy::kDrop) {
      ++counters_.dropped_stale;
      Observe(now, d, true);
      continue;
    }
    ++(d.stale ? counters_.delivered_stale : counters_.delivered_fresh);
    Observe(now, d, false);
    batch.items.push_back(std::move(d));
  }
  if (!batch.items.empty()) {
    batch.id = next_batch_++;
    outstanding_[batch.id] = batch.items;
    outstanding_items_ += batch.items.size();
    ++counters_.batches;
    Progress(now);
  }
  return batch;
}

void OrchestratorCore::Observe(Micros now, const Delivered& d, bool dropped,
                               bool redelivered) const {
  if (observer_ == nullptr) return;
  auto found = clusters_.find(d.group.cluster);
  // A fixed model's groups lag nothing: it has no versions to fall behind.
  const uint64_t latest = d.model.empty() ? latest_.value_or(0) : 0;
  observer_->Taken(now, found != clusters_.end() ? found->second.region : std::string(),
                   latest > d.group.version_start ? latest - d.group.version_start : 0, dropped,
                   redelivered);
}

bool OrchestratorCore::Tick(Micros now) {
  const uint64_t before =
      counters_.leases_expired + counters_.clusters_lost + counters_.jobs_given_up;
  std::vector<uint64_t> expired;
  for (uint64_t job : leases_) {
    if (jobs_[job].deadline <= now) expired.push_back(job);
  }
  for (uint64_t job : expired) {
    Requeue(job);
    ++counters_.leases_expired;
  }
  for (auto& [id, c] : clusters_) {
    if (c.gone || c.last_heartbeat + config_.cluster_timeout > now) continue;
    std::vector<uint64_t> held(c.jobs.begin(), c.jobs.end());
    for (uint64_t job : held) {
      Requeue(job);
      ++counters_.leases_expired;
    }
    if (observer_ != nullptr) observer_->Left(now, id);
    c.gone = true;
    c.ready_version.reset();
    ++counters_.clusters_lost;
  }
  return counters_.leases_expired + counters_.clusters_lost + counters_.jobs_given_up != before;
}

std::vector<ClusterView> OrchestratorCore::clusters() const {
  std::vector<ClusterView> views;
  for (const auto& [id, c] : clusters_) views.push_back(ViewOf(id, c));
  return views;
}

std::optional<ClusterView> OrchestratorCore::cluster(const std::string& id) const {
  auto found = clusters_.find(id);
  if (found == clusters_.end()) return std::nullopt;
  return ViewOf(id, found->second);
}

ClusterView OrchestratorCore::ViewOf(const std::string& id, const Cluster& c) {
  return {id,
          c.region,
          c.capacity,
          c.ready_version,
          c.draining,
          c.gone,
          static_cast<uint32_t>(c.jobs.size()),
          c.completed,
          c.throughput,
          c.last_heartbeat,
          c.model};
}

const char* DispatchName(DispatchPolicy policy) {
  return policy == DispatchPolicy::kWeighted ? "weighted" : "first_come";
}

Result<DispatchPolicy> ParseDispatch(const std::string& name) {
  if (name == "weighted") return DispatchPolicy::kWeighted;
  if (name == "first_come") return DispatchPolicy::kFirstCome;
  return InvalidArgument("'" + name + "' is not weighted or first_come");
}

std::optional<std::string> OrchestratorCore::credential(const std::string& cluster) const {
  auto found = clusters_.find(cluster);
  if (found == clusters_.end()) return std::nullopt;
  return found->second.credential;
}

std::map<uint64_t, uint64_t> OrchestratorCore::buffered_versions() const {
  std::map<uint64_t, uint64_t> histogram;
  for (const Delivered& d : buffer_) ++histogram[d.group.version_start];
  return histogram;
}

size_t OrchestratorCore::queued_jobs() const {
  size_t queued = 0;
  for (const auto& [model, queue] : queues_) queued += queue.size();
  return queued;
}

std::vector<ModelView> OrchestratorCore::models() const {
  std::map<std::string, ModelView> views;
  auto view = [&](const std::string& name) -> ModelView& {
    ModelView& v = views[name];
    v.name = name;
    auto fixed = fixed_models_.find(name);
    if (fixed != fixed_models_.end()) v.digest = fixed->second;
    return v;
  };
  for (const auto& [name, digest] : fixed_models_) view(name);
  for (const auto& [name, queue] : queues_) view(name).queued += queue.size();
  for (uint64_t job : leases_) ++view(jobs_.at(job).model).leased;
  for (const auto& [id, c] : clusters_) {
    if (c.gone || c.draining) continue;
    ModelView& v = view(c.model);
    ++v.clusters;
    if (Eligible(c)) ++v.ready;
  }
  std::vector<ModelView> out;
  for (auto& [name, v] : views) out.push_back(std::move(v));
  return out;
}

std::vector<std::string> OrchestratorCore::Alerts(Micros now) const {
  std::vector<std::string> alerts;
  const bool work = queued_jobs() > 0 || !leases_.empty();
  const std::vector<ModelView> views = models();
  for (const ModelView& m : views) {
    if (m.name.empty() && m.queued + m.leased > 0 && !latest_)
      alerts.push_back("no policy version announced yet: nothing can be leased");
  }
  for (const ModelView& m : views) {
    if (m.queued == 0 || m.ready > 0) continue;
    if (m.name.empty() && latest_) {
      alerts.push_back(std::to_string(m.queued) +
                       " jobs queued and no cluster is ready at version " +
                       std::to_string(admissible_version()) + " or newer");
    } else if (!m.name.empty()) {
      alerts.push_back(std::to_string(m.queued) + " jobs queued for model " + m.name +
                       (m.clusters == 0 ? " and no cluster serves it"
                                        : " and none of the " + std::to_string(m.clusters) +
                                              " clusters serving it has proved its weights yet"));
    }
  }
  if (work && now - last_progress_ >= config_.stall_after) {
    alerts.push_back("stalled: no lease granted, trajectory accepted or batch taken for " +
                     std::to_string((now - last_progress_) / 1'000'000) + " s (" +
                     std::to_string(queued_jobs()) + " jobs queued, " +
                     std::to_string(leases_.size()) + " leased)");
  }
  return alerts;
}

}  // namespace weft::orchestrator
