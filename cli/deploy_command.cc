// weft deploy slurm|kubernetes CONFIG [--out DIR] [--check] [--submit]: writes (or checks) the
// files of a deployment (cli/deploy.h), and for Slurm can submit them.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "cli/commands.h"
#include "cli/deploy.h"
#include "cli/example_trainer_config.h"
#include "common/file_util.h"

namespace weft::cli {
namespace fs = std::filesystem;
namespace {

struct DeployFlags {
  std::string target;  // slurm or kubernetes
  std::string config;
  std::string out;
  bool check = false;
  bool submit = false;
};

// Where a directory is node-local: a memory file system, or a path every machine has its own of.
std::string NodeLocalReason(const std::string& path) {
  for (const char* local : {"/tmp", "/var/tmp", "/dev/shm", "/run"}) {
    const std::string prefix = local;
    if (path == prefix || path.rfind(prefix + "/", 0) == 0)
      return "it lies under " + prefix + ", which every node has its own of";
  }
  // The nearest existing ancestor's file system.
  fs::path probe = path;
  while (!probe.empty() && !fs::exists(probe)) probe = probe.parent_path();
  if (Result<bool> memory = OnMemoryFileSystem(probe.string());
      !probe.empty() && memory.ok() && *memory)
    return "it is on a memory file system (tmpfs), which is the node's own and lost with it";
  return "";
}

// What the Slurm files need of this machine: shared storage, a weft binary.
Status CheckSlurmMachine(const RunConfig& config, const DeployContext& context) {
  const SlurmDeploy& s = config.deploy.slurm;
  if (const std::string reason = NodeLocalReason(s.dir); !reason.empty()) {
    return InvalidArgument("deploy.slurm.dir: " + s.dir + " is node-local storage (" + reason +
                           "); the orchestrator's journal must survive a requeue onto another "
                           "node, and every job reads the services' addresses there: give a "
                           "directory on shared storage");
  }
  if (access(context.weft.c_str(), X_OK) != 0) {
    return InvalidArgument(
        (s.weft.empty() ? std::string("this weft (") + context.weft + ")"
                        : "deploy.slurm.weft: " + context.weft) +
        " is not an executable file here; the jobs run it, so it must be on storage the nodes "
        "share (give deploy.slurm.weft)");
  }
  return Status::Ok();
}

Status WriteFiles(const std::vector<DeployFile>& files, const std::string& out) {
  std::error_code error;
  fs::create_directories(out, error);
  if (error) return Internal("cannot create " + out + ": " + error.message());
  for (const DeployFile& f : files) {
    const fs::path path = fs::path(out) / f.path;
    fs::create_directories(path.parent_path(), error);
    if (error)
      return Internal("cannot create " + path.parent_path().string() + ": " + error.message());
    // Its mode from the first byte on: a file with tokens is never readable by others, not even
    // for a moment.
    const mode_t mode = f.secret ? (f.executable ? 0700 : 0600) : (f.executable ? 0755 : 0644);
    WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(path.string(), f.content, mode));
  }
  return Status::Ok();
}

Status RunDeploy(const DeployFlags& flags) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(flags.config));
  // What weft run checks before anything starts holds here too: a config that deploys runs.
  if (config.trainer_command.empty())
    WEFT_RETURN_IF_ERROR(ExampleTrainerOptionsFor(config).status());
  const bool slurm = flags.target == "slurm";
  const std::string section = slurm ? "deploy.slurm" : "deploy.kubernetes";
  if (!(slurm ? config.deploy.slurm.present : config.deploy.kubernetes.present)) {
    return InvalidArgument(flags.config + ": no " + section + " section (docs/deploy.md)");
  }
  if (flags.submit && !slurm)
    return InvalidArgument("--submit: Kubernetes manifests are applied with kubectl apply -f");
  // The schedulers' files start the policy's workers only: a config whose fixed models would have
  // no workers is refused rather than deployed without them.
  for (const RegionConfig& r : config.regions) {
    if (!r.model_workers.empty())
      return InvalidArgument(flags.config + ": regions: region " + r.name +
                             " runs workers of fixed models (models:), which weft deploy does not "
                             "deploy yet; start them with weft worker --model");
  }
  DeployContext context;
  context.config_path = fs::absolute(flags.config).lexically_normal().string();
  if (slurm) {
    WEFT_ASSIGN_OR_RETURN(context.weft, ThisProgramPath());
    if (!config.deploy.slurm.weft.empty()) context.weft = config.deploy.slurm.weft;
  }
  const std::string out = !flags.out.empty() ? flags.out
                          : slurm            ? config.deploy.slurm.dir + "/slurm"
                                             : std::string("deploy-kubernetes");
  context.out_dir = fs::absolute(out).lexically_normal().string();
  // Relative paths of the config (task.dataset, say) resolve where weft deploy ran, as they do
  // where weft run runs.
  context.work_dir = fs::current_path().string();
  if (slurm) {
    // The jobs read them from the config (or from WEFT_*_TOKEN in the environment sbatch runs
    // in, which Slurm passes on); on Kubernetes from Secrets.
    WEFT_RETURN_IF_ERROR(config.NeedTokens(true, true, true));
    WEFT_RETURN_IF_ERROR(CheckSlurmMachine(config, context));
  }
  Result<std::vector<DeployFile>> files =
      slurm ? SlurmDeployment(config, context) : KubernetesDeployment(config, context);
  if (!files.ok()) return files.status().WithContext(flags.config);
  if (flags.check) {
    std::printf("%s: the %s deployment checks out (%zu files, not written)\n", flags.config.c_str(),
                flags.target.c_str(), files->size());
    return Status::Ok();
  }
  WEFT_RETURN_IF_ERROR(WriteFiles(*files, context.out_dir));
  std::printf("wrote %zu files to %s\n", files->size(), context.out_dir.c_str());
  for (const DeployFile& f : *files) std::printf("  %s\n", f.path.c_str());
  if (!flags.submit) {
    if (slurm)
      std::printf("submit them with %s/submit.sh (or weft deploy slurm --submit)\n",
                  context.out_dir.c_str());
    else
      std::printf("create the Secrets with %s/secrets.sh, then kubectl apply -f %s\n",
                  context.out_dir.c_str(), context.out_dir.c_str());
    return Status::Ok();
  }
  std::fflush(stdout);
  const std::string script = context.out_dir + "/submit.sh";
  const int status = std::system(ShellQuote(script).c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Unavailable(script + " failed (its output is above)");
  return Status::Ok();
}

}  // namespace

std::string DeployedOrchestratorYaml(const RunConfig& config, const std::string& journal,
                                     bool without_tokens) {
  YAML::Node section = YAML::Clone(config.orchestrator_section);
  section["listen"] = "0.0.0.0:" + std::to_string(ListenPort(config.orchestrator_listen()));
  section["journal"] = journal;
  if (without_tokens) section.remove("tokens");
  YAML::Node root;
  root["orchestrator"] = section;
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

std::string DeployedRunConfigYaml(const RunConfig& config, bool without_tokens) {
  YAML::Node root = YAML::Clone(config.document);
  root.remove("deploy");
  if (without_tokens && root["orchestrator"] && root["orchestrator"].IsMap())
    root["orchestrator"].remove("tokens");
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

void RegisterDeploy(CLI::App& app, Action* action) {
  auto flags = std::make_shared<DeployFlags>();
  CLI::App* d = app.add_subcommand(
      "deploy",
      "Write the Slurm batch scripts or Kubernetes manifests that run a config's deployment "
      "(its deploy: section; docs/deploy.md)");
  d->add_option("target", flags->target, "slurm or kubernetes")
      ->required()
      ->check(CLI::IsMember({"slurm", "kubernetes"}));
  d->add_option("config", flags->config, "the run's YAML config")
      ->required()
      ->check(CLI::ExistingFile);
  d->add_option("--out", flags->out,
                "where the files go (default: deploy.slurm.dir/slurm for Slurm, which the jobs "
                "read; ./deploy-kubernetes for Kubernetes)");
  d->add_flag("--check", flags->check, "check the config and the deployment, write nothing");
  d->add_flag("--submit", flags->submit,
              "Slurm: submit the jobs after writing them (OUT/submit.sh)");
  d->callback([flags, action] { *action = [flags] { return RunDeploy(*flags); }; });
}

}  // namespace weft::cli
