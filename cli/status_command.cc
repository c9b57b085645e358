// weft status [URL]: a running deployment at a glance in a terminal (docs/operate.md): versions,
// publication to ready per region, throughput, staleness, the trainer's wait and the alerts, from
// the orchestrator's /v1/status; refreshed with --watch.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "cli/commands.h"
#include "cli/run_report.h"
#include "orchestrator/client.h"

namespace weft::cli {
namespace {

using orchestrator::wire::StatusPage;
using Json = nlohmann::json;

std::string Fixed(double value, const char* format) {
  char text[48];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

std::string Summary(const std::string& url, const StatusPage& s) {
  std::string out;
  const std::time_t now = std::time(nullptr);
  char clock[16];
  std::strftime(clock, sizeof(clock), "%H:%M:%S", std::localtime(&now));
  out += "run " + s.run + " at " + url + " (" + clock + ")\n";
  out += "versions    latest " + (s.latest_version ? std::to_string(*s.latest_version) : "none") +
         ", admissible " + std::to_string(s.admissible_version) + " (bound " +
         std::to_string(s.max_staleness) + ")";
  if (s.versions.size() >= 2) {
    const double span = s.versions.back().announced_at - s.versions.front().announced_at;
    out += ", one every " + Fixed(span / static_cast<double>(s.versions.size() - 1), "%.2f s");
  }
  out += "\n";
  out += "work        queued " + std::to_string(s.jobs.queued) + ", leased " +
         std::to_string(s.jobs.leased) + ", buffered " + std::to_string(s.trajectories.buffered) +
         "; accepted " + Fixed(s.rates.accepted_per_s, "%.1f") + "/s, delivered " +
         Fixed(s.rates.delivered_per_s, "%.1f") + "/s, leases " +
         Fixed(s.rates.leases_per_s, "%.1f") + "/s (over " +
         Fixed(s.rates.window_seconds, "%.0f s") + ")\n";
  uint64_t delivered = 0;
  for (const auto& [lag, count] : s.staleness) delivered += count;
  out += "staleness   ";
  if (delivered == 0) out += "nothing delivered yet";
  for (const auto& [lag, count] : s.staleness) {
    out += "lag " + std::to_string(lag) + " " +
           Fixed(100.0 * static_cast<double>(count) / static_cast<double>(delivered), "%.0f%%") +
           "  ";
  }
  out += "; dropped stale " + std::to_string(s.trajectories.dropped_stale) + "\n";
  const StatusPage::Trainer& t = s.trainer;
  out += "trainer     ";
  if (t.steps_reported == 0) {
    out += "no wait reported yet";
  } else {
    double worst = 0;
    for (double w : t.recent_wait_seconds) worst = std::max(worst, w);
    out += "waited " +
           Fixed(t.wait_seconds_total / static_cast<double>(t.steps_reported), "%.3f s") +
           " per batch (worst of the last " + std::to_string(t.recent_wait_seconds.size()) + " " +
           Fixed(worst, "%.3f s") + ")";
  }
  if (t.publishes_reported > 0) {
    out += ", publish " +
           Fixed(t.publish_seconds_total / static_cast<double>(t.publishes_reported), "%.3f s") +
           " per version";
  }
  out += "\n\n";
  out +=
      "region          ready  util  to ready 50%     90%       100%      (median of "
      "the last versions; worst 100%)\n";
  const Json regions = RegionsReport(&s, Json());
  for (const Json& r : regions) {
    const std::string name = r["name"];
    const StatusPage::Region& region = s.regions.at(name);
    const Json& q = r["ready_after_publication"];
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%-15s %3llu/%-3llu %3.0f%%  %-9s %-9s %-9s (%llu versions; %s)\n", name.c_str(),
                  static_cast<unsigned long long>(region.ready),
                  static_cast<unsigned long long>(region.clusters), 100 * region.utilisation,
                  SecondsOrNever(q["p50_median"]).c_str(), SecondsOrNever(q["p90_median"]).c_str(),
                  SecondsOrNever(q["p100_median"]).c_str(),
                  static_cast<unsigned long long>(q["versions"].get<uint64_t>()),
                  SecondsOrNever(q["p100_worst"]).c_str());
    out += line;
  }
  out += "\nalerts      ";
  if (s.alerts.empty()) out += "none";
  for (size_t i = 0; i < s.alerts.size(); ++i) out += (i > 0 ? "\n            " : "") + s.alerts[i];
  out += "\n";
  return out;
}

Status RunStatus(const std::string& url, std::string token, double watch) {
  for (const char* variable : {"WEFT_VIEWER_TOKEN", "WEFT_ADMIN_TOKEN"}) {
    if (!token.empty()) break;
    if (const char* value = std::getenv(variable)) token = value;
  }
  if (token.empty())
    return InvalidArgument(
        "weft status needs a token that may read /v1/status (the viewer's or any role's): "
        "--token, or WEFT_VIEWER_TOKEN or WEFT_ADMIN_TOKEN in the environment");
  HttpClientOptions options;
  options.deadline = std::chrono::milliseconds(5000);
  orchestrator::OrchestratorClient client(url, token, options);
  if (watch <= 0) {
    WEFT_ASSIGN_OR_RETURN(StatusPage page, client.GetStatus());
    std::fputs(Summary(url, page).c_str(), stdout);
    return Status::Ok();
  }
  StopSignals stop;
  do {
    Result<StatusPage> page = client.GetStatus();
    std::string text = "\x1b[H\x1b[2J";  // from the top of a cleared screen
    text += page.ok() ? Summary(url, *page) : "weft status: " + page.status().ToString() + "\n";
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  } while (!stop.WaitFor(std::chrono::milliseconds(static_cast<int64_t>(watch * 1000))));
  return Status::Ok();
}

}  // namespace

void RegisterStatus(CLI::App& app, Action* action) {
  struct Options {
    std::string url = "http://127.0.0.1:8171";
    std::string token;
    std::string watch;
  };
  auto options = std::make_shared<Options>();
  CLI::App* s = app.add_subcommand(
      "status", "A running deployment at a glance: versions, readiness per region, throughput");
  s->add_option("url", options->url, "The orchestrator's URL (default: configs/local.yaml's)");
  s->add_option("--token", options->token,
                "A token that may read /v1/status (default: $WEFT_VIEWER_TOKEN, else "
                "$WEFT_ADMIN_TOKEN)");
  s->add_option("--watch", options->watch, "Refresh every SECONDS (default 2) until interrupted")
      ->expected(0, 1);
  s->callback([options, action, s] {
    double watch = 0;
    if (s->count("--watch") > 0) {
      watch = 2;
      if (!options->watch.empty()) {
        char* end = nullptr;
        watch = std::strtod(options->watch.c_str(), &end);
        if (*end != '\0' || !(watch >= 0.1 && watch <= 3600))
          throw CLI::ValidationError(
              "--watch", "takes seconds from 0.1 to 3600, not '" + options->watch + "'");
      }
    }
    *action = [options, watch] { return RunStatus(options->url, options->token, watch); };
  });
}

}  // namespace weft::cli
