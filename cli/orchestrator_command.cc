// weft orchestrator --config FILE.yaml: the control plane (docs/api.md, "Orchestrator API").
#include <cstdio>

#include "cli/commands.h"
#include "orchestrator/config.h"
#include "orchestrator/durable_core.h"
#include "orchestrator/service.h"

namespace weft::cli {
namespace {

using namespace weft::orchestrator;

Status RunOrchestrator(const std::string& config_path) {
  WEFT_ASSIGN_OR_RETURN(OrchestratorConfig config, LoadOrchestratorConfig(config_path));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<DurableCore> core,
                        DurableCore::Open(config.journal, config.core, config.durable));
  if (core->fresh() && !config.dataset.empty()) {
    WEFT_ASSIGN_OR_RETURN(auto prompts, LoadPrompts(config.dataset, config.dataset_limits));
    WEFT_RETURN_IF_ERROR(core->AddJobs(WallMicros(), prompts).status());
    std::printf("queued %zu prompts from %s\n", prompts.size(), config.dataset.c_str());
  }
  StopSignals stop;  // before the server's threads start
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<OrchestratorService> service,
                        OrchestratorService::Start(*core, config.service));
  std::printf(
      "orchestrator for run %s on %s://%s:%u (journal %s, generation %llu, %llu events replayed)\n",
      config.service.run_id.c_str(), config.service.server.tls_cert_file.empty() ? "http" : "https",
      config.service.server.address.c_str(), static_cast<unsigned>(service->port()),
      config.journal.c_str(), static_cast<unsigned long long>(core->generation()),
      static_cast<unsigned long long>(core->events_replayed()));
  std::fflush(stdout);
  stop.Wait();
  service->Stop();
  std::printf("stopped\n");
  return Status::Ok();
}

}  // namespace

void RegisterOrchestrator(CLI::App& app, Action* action) {
  auto config = std::make_shared<std::string>();
  CLI::App* o = app.add_subcommand(
      "orchestrator", "Run the orchestrator: versions, leases, staleness, trajectories");
  o->add_option("--config", *config, "YAML file with an 'orchestrator:' section")
      ->required()
      ->check(CLI::ExistingFile);
  o->callback([config, action] { *action = [config] { return RunOrchestrator(*config); }; });
}

}  // namespace weft::cli
