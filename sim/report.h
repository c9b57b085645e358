// The simulator's reports: a summary for the terminal, an SVG of the figures and an HTML page
// around it, made from report.json's content (docs/sim.md, "The report"); and the table that
// compares the runs of a sweep.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace weft::sim {

// The median and the worst of per-version figures (seconds; infinity: never), as report.json
// gives them (null: never): publication to ready in `weft sim`'s report and in `weft run`'s.
std::pair<nlohmann::json, nlohmann::json> MedianAndWorst(std::vector<double> values);

std::string SummaryText(const nlohmann::json& report);
std::string ReportSvg(const nlohmann::json& report);
std::string ReportHtml(const nlohmann::json& report);

// One row per run of a sweep: (variant name, report).
std::string SweepTable(const std::vector<std::pair<std::string, nlohmann::json>>& runs);

}  // namespace weft::sim
