#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

namespace weft::sim {
namespace {

using Json = nlohmann::json;

std::string Fixed(double x, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, x);
  return text;
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 5) {
    bytes /= 1000;
    ++unit;
  }
  return Fixed(bytes, bytes < 10 ? 2 : 1) + " " + units[unit];
}

std::string SecondsText(const Json& value) {
  return value.is_number() ? Fixed(value.get<double>(), 1) + " s" : "never";
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

// A grouped bar chart: one group per category, one bar per series.
struct Chart {
  std::string title;
  std::vector<std::string> categories;
  std::vector<std::string> series;
  std::vector<std::vector<double>> values;  // [series][category]
  bool log_scale = false;
  std::string (*label)(double) = nullptr;
};

const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};

double DrawChart(std::ostringstream& svg, const Chart& chart, double y0, double width) {
  const double height = 230, left = 80, right = 20, top = 40, bottom = 40;
  const double plot_h = height - top - bottom;
  double high = 0, low = 1e300;
  for (const auto& row : chart.values) {
    for (double v : row) {
      high = std::max(high, v);
      if (v > 0) low = std::min(low, v);
    }
  }
  if (high <= 0) high = 1;
  if (chart.log_scale) {
    low = std::pow(10, std::floor(std::log10(std::min(low, high))));
    high = std::pow(10, std::ceil(std::log10(high)));
    if (high <= low) high = low * 10;
  } else {
    low = 0;
    high *= 1.1;
  }
  auto y_of = [&](double v) {
    double f;
    if (chart.log_scale) {
      f = v <= 0 ? 0
                 : (std::log10(std::max(v, low)) - std::log10(low)) /
                       (std::log10(high) - std::log10(low));
    } else {
      f = v / high;
    }
    return y0 + top + plot_h * (1 - std::clamp(f, 0.0, 1.0));
  };
  svg << "<text x=\"" << left << "\" y=\"" << y0 + 20 << "\" font-weight=\"bold\">"
      << Escape(chart.title) << "</text>\n";
  // Axis and grid.
  std::vector<double> ticks;
  if (chart.log_scale) {
    for (double t = low; t <= high * 1.0001; t *= 10) ticks.push_back(t);
  } else {
    for (int i = 0; i <= 4; ++i) ticks.push_back(high * i / 4);
  }
  for (double t : ticks) {
    const double y = y_of(t);
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << width - right << "\" y2=\""
        << y << "\" stroke=\"#ddd\"/>\n<text x=\"" << left - 6 << "\" y=\"" << y + 4
        << "\" text-anchor=\"end\">" << Escape(chart.label(t)) << "</text>\n";
  }
  svg << "<line x1=\"" << left << "\" y1=\"" << y0 + top + plot_h << "\" x2=\"" << width - right
      << "\" y2=\"" << y0 + top + plot_h << "\" stroke=\"black\"/>\n";
  const size_t groups = std::max<size_t>(1, chart.categories.size());
  const double group_w = (width - left - right) / static_cast<double>(groups);
  const double bar_w = std::max(
      1.0, (group_w * 0.8) / static_cast<double>(std::max<size_t>(1, chart.series.size())));
  for (size_t g = 0; g < chart.categories.size(); ++g) {
    const double x0 = left + group_w * static_cast<double>(g) + group_w * 0.1;
    for (size_t s = 0; s < chart.series.size(); ++s) {
      const double v = chart.values[s][g];
      const double y = y_of(v);
      svg << "<rect x=\"" << x0 + bar_w * static_cast<double>(s) << "\" y=\"" << y << "\" width=\""
          << bar_w - 1 << "\" height=\"" << y0 + top + plot_h - y << "\" fill=\"" << kColours[s % 5]
          << "\"><title>" << Escape(chart.series[s]) << ": " << Escape(chart.label(v))
          << "</title></rect>\n";
    }
    svg << "<text x=\"" << x0 + group_w * 0.4 << "\" y=\"" << y0 + top + plot_h + 16
        << "\" text-anchor=\"middle\">" << Escape(chart.categories[g]) << "</text>\n";
  }
  // Legend.
  double lx = left + 360;
  for (size_t s = 0; s < chart.series.size() && chart.series.size() > 1; ++s) {
    svg << "<rect x=\"" << lx << "\" y=\"" << y0 + 28 << "\" width=\"10\" height=\"10\" fill=\""
        << kColours[s % 5] << "\"/><text x=\"" << lx + 14 << "\" y=\"" << y0 + 37 << "\">"
        << Escape(chart.series[s]) << "</text>\n";
    lx += 14 + 7.0 * static_cast<double>(chart.series[s].size()) + 16;
  }
  return y0 + height;
}

std::string SecondsLabel(double s) { return Fixed(s, s < 10 ? 1 : 0) + " s"; }
std::string BytesLabel(double b) { return Bytes(b); }
std::string FractionLabel(double f) { return Fixed(100 * f, 0) + "%"; }
std::string CountLabel(double n) { return Fixed(n, 0); }

}  // namespace

nlohmann::json ReadyAfterPublication(const std::vector<double> (&after)[3]) {
  // The median and the worst over versions, "never" (infinite) counting as the longest.
  auto median_and_worst = [](std::vector<double> values) -> std::pair<Json, Json> {
    if (values.empty()) return {nullptr, nullptr};
    std::sort(values.begin(), values.end());
    auto finite = [](double x) { return std::isinf(x) ? Json(nullptr) : Json(x); };
    return {finite(values[values.size() / 2]), finite(values.back())};
  };
  const auto [p50, p50_worst] = median_and_worst(after[0]);
  const auto [p90, p90_worst] = median_and_worst(after[1]);
  const auto [p100, p100_worst] = median_and_worst(after[2]);
  return {{"versions", after[2].size()},
          {"p50_median", p50},
          {"p90_median", p90},
          {"p100_median", p100},
          {"p50_worst", p50_worst},
          {"p90_worst", p90_worst},
          {"p100_worst", p100_worst},
          {"versions_never_fully_ready", std::count_if(after[2].begin(), after[2].end(),
                                                       [](double x) { return std::isinf(x); })}};
}

std::string SummaryText(const Json& report) {
  std::ostringstream out;
  const Json& t = report["trainer"];
  const Json& tr = report["trajectories"];
  out << report["name"].get<std::string>() << " (seed " << report["seed"]
      << "): " << Fixed(report["simulated_seconds"].get<double>(), 0) << " simulated seconds, "
      << report["events"] << " events, " << report["invariant_checks"] << " invariant checks\n";
  out << "  trainer: " << t["steps"] << " steps, " << t["versions_published"] << " versions, idle "
      << Fixed(100 * t["idle_fraction"].get<double>(), 1) << "%\n";
  out << "  trajectories: " << tr["accepted"] << " accepted, " << tr["delivered_fresh"]
      << " delivered fresh, " << tr["delivered_stale"] << " delivered stale, "
      << tr["dropped_stale"] << " dropped stale, " << tr["given_up"] << " given up; mean lag "
      << Fixed(report["staleness"]["mean"].get<double>(), 2) << "\n";
  out << "  region        util  ready p50 / p90 / p100 (median over versions)  WAN bytes"
         " (relay | none | full ckpt)\n";
  for (const Json& r : report["regions"]) {
    const Json& ready = r["ready_after_publication"];
    char line[512];
    std::snprintf(
        line, sizeof(line), "  %-12s %5.1f%%  %8s / %8s / %8s%s  %s | %s | %s\n",
        r["name"].get<std::string>().c_str(), 100 * r["rollout_utilisation"].get<double>(),
        SecondsText(ready["p50_median"]).c_str(), SecondsText(ready["p90_median"]).c_str(),
        SecondsText(ready["p100_median"]).c_str(),
        ready["versions_never_fully_ready"].get<uint64_t>() > 0
            ? (" (" + std::to_string(ready["versions_never_fully_ready"].get<uint64_t>()) +
               " never all)")
                  .c_str()
            : "",
        Bytes(r["wan_bytes_with_relay"].get<double>()).c_str(),
        Bytes(r["wan_bytes_without_relay"].get<double>()).c_str(),
        Bytes(r["wan_bytes_full_checkpoints_with_relay"].get<double>()).c_str());
    out << line;
  }
  if (!report["failure"].is_null())
    out << "  FAILED: " << report["failure"].get<std::string>() << "\n";
  return out.str();
}

std::string ReportSvg(const Json& report) {
  const double width = 900;
  std::ostringstream body;
  std::vector<std::string> names;
  Chart ready{"Publication to ready, per region (median over versions; no bar: never)",
              {},
              {"50%", "90%", "100%"},
              {{}, {}, {}},
              false,
              SecondsLabel};
  Chart util{"Rollout utilisation (busy slot time / slot time up)",
             {},
             {"utilisation"},
             {{}},
             false,
             FractionLabel};
  Chart wan{"WAN bytes per region (log scale)",
            {},
            {"deltas, relay", "deltas, no relay", "full checkpoints, relay"},
            {{}, {}, {}},
            true,
            BytesLabel};
  for (const Json& r : report["regions"]) {
    const std::string name = r["name"].get<std::string>();
    const Json& q = r["ready_after_publication"];
    ready.categories.push_back(name);
    ready.values[0].push_back(q["p50_median"].is_number() ? q["p50_median"].get<double>() : 0);
    ready.values[1].push_back(q["p90_median"].is_number() ? q["p90_median"].get<double>() : 0);
    ready.values[2].push_back(q["p100_median"].is_number() ? q["p100_median"].get<double>() : 0);
    util.categories.push_back(name);
    util.values[0].push_back(r["rollout_utilisation"].get<double>());
    wan.categories.push_back(name);
    wan.values[0].push_back(r["wan_bytes_with_relay"].get<double>());
    wan.values[1].push_back(r["wan_bytes_without_relay"].get<double>());
    wan.values[2].push_back(r["wan_bytes_full_checkpoints_with_relay"].get<double>());
  }
  Chart lag{"Staleness of the trajectories delivered (trainer version - oldest version used)",
            {},
            {"groups"},
            {{}},
            false,
            CountLabel};
  // (JSON object keys sort as text, "10" before "2": the lags in numeric order.)
  std::map<uint64_t, double> lags;
  for (const auto& [l, n] : report["staleness"]["histogram"].items())
    lags[std::stoull(l)] = n.get<double>();
  for (const auto& [l, n] : lags) {
    lag.categories.push_back(std::to_string(l));
    lag.values[0].push_back(n);
  }
  double y = 0;
  y = DrawChart(body, ready, y, width);
  y = DrawChart(body, util, y, width);
  y = DrawChart(body, wan, y, width);
  y = DrawChart(body, lag, y, width);
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << y + 10
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
         "fill=\"white\"/>\n"
      << body.str() << "</svg>\n";
  return svg.str();
}

std::string ReportHtml(const Json& report) {
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>weft sim: "
       << Escape(report["name"].get<std::string>())
       << "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#eee}"
          "td:first-child{text-align:left}</style></head><body>\n";
  html << "<h1>weft sim: " << Escape(report["name"].get<std::string>()) << "</h1>\n<pre>"
       << Escape(SummaryText(report)) << "</pre>\n";
  html << "<h2>Regions</h2>\n<table><tr><th>region</th><th>relay</th><th>utilisation</th>"
          "<th>ready 50%</th><th>ready 90%</th><th>ready 100%</th><th>worst 100%</th>"
          "<th>WAN (as run)</th><th>WAN relay</th><th>WAN no relay</th><th>full ckpt relay</th>"
          "<th>full ckpt no relay</th><th>pulls</th><th>keyframe pulls</th></tr>\n";
  for (const Json& r : report["regions"]) {
    const Json& q = r["ready_after_publication"];
    html << "<tr><td>" << Escape(r["name"].get<std::string>()) << "</td><td>"
         << (r["relay"].get<bool>() ? "yes" : "no") << "</td><td>"
         << Fixed(100 * r["rollout_utilisation"].get<double>(), 1) << "%</td><td>"
         << SecondsText(q["p50_median"]) << "</td><td>" << SecondsText(q["p90_median"])
         << "</td><td>" << SecondsText(q["p100_median"]) << "</td><td>"
         << SecondsText(q["p100_worst"]) << "</td><td>" << Bytes(r["wan_bytes"].get<double>())
         << "</td><td>" << Bytes(r["wan_bytes_with_relay"].get<double>()) << "</td><td>"
         << Bytes(r["wan_bytes_without_relay"].get<double>()) << "</td><td>"
         << Bytes(r["wan_bytes_full_checkpoints_with_relay"].get<double>()) << "</td><td>"
         << Bytes(r["wan_bytes_full_checkpoints_without_relay"].get<double>()) << "</td><td>"
         << r["pulls"] << "</td><td>" << r["keyframe_pulls"] << "</td></tr>\n";
  }
  html << "</table>\n<h2>Figures</h2>\n"
       << ReportSvg(report) << "<h2>Faults</h2>\n<pre>" << Escape(report["faults"].dump(1))
       << "</pre>\n</body></html>\n";
  return html.str();
}

std::string SweepTable(const std::vector<std::pair<std::string, Json>>& runs) {
  std::ostringstream out;
  out << "| run | k | dispatch | clusters | trainer idle | mean lag | max lag | delivered fresh | "
         "dropped stale | utilisation | ready p90 (worst region) |\n"
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& [name, r] : runs) {
    uint64_t max_lag = 0;
    for (const auto& [l, n] : r["staleness"]["histogram"].items())
      max_lag = std::max<uint64_t>(max_lag, std::stoull(l));
    double busy = 0, regions = 0, worst_p90 = 0;
    for (const Json& region : r["regions"]) {
      busy += region["rollout_utilisation"].get<double>();
      regions += 1;
      const Json& p90 = region["ready_after_publication"]["p90_median"];
      worst_p90 = std::max(
          worst_p90, p90.is_number() ? p90.get<double>() : std::numeric_limits<double>::infinity());
    }
    out << "| " << name << " | " << r["settings"]["max_staleness"] << " | "
        << r["settings"]["dispatch"].get<std::string>() << " | " << r["settings"]["clusters"]
        << " | " << Fixed(100 * r["trainer"]["idle_fraction"].get<double>(), 1) << "% | "
        << Fixed(r["staleness"]["mean"].get<double>(), 2) << " | " << max_lag << " | "
        << r["trajectories"]["delivered_fresh"] << " | " << r["trajectories"]["dropped_stale"]
        << " | " << Fixed(100 * (regions > 0 ? busy / regions : 0), 1) << "% | "
        << (std::isinf(worst_p90) ? "never" : Fixed(worst_p90, 1) + " s") << " |\n";
  }
  return out.str();
}

}  // namespace weft::sim
