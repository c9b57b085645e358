// The simulator's reports: a summary for the terminal, an SVG of the figures and an HTML page
// around it, made from report.json's content (docs/sim.md, "The report"); and the table that
// compares the runs of a sweep.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace weft::sim {

// A region's "ready_after_publication" in report.json, `weft sim`'s and `weft run`'s alike: from
// each version's seconds from publication to 50%, 90% and 100% of the region's clusters ready
// (infinity: never), the number of versions, the median and the worst over them of each (null:
// never) and the versions never fully ready.
nlohmann::json ReadyAfterPublication(const std::vector<double> (&after)[3]);

std::string SummaryText(const nlohmann::json& report);
std::string ReportSvg(const nlohmann::json& report);
std::string ReportHtml(const nlohmann::json& report);

// One row per run of a sweep: (variant name, report).
std::string SweepTable(const std::vector<std::pair<std::string, nlohmann::json>>& runs);

}  // namespace weft::sim
