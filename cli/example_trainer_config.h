// The built-in example trainer's options (examples/example_trainer.h) from a run config: what
// `weft train` runs with, and what `weft run` checks before anything starts when no
// trainer.command replaces the built-in trainer. The run config holds the schema every trainer
// shares (cli/run_config.h, TrainerSettings); this adds what the example trainer needs beyond it:
// its arithmetic problems of task.digits digits, with their answers, must fit the workers'
// sequences, since its model takes their length. Pure; errors start with the config's path and
// name the key, as the run config's do.
#pragma once

#include "cli/run_config.h"
#include "common/status.h"
#include "examples/example_trainer.h"

namespace weft::cli {

// The options for the run `config` describes: its model, task and trainer settings, the workers'
// sequence length, and the run, orchestrator, trainer token and staleness bound of the config
// (the store is left for the caller).
Result<examples::ExampleTrainerOptions> ExampleTrainerOptionsFor(const RunConfig& config);

}  // namespace weft::cli
