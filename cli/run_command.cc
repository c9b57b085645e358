// weft run CONFIG: a whole run on one machine, as separate processes (this binary's other
// subcommands): the store server over the run's store directory, the orchestrator, one relay per
// region behind the region's emulated WAN link, the workers of every region and the example
// trainer. It supervises them (the store, the orchestrator and the relays are restarted if they
// die; a worker that dies stays dead and its jobs go to others), prints a progress line, stops
// everything on Ctrl-C or when the trainer is done, and writes the report (docs/run.md).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/run_config.h"
#include "common/file_util.h"
#include "common/http_client.h"
#include "orchestrator/client.h"

namespace weft::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const char kMarker[] = ".weft-run";

// One process of the run.
struct Child {
  std::string name;
  std::vector<std::string> args;  // after the binary
  bool restart = false;           // restarted when it dies (store, orchestrator, relays)
  std::string listen;             // ADDRESS:PORT it serves, if any
  pid_t pid = -1;
  int restarts = 0;
  bool running = false;
  std::string ended;   // how it ended, once it has
  int exit_code = -1;  // ... and its exit status (128 + signal when killed)
};

Child MakeChild(std::string name, std::vector<std::string> args, bool restart,
                std::string listen = "") {
  Child child;
  child.name = std::move(name);
  child.args = std::move(args);
  child.restart = restart;
  child.listen = std::move(listen);
  return child;
}

class Supervisor {
 public:
  Supervisor(std::string binary, std::string log_dir)
      : binary_(std::move(binary)), log_dir_(std::move(log_dir)) {}

  Status Start(Child& child) {
    std::vector<std::string> argv = {binary_};
    argv.insert(argv.end(), child.args.begin(), child.args.end());
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    const std::string log = log_dir_ + "/" + child.name + ".log";
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return Internal("cannot open " + log);
    sigset_t none;
    sigemptyset(&none);
    const pid_t pid = fork();
    if (pid < 0) {
      ::close(fd);
      return Internal("fork failed for " + child.name);
    }
    if (pid == 0) {
      // The child: its own process group (a Ctrl-C reaches only weft run, which stops everything
      // in order), output to its log, signals unblocked.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // weft run killed outright: its processes stop too
      dup2(fd, 1);
      dup2(fd, 2);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execv(raw[0], raw.data());
      _exit(127);
    }
    ::close(fd);
    child.pid = pid;
    child.running = true;
    child.ended.clear();
    return Status::Ok();
  }

  // Reaps children that ended; returns them.
  std::vector<Child*> Reap(std::vector<Child>& children) {
    std::vector<Child*> ended;
    for (Child& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.running = false;
        c.ended = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                    : "killed by signal " + std::to_string(WTERMSIG(status));
        c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        ended.push_back(&c);
      }
    }
    return ended;
  }

  // SIGTERM, then SIGKILL after `grace`.
  void Stop(std::vector<Child*> children, std::chrono::milliseconds grace) {
    for (Child* c : children) {
      if (c->running) kill(c->pid, SIGTERM);
    }
    const auto deadline = Clock::now() + grace;
    for (Child* c : children) {
      while (c->running) {
        int status = 0;
        if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
          c->running = false;
          c->ended = "stopped";
          break;
        }
        if (Clock::now() > deadline) {
          kill(c->pid, SIGKILL);
          waitpid(c->pid, &status, 0);
          c->running = false;
          c->ended =
              "killed after not stopping within " + std::to_string(grace.count() / 1000) + " s";
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

 private:
  std::string binary_, log_dir_;
};

// Waits until something accepts connections on ADDRESS:PORT.
bool WaitForPort(const std::string& listen, std::chrono::milliseconds timeout, const Child& child) {
  const size_t colon = listen.rfind(':');
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(listen.substr(colon + 1))));
  std::string host = listen.substr(0, colon);
  if (host == "0.0.0.0" || host == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) return false;
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    ::close(fd);
    if (connected) return true;
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) return false;  // it died
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string Megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text),
                bytes >= 1e9   ? "%.2f GB"
                : bytes >= 1e6 ? "%.1f MB"
                               : "%.0f kB",
                bytes >= 1e9   ? bytes / 1e9
                : bytes >= 1e6 ? bytes / 1e6
                               : bytes / 1e3);
  return text;
}

Json ReadJsonFile(const std::string& path) {
  Result<std::vector<uint8_t>> bytes = ReadFile(path);
  return bytes.ok() ? Json::parse(bytes->begin(), bytes->end(), nullptr, false) : Json();
}

// The report's figures that come from the orchestrator's view of the clusters.
struct SyncTotals {
  uint64_t bytes_sent = 0, digest_mismatches = 0, pulls = 0, keyframe_pulls = 0, clusters = 0;
  double full_versions = 0;  // sum over clusters of the versions published while it served
  double max_pause_ms = 0;
};

SyncTotals Totals(const Json& status) {
  SyncTotals t;
  if (!status.is_object() || !status.contains("clusters")) return t;
  for (const Json& c : status["clusters"]) {
    if (!c.contains("sync")) continue;
    const Json& s = c["sync"];
    ++t.clusters;
    t.bytes_sent += s["bytes_downloaded"].get<uint64_t>();
    t.digest_mismatches += s["digest_mismatches"].get<uint64_t>();
    t.pulls += s["pulls"].get<uint64_t>();
    t.keyframe_pulls += s["keyframe_pulls"].get<uint64_t>();
    t.max_pause_ms = std::max(t.max_pause_ms, s["max_pause_ms"].get<double>());
    if (!s["first_version"].is_null() && !s["newest_version"].is_null()) {
      t.full_versions += static_cast<double>(s["newest_version"].get<uint64_t>() -
                                             s["first_version"].get<uint64_t>() + 1);
    }
  }
  return t;
}

std::string ProgressLine(const Json& trainer, const Json& status, const RunConfig& config) {
  std::ostringstream line;
  char buffer[256];
  const std::string phase = trainer.is_object() ? trainer.value("phase", "starting") : "starting";
  if (phase == "warm-up") {
    std::snprintf(buffer, sizeof(buffer), "warm-up %d/%d loss %.3f",
                  trainer.value("warmup_step", 0), config.trainer.warmup_steps,
                  trainer.value("warmup_loss", 0.0));
    line << buffer;
  } else if (phase == "rl" || phase == "done") {
    const Json& steps = trainer["steps"];
    if (!steps.empty()) {
      const Json& last = steps.back();
      std::snprintf(buffer, sizeof(buffer), "step %d/%d v%llu reward %.3f lag %.1f (max %llu)",
                    last.value("step", 0), config.trainer.steps,
                    static_cast<unsigned long long>(last.value("version", uint64_t{0})),
                    last.value("reward", 0.0), last.value("mean_lag", 0.0),
                    static_cast<unsigned long long>(last.value("max_lag", uint64_t{0})));
      line << buffer;
    } else {
      line << "step 0/" << config.trainer.steps << " v0 (waiting for trajectories)";
    }
  } else {
    line << phase;
  }
  if (status.is_object() && status.contains("regions")) {
    line << " | ready";
    for (const RegionConfig& r : config.regions) {
      const Json region = status["regions"].contains(r.name) ? status["regions"][r.name] : Json();
      line << " " << r.name << " " << (region.is_object() ? region.value("ready", 0) : 0) << "/"
           << (region.is_object() ? region.value("clusters", 0) : 0);
    }
    const SyncTotals totals = Totals(status);
    line << " | synced " << Megabytes(static_cast<double>(totals.bytes_sent));
    line << " | dropped " << status["trajectories"].value("dropped_stale", uint64_t{0});
  } else {
    line << " | orchestrator not answering";
  }
  return line.str();
}

// The report's picture: reward per step, bytes per version against a full checkpoint.
std::string Svg(const Json& report) {
  const Json& steps = report["per_step"];
  const double w = 720, h = 260, left = 60, right = 20, top = 30, bottom = 40;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << 2 * h + 20
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
         "fill=\"white\"/>\n";
  const size_t n = steps.size();
  auto x_of = [&](size_t i) {
    return left + (n <= 1
                       ? 0.0
                       : (w - left - right) * static_cast<double>(i) / static_cast<double>(n - 1));
  };
  // Reward.
  svg << "<text x=\"" << left
      << "\" y=\"18\" font-weight=\"bold\">Mean reward of each step's batch (the rollouts' own "
         "rewards)</text>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << h - bottom << "\" x2=\"" << w - right << "\" y2=\""
      << h - bottom << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
      << h - bottom << "\" stroke=\"black\"/>\n";
  for (double r : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    const double y = h - bottom - (h - top - bottom) * r;
    svg << "<text x=\"" << left - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << r
        << "</text>\n";
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << w - right << "\" y2=\"" << y
        << "\" stroke=\"#ddd\"/>\n";
  }
  svg << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"";
  for (size_t i = 0; i < n; ++i) {
    svg << x_of(i) << ","
        << h - bottom - (h - top - bottom) * std::clamp(steps[i].value("reward", 0.0), 0.0, 1.0)
        << " ";
  }
  svg << "\"/>\n<text x=\"" << (w + left) / 2 << "\" y=\"" << h - 10
      << "\" text-anchor=\"middle\">step</text>\n";
  // Step (and version) numbers under both charts.
  auto ticks = [&](double axis_y) {
    for (size_t k = 0; k < 5 && n > 0; ++k) {
      const size_t i = (n - 1) * k / 4;
      svg << "<text x=\"" << x_of(i) << "\" y=\"" << axis_y + 14 << "\" text-anchor=\"middle\">"
          << steps[i].value("step", 0) << "</text>\n";
    }
  };
  ticks(h - bottom);
  // Bytes per version, log scale, against one full checkpoint.
  const double full = std::max(1.0, report.value("full_checkpoint_bytes", 1.0));
  const double y0 = h + 20;
  svg << "<text x=\"" << left << "\" y=\"" << y0 + 18
      << "\" font-weight=\"bold\">Delta bytes of each version (log scale); red: one full "
         "checkpoint</text>\n";
  const double low = 1e3, high = std::max(full * 2, 1e4);
  auto y_of = [&](double bytes) {
    const double f =
        (std::log10(std::max(bytes, low)) - std::log10(low)) / (std::log10(high) - std::log10(low));
    return y0 + h - bottom - (h - top - bottom) * f;
  };
  svg << "<line x1=\"" << left << "\" y1=\"" << y0 + h - bottom << "\" x2=\"" << w - right
      << "\" y2=\"" << y0 + h - bottom << "\" stroke=\"black\"/>\n";
  for (double b = low; b <= high; b *= 10) {
    svg << "<text x=\"" << left - 8 << "\" y=\"" << y_of(b) + 4 << "\" text-anchor=\"end\">"
        << Megabytes(b) << "</text>\n";
  }
  const double bar = std::max(1.0, (w - left - right) / std::max<size_t>(1, n) - 1);
  for (size_t i = 0; i < n; ++i) {
    const double bytes = steps[i].value("delta_bytes", 0.0);
    svg << "<rect x=\"" << x_of(i) - bar / 2 << "\" y=\"" << y_of(bytes) << "\" width=\"" << bar
        << "\" height=\"" << y0 + h - bottom - y_of(bytes) << "\" fill=\"#2ca02c\"/>\n";
  }
  svg << "<line x1=\"" << left << "\" y1=\"" << y_of(full) << "\" x2=\"" << w - right << "\" y2=\""
      << y_of(full) << "\" stroke=\"red\" stroke-dasharray=\"4\"/>\n";
  ticks(y0 + h - bottom);
  svg << "<text x=\"" << (w + left) / 2 << "\" y=\"" << y0 + h - 10
      << "\" text-anchor=\"middle\">version</text>\n</svg>\n";
  return svg.str();
}

Status RunRun(const std::string& config_path) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(config_path));
  const fs::path dir = fs::absolute(config.dir);
  // A fresh directory, or one an earlier run made (its marker says so): start it afresh.
  std::error_code error;
  if (fs::exists(dir)) {
    if (!fs::is_directory(dir))
      return InvalidArgument("run.dir " + dir.string() + " is not a directory");
    if (!fs::is_empty(dir) && !fs::exists(dir / kMarker)) {
      return InvalidArgument("run.dir " + dir.string() +
                             " holds files weft run did not write; pick another run.dir");
    }
    for (const auto& entry : fs::directory_iterator(dir)) fs::remove_all(entry.path(), error);
  }
  fs::create_directories(dir / "logs", error);
  if (error) return Internal("cannot create " + (dir / "logs").string() + ": " + error.message());
  std::ofstream(dir / kMarker) << "made by weft run\n";
  fs::create_directories(dir / "store");
  // The orchestrator's own config: the section, with the journal inside the run directory.
  {
    YAML::Node section = YAML::Clone(config.orchestrator_section);
    section["journal"] = (dir / "orchestrator.journal").string();
    YAML::Node root;
    root["orchestrator"] = section;
    YAML::Emitter out;
    out << root;
    WEFT_RETURN_IF_ERROR(
        WriteTextFileAtomic((dir / "orchestrator.yaml").string(), std::string(out.c_str()) + "\n"));
  }
  const std::string config_abs = fs::absolute(config_path).string();
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return Internal("cannot find this program's path");
  self[length] = '\0';

  std::vector<Child> children;
  const std::string listen_orchestrator = config.orchestrator_listen();
  children.push_back(MakeChild("store",
                               {"store", "serve", "--store", (dir / "store").string(), "--listen",
                                config.store_listen, "--threads", "4"},
                               true, config.store_listen));
  children.push_back(MakeChild("orchestrator",
                               {"orchestrator", "--config", (dir / "orchestrator.yaml").string()},
                               true, listen_orchestrator));
  for (const RegionConfig& r : config.regions) {
    std::vector<std::string> args = {"relay",
                                     "--upstream",
                                     config.store_url(),
                                     "--cache",
                                     (dir / "relays" / r.name).string(),
                                     "--listen",
                                     r.relay_listen,
                                     "--threads",
                                     "16"};
    if (r.bandwidth > 0)
      args.insert(args.end(), {"--shape-bandwidth", std::to_string(r.bandwidth)});
    if (r.latency.count() > 0)
      args.insert(args.end(), {"--shape-latency", std::to_string(r.latency.count()) + "us"});
    children.push_back(MakeChild("relay-" + r.name, args, true, r.relay_listen));
  }
  const size_t first_worker = children.size();
  for (const RegionConfig& r : config.regions) {
    for (int i = 1; i <= r.workers; ++i) {
      const std::string name = r.name + "-" + std::to_string(i);
      children.push_back(MakeChild(
          "worker-" + name,
          {"worker", "--config", config_abs, "--cluster", name, "--region", r.name}, false));
    }
  }
  const size_t trainer_index = children.size();
  children.push_back(
      MakeChild("trainer",
                {"train", "--config", config_abs, "--store", (dir / "store").string(), "--progress",
                 (dir / "trainer.json").string()},
                false));

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Supervisor supervisor(self, (dir / "logs").string());
  // The workers (and the trainer) first: they drain, handing back jobs, and deregister. Then the
  // relays, the orchestrator and the store, in the reverse of their start.
  auto stop_workers = [&] {
    std::vector<Child*> workers;
    for (size_t i = first_worker; i < children.size(); ++i) workers.push_back(&children[i]);
    supervisor.Stop(workers, std::chrono::seconds(20));
  };
  auto stop_infrastructure = [&] {
    std::vector<Child*> infrastructure;
    for (size_t i = first_worker; i-- > 0;) infrastructure.push_back(&children[i]);
    supervisor.Stop(infrastructure, std::chrono::seconds(10));
  };
  std::printf("weft run %s: run %s in %s (logs in %s/logs)\n", config_path.c_str(),
              config.run_id.c_str(), dir.string().c_str(), dir.string().c_str());
  for (size_t i = 0; i < first_worker; ++i) {
    WEFT_RETURN_IF_ERROR(supervisor.Start(children[i]));
    if (!WaitForPort(children[i].listen, std::chrono::seconds(20), children[i])) {
      stop_infrastructure();
      return Unavailable(children[i].name + " did not start listening on " + children[i].listen +
                         " (see " + dir.string() + "/logs/" + children[i].name + ".log)");
    }
  }
  for (size_t i = first_worker; i < children.size(); ++i)
    WEFT_RETURN_IF_ERROR(supervisor.Start(children[i]));
  std::printf(
      "started the store (%s), the orchestrator (%s), %zu relays, %zu workers and the trainer\n",
      config.store_listen.c_str(), listen_orchestrator.c_str(), config.regions.size(),
      trainer_index - first_worker);
  std::fflush(stdout);

  HttpClientOptions quick;
  quick.attempts = 1;
  quick.deadline = std::chrono::milliseconds(2000);
  orchestrator::OrchestratorClient status_client(config.orchestrator_url(),
                                                 config.orchestrator.service.admin_token, quick);
  const bool tty = isatty(1);
  const auto started = Clock::now();
  auto last_line = Clock::now() - std::chrono::hours(1);
  std::string failure;
  bool interrupted = false;
  Json status;
  while (true) {
    timespec wait{0, 250'000'000};
    if (sigtimedwait(&signals, nullptr, &wait) > 0) {
      interrupted = true;
      failure = "interrupted";
      break;
    }
    bool trainer_done = false;
    for (Child* ended : supervisor.Reap(children)) {
      if (ended == &children[trainer_index]) {
        trainer_done = true;
        if (ended->exit_code != 0)
          failure = "the trainer " + ended->ended + " (see " + dir.string() + "/logs/trainer.log)";
      } else if (ended->restart) {
        std::printf("%s%s %s; restarting it\n", tty ? "\n" : "", ended->name.c_str(),
                    ended->ended.c_str());
        ++ended->restarts;
        if (ended->restarts > 5) {
          failure =
              ended->name + " keeps dying (see " + dir.string() + "/logs/" + ended->name + ".log)";
          break;
        }
        Status restarted = supervisor.Start(*ended);
        if (!restarted.ok()) failure = restarted.message();
      } else {
        std::printf("%s%s %s; its jobs go to the other workers\n", tty ? "\n" : "",
                    ended->name.c_str(), ended->ended.c_str());
      }
    }
    if (!failure.empty() || trainer_done) break;
    if (Clock::now() - started > config.time_limit) {
      failure =
          "the run passed its time limit of " + std::to_string(config.time_limit.count()) + " s";
      break;
    }
    if (Clock::now() - last_line >= std::chrono::seconds(tty ? 1 : 5)) {
      last_line = Clock::now();
      Result<Json> s = status_client.GetStatus();
      if (s.ok()) status = *s;
      const std::string line = ProgressLine(ReadJsonFile((dir / "trainer.json").string()),
                                            s.ok() ? status : Json(), config);
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      if (tty) {
        std::printf("\r\033[K[%5.0fs] %s", elapsed, line.c_str());
      } else {
        std::printf("[%5.0fs] %s\n", elapsed, line.c_str());
      }
      std::fflush(stdout);
    }
  }
  if (tty) std::printf("\n");
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  // Stop the workers first (they drain and send their last counters), then read the final state.
  stop_workers();
  HttpClientOptions patient;
  patient.deadline = std::chrono::milliseconds(10000);
  orchestrator::OrchestratorClient final_client(config.orchestrator_url(),
                                                config.orchestrator.service.admin_token, patient);
  if (Result<Json> s = final_client.GetStatus(); s.ok()) status = *s;
  Json relays = Json::object();
  for (const RegionConfig& r : config.regions) {
    HttpClient relay("http://" + r.relay_listen, quick);
    Result<HttpReply> reply = relay.Request("GET", "/v1/stats", {}, {});
    if (reply.ok() && reply->status == 200)
      relays[r.name] = Json::parse(reply->body.begin(), reply->body.end(), nullptr, false);
  }
  stop_infrastructure();

  // The report.
  const Json trainer = ReadJsonFile((dir / "trainer.json").string());
  const bool trained = trainer.is_object() && trainer.value("phase", "") == "done";
  const SyncTotals totals = Totals(status);
  const double full = trainer.is_object() ? trainer.value("served_bytes", 0.0) : 0.0;
  uint64_t wan = 0, corrupted = 0;
  for (const auto& [name, stats] : relays.items()) {
    if (!stats.is_object()) continue;
    wan += stats.value("upstream_bytes", uint64_t{0});
    corrupted += stats.value("corrupted", uint64_t{0});
  }
  Json per_step =
      trainer.is_object() && trainer.contains("steps") ? trainer["steps"] : Json::array();
  double density_sum = 0;
  for (const Json& s : per_step) density_sum += s.value("density", 0.0);
  Json report = {
      {"run", config.run_id},
      {"config", config_abs},
      {"completed", failure.empty()},
      {"failure", failure.empty() ? Json(nullptr) : Json(failure)},
      {"seconds", seconds},
      {"task", "two-number addition, " + std::to_string(config.trainer.digits) +
                   "-digit operands, exact-match reward"},
      {"initial_reward", trainer.value("initial_reward", 0.0)},
      {"final_reward", trainer.value("final_reward", 0.0)},
      {"random_policy_reward", trainer.value("random_policy_reward", 0.0)},
      {"eval_accuracy_before", trainer.value("eval_accuracy_before", 0.0)},
      {"eval_accuracy_after",
       trained ? Json(trainer.value("eval_accuracy_after", 0.0)) : Json(nullptr)},
      {"warmup_steps", config.trainer.warmup_steps},
      {"steps", per_step.size()},
      {"versions_published", trainer.value("versions_published", uint64_t{0})},
      {"parameters", trainer.value("parameters", uint64_t{0})},
      {"full_checkpoint_bytes", full},
      {"digest_mismatches", totals.digest_mismatches},
      {"staleness_violations", trainer.value("staleness_violations", uint64_t{0})},
      {"max_staleness", config.orchestrator.core.max_staleness},
      {"trajectories_dropped_stale",
       status.is_object() ? status["trajectories"].value("dropped_stale", uint64_t{0}) : 0},
      {"trajectories_delivered_stale",
       status.is_object() ? status["trajectories"].value("delivered_stale", uint64_t{0}) : 0},
      {"bytes_sent", totals.bytes_sent},
      {"bytes_full_equivalent", totals.full_versions * full},
      {"bytes_sent_fraction",
       totals.full_versions * full > 0
           ? static_cast<double>(totals.bytes_sent) / (totals.full_versions * full)
           : 0.0},
      {"bytes_wan", wan},
      {"bytes_published", trainer.value("bytes_published", uint64_t{0})},
      {"mean_density", per_step.empty() ? 0.0 : density_sum / static_cast<double>(per_step.size())},
      {"clusters", totals.clusters},
      {"pulls", totals.pulls},
      {"keyframe_pulls", totals.keyframe_pulls},
      {"max_commit_pause_ms", totals.max_pause_ms},
      {"relays", relays},
      {"relay_corrupted_blobs_refetched", corrupted},
      {"orchestrator", status.is_object() ? Json{{"jobs", status["jobs"]},
                                                 {"leases", status["leases"]},
                                                 {"clusters_lost", status["clusters_lost"]},
                                                 {"trajectories", status["trajectories"]},
                                                 {"journal", status["journal"]},
                                                 {"regions", status["regions"]},
                                                 {"clusters", status["clusters"]}}
                                          : Json()},
      {"restarts", Json::object()},
      {"per_step", per_step}};
  for (const Child& c : children) {
    if (c.restarts > 0) report["restarts"][c.name] = c.restarts;
  }
  const std::string report_path = (dir / "report.json").string();
  const std::string svg_path = (dir / "report.svg").string();
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(report_path, report.dump(2) + "\n"));
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(svg_path, Svg(report)));

  std::printf("\nsummary of run %s (%.0f s%s)\n", config.run_id.c_str(), seconds,
              failure.empty() ? "" : (", " + failure).c_str());
  std::printf(
      "  reward            %.3f -> %.3f over %zu RL steps (first and last 5 steps' batches; random "
      "policy %.5f)\n",
      report["initial_reward"].get<double>(), report["final_reward"].get<double>(), per_step.size(),
      report["random_policy_reward"].get<double>());
  std::printf(
      "  greedy accuracy   %.3f -> %s (%d held-out problems; after a %d-step supervised warm-up)\n",
      report["eval_accuracy_before"].get<double>(),
      trained ? std::to_string(report["eval_accuracy_after"].get<double>()).substr(0, 5).c_str()
              : "not measured (unfinished)",
      config.trainer.eval_problems, config.trainer.warmup_steps);
  std::printf(
      "  versions          %llu published, %llu pulls by %llu workers (%llu from a keyframe), "
      "digest mismatches %llu\n",
      static_cast<unsigned long long>(report["versions_published"].get<uint64_t>()),
      static_cast<unsigned long long>(totals.pulls),
      static_cast<unsigned long long>(totals.clusters),
      static_cast<unsigned long long>(totals.keyframe_pulls),
      static_cast<unsigned long long>(totals.digest_mismatches));
  std::printf(
      "  staleness         bound %llu, violations %llu, dropped stale %llu\n",
      static_cast<unsigned long long>(config.orchestrator.core.max_staleness),
      static_cast<unsigned long long>(report["staleness_violations"].get<uint64_t>()),
      static_cast<unsigned long long>(report["trajectories_dropped_stale"].get<uint64_t>()));
  std::printf(
      "  bytes to workers  %s, %.1f%% of %s for full checkpoints (mean density %.2f%% of served "
      "elements per version); WAN %s\n",
      Megabytes(static_cast<double>(totals.bytes_sent)).c_str(),
      100.0 * report["bytes_sent_fraction"].get<double>(),
      Megabytes(totals.full_versions * full).c_str(), 100.0 * report["mean_density"].get<double>(),
      Megabytes(static_cast<double>(wan)).c_str());
  std::printf("report: %s (picture: %s)\n", report_path.c_str(), svg_path.c_str());
  if (interrupted)
    return Unavailable("interrupted; everything was stopped and the report covers the run so far");
  if (!failure.empty()) return Internal(failure);
  return Status::Ok();
}

}  // namespace

void RegisterRun(CLI::App& app, Action* action) {
  auto config = std::make_shared<std::string>();
  CLI::App* r = app.add_subcommand("run",
                                   "Run everything on this machine from one config (e.g. "
                                   "configs/local.yaml) and write a report");
  r->add_option("config", *config, "the run's YAML config")->required()->check(CLI::ExistingFile);
  r->callback([config, action] { *action = [config] { return RunRun(*config); }; });
}

}  // namespace weft::cli
