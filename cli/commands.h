// The `weft` subcommands. Each Register* adds its subcommand to the CLI11 app; the callback runs
// the command and returns a Status, which main() prints as "weft: error: ..." with exit code 1.
#pragma once

#include <CLI/CLI.hpp>

#include <signal.h>

#include <chrono>
#include <functional>

#include "common/status.h"

namespace weft::cli {

// Set by a subcommand's parse callback; main() runs it after parsing.
using Action = std::function<Status()>;

// A --threads value: the number given, or every hardware thread when it is 0 (the default).
int ThreadsOrAll(int requested);

// The path of the running weft binary (what weft run starts its children as, and what Slurm jobs
// run by default).
Result<std::string> ThisProgramPath();

// SIGINT and SIGTERM, for the whole process. main() calls Install() before anything else runs:
// the signals are blocked in every thread any command starts, and one thread of their own waits
// for them. A command that stops gracefully holds a StopSignals while it runs, whatever threads it
// started before: a signal then wakes Wait() (or WaitFor) instead of ending the process. A signal
// that comes while no StopSignals is held ends the process as the signal's default action does.
class StopSignals {
 public:
  static void Install();
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // Returns once a signal came (or Wake was called).
  void Wait();
  // Waits `timeout` at most; true once a signal came (or Wake was called).
  bool WaitFor(std::chrono::milliseconds timeout);
  // Wakes the waiters without a signal (the command ends on its own).
  void Wake();
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
void RegisterGenerate(CLI::App& app, Action* action);
void RegisterSim(CLI::App& app, Action* action);
void RegisterDeploy(CLI::App& app, Action* action);
void RegisterStatus(CLI::App& app, Action* action);

}  // namespace weft::cli
