// The orchestrator as a process: `weft orchestrator` killed with SIGKILL under load from workers
// and restarted on its journal, several times; every trajectory it acknowledged reaches the
// trainer exactly once.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "orchestrator/client.h"
#include "tests/source_dir.h"
#include "tests/temp_path.h"

#ifdef WEFT_BINARY
namespace weft::orchestrator {
namespace {

using Json = nlohmann::json;

pid_t Spawn(const std::string& config, const std::string& log) {
  // Before the fork: the child of a process with threads should allocate nothing before exec.
  const std::string weft = testing::BuildTreeProgram(WEFT_BINARY);
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* out = std::freopen(log.c_str(), "a", stdout);
    if (out != nullptr) dup2(fileno(out), STDERR_FILENO);  // its log lines too
    execl(weft.c_str(), weft.c_str(), "orchestrator", "--config", config.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

TEST_CASE(
    "weft orchestrator: killed with SIGKILL under load and restarted, loses and doubles nothing "
    "acknowledged") {
  const std::string dir = testing::TempPath("orchestrator_process");
  std::filesystem::create_directories(dir);
  // The same port in every round; a slice of its own below the ephemeral range (32768 and up,
  // where a client's connection may hold any port) and below the shell tests' slices.
  const uint16_t port = static_cast<uint16_t>(17800 + getpid() % 2000);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const std::string config = dir + "/orchestrator.yaml";
  std::ofstream(config) << "orchestrator:\n  listen: 127.0.0.1:" << port << "\n  journal: " << dir
                        << "/journal\n  max_staleness: 100\n  max_in_flight: 100000\n  lease: "
                           "60s\n  cluster_timeout: 60s\n  tick: 20ms\n  compact_after: 256KiB\n"
                        << "  tokens: {worker: w, trainer: t, admin: a}\n";
  HttpClientOptions quick;
  quick.deadline = std::chrono::milliseconds(5000);
  quick.first_backoff = std::chrono::milliseconds(20);
  std::mutex mutex;
  std::set<uint64_t> acknowledged;
  std::mt19937_64 rng(11);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const pid_t pid = Spawn(config, dir + "/log");
    REQUIRE(pid > 0);
    OrchestratorClient trainer(url, "t", quick);
    const Result<wire::StatusPage> listening = trainer.GetStatus();  // retried until it listens
    if (!listening.ok()) {
      std::ifstream in(dir + "/log");
      const std::string said((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      FAIL("the orchestrator does not answer on port "
           << port << ": " << listening.status().ToString() << "; its output:\n"
           << said);
    }
    if (round == 0) {
      REQUIRE(trainer.AnnounceVersion(0).ok());
      std::vector<std::pair<Json, uint32_t>> prompts(20000, {Json("p"), 1});
      REQUIRE(trainer.AddJobs(prompts).ok());
    }
    std::atomic<bool> stop{false};
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        HttpClientOptions brief;
        brief.deadline = std::chrono::milliseconds(300);
        brief.first_backoff = std::chrono::milliseconds(10);
        OrchestratorClient client(url, "w", brief);
        const std::string id = "worker" + std::to_string(w);
        if (!client.Register(id, "eu", 8).ok() || !client.Heartbeat(id, 0).ok()) return;
        while (!stop) {
          auto answer = client.RequestLeases(id, 8, std::chrono::milliseconds(100));
          if (!answer.ok()) continue;  // killed, or a lease lost with it
          for (const Lease& lease : answer->leases) {
            TrajectoryGroup s;
            s.job = lease.job;
            s.attempt = lease.attempt;
            s.cluster = id;
            s.segments = {{0, 0}};
            s.tokens = 4;
            s.trajectories = Json{{"job", lease.job}}.dump();
            auto result = client.Submit(s);
            if (result.ok()) {
              std::lock_guard<std::mutex> lock(mutex);
              acknowledged.insert(lease.job);
            }
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 500));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    stop = true;
    for (auto& worker : workers) worker.join();
  }
  REQUIRE(acknowledged.size() > 50);
  // Restart once more and drain everything to the trainer.
  const pid_t pid = Spawn(config, dir + "/log");
  OrchestratorClient trainer(url, "t", quick);
  auto status = trainer.GetStatus();
  REQUIRE(status.ok());
  CHECK(status->journal.generation > 0);  // it compacted on the way
  std::map<uint64_t, int> delivered;
  for (;;) {
    auto batch = trainer.TakeBatch(1000, std::chrono::milliseconds(0));
    REQUIRE(batch.ok());
    if (batch->empty()) break;
    for (const Delivered& d : *batch) ++delivered[d.group.job];
  }
  for (const auto& [job, count] : delivered) CHECK(count == 1);
  size_t missing = 0;
  for (uint64_t job : acknowledged) missing += delivered.count(job) ? 0 : 1;
  CHECK(missing == 0);
  MESSAGE(acknowledged.size() << " acknowledged submissions over 3 kills, " << delivered.size()
                              << " delivered after recovery");
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace weft::orchestrator
#endif  // WEFT_BINARY
