// The `weft` subcommands. Each Register* adds its subcommand to the CLI11 app; the callback runs
// the command and returns a Status, which main() prints as "weft: error: ..." with exit code 1.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "common/status.h"

namespace weft::cli {

// Set by a subcommand's parse callback; main() runs it after parsing.
using Action = std::function<Status()>;

// A --threads value: the number given, or every hardware thread when it is 0 (the default).
int ThreadsOrAll(int requested);

void RegisterCast(CLI::App& app, Action* action);
void RegisterDelta(CLI::App& app, Action* action);
void RegisterDemo(CLI::App& app, Action* action);
void RegisterStore(CLI::App& app, Action* action);
void RegisterRelay(CLI::App& app, Action* action);

}  // namespace weft::cli
