// weft: one binary, one subcommand per job. See `weft --help`.
#include <pthread.h>
#include <sys/resource.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "common/parallel.h"

namespace weft::cli {

int ThreadsOrAll(int requested) { return requested > 0 ? requested : HardwareThreads(); }

namespace {

// The process's stop signals: whether a command holds them, and whether one came.
struct Stopping {
  std::mutex mutex;
  std::condition_variable changed;
  int holders = 0;
  bool stopped = false;
};
Stopping& Stop() {
  static Stopping* stopping = new Stopping;  // never destroyed: its thread outlives main()
  return *stopping;
}

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void StopSignals::Install() {
  const sigset_t set = StopSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    while (true) {
      int received = 0;
      if (sigwait(&set, &received) != 0) continue;
      Stopping& s = Stop();
      std::unique_lock<std::mutex> lock(s.mutex);
      if (s.holders > 0) {
        s.stopped = true;
        s.changed.notify_all();
        continue;
      }
      // Nobody stops gracefully: the signal's default action, as without weft.
      lock.unlock();
      std::signal(received, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, received);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      raise(received);
    }
  }).detach();
}

StopSignals::StopSignals() {
  std::lock_guard<std::mutex> lock(Stop().mutex);
  ++Stop().holders;
}

StopSignals::~StopSignals() {
  std::lock_guard<std::mutex> lock(Stop().mutex);
  --Stop().holders;
}

void StopSignals::Wait() {
  std::unique_lock<std::mutex> lock(Stop().mutex);
  Stop().changed.wait(lock, [] { return Stop().stopped; });
}

bool StopSignals::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(Stop().mutex);
  return Stop().changed.wait_for(lock, timeout, [] { return Stop().stopped; });
}

void StopSignals::Wake() {
  std::lock_guard<std::mutex> lock(Stop().mutex);
  Stop().stopped = true;
  Stop().changed.notify_all();
}

}  // namespace weft::cli

int main(int argc, char** argv) {
  // Before anything else: no thread of any command may take a stop signal (cli/commands.h).
  weft::cli::StopSignals::Install();
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
