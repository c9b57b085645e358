#include "cli/example_trainer_config.h"

#include "examples/arithmetic_task.h"
#include "examples/optimizers.h"

namespace weft::cli {

Result<examples::ExampleTrainerOptions> ExampleTrainerOptionsFor(const RunConfig& config) {
  const TrainerSettings& t = config.trainer;
  examples::ExampleTrainerOptions options;
  options.model.vocab = t.model.vocab;
  options.model.d_model = t.model.d_model;
  options.model.layers = t.model.layers;
  options.model.heads = t.model.heads;
  options.model.d_ff = t.model.d_ff;
  options.digits = t.digits;
  options.sequence_length = config.model_positions();
  options.dataset = t.dataset;
  options.seed = t.seed;
  options.threads = t.threads;
  options.warmup_steps = t.warmup_steps;
  options.warmup_batch = t.warmup_batch;
  options.warmup_learning_rate = t.warmup_learning_rate;
  options.steps = t.steps;
  options.prompts_per_step = t.prompts_per_step;
  options.samples_per_prompt = t.samples_per_prompt;
  options.steps_ahead = t.steps_ahead;
  const std::optional<examples::OptimizerKind> optimizer = examples::OptimizerFromName(t.optimizer);
  if (!optimizer) {
    // The schema names only optimisers the example has; this guards against the two parting.
    return InvalidArgument(config.path + ": trainer.optimizer: the built-in trainer has no '" +
                           t.optimizer + "'");
  }
  options.optimizer_kind = *optimizer;
  options.optimizer.learning_rate = t.learning_rate;
  options.policy_gradient.truncation = t.truncation;
  const std::optional<examples::Algorithm> algorithm = examples::AlgorithmFromName(t.algorithm);
  if (!algorithm) {
    // As for the optimiser: the schema names only algorithms the example has.
    return InvalidArgument(config.path + ": trainer.algorithm: the built-in trainer has no '" +
                           t.algorithm + "'");
  }
  options.algorithm = *algorithm;
  options.rft_threshold = t.rft_threshold;
  if (const FixedModelConfig* teacher = config.FindFixedModel(t.teacher)) {
    options.teacher.name = teacher->name;
    options.teacher.run = teacher->run;
    options.teacher.model.vocab = teacher->shape.vocab;
    options.teacher.model.d_model = teacher->shape.d_model;
    options.teacher.model.layers = teacher->shape.layers;
    options.teacher.model.heads = teacher->shape.heads;
    options.teacher.model.d_ff = teacher->shape.d_ff;
    options.teacher.warmup_steps = t.teacher_warmup_steps;
    options.teacher.warmup_batch = t.teacher_warmup_batch;
    options.teacher.warmup_learning_rate = t.teacher_warmup_learning_rate;
  }
  options.eval_problems = t.eval_problems;
  options.publisher.keyframes.interval = t.keyframe_interval;
  options.publisher.keyframes.delta_budget = t.keyframe_budget;
  options.publisher.keyframes.delta_mode = t.delta_mode;
  options.stall_after = t.stall_after;
  options.min_step_time = t.min_step_time;
  options.run_id = config.run_id;
  options.max_staleness = config.orchestrator.core.max_staleness;
  options.trainer_token = config.orchestrator.service.trainer_token;
  options.orchestrator = config.orchestrator_url();
  // It warms up and evaluates on arithmetic problems of task.digits digits, which the workers'
  // sequences (and so the model, at least as long) must fit.
  const int needed = examples::ArithmeticTask(t.digits).max_length();
  if (config.sequence_length() < needed) {
    return InvalidArgument(config.path + ": task: the workers' sequences are " +
                           std::to_string(config.sequence_length()) +
                           " tokens (max_prompt_tokens + max_tokens); the built-in trainer's "
                           "problems of " +
                           std::to_string(t.digits) + " digits with their answers need " +
                           std::to_string(needed));
  }
  return options;
}

}  // namespace weft::cli
