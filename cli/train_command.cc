// weft train: the example trainer of a run (examples/example_trainer.h), as `weft run` starts it.
#include <cstdio>

#include "cli/commands.h"
#include "cli/run_config.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "examples/example_trainer.h"

namespace weft::cli {
namespace {

struct TrainFlags {
  std::string config;
  std::string store;     // default: <run dir>/store
  std::string progress;  // default: <run dir>/trainer.json
};

Status RunTrain(const TrainFlags& flags) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(flags.config));
  examples::ExampleTrainerOptions options = config.trainer;
  options.store = flags.store.empty() ? config.dir + "/store" : flags.store;
  const std::string progress_path =
      flags.progress.empty() ? config.dir + "/trainer.json" : flags.progress;
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
      ->check(CLI::ExistingFile);
  t->add_option("--store", flags->store, "the store it publishes to (default: <run dir>/store)");
  t->add_option("--progress", flags->progress,
                "JSON file rewritten after every step (default: <run dir>/trainer.json)");
  t->callback([flags, action] { *action = [flags] { return RunTrain(*flags); }; });
}

}  // namespace weft::cli
