#include "orchestrator/measurements.h"

#include <algorithm>
#include <cmath>

namespace weft::orchestrator {
namespace {

double Seconds(Micros us) { return static_cast<double>(us) / 1e6; }

// Clusters needed for `fraction` of `population` (at least one).
uint64_t Needed(double fraction, uint64_t population) {
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(population) - 1e-9)));
}

const char* FractionLabel(int i) { return i == 0 ? "0.5" : i == 1 ? "0.9" : "1"; }

}  // namespace

std::map<std::string, RegionSlots> SlotsByRegion(const std::vector<ClusterView>& clusters) {
  std::map<std::string, RegionSlots> slots;
  for (const ClusterView& c : clusters) {
    RegionSlots& s = slots[c.region];
    s.accepted += c.completed;
    if (c.gone) continue;
    ++s.states[c.draining ? 2 : c.ready_version ? 1 : 0];
    if (c.draining) continue;
    s.capacity += c.capacity;
    s.busy += c.leases;
  }
  return slots;
}

void Measurements::Announced(Micros now, uint64_t version, const OrchestratorCore& core) {
  VersionRecord record;
  record.version = version;
  record.announced = now;
  for (const ClusterView& c : core.clusters()) {
    if (c.gone || c.draining || !c.model.empty()) continue;  // a fixed model gets no versions
    RegionReadiness& r = record.regions[c.region];
    r.waiting.insert(c.id);
    ++r.population;
  }
  MutexLock lock(mutex_);
  if (!versions_.empty()) {
    for (auto& [name, r] : versions_.back().regions) {
      r.missed = r.waiting.size();
      regions_[name].missed += r.waiting.size();
    }
  }
  for (auto& [name, r] : record.regions) regions_[name];  // the region's series exist from now
  versions_.push_back(std::move(record));
  while (versions_.size() > std::max<size_t>(1, options_.versions)) {
    Retire(versions_.front());
    versions_.pop_front();
  }
}

void Measurements::Proved(Micros now, const std::string& cluster, const std::string& region,
                          uint64_t version) {
  MutexLock lock(mutex_);
  auto [known, fresh] = proven_.emplace(cluster, version);
  if (!fresh) {
    if (known->second >= version) return;
    known->second = version;
  }
  for (VersionRecord& record : versions_) {
    if (record.version > version) break;
    auto found = record.regions.find(region);
    if (found == record.regions.end()) continue;
    RegionReadiness& r = found->second;
    if (r.waiting.erase(cluster) == 0) continue;
    r.delays.push_back(now - record.announced);
    Reach(region, r);
  }
}

void Measurements::Left(Micros, const std::string& cluster) {
  MutexLock lock(mutex_);
  proven_.erase(cluster);  // registering again, it proves afresh
  for (VersionRecord& record : versions_) {
    for (auto& [region, r] : record.regions) {
      if (r.waiting.erase(cluster) == 0) continue;
      --r.population;
      Reach(region, r);
    }
  }
}

void Measurements::Reach(const std::string& region, RegionReadiness& r) {
  for (int i = 0; i < 3; ++i) {
    if (r.reached[i] || r.population == 0) continue;
    const uint64_t needed = Needed(kFractions[i], r.population);
    if (r.delays.size() < needed) continue;
    // The delays come in order: the needed-th is when the fraction was reached (a cluster that
    // left may make it reached now by an earlier cluster's proof).
    r.reached[i] = r.delays[needed - 1];
    regions_[region].ready[i].Observe(Seconds(*r.reached[i]));
  }
}

void Measurements::Retire(const VersionRecord& record) {
  for (const auto& [name, r] : record.regions) {
    if (r.population == 0) continue;
    for (int i = 0; i < 3; ++i)
      if (!r.reached[i]) ++regions_[name].unreached[i];
  }
}

void Measurements::Taken(Micros, const std::string& region, uint64_t lag, bool dropped,
                         bool redelivered) {
  MutexLock lock(mutex_);
  RegionFigures& figures = regions_[region];
  if (dropped) {
    ++figures.dropped_stale;
    // Delivered before in a batch the trainer never acknowledged: no longer counted delivered.
    // (The staleness figures keep it, at the lag it was delivered at: a histogram only grows.)
    if (redelivered && figures.delivered > 0) --figures.delivered;
    return;
  }
  ++figures.delivered;
  figures.staleness.Observe(static_cast<double>(lag));
  ++staleness_[lag];
}

void Measurements::TrainerWaited(double seconds) {
  MutexLock lock(mutex_);
  trainer_wait_.Observe(seconds);
  recent_waits_.push_back(seconds);
  while (recent_waits_.size() > options_.recent_steps) recent_waits_.pop_front();
}

void Measurements::Published(uint64_t version, double seconds) {
  MutexLock lock(mutex_);
  for (VersionRecord& record : versions_) {
    if (record.version != version) continue;
    if (record.publish_seconds) return;  // an announcement repeated (its answer was lost)
    record.publish_seconds = seconds;
  }
  publish_.Observe(seconds);
}

void Measurements::Synced(const std::string& cluster, const std::string& region,
                          const SyncReport& report) {
  MutexLock lock(mutex_);
  ClusterReport& last = reports_[cluster];
  bool restarted = report.bytes_downloaded < last.bytes || report.pause_sum_ms < last.pause_sum_ms;
  if (last.pause_counts.size() == report.pause_counts.size()) {
    for (size_t i = 0; i < report.pause_counts.size(); ++i)
      restarted = restarted || report.pause_counts[i] < last.pause_counts[i];
  } else if (!last.pause_counts.empty()) {
    restarted = true;
  }
  if (restarted || last.region != region) last = ClusterReport{region, 0, {}, 0, 0};
  RegionFigures& figures = regions_[region];
  const uint64_t bytes = report.bytes_downloaded - last.bytes;
  figures.sync_bytes += bytes;
  if (!versions_.empty()) versions_.back().regions[region].sync_bytes += bytes;
  if (!report.pause_counts.empty()) {
    std::vector<uint64_t> counts = report.pause_counts;
    for (size_t i = 0; i < last.pause_counts.size() && i < counts.size(); ++i)
      counts[i] -= last.pause_counts[i];
    figures.pauses.Add(counts, (report.pause_sum_ms - last.pause_sum_ms) / 1000.0);
  }
  last.bytes = report.bytes_downloaded;
  last.pause_counts = report.pause_counts;
  last.pause_sum_ms = report.pause_sum_ms;
  last.max_pause_ms = report.max_pause_ms;
}

void Measurements::Sample(Micros now, const Counters& counters) {
  MutexLock lock(mutex_);
  // One sample a second at most, over the window and one more.
  if (!samples_.empty() && now - samples_.back().first < 1'000'000) return;
  samples_.emplace_back(now, counters);
  while (samples_.size() > 2 && now - samples_[1].first >= options_.rate_window)
    samples_.pop_front();
}

void Measurements::Fill(wire::StatusPage* page) const {
  MutexLock lock(mutex_);
  for (const VersionRecord& record : versions_) {
    wire::StatusPage::Version& v = page->versions.emplace_back();
    v.version = record.version;
    v.announced_at = Seconds(record.announced);
    v.publish_seconds = record.publish_seconds;
    for (const auto& [name, r] : record.regions) {
      wire::StatusPage::Readiness& out = v.regions[name];
      out.population = r.population;
      out.ready = r.delays.size();
      std::optional<double>* fields[3] = {&out.ready_50_seconds, &out.ready_90_seconds,
                                          &out.ready_100_seconds};
      for (int i = 0; i < 3; ++i)
        if (r.reached[i]) *fields[i] = Seconds(*r.reached[i]);
      out.missed = r.missed;
      out.sync_bytes = r.sync_bytes;
    }
  }
  page->trainer.steps_reported = trainer_wait_.count();
  page->trainer.wait_seconds_total = trainer_wait_.sum();
  page->trainer.recent_wait_seconds.assign(recent_waits_.begin(), recent_waits_.end());
  page->trainer.publishes_reported = publish_.count();
  page->trainer.publish_seconds_total = publish_.sum();
  if (samples_.size() >= 2) {
    const auto& [t0, a] = samples_.front();
    const auto& [t1, b] = samples_.back();
    const double span = Seconds(t1 - t0);
    page->rates.window_seconds = span;
    auto rate = [&](uint64_t from, uint64_t to) {
      return to >= from ? static_cast<double>(to - from) / span : 0.0;
    };
    page->rates.accepted_per_s = rate(a.submissions_accepted, b.submissions_accepted);
    page->rates.delivered_per_s =
        rate(a.delivered_fresh + a.delivered_stale, b.delivered_fresh + b.delivered_stale);
    page->rates.leases_per_s = rate(a.leases_granted, b.leases_granted);
  }
  page->staleness = staleness_;
  for (auto& [name, region] : page->regions) {
    auto found = regions_.find(name);
    if (found == regions_.end()) continue;
    region.delivered = found->second.delivered;
    region.dropped_stale = found->second.dropped_stale;
  }
}

void Measurements::Metrics(std::string& out, const OrchestratorCore& core) const {
  using prometheus::Family;
  using prometheus::Labels;
  using prometheus::Sample;
  const std::map<std::string, RegionSlots> slots = SlotsByRegion(core.clusters());
  const std::string p = "weft_orchestrator_";
  // A family with one sample per region of `by_region`, of value(its entry).
  auto per_region = [&](const auto& by_region, const std::string& name, const char* type,
                        const char* help, auto value) {
    Family(out, p + name, type, help);
    for (const auto& [region, entry] : by_region)
      Sample(out, p + name, {{"region", region}}, static_cast<double>(value(entry)));
  };
  per_region(slots, "region_capacity_slots", "gauge",
             "Job slots of the region's clusters that neither drain nor are gone.",
             [](const RegionSlots& s) { return s.capacity; });
  per_region(slots, "region_busy_slots", "gauge", "Leases the region's clusters hold.",
             [](const RegionSlots& s) { return s.busy; });
  per_region(slots, "region_utilisation_ratio", "gauge",
             "Busy slots over capacity in the region (0 to 1).",
             [](const RegionSlots& s) { return s.utilisation(); });
  Family(out, p + "region_clusters", "gauge",
         "The region's clusters by state (syncing, ready, draining; gone ones are not counted).");
  static constexpr const char* kStates[3] = {"syncing", "ready", "draining"};
  for (const auto& [region, s] : slots)
    for (int i = 0; i < 3; ++i)
      Sample(out, p + "region_clusters", {{"region", region}, {"state", kStates[i]}},
             static_cast<double>(s.states[i]));
  per_region(slots, "region_accepted_total", "counter",
             "Trajectory groups accepted from the region's clusters.",
             [](const RegionSlots& s) { return s.accepted; });

  MutexLock lock(mutex_);
  Family(out, p + "publication_to_ready_seconds", "histogram",
         "Time from a version's announce until a fraction (0.5, 0.9, 1) of the region's clusters "
         "that could get ready proved it.");
  for (const auto& [region, f] : regions_)
    for (int i = 0; i < 3; ++i)
      prometheus::HistogramSamples(out, p + "publication_to_ready_seconds",
                                   {{"region", region}, {"fraction", FractionLabel(i)}},
                                   f.ready[i]);
  Family(out, p + "publication_unreached_total", "counter",
         "Versions forgotten (past the versions kept) before a fraction of the region's clusters "
         "proved them.");
  for (const auto& [region, f] : regions_)
    for (int i = 0; i < 3; ++i)
      Sample(out, p + "publication_unreached_total",
             {{"region", region}, {"fraction", FractionLabel(i)}},
             static_cast<double>(f.unreached[i]));
  per_region(regions_, "publication_missed_clusters_total", "counter",
             "Clusters that had not proved a version when the next one was announced.",
             [](const RegionFigures& f) { return f.missed; });
  Family(out, p + "delivered_staleness_versions", "histogram",
         "Versions between the latest and the oldest a delivered trajectory group used.");
  for (const auto& [region, f] : regions_)
    prometheus::HistogramSamples(out, p + "delivered_staleness_versions", {{"region", region}},
                                 f.staleness);
  per_region(regions_, "region_delivered_total", "counter",
             "Trajectory groups from the region delivered to the trainer.",
             [](const RegionFigures& f) { return f.delivered; });
  per_region(regions_, "region_dropped_stale_total", "counter",
             "Trajectory groups from the region dropped as older than the staleness bound.",
             [](const RegionFigures& f) { return f.dropped_stale; });
  per_region(regions_, "region_sync_bytes_total", "counter",
             "Weight bytes the region's workers downloaded, as they report it.",
             [](const RegionFigures& f) { return f.sync_bytes; });
  Family(out, p + "engine_pause_seconds", "histogram",
         "Pauses of the region's engines for weight loads, as their workers report them.");
  for (const auto& [region, f] : regions_)
    prometheus::HistogramSamples(out, p + "engine_pause_seconds", {{"region", region}}, f.pauses);
  Family(out, p + "trainer_wait_seconds", "histogram",
         "Time the trainer's next_batch calls waited for trajectories, as the trainer reports it.");
  prometheus::HistogramSamples(out, p + "trainer_wait_seconds", {}, trainer_wait_);
  Family(out, p + "publish_seconds", "histogram",
         "Time the trainer took to publish each version, as it reports it.");
  prometheus::HistogramSamples(out, p + "publish_seconds", {}, publish_);
}

}  // namespace weft::orchestrator
