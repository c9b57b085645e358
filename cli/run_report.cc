#include "cli/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "cli/trainer_channel.h"
#include "sim/report.h"

namespace weft::cli {
namespace {

using Json = nlohmann::json;

std::string Megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text),
                bytes >= 1e9   ? "%.2f GB"
                : bytes >= 1e6 ? "%.1f MB"
                               : "%.0f kB",
                bytes >= 1e9   ? bytes / 1e9
                : bytes >= 1e6 ? bytes / 1e6
                               : bytes / 1e3);
  return text;
}

// The report's figures that come from the orchestrator's view of the clusters.
struct SyncTotals {
  uint64_t bytes_sent = 0, digest_mismatches = 0, pulls = 0, keyframe_pulls = 0, clusters = 0;
  double full_versions = 0;  // sum over clusters of the versions published while it served
  double max_pause_ms = 0;
};

SyncTotals Totals(const orchestrator::wire::StatusPage* status) {
  SyncTotals t;
  if (status == nullptr) return t;
  for (const orchestrator::wire::StatusPage::Cluster& c : status->clusters) {
    if (!c.sync) continue;
    const orchestrator::SyncReport& s = *c.sync;
    ++t.clusters;
    t.bytes_sent += s.bytes_downloaded;
    t.digest_mismatches += s.digest_mismatches;
    t.pulls += s.pulls;
    t.keyframe_pulls += s.keyframe_pulls;
    t.max_pause_ms = std::max(t.max_pause_ms, s.max_pause_ms);
    if (s.first_version && s.newest_version)
      t.full_versions += static_cast<double>(*s.newest_version - *s.first_version + 1);
  }
  return t;
}

// The trainer's `key` (a checked progress file holds it with its type), or null.
Json Reported(const Json& trainer, const char* key) {
  return trainer.is_object() && trainer.contains(key) ? trainer[key] : Json();
}

// The trainer's count of `key` if it reports one, else the config's (the progress denominators).
unsigned long long CountOr(const Json& trainer, const char* key, int configured) {
  const Json reported = Reported(trainer, key);
  return reported.is_null() ? static_cast<unsigned long long>(configured)
                            : reported.get<unsigned long long>();
}

// The mean reward of steps [from, to), weighted by their samples where they say how many; null
// when there are none.
Json MeanReward(const Json& steps, size_t from, size_t to) {
  double sum = 0, weight = 0;
  for (size_t i = from; i < to; ++i) {
    const double w = steps[i].contains("samples") ? steps[i]["samples"].get<double>() : 1.0;
    sum += w * steps[i]["reward"].get<double>();
    weight += w;
  }
  return weight > 0 ? Json(sum / weight) : Json();
}

// A figure of the summary: `format` applied to the number, or "n/a" when there is none.
std::string Figure(const Json& value, const char* format, double scale = 1.0) {
  if (!value.is_number()) return "n/a";
  char text[64];
  std::snprintf(text, sizeof(text), format, value.get<double>() * scale);
  return text;
}

}  // namespace

std::string SecondsOrNever(const Json& value, const char* format) {
  return value.is_number() ? Figure(value, format) : "never";
}

std::string ProgressLine(const Json& trainer, const orchestrator::wire::StatusPage* status,
                         const RunConfig& config) {
  std::ostringstream line;
  char buffer[256];
  const std::string phase = trainer.is_object() ? trainer.value("phase", "starting") : "starting";
  if (phase == "warm-up" || phase == "teacher") {
    std::snprintf(buffer, sizeof(buffer), "%s %llu/%llu",
                  phase == "teacher" ? "training the teacher" : "warm-up",
                  trainer.value("warmup_step", 0ULL),
                  CountOr(trainer, "warmup_steps", config.trainer.warmup_steps));
    line << buffer;
    if (trainer.contains("warmup_loss")) line << Figure(trainer["warmup_loss"], " loss %.3f");
  } else if (phase == "rl" || phase == "done") {
    const unsigned long long total = CountOr(trainer, "steps_total", config.trainer.steps);
    const Json& steps = trainer["steps"];
    if (!steps.empty()) {
      const Json& last = steps.back();
      std::snprintf(buffer, sizeof(buffer), "step %llu/%llu v%llu reward %.3f",
                    last["step"].get<unsigned long long>(), total,
                    last["version"].get<unsigned long long>(), last["reward"].get<double>());
      line << buffer;
      if (last.contains("mean_lag")) line << Figure(last["mean_lag"], " lag %.1f");
      if (last.contains("max_lag")) line << Figure(last["max_lag"], " (max %.0f)");
    } else {
      line << "step 0/" << total << " v0 (waiting for trajectories)";
    }
  } else {
    line << phase;
  }
  if (status != nullptr) {
    line << " | ready";
    for (const RegionConfig& r : config.regions) {
      const auto region = status->regions.find(r.name);
      const bool known = region != status->regions.end();
      line << " " << r.name << " " << (known ? region->second.ready : 0) << "/"
           << (known ? region->second.clusters : 0);
    }
    const SyncTotals totals = Totals(status);
    line << " | synced " << Megabytes(static_cast<double>(totals.bytes_sent));
    line << " | dropped " << status->trajectories.dropped_stale;
  } else {
    line << " | orchestrator not answering";
  }
  return line.str();
}

namespace {

// A chart of lines over x = 0..n-1 (one per named series; NaN: no point), from y = 0 up, at
// vertical offset `y0` of the picture.
void LineChart(std::ostringstream& svg, double y0, const std::string& title,
               const std::vector<std::pair<std::string, std::vector<double>>>& series,
               const std::string& x_label, const std::string& unit) {
  const double w = 720, h = 260, left = 60, right = 20, top = 30, bottom = 40;
  static const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  size_t n = 0;
  double high = 0;
  for (const auto& [name, values] : series) {
    n = std::max(n, values.size());
    for (double v : values)
      if (std::isfinite(v)) high = std::max(high, v);
  }
  high = high > 0 ? high * 1.1 : 1;
  auto x_of = [&](size_t i) {
    return left + (n <= 1
                       ? 0.0
                       : (w - left - right) * static_cast<double>(i) / static_cast<double>(n - 1));
  };
  auto y_of = [&](double v) { return y0 + h - bottom - (h - top - bottom) * v / high; };
  svg << "<text x=\"" << left << "\" y=\"" << y0 + 18 << "\" font-weight=\"bold\">" << title
      << "</text>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << y_of(0) << "\" x2=\"" << w - right << "\" y2=\""
      << y_of(0) << "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double v = high * k / 4;
    char label[32];
    std::snprintf(label, sizeof(label), "%.3g%s", v, unit.c_str());
    svg << "<text x=\"" << left - 8 << "\" y=\"" << y_of(v) + 4 << "\" text-anchor=\"end\">"
        << label << "</text>\n<line x1=\"" << left << "\" y1=\"" << y_of(v) << "\" x2=\""
        << w - right << "\" y2=\"" << y_of(v) << "\" stroke=\"#ddd\"/>\n";
  }
  for (size_t s = 0; s < series.size(); ++s) {
    const char* colour = kColours[s % 5];
    svg << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\" points=\"";
    for (size_t i = 0; i < series[s].second.size(); ++i)
      if (std::isfinite(series[s].second[i]))
        svg << x_of(i) << "," << y_of(series[s].second[i]) << " ";
    svg << "\"/>\n<text x=\"" << w - right - 150 << "\" y=\"" << y0 + 36 + 14 * s << "\" fill=\""
        << colour << "\">" << series[s].first << "</text>\n";
  }
  svg << "<text x=\"" << (w + left) / 2 << "\" y=\"" << y0 + h - 10 << "\" text-anchor=\"middle\">"
      << x_label << "</text>\n";
}

}  // namespace

std::string ReportSvg(const Json& report) {
  const Json& steps = report["per_step"];
  const double w = 720, h = 260, left = 60, right = 20, top = 30, bottom = 40;
  // The trainer's wait per step, and publication to 100% ready per version and region (when the
  // report has them).
  std::vector<std::pair<std::string, std::vector<double>>> waits, ready;
  if (report.contains("trainer_wait")) {
    std::vector<double> values;
    for (const Json& v : report["trainer_wait"]["per_step"]) values.push_back(v.get<double>());
    waits.emplace_back("wait", std::move(values));
  }
  if (report.contains("publication") && report.contains("regions")) {
    for (const Json& region : report["regions"]) {
      const std::string name = region["name"];
      std::vector<double> values;
      for (const Json& v : report["publication"]) {
        const Json& r = v["regions"].contains(name) ? v["regions"][name] : Json();
        values.push_back(r.is_object() && r["ready_100_seconds"].is_number()
                             ? r["ready_100_seconds"].get<double>()
                             : std::nan(""));
      }
      ready.emplace_back(name, std::move(values));
    }
  }
  const int charts = 2 + (waits.empty() ? 0 : 1) + (ready.empty() ? 0 : 1);
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\""
      << charts * (h + 20)
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
         "fill=\"white\"/>\n";
  const size_t n = steps.size();
  auto x_of = [&](size_t i) {
    return left + (n <= 1
                       ? 0.0
                       : (w - left - right) * static_cast<double>(i) / static_cast<double>(n - 1));
  };
  // Reward.
  svg << "<text x=\"" << left
      << "\" y=\"18\" font-weight=\"bold\">Mean reward of each step's batch (the rollouts' own "
         "rewards)</text>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << h - bottom << "\" x2=\"" << w - right << "\" y2=\""
      << h - bottom << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
      << h - bottom << "\" stroke=\"black\"/>\n";
  for (double r : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    const double y = h - bottom - (h - top - bottom) * r;
    svg << "<text x=\"" << left - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << r
        << "</text>\n";
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << w - right << "\" y2=\"" << y
        << "\" stroke=\"#ddd\"/>\n";
  }
  svg << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"";
  for (size_t i = 0; i < n; ++i) {
    svg << x_of(i) << ","
        << h - bottom - (h - top - bottom) * std::clamp(steps[i].value("reward", 0.0), 0.0, 1.0)
        << " ";
  }
  svg << "\"/>\n<text x=\"" << (w + left) / 2 << "\" y=\"" << h - 10
      << "\" text-anchor=\"middle\">step</text>\n";
  // Step (and version) numbers under both charts.
  auto ticks = [&](double axis_y) {
    for (size_t k = 0; k < 5 && n > 0; ++k) {
      const size_t i = (n - 1) * k / 4;
      svg << "<text x=\"" << x_of(i) << "\" y=\"" << axis_y + 14 << "\" text-anchor=\"middle\">"
          << steps[i].value("step", 0) << "</text>\n";
    }
  };
  ticks(h - bottom);
  // Bytes per version, log scale, against one full checkpoint (if the trainer said its size).
  const bool full_known = report["full_checkpoint_bytes"].is_number();
  const double full =
      std::max(1.0, full_known ? report["full_checkpoint_bytes"].get<double>() : 1.0);
  const double y0 = h + 20;
  svg << "<text x=\"" << left << "\" y=\"" << y0 + 18
      << "\" font-weight=\"bold\">Delta bytes of each version (log scale); red: one full "
         "checkpoint</text>\n";
  const double low = 1e3, high = std::max(full * 2, 1e4);
  auto y_of = [&](double bytes) {
    const double f =
        (std::log10(std::max(bytes, low)) - std::log10(low)) / (std::log10(high) - std::log10(low));
    return y0 + h - bottom - (h - top - bottom) * f;
  };
  svg << "<line x1=\"" << left << "\" y1=\"" << y0 + h - bottom << "\" x2=\"" << w - right
      << "\" y2=\"" << y0 + h - bottom << "\" stroke=\"black\"/>\n";
  for (double b = low; b <= high; b *= 10) {
    svg << "<text x=\"" << left - 8 << "\" y=\"" << y_of(b) + 4 << "\" text-anchor=\"end\">"
        << Megabytes(b) << "</text>\n";
  }
  const double bar = std::max(1.0, (w - left - right) / std::max<size_t>(1, n) - 1);
  for (size_t i = 0; i < n; ++i) {
    const double bytes = steps[i].value("delta_bytes", 0.0);
    svg << "<rect x=\"" << x_of(i) - bar / 2 << "\" y=\"" << y_of(bytes) << "\" width=\"" << bar
        << "\" height=\"" << y0 + h - bottom - y_of(bytes) << "\" fill=\"#2ca02c\"/>\n";
  }
  if (full_known) {
    svg << "<line x1=\"" << left << "\" y1=\"" << y_of(full) << "\" x2=\"" << w - right
        << "\" y2=\"" << y_of(full) << "\" stroke=\"red\" stroke-dasharray=\"4\"/>\n";
  }
  ticks(y0 + h - bottom);
  svg << "<text x=\"" << (w + left) / 2 << "\" y=\"" << y0 + h - 10
      << "\" text-anchor=\"middle\">version</text>\n";
  double next = y0 + h + 20;
  if (!waits.empty()) {
    LineChart(svg, next, "Trainer wait for trajectories, per step", waits, "step", " s");
    next += h + 20;
  }
  if (!ready.empty()) {
    LineChart(svg, next,
              "Publication to 100% of a region's clusters ready, per version (the last " +
                  std::to_string(report["publication"].size()) + ")",
              ready, "version", " s");
  }
  svg << "</svg>\n";
  return svg.str();
}

Json RegionsReport(const orchestrator::wire::StatusPage* status, const Json& relays) {
  Json regions = Json::array();
  if (status == nullptr) return regions;
  for (const auto& [name, region] : status->regions) {
    std::vector<double> after[3];
    uint64_t missed = 0;
    for (const orchestrator::wire::StatusPage::Version& v : status->versions) {
      auto found = v.regions.find(name);
      if (found == v.regions.end() || found->second.population == 0) continue;
      const orchestrator::wire::StatusPage::Readiness& r = found->second;
      if (!r.missed && !r.ready_100_seconds) continue;  // the latest, still under way
      missed += r.missed.value_or(0);
      const std::optional<double>* fractions[3] = {&r.ready_50_seconds, &r.ready_90_seconds,
                                                   &r.ready_100_seconds};
      for (int i = 0; i < 3; ++i)
        after[i].push_back(fractions[i]->value_or(std::numeric_limits<double>::infinity()));
    }
    Json ready = sim::ReadyAfterPublication(after);
    ready["clusters_missed"] = missed;
    const Json relay = relays.is_object() && relays.contains(name) ? relays[name] : Json();
    regions.push_back(
        {{"name", name},
         {"clusters_registered", region.clusters},
         {"groups_accepted", region.accepted},
         {"groups_delivered", region.delivered},
         {"groups_dropped_stale", region.dropped_stale},
         {"ready_after_publication", std::move(ready)},
         {"sync_bytes", region.sync.bytes_downloaded},
         {"wan_bytes", relay.is_object() ? relay.value("upstream_bytes", Json()) : Json()}});
  }
  return regions;
}

namespace {

// The trainer's wait for trajectories: per step from its progress file when it reports it (the
// built-in trainer does), else what the orchestrator was told (its latest batch calls only).
Json TrainerWait(const Json& per_step, const orchestrator::wire::StatusPage* status) {
  Json waits = Json::array();
  for (const Json& s : per_step)
    if (s.contains("wait_seconds")) waits.push_back(s["wait_seconds"]);
  std::string source = "trainer";
  double total = 0;
  if (waits.empty() && status != nullptr) {
    source = "orchestrator (latest batch calls)";
    for (double w : status->trainer.recent_wait_seconds) waits.push_back(w);
  }
  for (const Json& w : waits) total += w.get<double>();
  if (source != "trainer" && status != nullptr) total = status->trainer.wait_seconds_total;
  const uint64_t steps =
      source == "trainer" || status == nullptr ? waits.size() : status->trainer.steps_reported;
  return {{"source", source},
          {"steps", steps},
          {"total_seconds", total},
          {"mean_seconds", steps > 0 ? Json(total / static_cast<double>(steps)) : Json()},
          {"per_step", waits}};
}

}  // namespace

std::string ReportHtml(const Json& report) {
  auto escape = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '<')
        out += "&lt;";
      else if (c == '>')
        out += "&gt;";
      else if (c == '&')
        out += "&amp;";
      else if (c == '"')
        out += "&quot;";
      else
        out += c;
    }
    return out;
  };
  auto text = [&](const Json& value) {
    return escape(value.is_null()     ? std::string("-")
                  : value.is_string() ? value.get<std::string>()
                                      : value.dump());
  };
  auto seconds = [](const Json& value) { return SecondsOrNever(value, "%.3f s"); };
  std::ostringstream html;
  const std::string run = report.value("run", std::string());
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>weft run: " << escape(run)
       << "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
          "margin-bottom:1em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
          "th{background:#eee}td:first-child{text-align:left}</style></head><body>\n";
  html << "<h1>weft run: " << escape(run) << "</h1>\n<table>\n";
  for (const char* key :
       {"completed", "failure", "seconds", "steps", "versions_published", "initial_reward",
        "final_reward", "eval_accuracy_before", "eval_accuracy_after", "bytes_sent", "bytes_wan",
        "mean_density", "delivered_per_s", "trajectories_dropped_stale", "digest_mismatches",
        "staleness_violations"}) {
    html << "<tr><td>" << key << "</td><td>" << text(report.value(key, Json())) << "</td></tr>\n";
  }
  const Json wait = report.value("trainer_wait", Json::object());
  html << "<tr><td>trainer wait (mean per step, total)</td><td>"
       << seconds(wait.value("mean_seconds", Json())) << ", "
       << seconds(wait.value("total_seconds", Json())) << "</td></tr>\n</table>\n";
  html << "<h2>Regions: publication to ready (median over versions; worst)</h2>\n<table><tr>"
          "<th>region</th><th>versions</th><th>ready 50%</th><th>ready 90%</th><th>ready 100%</th>"
          "<th>worst 100%</th><th>never fully ready</th><th>clusters missed</th><th>delivered</th>"
          "<th>dropped stale</th><th>weights downloaded</th><th>WAN (relay)</th></tr>\n";
  for (const Json& r : report.value("regions", Json::array())) {
    const Json& q = r["ready_after_publication"];
    html << "<tr><td>" << text(r["name"]) << "</td><td>" << q["versions"] << "</td><td>"
         << seconds(q["p50_median"]) << "</td><td>" << seconds(q["p90_median"]) << "</td><td>"
         << seconds(q["p100_median"]) << "</td><td>" << seconds(q["p100_worst"]) << "</td><td>"
         << q["versions_never_fully_ready"] << "</td><td>" << q["clusters_missed"] << "</td><td>"
         << r["groups_delivered"] << "</td><td>" << r["groups_dropped_stale"] << "</td><td>"
         << Megabytes(r["sync_bytes"].get<double>()) << "</td><td>"
         << (r["wan_bytes"].is_number() ? Megabytes(r["wan_bytes"].get<double>()) : "-")
         << "</td></tr>\n";
  }
  html << "</table>\n<h2>Figures</h2>\n" << ReportSvg(report) << "</body></html>\n";
  return html.str();
}

Json BuildReport(const RunConfig& config, const RunOutcome& outcome) {
  const Json& trainer = outcome.trainer;
  const orchestrator::wire::StatusPage* status = outcome.status ? &*outcome.status : nullptr;
  const bool trained = trainer.is_object() && trainer.value("phase", "") == "done";
  const SyncTotals totals = Totals(status);
  // The orchestrator's section: parts of its status page, as /v1/status gives them.
  Json orchestrator;
  if (status != nullptr) {
    const Json page = Json::parse(orchestrator::wire::Encode(*status));
    orchestrator = Json::object();
    for (const char* key :
         {"jobs", "leases", "clusters_lost", "trajectories", "journal", "regions", "clusters"})
      orchestrator[key] = page[key];
  }
  // One full checkpoint in the serving format, if the trainer said.
  const Json full = Reported(trainer, "served_bytes");
  const double full_versions_bytes =
      full.is_null() ? 0.0 : totals.full_versions * full.get<double>();
  uint64_t wan = 0, corrupted = 0;
  for (const auto& [name, stats] : outcome.relays.items()) {
    if (!stats.is_object()) continue;
    wan += stats.value("upstream_bytes", uint64_t{0});
    corrupted += stats.value("corrupted", uint64_t{0});
  }
  const Json per_step =
      trainer.is_object() && trainer.contains("steps") ? trainer["steps"] : Json::array();
  double density_sum = 0;
  size_t densities = 0;
  for (const Json& s : per_step) {
    if (!s.contains("density")) continue;
    density_sum += s["density"].get<double>();
    ++densities;
  }
  // The rewards of the first and last steps' batches, as the trainer computed them or, if it did
  // not, from its steps (the example trainer's way: the first and last 5, by samples).
  const size_t window = std::min<size_t>(5, per_step.size());
  Json initial_reward = Reported(trainer, "initial_reward");
  if (initial_reward.is_null()) initial_reward = MeanReward(per_step, 0, window);
  Json final_reward = Reported(trainer, "final_reward");
  if (final_reward.is_null())
    final_reward = MeanReward(per_step, per_step.size() - window, per_step.size());
  Json report = {
      {"run", config.run_id},
      {"config", outcome.config_path},
      {"trainer", TrainerDescription(config)},
      {"completed", outcome.failure.empty()},
      {"failure", outcome.failure.empty() ? Json(nullptr) : Json(outcome.failure)},
      {"progress_error",
       outcome.progress_problem.empty() ? Json(nullptr) : Json(outcome.progress_problem)},
      {"seconds", outcome.seconds},
      {"task", "two-number addition, " + std::to_string(config.trainer.digits) +
                   "-digit operands, exact-match reward"},
      {"initial_reward", initial_reward},
      {"final_reward", final_reward},
      {"random_policy_reward", Reported(trainer, "random_policy_reward")},
      {"eval_accuracy_before", Reported(trainer, "eval_accuracy_before")},
      {"eval_accuracy_after", trained ? Reported(trainer, "eval_accuracy_after") : Json(nullptr)},
      {"algorithm", config.trainer.algorithm},
      {"teacher_accuracy", Reported(trainer, "teacher_accuracy")},
      {"groups_scored", Reported(trainer, "groups_scored")},
      {"trajectories_accepted", status != nullptr ? status->trajectories.accepted : 0},
      {"warmup_steps", CountOr(trainer, "warmup_steps", config.trainer.warmup_steps)},
      {"steps", per_step.size()},
      {"versions_published", Reported(trainer, "versions_published")},
      {"parameters", Reported(trainer, "parameters")},
      {"full_checkpoint_bytes", full},
      {"digest_mismatches", totals.digest_mismatches},
      {"staleness_violations", Reported(trainer, "staleness_violations")},
      {"max_staleness", config.orchestrator.core.max_staleness},
      {"trajectories_dropped_stale", status != nullptr ? status->trajectories.dropped_stale : 0},
      {"trajectories_delivered_stale",
       status != nullptr ? status->trajectories.delivered_stale : 0},
      {"bytes_sent", totals.bytes_sent},
      {"bytes_full_equivalent", full.is_null() ? Json() : Json(full_versions_bytes)},
      {"bytes_sent_fraction",
       full.is_null() ? Json()
       : full_versions_bytes > 0
           ? Json(static_cast<double>(totals.bytes_sent) / full_versions_bytes)
           : Json(0.0)},
      {"bytes_wan", wan},
      {"bytes_published", Reported(trainer, "bytes_published")},
      {"mean_density",
       densities == 0 ? Json() : Json(density_sum / static_cast<double>(densities))},
      {"clusters", totals.clusters},
      {"pulls", totals.pulls},
      {"keyframe_pulls", totals.keyframe_pulls},
      {"max_commit_pause_ms", totals.max_pause_ms},
      {"relays", outcome.relays},
      {"relay_corrupted_blobs_refetched", corrupted},
      {"orchestrator", orchestrator},
      {"restarts", Json::object()},
      {"per_step", per_step}};
  report["regions"] = RegionsReport(status, outcome.relays);
  report["trainer_wait"] = TrainerWait(per_step, status);
  report["publication"] = Json::array();
  report["delivered_per_s"] = nullptr;
  if (status != nullptr) {
    const Json page = Json::parse(orchestrator::wire::Encode(*status));
    report["publication"] = page["versions"];
    if (outcome.seconds > 0) {
      report["delivered_per_s"] = static_cast<double>(status->trajectories.delivered_fresh +
                                                      status->trajectories.delivered_stale) /
                                  outcome.seconds;
    }
  }
  for (const auto& [name, restarts] : outcome.restarts) report["restarts"][name] = restarts;
  return report;
}

void PrintSummary(const RunConfig& config, const Json& report) {
  const bool failed = !report["failure"].is_null();
  std::printf("\nsummary of run %s (%.0f s%s; trainer: %s)\n", config.run_id.c_str(),
              report["seconds"].get<double>(),
              failed ? (", " + report["failure"].get<std::string>()).c_str() : "",
              report["trainer"].get<std::string>().c_str());
  std::printf(
      "  reward            %s -> %s over %zu RL steps (first and last 5 steps' batches; random "
      "policy %s)\n",
      Figure(report["initial_reward"], "%.3f").c_str(),
      Figure(report["final_reward"], "%.3f").c_str(), report["per_step"].size(),
      Figure(report["random_policy_reward"], "%.5f").c_str());
  const std::string after = !report["eval_accuracy_after"].is_null()
                                ? Figure(report["eval_accuracy_after"], "%.3f")
                            : failed ? "not measured (unfinished)"
                                     : "not reported";
  std::printf(
      "  greedy accuracy   %s -> %s (%d held-out problems; after a %llu-step supervised warm-up)\n",
      Figure(report["eval_accuracy_before"], "%.3f").c_str(), after.c_str(),
      config.trainer.eval_problems, report["warmup_steps"].get<unsigned long long>());
  auto count = [&](const char* key) { return Figure(report[key], "%.0f"); };
  std::printf(
      "  versions          %s published, %s pulls by %s workers (%s from a keyframe), digest "
      "mismatches %s\n",
      count("versions_published").c_str(), count("pulls").c_str(), count("clusters").c_str(),
      count("keyframe_pulls").c_str(), count("digest_mismatches").c_str());
  std::printf("  staleness         bound %s, violations %s, dropped stale %s\n",
              count("max_staleness").c_str(), count("staleness_violations").c_str(),
              count("trajectories_dropped_stale").c_str());
  std::printf(
      "  bytes to workers  %s, %s%% of %s for full checkpoints (mean density %s%% of served "
      "elements per version); WAN %s\n",
      Megabytes(static_cast<double>(report["bytes_sent"].get<uint64_t>())).c_str(),
      Figure(report["bytes_sent_fraction"], "%.1f", 100.0).c_str(),
      report["bytes_full_equivalent"].is_number()
          ? Megabytes(report["bytes_full_equivalent"].get<double>()).c_str()
          : "n/a",
      Figure(report["mean_density"], "%.2f", 100.0).c_str(),
      Megabytes(static_cast<double>(report["bytes_wan"].get<uint64_t>())).c_str());
  for (const Json& r : report.value("regions", Json::array())) {
    const Json& q = r["ready_after_publication"];
    auto after = [&](const char* key) { return SecondsOrNever(q[key]); };
    std::printf(
        "  ready %-11s 50%% %s, 90%% %s, 100%% %s after publication (median of %s versions; worst "
        "100%% %s)\n",
        r["name"].get<std::string>().c_str(), after("p50_median").c_str(),
        after("p90_median").c_str(), after("p100_median").c_str(),
        Figure(q["versions"], "%.0f").c_str(), after("p100_worst").c_str());
  }
  const Json wait = report.value("trainer_wait", Json::object());
  if (wait.value("steps", 0) > 0) {
    std::printf("  trainer wait      %s per step (mean over %s steps), %s in all\n",
                Figure(wait["mean_seconds"], "%.3f s").c_str(),
                Figure(wait["steps"], "%.0f").c_str(),
                Figure(wait["total_seconds"], "%.1f s").c_str());
  }
}

}  // namespace weft::cli
