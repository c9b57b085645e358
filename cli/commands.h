// The `weft` subcommands. Each Register* adds its subcommand to the CLI11 app; the callback runs
// the command and returns a Status, which main() prints as "weft: error: ..." with exit code 1.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "common/status.h"

namespace weft::cli {

// Set by a subcommand's parse callback; main() runs it after parsing.
using Action = std::function<Status()>;

void RegisterCast(CLI::App& app, Action* action);
void RegisterDelta(CLI::App& app, Action* action);
void RegisterDemo(CLI::App& app, Action* action);
void RegisterStore(CLI::App& app, Action* action);

}  // namespace weft::cli
