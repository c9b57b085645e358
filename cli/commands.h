// The `weft` subcommands. Each Register* adds its subcommand to the CLI11 app; the callback runs
// the command and returns a Status, which main() prints as "weft: error: ..." with exit code 1.
#pragma once

#include <CLI/CLI.hpp>

#include <signal.h>

#include <functional>

#include "common/status.h"

namespace weft::cli {

// Set by a subcommand's parse callback; main() runs it after parsing.
using Action = std::function<Status()>;

// A --threads value: the number given, or every hardware thread when it is 0 (the default).
int ThreadsOrAll(int requested);

// Blocks SIGINT and SIGTERM for every thread started after it (construct it before starting
// servers); Wait() returns once one of them arrives.
class StopSignals {
 public:
  StopSignals();
  void Wait();

 private:
  sigset_t signals_;
};

void RegisterCast(CLI::App& app, Action* action);
void RegisterDelta(CLI::App& app, Action* action);
void RegisterDemo(CLI::App& app, Action* action);
void RegisterStore(CLI::App& app, Action* action);
void RegisterRelay(CLI::App& app, Action* action);
void RegisterOrchestrator(CLI::App& app, Action* action);
void RegisterWorker(CLI::App& app, Action* action);
void RegisterTrain(CLI::App& app, Action* action);
void RegisterRun(CLI::App& app, Action* action);
void RegisterSim(CLI::App& app, Action* action);

}  // namespace weft::cli
