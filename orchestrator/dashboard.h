// The dashboard page the orchestrator serves at /ui: orchestrator/dashboard.html, compiled in
// (the build writes it into a raw string), so the binary carries it wherever it runs.
#pragma once

#include <string_view>

namespace weft::orchestrator {

// The page's HTML: self-contained (no external scripts, styles or fonts); it reads /v1/status
// with the token its user gives it.
std::string_view DashboardPage();

}  // namespace weft::orchestrator
