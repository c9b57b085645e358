// `weft deploy slurm|kubernetes CONFIG`: the files that run a config's deployment through a
// scheduler (docs/deploy.md), made from the run config and its `deploy:` section
// (cli/deploy_config.h). The generators are pure functions of the config and the context below;
// the command (cli/deploy_command.cc) checks what depends on this machine, writes the files and,
// for Slurm, can submit them.
#pragma once

#include <string>
#include <vector>

#include "cli/run_config.h"
#include "cli/trainer_channel.h"
#include "common/status.h"

namespace weft::cli {

// One file of a deployment, relative to the output directory.
struct DeployFile {
  std::string path;
  std::string content;
  bool executable = false;
  bool secret = false;  // holds tokens: written readable by its owner alone
};

struct DeployContext {
  std::string config_path;  // the run config, absolute
  std::string weft;         // the weft binary the jobs run (Slurm), absolute
  std::string out_dir;      // where the files go, absolute
  std::string work_dir;     // the jobs' working directory (relative paths in the config), absolute
};

// Slurm: one batch script per job, submit.sh (in dependency order) and the files the jobs read.
Result<std::vector<DeployFile>> SlurmDeployment(const RunConfig& config,
                                                const DeployContext& context);
// Kubernetes: manifests (one YAML document per object) and the commands that create the Secrets.
Result<std::vector<DeployFile>> KubernetesDeployment(const RunConfig& config,
                                                     const DeployContext& context);

// Shared by both generators.
//
// The orchestrator's own config for a deployment: the config's orchestrator section listening on
// every address of its node at the config's port, with its journal at `journal`, and without its
// tokens when `without_tokens` (they then come from WEFT_*_TOKEN in its environment).
std::string DeployedOrchestratorYaml(const RunConfig& config, const std::string& journal,
                                     bool without_tokens);
// The run config as the deployed processes read it: the file's document, less its deploy:
// section, and less orchestrator.tokens when `without_tokens`.
std::string DeployedRunConfigYaml(const RunConfig& config, bool without_tokens);

}  // namespace weft::cli
