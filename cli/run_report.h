// The report of `weft run` (docs/run.md, "The progress line" and "The report"): the live progress
// line, report.json built from the trainer's progress file and the orchestrator's and relays'
// final state, its picture (report.svg), and the summary printed at the end. The progress file
// comes checked (cli/trainer_channel.h, CheckProgress): whichever trainer wrote it, its optional
// fields may be absent, and the report then says null. Pure functions of their inputs; no I/O
// except the summary's printing.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/run_config.h"
#include "orchestrator/wire.h"

namespace weft::cli {

// "step 37/150 v37 reward 0.712 lag 1.2 (max 3) | ready us-east 2/2 ... | synced 4.1 MB | dropped
// 0", from the trainer's checked progress file (null if none) and /v1/status (null: the
// orchestrator did not answer).
std::string ProgressLine(const nlohmann::json& trainer,
                         const orchestrator::wire::StatusPage* status, const RunConfig& config);

// How a run ended, as the report records it.
struct RunOutcome {
  std::string config_path;  // absolute
  std::string failure;      // empty: completed
  double seconds = 0;
  nlohmann::json trainer;        // its last usable progress file, checked (null if none)
  std::string progress_problem;  // what was wrong with the newest one, if anything
  std::optional<orchestrator::wire::StatusPage> status;  // the orchestrator's last /v1/status
  nlohmann::json relays;                                 // region -> the relay's /v1/stats
  std::map<std::string, int> restarts;  // process name -> restarts, for those restarted
};

// Each region as a status page shows it: publication to 50/90/100% ready, as `weft sim` reports
// it (the median and the worst over the versions listed whose population was not empty, but the
// latest while it is still under way; null: never), its trajectories and its weight bytes
// (downloaded by its workers; fetched over the WAN by its relay, from `relays`: region -> the
// relay's /v1/stats, when known).
nlohmann::json RegionsReport(const orchestrator::wire::StatusPage* status,
                             const nlohmann::json& relays);

// Seconds as the reports and `weft status` print them ("0.18 s"), or "never" for null (a fraction
// of a region never ready).
std::string SecondsOrNever(const nlohmann::json& value, const char* format = "%.2f s");

nlohmann::json BuildReport(const RunConfig& config, const RunOutcome& outcome);
// The picture: reward per step, and delta bytes per version against a full checkpoint.
std::string ReportSvg(const nlohmann::json& report);
// report.html: the figures, the regions' publication to ready and the picture, on one page (as
// `weft sim` writes its own).
std::string ReportHtml(const nlohmann::json& report);
// The summary on standard output.
void PrintSummary(const RunConfig& config, const nlohmann::json& report);

}  // namespace weft::cli
