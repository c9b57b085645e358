// weft worker: one rollout cluster joining a run, driving the engine and generating for the task
// the run's config names (cli/builtins.h).
#include <algorithm>
#include <cstdio>
#include <thread>

#include "cli/builtins.h"
#include "cli/commands.h"
#include "cli/run_config.h"
#include "orchestrator/client.h"
#include "policy_store/object_store.h"
#include "rollout_worker/http_engine.h"
#include "rollout_worker/worker.h"

namespace weft::cli {
namespace {

struct WorkerFlags {
  std::string config;
  std::string cluster;
  std::string region;
  std::string orchestrator;              // default: the config's orchestrator
  std::string store;                     // default: the region's relay
  std::vector<std::string> engine_urls;  // default: the region's worker_engines, or engine.urls
  std::string model;                     // a fixed model of the config's (default: the policy)
};

// A worker may start before its orchestrator answers (a scheduler starts them together, or the
// orchestrator is replaying its journal after a restart): it waits for /readyz, backing off from
// 1 s to 30 s and saying so. False when a stop signal came first.
bool WaitForOrchestrator(const std::string& cluster, const std::string& url, StopSignals& stop) {
  HttpClientOptions quick;
  quick.attempts = 1;
  quick.deadline = std::chrono::milliseconds(5000);
  HttpClient probe(url, quick);
  std::chrono::seconds delay(1);
  for (bool first = true;; first = false) {
    Result<HttpReply> reply = probe.Request("GET", "/readyz", {}, {});
    if (reply.ok() && reply->status == 200) {
      if (!first) {
        std::printf("worker %s: the orchestrator at %s answers\n", cluster.c_str(), url.c_str());
        std::fflush(stdout);
      }
      return true;
    }
    const std::string why = reply.ok()
                                ? "it answered /readyz with HTTP " + std::to_string(reply->status)
                                : reply.status().message();
    std::printf(
        "worker %s: the orchestrator at %s does not answer yet (%s); trying again in %lld s\n",
        cluster.c_str(), url.c_str(), why.c_str(), static_cast<long long>(delay.count()));
    std::fflush(stdout);
    if (stop.WaitFor(delay)) return false;
    delay = std::min(delay * 2, std::chrono::seconds(30));
  }
}

Status RunWorker(const WorkerFlags& flags) {
  // From the start: a stop signal while the engine and the store are being set up (their
  // threads started) drains the worker as soon as it runs.
  StopSignals stop;
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(flags.config));
  WEFT_RETURN_IF_ERROR(config.NeedTokens(true, false, false));
  if (flags.cluster.empty() || flags.cluster.find_first_of("/ ") != std::string::npos) {
    return InvalidArgument("--cluster: '" + flags.cluster +
                           "' is not a cluster name (no '/' or spaces)");
  }
  std::string store_uri = flags.store;
  if (store_uri.empty()) {
    const RegionConfig* region = config.FindRegion(flags.region);
    if (region == nullptr) {
      return InvalidArgument("region '" + flags.region + "' is not in " + flags.config +
                             "; give --store (the region's relay or store URL)");
    }
    store_uri = "http://" + region->relay_listen;
  }
  const std::string orchestrator_url =
      flags.orchestrator.empty() ? config.orchestrator_url() : flags.orchestrator;
  policy_store::OpenOptions link;
  link.deadline = std::chrono::milliseconds(60000);
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<policy_store::ObjectStore> store,
                        policy_store::OpenStore(store_uri, link));
  HttpClientOptions http;
  http.deadline = std::chrono::milliseconds(60000);  // rides out an orchestrator restart
  orchestrator::OrchestratorClient client(orchestrator_url,
                                          config.orchestrator.service.worker_token, http);

  // A fixed model's worker serves its run, its engine shaped by its own `model` section.
  const FixedModelConfig* fixed = nullptr;
  if (!flags.model.empty()) {
    fixed = config.FindFixedModel(flags.model);
    if (fixed == nullptr)
      return InvalidArgument("--model: '" + flags.model + "' is not one of the fixed_models of " +
                             flags.config);
  }
  YAML::Node document = fixed != nullptr ? FixedModelDocument(config, *fixed) : config.document;
  rollout_worker::ComponentConfig component{document, config.path, config.worker.threads};
  component.cluster = flags.cluster;
  component.engine_urls = flags.engine_urls;
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<rollout_worker::Task> task,
                        Builtins().MakeTask(config.task, component));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<rollout_worker::Engine> engine,
                        Builtins().MakeEngine(config.worker.engine, component, *task));
  const rollout_worker::TaskLimits limits = task->limits();

  rollout_worker::WorkerOptions options;
  options.cluster = flags.cluster;
  options.region = flags.region;
  options.run_id = fixed != nullptr ? fixed->run : config.run_id;
  options.model = flags.model;
  options.capacity = config.worker.capacity;
  options.heartbeat_interval = config.worker.heartbeat;
  options.push = config.worker.push;
  if (!config.worker.spill_dir.empty()) options.spill_dir = config.worker.spill_dir;
  options.sampling.temperature = static_cast<float>(config.worker.temperature);
  options.sampling.top_p = static_cast<float>(config.worker.top_p);
  options.sampling.max_tokens = limits.max_completion_tokens;
  options.sampling.stop_token = limits.stop_token;
  // A serving engine's copy lives in its served checkpoint directory and nowhere else (no second
  // copy of the model in host memory, rollout_worker/weight_sink.h), unless engine.copy says
  // memory.
  std::unique_ptr<rollout_worker::WeightSink> sink;
  if (auto* http = dynamic_cast<rollout_worker::HttpEngine*>(engine.get());
      http != nullptr && http->options().copy_in_file)
    sink = std::make_unique<rollout_worker::DirectoryWeightSink>(*http);
  rollout_worker::RolloutWorker worker(options, client, *store, *engine, *task, sink.get());

  std::printf("worker %s (region %s): orchestrator %s, weights from %s, its copy %s\n",
              flags.cluster.c_str(), flags.region.c_str(), orchestrator_url.c_str(),
              store_uri.c_str(),
              sink != nullptr ? "in the served checkpoint file" : "in host memory");
  std::fflush(stdout);
  if (!WaitForOrchestrator(flags.cluster, orchestrator_url, stop)) {
    std::printf("worker %s stopped before the orchestrator answered; it never registered\n",
                flags.cluster.c_str());
    return Status::Ok();
  }
  std::thread stopper([&] {
    stop.Wait();
    worker.Stop();
  });
  Status ran = worker.Run();
  if (stopper.joinable()) {
    // Run() only returns after Stop() (or a failed registration): wake the stopper if needed.
    if (!ran.ok()) stop.Wake();
    stopper.join();
  }
  const rollout_worker::WorkerStats stats = worker.stats();
  const orchestrator::SyncReport sync = worker.sync_report();
  std::printf(
      "worker %s stopped: %llu jobs (%llu samples, mean reward %.3f), %llu handed back, %llu "
      "rejected; %llu versions loaded, "
      "%llu bytes downloaded, %llu digest mismatches\n",
      flags.cluster.c_str(), static_cast<unsigned long long>(stats.jobs),
      static_cast<unsigned long long>(stats.samples),
      stats.samples > 0 ? stats.reward_sum / static_cast<double>(stats.samples) : 0.0,
      static_cast<unsigned long long>(stats.handed_back),
      static_cast<unsigned long long>(stats.submissions_rejected),
      static_cast<unsigned long long>(sync.commits),
      static_cast<unsigned long long>(sync.bytes_downloaded),
      static_cast<unsigned long long>(sync.digest_mismatches));
  // Serving engines: what each replica went through.
  if (const auto* http = dynamic_cast<const rollout_worker::HttpEngine*>(engine.get())) {
    const rollout_worker::HttpEngineStats s = http->stats();
    std::printf(
        "  %llu samples continued after a pause, %llu generated again; %llu targets scored, %llu "
        "scored again\n",
        static_cast<unsigned long long>(s.continued),
        static_cast<unsigned long long>(s.regenerated), static_cast<unsigned long long>(s.scored),
        static_cast<unsigned long long>(s.rescored));
    for (const rollout_worker::ReplicaStats& r : s.replicas) {
      std::printf(
          "  replica %s: %llu loads (pause max %.1f ms, mean %.1f ms), %llu requests, %llu "
          "failures\n",
          r.url.c_str(), static_cast<unsigned long long>(r.loads), r.max_pause_ms,
          r.loads > 0 ? r.total_pause_ms / static_cast<double>(r.loads) : 0.0,
          static_cast<unsigned long long>(r.requests), static_cast<unsigned long long>(r.failures));
    }
  }
  return ran;
}

}  // namespace

void RegisterWorker(CLI::App& app, Action* action) {
  auto flags = std::make_shared<WorkerFlags>();
  CLI::App* w = app.add_subcommand(
      "worker",
      "Join a run as a rollout cluster driving the config's engine (embedded, sglang or vllm); "
      "SIGTERM drains it");
  w->add_option("--config", flags->config, "the run's YAML config")
      ->required()
      ->check(CLI::ExistingFile);
  w->add_option("--cluster", flags->cluster, "this cluster's name (unique in the run)")->required();
  w->add_option("--region", flags->region, "its region")->required();
  w->add_option("--orchestrator", flags->orchestrator,
                "orchestrator URL (default: from the config)");
  w->add_option("--store", flags->store,
                "where weights come from (default: the region's relay from the config)");
  w->add_option("--model", flags->model,
                "serve this fixed model of the config's fixed_models (default: the run's policy)");
  w->add_option("--engine-url", flags->engine_urls,
                "an engine replica this worker drives (repeat for several; default: engine.urls "
                "from the config)");
  w->callback([flags, action] { *action = [flags] { return RunWorker(*flags); }; });
}

}  // namespace weft::cli
