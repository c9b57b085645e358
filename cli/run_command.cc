// weft run CONFIG: a whole run on one machine, as separate processes (this binary's other
// subcommands): the store server over the run's store directory, the orchestrator, one relay per
// region behind the region's emulated WAN link, the workers of every region and the trainer (the
// built-in example trainer, `weft train`, or the command `trainer.command` names, which gets the
// run's settings through the channel of cli/trainer_channel.h). It supervises them
// (cli/supervisor.h: the store, the orchestrator and the relays are restarted if they die; a worker
// that dies stays dead and its jobs go to others), prints a progress line, stops everything on
// Ctrl-C or when the trainer is done, and writes the report (cli/run_report.h; docs/run.md).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/builtins.h"
#include "cli/commands.h"
#include "cli/example_trainer_config.h"
#include "cli/run_config.h"
#include "cli/run_processes.h"
#include "cli/run_report.h"
#include "cli/supervisor.h"
#include "cli/trainer_channel.h"
#include "common/file_util.h"
#include "common/http_client.h"
#include "orchestrator/client.h"

namespace weft::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const char kMarker[] = ".weft-run";

// The trainer's progress file, as the progress line and the report read it: the last one that
// was readable and matched the schema, and what was wrong with the newest if it did not.
class ProgressReader {
 public:
  explicit ProgressReader(std::string path) : path_(std::move(path)) {}

  void Read() {
    Result<std::vector<uint8_t>> bytes = ReadFile(path_);
    if (!bytes.ok()) {
      // Not written yet is no problem; anything else is.
      problem_ = bytes.status().code() == StatusCode::kNotFound ? "" : bytes.status().message();
      return;
    }
    const Json parsed = Json::parse(bytes->begin(), bytes->end(), nullptr, false);
    Result<Json> checked =
        parsed.is_discarded() ? Result<Json>(InvalidArgument("not JSON")) : CheckProgress(parsed);
    if (!checked.ok()) {
      problem_ = path_ + ": " + checked.status().message();
      return;
    }
    last_ = std::move(*checked);
    problem_.clear();
  }
  const Json& last() const { return last_; }               // null until one was good
  const std::string& problem() const { return problem_; }  // empty: the newest was good

 private:
  std::string path_;
  Json last_;
  std::string problem_;
};

Status RunRun(const std::string& config_path) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(config_path));
  WEFT_RETURN_IF_ERROR(config.NeedTokens(true, true, true));
  // The built-in trainer's own needs, when it is the trainer: checked before anything starts.
  if (config.trainer_command.empty())
    WEFT_RETURN_IF_ERROR(ExampleTrainerOptionsFor(config).status());
  // The workers' task and engine, made once here so that a bad name or setting fails before
  // anything starts.
  {
    rollout_worker::ComponentConfig component{config.document, config.path, 1};
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<rollout_worker::Task> task,
                          Builtins().MakeTask(config.task, component));
    for (const RegionConfig& r : config.regions) {
      for (int i = 0; i < std::max(1, r.workers); ++i) {  // each worker's own engine settings
        component.cluster = r.name + "-" + std::to_string(i + 1);
        component.engine_urls =
            r.worker_engines.empty() ? std::vector<std::string>() : r.worker_engines[i];
        WEFT_RETURN_IF_ERROR(
            Builtins().MakeEngine(config.worker.engine, component, *task).status());
      }
    }
    for (const FixedModelConfig& m : config.fixed_models) {  // in its own shape
      rollout_worker::ComponentConfig own{FixedModelDocument(config, m), config.path, 1};
      auto check = [&](const std::string& cluster, const std::vector<std::string>& urls) {
        own.cluster = cluster;
        own.engine_urls = urls;
        return Builtins()
            .MakeEngine(config.worker.engine, own, *task)
            .status()
            .WithContext("fixed model " + m.name);
      };
      bool own_engines = false;  // its workers' engines are given per worker (model_engines)
      for (const RegionConfig& r : config.regions) {
        const auto engines = r.model_engines.find(m.name);
        if (engines == r.model_engines.end()) continue;
        own_engines = true;
        for (size_t i = 0; i < engines->second.size(); ++i) {
          WEFT_RETURN_IF_ERROR(
              check(r.name + "-" + m.name + "-" + std::to_string(i + 1), engines->second[i]));
        }
      }
      if (!own_engines) WEFT_RETURN_IF_ERROR(check(m.name, {}));
    }
  }
  // The trainer's program, found before anything starts (on the PATH it will have).
  std::string trainer_program;
  if (!config.trainer_command.empty()) {
    const char* path = std::getenv("PATH");
    const auto own_path = config.trainer_env.find("PATH");
    Result<std::string> found = FindExecutable(
        config.trainer_command[0], own_path != config.trainer_env.end() ? own_path->second
                                   : path != nullptr                    ? path
                                                                        : "/bin:/usr/bin");
    if (!found.ok()) return found.status().WithContext(config.path + ": trainer.command");
    trainer_program = *found;
  }
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
  if (config.store_uri.empty()) fs::create_directories(dir / "store");
  const std::string config_abs = fs::absolute(config_path).string();
  // What the trainer reads (docs/run.md, "The trainer"): its settings, resolved.
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(TrainerSettingsPath(dir.string()),
                                           TrainerSettingsJson(config).dump(2) + "\n"));
  const std::string progress_path = TrainerProgressPath(dir.string());
  WEFT_ASSIGN_OR_RETURN(const std::string self, ThisProgramPath());

  WEFT_ASSIGN_OR_RETURN(RunProcesses processes, PlanRunProcesses(config, dir, config_abs));
  std::vector<Child>& children = processes.children;
  const size_t first_worker = processes.first_worker;
  const std::string listen_orchestrator = config.orchestrator_listen();
  const size_t trainer_index = children.size();
  if (config.trainer_command.empty()) {
    children.push_back(MakeChild("trainer",
                                 {"train", "--config", config_abs, "--store",
                                  config.publish_store(dir.string()), "--progress", progress_path},
                                 false));
  } else {
    Child trainer = MakeChild(
        "trainer", {config.trainer_command.begin() + 1, config.trainer_command.end()}, false);
    trainer.executable = trainer_program;
    trainer.argv0 = config.trainer_command[0];
    children.push_back(std::move(trainer));
  }
  children[trainer_index].environment = config.trainer_env;
  for (auto& [name, value] : TrainerChannelEnvironment(config, dir.string(), config_abs))
    children[trainer_index].environment[name] = value;

  StopSignals stop;
  Supervisor supervisor(self, (dir / "logs").string());
  // The workers (and the trainer) first: they drain, handing back jobs, and deregister. Then the
  // relays, the orchestrator and the store, in the reverse of their start.
  auto stop_workers = [&] { StopWorkers(supervisor, children, first_worker); };
  auto stop_infrastructure = [&] { StopInfrastructure(supervisor, children, first_worker); };
  std::printf("weft run %s: run %s in %s (logs in %s/logs)\n", config_path.c_str(),
              config.run_id.c_str(), dir.string().c_str(), dir.string().c_str());
  WEFT_RETURN_IF_ERROR(StartRunProcesses(supervisor, children, first_worker, dir));
  const std::string own_store =
      config.store_uri.empty() ? "the store (" + config.store_listen + "), " : "";
  const std::string shared_store =
      config.store_uri.empty() ? "" : ", with the store " + config.store_uri;
  std::printf("started %sthe orchestrator (%s), %zu relays, %zu workers and the trainer (%s)%s\n",
              own_store.c_str(), listen_orchestrator.c_str(), config.regions.size(),
              trainer_index - first_worker, TrainerDescription(config).c_str(),
              shared_store.c_str());
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
  std::optional<orchestrator::wire::StatusPage> status;  // the last the orchestrator gave
  // Every version any status page listed, by number (the page lists only the latest few).
  std::map<uint64_t, orchestrator::wire::StatusPage::Version> versions;
  ProgressReader progress(progress_path);
  while (true) {
    if (stop.WaitFor(std::chrono::milliseconds(250))) {
      interrupted = true;
      failure = "interrupted";
      break;
    }
    bool trainer_done = false;
    for (Child* ended : ReapRunProcesses(supervisor, children, dir, tty, &failure)) {
      if (ended == &children[trainer_index]) {
        trainer_done = true;
        if (ended->exit_code != 0)
          failure = "the trainer " + ended->ended + " (see " + dir.string() + "/logs/trainer.log)";
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
      Result<orchestrator::wire::StatusPage> s = status_client.GetStatus();
      if (s.ok()) {
        for (const auto& v : s->versions) versions[v.version] = v;
        status = std::move(*s);
      }
      progress.Read();
      std::string line = ProgressLine(progress.last(), s.ok() ? &*status : nullptr, config);
      if (!progress.problem().empty()) line += " | " + progress.problem();
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
  if (Result<orchestrator::wire::StatusPage> s = final_client.GetStatus(); s.ok())
    status = std::move(*s);
  if (status) {
    // Every version seen along the way (the page lists the latest few): the report's
    // publication to ready covers the whole run.
    for (const auto& v : status->versions) versions[v.version] = v;
    status->versions.clear();
    for (auto& [number, v] : versions) status->versions.push_back(std::move(v));
  }
  Json relays = Json::object();
  for (const RegionConfig& r : config.regions) {
    HttpClient relay("http://" + r.relay_listen, quick);
    Result<HttpReply> reply = relay.Request("GET", "/v1/stats", {}, {});
    if (reply.ok() && reply->status == 200)
      relays[r.name] = Json::parse(reply->body.begin(), reply->body.end(), nullptr, false);
  }
  stop_infrastructure();

  // The report.
  progress.Read();
  RunOutcome outcome{config_abs,         failure, seconds, progress.last(),
                     progress.problem(), status,  relays,  {}};
  if (!progress.problem().empty())
    std::printf("the trainer's last progress file is unusable: %s\n", progress.problem().c_str());
  for (const Child& c : children) {
    if (c.restarts > 0) outcome.restarts[c.name] = c.restarts;
  }
  const Json report = BuildReport(config, outcome);
  const std::string report_path = (dir / "report.json").string();
  const std::string svg_path = (dir / "report.svg").string();
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(report_path, report.dump(2) + "\n"));
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(svg_path, ReportSvg(report)));
  WEFT_RETURN_IF_ERROR(WriteTextFileAtomic((dir / "report.html").string(), ReportHtml(report)));
  PrintSummary(config, report);
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
