#include "cli/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

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

SyncTotals Totals(const Json& status) {
  SyncTotals t;
  if (!status.is_object() || !status.contains("clusters")) return t;
  for (const Json& c : status["clusters"]) {
    if (!c.contains("sync")) continue;
    const Json& s = c["sync"];
    ++t.clusters;
    t.bytes_sent += s["bytes_downloaded"].get<uint64_t>();
    t.digest_mismatches += s["digest_mismatches"].get<uint64_t>();
    t.pulls += s["pulls"].get<uint64_t>();
    t.keyframe_pulls += s["keyframe_pulls"].get<uint64_t>();
    t.max_pause_ms = std::max(t.max_pause_ms, s["max_pause_ms"].get<double>());
    if (!s["first_version"].is_null() && !s["newest_version"].is_null()) {
      t.full_versions += static_cast<double>(s["newest_version"].get<uint64_t>() -
                                             s["first_version"].get<uint64_t>() + 1);
    }
  }
  return t;
}

}  // namespace

std::string ProgressLine(const Json& trainer, const Json& status, const RunConfig& config) {
  std::ostringstream line;
  char buffer[256];
  const std::string phase = trainer.is_object() ? trainer.value("phase", "starting") : "starting";
  if (phase == "warm-up") {
    std::snprintf(buffer, sizeof(buffer), "warm-up %d/%d loss %.3f",
                  trainer.value("warmup_step", 0), config.trainer.warmup_steps,
                  trainer.value("warmup_loss", 0.0));
    line << buffer;
  } else if (phase == "rl" || phase == "done") {
    const Json& steps = trainer["steps"];
    if (!steps.empty()) {
      const Json& last = steps.back();
      std::snprintf(buffer, sizeof(buffer), "step %d/%d v%llu reward %.3f lag %.1f (max %llu)",
                    last.value("step", 0), config.trainer.steps,
                    static_cast<unsigned long long>(last.value("version", uint64_t{0})),
                    last.value("reward", 0.0), last.value("mean_lag", 0.0),
                    static_cast<unsigned long long>(last.value("max_lag", uint64_t{0})));
      line << buffer;
    } else {
      line << "step 0/" << config.trainer.steps << " v0 (waiting for trajectories)";
    }
  } else {
    line << phase;
  }
  if (status.is_object() && status.contains("regions")) {
    line << " | ready";
    for (const RegionConfig& r : config.regions) {
      const Json region = status["regions"].contains(r.name) ? status["regions"][r.name] : Json();
      line << " " << r.name << " " << (region.is_object() ? region.value("ready", 0) : 0) << "/"
           << (region.is_object() ? region.value("clusters", 0) : 0);
    }
    const SyncTotals totals = Totals(status);
    line << " | synced " << Megabytes(static_cast<double>(totals.bytes_sent));
    line << " | dropped " << status["trajectories"].value("dropped_stale", uint64_t{0});
  } else {
    line << " | orchestrator not answering";
  }
  return line.str();
}

std::string ReportSvg(const Json& report) {
  const Json& steps = report["per_step"];
  const double w = 720, h = 260, left = 60, right = 20, top = 30, bottom = 40;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << 2 * h + 20
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
  // Bytes per version, log scale, against one full checkpoint.
  const double full = std::max(1.0, report.value("full_checkpoint_bytes", 1.0));
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
  svg << "<line x1=\"" << left << "\" y1=\"" << y_of(full) << "\" x2=\"" << w - right << "\" y2=\""
      << y_of(full) << "\" stroke=\"red\" stroke-dasharray=\"4\"/>\n";
  ticks(y0 + h - bottom);
  svg << "<text x=\"" << (w + left) / 2 << "\" y=\"" << y0 + h - 10
      << "\" text-anchor=\"middle\">version</text>\n</svg>\n";
  return svg.str();
}

Json BuildReport(const RunConfig& config, const RunOutcome& outcome) {
  const Json& trainer = outcome.trainer;
  const Json& status = outcome.status;
  const bool trained = trainer.is_object() && trainer.value("phase", "") == "done";
  const SyncTotals totals = Totals(status);
  const double full = trainer.is_object() ? trainer.value("served_bytes", 0.0) : 0.0;
  uint64_t wan = 0, corrupted = 0;
  for (const auto& [name, stats] : outcome.relays.items()) {
    if (!stats.is_object()) continue;
    wan += stats.value("upstream_bytes", uint64_t{0});
    corrupted += stats.value("corrupted", uint64_t{0});
  }
  Json per_step =
      trainer.is_object() && trainer.contains("steps") ? trainer["steps"] : Json::array();
  double density_sum = 0;
  for (const Json& s : per_step) density_sum += s.value("density", 0.0);
  auto value = [&](const char* key, auto fallback) {
    return trainer.is_object() ? trainer.value(key, fallback) : fallback;
  };
  Json report = {
      {"run", config.run_id},
      {"config", outcome.config_path},
      {"completed", outcome.failure.empty()},
      {"failure", outcome.failure.empty() ? Json(nullptr) : Json(outcome.failure)},
      {"seconds", outcome.seconds},
      {"task", "two-number addition, " + std::to_string(config.trainer.digits) +
                   "-digit operands, exact-match reward"},
      {"initial_reward", value("initial_reward", 0.0)},
      {"final_reward", value("final_reward", 0.0)},
      {"random_policy_reward", value("random_policy_reward", 0.0)},
      {"eval_accuracy_before", value("eval_accuracy_before", 0.0)},
      {"eval_accuracy_after", trained ? Json(value("eval_accuracy_after", 0.0)) : Json(nullptr)},
      {"warmup_steps", config.trainer.warmup_steps},
      {"steps", per_step.size()},
      {"versions_published", value("versions_published", uint64_t{0})},
      {"parameters", value("parameters", uint64_t{0})},
      {"full_checkpoint_bytes", full},
      {"digest_mismatches", totals.digest_mismatches},
      {"staleness_violations", value("staleness_violations", uint64_t{0})},
      {"max_staleness", config.orchestrator.core.max_staleness},
      {"trajectories_dropped_stale",
       status.is_object() ? status["trajectories"].value("dropped_stale", uint64_t{0}) : 0},
      {"trajectories_delivered_stale",
       status.is_object() ? status["trajectories"].value("delivered_stale", uint64_t{0}) : 0},
      {"bytes_sent", totals.bytes_sent},
      {"bytes_full_equivalent", totals.full_versions * full},
      {"bytes_sent_fraction",
       totals.full_versions * full > 0
           ? static_cast<double>(totals.bytes_sent) / (totals.full_versions * full)
           : 0.0},
      {"bytes_wan", wan},
      {"bytes_published", value("bytes_published", uint64_t{0})},
      {"mean_density", per_step.empty() ? 0.0 : density_sum / static_cast<double>(per_step.size())},
      {"clusters", totals.clusters},
      {"pulls", totals.pulls},
      {"keyframe_pulls", totals.keyframe_pulls},
      {"max_commit_pause_ms", totals.max_pause_ms},
      {"relays", outcome.relays},
      {"relay_corrupted_blobs_refetched", corrupted},
      {"orchestrator", status.is_object() ? Json{{"jobs", status["jobs"]},
                                                 {"leases", status["leases"]},
                                                 {"clusters_lost", status["clusters_lost"]},
                                                 {"trajectories", status["trajectories"]},
                                                 {"journal", status["journal"]},
                                                 {"regions", status["regions"]},
                                                 {"clusters", status["clusters"]}}
                                          : Json()},
      {"restarts", Json::object()},
      {"per_step", per_step}};
  for (const auto& [name, restarts] : outcome.restarts) report["restarts"][name] = restarts;
  return report;
}

void PrintSummary(const RunConfig& config, const Json& report) {
  const bool failed = !report["failure"].is_null();
  std::printf("\nsummary of run %s (%.0f s%s)\n", config.run_id.c_str(),
              report["seconds"].get<double>(),
              failed ? (", " + report["failure"].get<std::string>()).c_str() : "");
  std::printf(
      "  reward            %.3f -> %.3f over %zu RL steps (first and last 5 steps' batches; random "
      "policy %.5f)\n",
      report["initial_reward"].get<double>(), report["final_reward"].get<double>(),
      report["per_step"].size(), report["random_policy_reward"].get<double>());
  const bool trained = !report["eval_accuracy_after"].is_null();
  std::printf(
      "  greedy accuracy   %.3f -> %s (%d held-out problems; after a %d-step supervised warm-up)\n",
      report["eval_accuracy_before"].get<double>(),
      trained ? std::to_string(report["eval_accuracy_after"].get<double>()).substr(0, 5).c_str()
              : "not measured (unfinished)",
      config.trainer.eval_problems, config.trainer.warmup_steps);
  auto count = [&](const char* key) {
    return static_cast<unsigned long long>(report[key].get<uint64_t>());
  };
  std::printf(
      "  versions          %llu published, %llu pulls by %llu workers (%llu from a keyframe), "
      "digest mismatches %llu\n",
      count("versions_published"), count("pulls"), count("clusters"), count("keyframe_pulls"),
      count("digest_mismatches"));
  std::printf("  staleness         bound %llu, violations %llu, dropped stale %llu\n",
              count("max_staleness"), count("staleness_violations"),
              count("trajectories_dropped_stale"));
  std::printf(
      "  bytes to workers  %s, %.1f%% of %s for full checkpoints (mean density %.2f%% of served "
      "elements per version); WAN %s\n",
      Megabytes(static_cast<double>(report["bytes_sent"].get<uint64_t>())).c_str(),
      100.0 * report["bytes_sent_fraction"].get<double>(),
      Megabytes(report["bytes_full_equivalent"].get<double>()).c_str(),
      100.0 * report["mean_density"].get<double>(),
      Megabytes(static_cast<double>(report["bytes_wan"].get<uint64_t>())).c_str());
}

}  // namespace weft::cli
