// weft: one binary, one subcommand per job. See `weft --help`.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "common/mutex.h"
#include "common/parallel.h"

namespace weft::cli {

int ThreadsOrAll(int requested) { return requested > 0 ? requested : HardwareThreads(); }

Result<std::string> ThisProgramPath() {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return Internal("cannot find this program's path");
  return std::string(self, static_cast<size_t>(length));
}

namespace {

// The process's stop signals: whether a command holds them, and whether one came.
struct Stopping {
  Mutex mutex;
  std::condition_variable changed;
  int holders GUARDED_BY(mutex) = 0;
  bool stopped GUARDED_BY(mutex) = false;
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
      MutexLock lock(s.mutex);
      if (s.holders > 0) {
        s.stopped = true;
        s.changed.notify_all();
        continue;
      }
      // Nobody stops gracefully: the signal's default action, as without weft.
      lock.Unlock();
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
  Stopping& s = Stop();
  MutexLock lock(s.mutex);
  ++s.holders;
}

StopSignals::~StopSignals() {
  Stopping& s = Stop();
  MutexLock lock(s.mutex);
  --s.holders;
}

void StopSignals::Wait() {
  Stopping& s = Stop();
  MutexLock lock(s.mutex);
  s.changed.wait(lock.native(), [&]() REQUIRES(s.mutex) { return s.stopped; });
}

bool StopSignals::WaitFor(std::chrono::milliseconds timeout) {
  Stopping& s = Stop();
  MutexLock lock(s.mutex);
  return s.changed.wait_for(lock.native(), timeout, [&]() REQUIRES(s.mutex) { return s.stopped; });
}

void StopSignals::Wake() {
  Stopping& s = Stop();
  MutexLock lock(s.mutex);
  s.stopped = true;
  s.changed.notify_all();
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
  weft::cli::RegisterGenerate(app, &action);
  weft::cli::RegisterDeploy(app, &action);
  weft::cli::RegisterSim(app, &action);
  weft::cli::RegisterStatus(app, &action);
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
