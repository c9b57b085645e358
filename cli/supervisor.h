// The process supervisor of `weft run` and `weft generate`: starts this binary's subcommands (or
// another program, the trainer a run config names) as child processes, each in its own process
// group with its output in a log file, notices when they end, and stops them (SIGTERM, then
// SIGKILL after a grace period, to the whole process group). A child dies with its supervisor (the
// kernel kills it; the thread that started it must live as long). Children run in the supervisor's
// working directory, with its environment plus their own variables. Not thread-safe: one
// supervising loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft::cli {

// One process of the run.
struct Child {
  std::string name;
  std::vector<std::string> args;  // after argv[0]
  // Another program than the supervisor's binary: its path (FindExecutable) and its argv[0].
  std::string executable;
  std::string argv0;
  std::map<std::string, std::string> environment;  // set on top of the supervisor's own
  bool restart = false;  // restarted when it dies (store, orchestrator, relays)
  std::string listen;    // ADDRESS:PORT it serves, if any
  pid_t pid = -1;
  int restarts = 0;
  bool running = false;
  std::string ended;   // how it ended, once it has
  int exit_code = -1;  // ... and its exit status (128 + signal when killed)
};

Child MakeChild(std::string name, std::vector<std::string> args, bool restart,
                std::string listen = "");

class Supervisor {
 public:
  // `binary`: the program the children run; their logs go to `log_dir`/<name>.log.
  Supervisor(std::string binary, std::string log_dir)
      : binary_(std::move(binary)), log_dir_(std::move(log_dir)) {}

  Status Start(Child& child);
  // Reaps children that ended; returns them.
  std::vector<Child*> Reap(std::vector<Child>& children);
  // SIGTERM, then SIGKILL after `grace`.
  void Stop(std::vector<Child*> children, std::chrono::milliseconds grace);

 private:
  std::string binary_, log_dir_;
};

// The executable `name` names: a path (relative to the working directory) when it holds a '/',
// else the first match in the directories of `search_path` (a PATH value), as execvp finds it.
// Errors say what was looked for and where.
Result<std::string> FindExecutable(const std::string& name, const std::string& search_path);

// Waits until something accepts connections on ADDRESS:PORT, while `child` is alive.
bool WaitForPort(const std::string& listen, std::chrono::milliseconds timeout, const Child& child);

}  // namespace weft::cli
