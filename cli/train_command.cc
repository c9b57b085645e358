// weft train: the example trainer of a run (examples/example_trainer.h), as `weft run` starts it.
// Its flags default to the variables of the trainer channel (cli/trainer_channel.h; docs/run.md,
// "The trainer"), so `weft run` can start it as it starts any other trainer command; the run,
// orchestrator, trainer token and staleness bound those variables name replace the config's.
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/example_trainer_config.h"
#include "cli/run_config.h"
#include "cli/trainer_channel.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "examples/example_trainer.h"
#include "policy_store/manifest.h"
#include "sync/safetensors.h"
#include "sync/served_model.h"

namespace weft::cli {
namespace {

struct TrainFlags {
  std::string config;      // or $WEFT_CONFIG
  std::string store;       // or $WEFT_STORE; default: <run dir>/store
  std::string progress;    // or $WEFT_PROGRESS; default: <run dir>/trainer.json
  std::string checkpoint;  // --checkpoint: only the warm-up, saved there
};

// weft train --checkpoint PATH: the config's policy after its supervised warm-up
// (trainer.warmup), saved as a served checkpoint (BF16 safetensors): a fixed model for
// `weft generate` or a teacher, made without a run.
Status SaveCheckpoint(const RunConfig& config, const examples::ExampleTrainerOptions& options,
                      const std::string& path) {
  const examples::ArithmeticTask task(options.digits);
  const examples::TinyLmLayout layout(options.PolicyShape());
  WEFT_ASSIGN_OR_RETURN(std::vector<float> weights,
                        examples::SupervisedPolicy(
                            layout, task, options.seed, options.warmup_steps, options.warmup_batch,
                            options.warmup_learning_rate, options.threads, "checkpoint"));
  WEFT_ASSIGN_OR_RETURN(
      sync::ServedModel served,
      sync::ServedModel::FromMaster(layout.Master(weights), sync::ServingPlan{}, options.threads));
  WEFT_RETURN_IF_ERROR(sync::WriteSafetensors(path, served.AsTensorsToWrite()));
  WEFT_ASSIGN_OR_RETURN(
      double accuracy,
      examples::GreedyAccuracy(layout, weights, task,
                               task.HeldOutProblems(options.seed, options.eval_problems),
                               options.threads));
  std::printf(
      "saved %s: the %s policy of %s after %d supervised steps (%zu parameters, greedy "
      "accuracy %.3f)\n",
      path.c_str(), config.run_id.c_str(), config.path.c_str(), options.warmup_steps, layout.size(),
      accuracy);
  return Status::Ok();
}

// The settings the channel's variables give, over the config's.
Status ApplyChannel(examples::ExampleTrainerOptions& options) {
  auto variable = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  };
  if (const char* run = variable(kRunIdVariable)) {
    WEFT_RETURN_IF_ERROR(policy_store::ValidateRunId(run).WithContext(kRunIdVariable));
    options.run_id = run;
  }
  if (const char* url = variable(kOrchestratorVariable)) options.orchestrator = url;
  if (const char* token = variable(kTrainerTokenVariable)) options.trainer_token = token;
  if (const char* bound = variable(kMaxStalenessVariable)) {
    char* end = nullptr;
    const unsigned long long k = std::strtoull(bound, &end, 10);
    if (*end != '\0' || bound[0] == '-') {
      return InvalidArgument(std::string(kMaxStalenessVariable) + ": '" + bound +
                             "' is not a non-negative integer");
    }
    options.max_staleness = k;
  }
  return Status::Ok();
}

Status RunTrain(const TrainFlags& flags) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(flags.config));
  WEFT_ASSIGN_OR_RETURN(examples::ExampleTrainerOptions options, ExampleTrainerOptionsFor(config));
  if (!flags.checkpoint.empty()) return SaveCheckpoint(config, options, flags.checkpoint);
  WEFT_RETURN_IF_ERROR(ApplyChannel(options));
  if (options.trainer_token.empty()) {
    return InvalidArgument(flags.config +
                           ": orchestrator.tokens.trainer is needed (in the file or " +
                           kTrainerTokenVariable + ")");
  }
  options.store = flags.store.empty() ? config.dir + "/store" : flags.store;
  const std::string progress_path =
      flags.progress.empty() ? TrainerProgressPath(config.dir) : flags.progress;
  auto write = [&](const examples::TrainerSummary& summary) {
    Status written = WriteTextFileAtomic(progress_path, summary.ToJson().dump());
    if (!written.ok()) {
      WEFT_LOG(kWarning) << "cannot write " << progress_path << ": " << written.message();
    }
  };
  WEFT_ASSIGN_OR_RETURN(examples::TrainerSummary summary,
                        examples::RunExampleTrainer(options, write));
  std::printf(
      "trained %zu steps: reward %.3f -> %.3f, greedy accuracy %.3f -> %.3f (random policy %.5f); "
      "%llu versions published\n",
      summary.steps.size(), summary.initial_reward, summary.final_reward,
      summary.eval_accuracy_before, summary.eval_accuracy_after, summary.random_policy_reward,
      static_cast<unsigned long long>(summary.versions_published));
  return Status::Ok();
}

}  // namespace

void RegisterTrain(CLI::App& app, Action* action) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* t = app.add_subcommand("train", "The example trainer of a run (weft run starts it)");
  t->add_option("--config", flags->config, "the run's YAML config")
      ->required()
      ->envname(kConfigVariable)
      ->check(CLI::ExistingFile);
  t->add_option("--store", flags->store, "the store it publishes to (default: <run dir>/store)")
      ->envname(kStoreVariable);
  t->add_option("--checkpoint", flags->checkpoint,
                "only warm the policy up (trainer.warmup) and save it here as a served checkpoint "
                "(safetensors); no run");
  t->add_option("--progress", flags->progress,
                "JSON file rewritten after every step (default: <run dir>/trainer.json)")
      ->envname(kProgressVariable);
  t->footer(
      "Without flags it takes WEFT_CONFIG, WEFT_STORE and WEFT_PROGRESS, and WEFT_RUN_ID, "
      "WEFT_ORCHESTRATOR, WEFT_TRAINER_TOKEN and WEFT_MAX_STALENESS replace the config's, as weft "
      "run sets them for its trainer (docs/run.md).");
  t->callback([flags, action] { *action = [flags] { return RunTrain(*flags); }; });
}

}  // namespace weft::cli
