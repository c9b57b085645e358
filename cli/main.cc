// weft: one binary, one subcommand per job. See `weft --help`.
#include <pthread.h>
#include <sys/resource.h>

#include <cstdio>

#include "cli/commands.h"
#include "common/parallel.h"

namespace weft::cli {

int ThreadsOrAll(int requested) { return requested > 0 ? requested : HardwareThreads(); }

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

void StopSignals::Wait() {
  int received = 0;
  sigwait(&signals_, &received);
}

}  // namespace weft::cli

int main(int argc, char** argv) {
  // A server holds a descriptor per connection (a thousand long-polling workers): the soft
  // open-file limit is raised to the hard one, as far as the system lets it.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  CLI::App app{"weft: reinforcement learning across datacenters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "weft 0.1.0");
  weft::cli::Action action;
  weft::cli::RegisterCast(app, &action);
  weft::cli::RegisterDelta(app, &action);
  weft::cli::RegisterDemo(app, &action);
  weft::cli::RegisterStore(app, &action);
  weft::cli::RegisterRelay(app, &action);
  weft::cli::RegisterOrchestrator(app, &action);
  weft::cli::RegisterRun(app, &action);
  weft::cli::RegisterSim(app, &action);
  weft::cli::RegisterWorker(app, &action);
  weft::cli::RegisterTrain(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  weft::Status status = action ? action() : weft::Internal("no command ran");
  if (!status.ok()) {
    std::fprintf(stderr, "weft: error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
