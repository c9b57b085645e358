// Real optimiser steps of the example policy, in process: TinyLm learning two-digit addition,
// warmed up by supervised AdamW steps and then fine-tuned step by step with AdamW or Muon at a
// small learning rate, so that what a real step does to the served weights (which elements
// change, how large the delta is) can be measured without a run, an orchestrator or workers.
//
//   RealStepsOptions options;                       // the defaults are the example trainer's
//   std::vector<float> warm = WarmUpWeights(options).value();         // about 0.1 s a step
//   auto steps = RealSteps::Create(options, warm).value();
//   auto served = sync::ServedModel::FromMaster(steps->Master(), plan, threads).value();
//   for (...) {
//     RealStep step = steps->Step().value();       // step.loss: the batch's, before the step
//     uint64_t changed = 0;
//     sync::ModelDelta delta = served.Update(steps->Master(), {}, &changed).value();
//   }
//
// Two kinds of step:
//   - supervised (the default): SupervisedStep on `batch` random problems, the cheaper one (about
//     0.1 s at batch 64 on two threads for the default model);
//   - policy gradient: `prompts_per_step` random problems, `samples_per_prompt` completions of
//     each sampled from the current weights by the Decoder (temperature 1), rewarded by the task,
//     and a PolicyGradientStep on the groups, on policy, as the example trainer's RL step is
//     (several times slower: generation plus a batch of prompts x samples sequences).
// Deterministic: the warm-up depends on the options only, and every RealSteps made with the same
// seed draws the same problems (and sampling seeds) step after step, whatever its optimiser or
// learning rate, so two runs from the same weights differ only by their update rule. The results
// do not depend on the thread count. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "examples/arithmetic_task.h"
#include "examples/optimizers.h"
#include "examples/tiny_lm.h"
#include "sync/served_model.h"

namespace weft::examples {

enum class RealStepKind { kSupervised, kPolicyGradient };

struct RealStepsOptions {
  TinyLmConfig model;  // max_seq is set to the task's longest problem and answer
  int digits = 2;      // the arithmetic task's operands
  uint64_t seed = 1;   // the initial weights, the warm-up's problems, the steps' problems
  int threads = 1;
  // WarmUpWeights: supervised AdamW steps from fresh weights.
  int warmup_steps = 300;
  int warmup_batch = 64;
  double warmup_learning_rate = 3e-3;
  // The steps.
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  AdamWConfig optimizer_config{3e-6, 0.9, 0.95, 1e-8, 0.0, 1.0};
  RealStepKind kind = RealStepKind::kSupervised;
  int batch = 64;               // supervised: problems per step
  int prompts_per_step = 16;    // policy gradient: groups per step ...
  int samples_per_prompt = 8;   // ... and completions per group
  int held_out_problems = 512;  // the fixed problems HeldOutLoss() measures
};

// The model `options` describe (the task's lengths filled in).
TinyLmLayout RealStepsLayout(const RealStepsOptions& options);

// Fresh weights (options.seed) after options.warmup_steps supervised AdamW steps of
// options.warmup_batch problems at options.warmup_learning_rate. `progress(step, loss)` (when
// given) is called after each step with the batch's loss.
Result<std::vector<float>> WarmUpWeights(const RealStepsOptions& options,
                                         const std::function<void(int, double)>& progress = {});

struct RealStep {
  int step = 0;  // 1 for the first
  // Supervised: the batch's mean negative log-likelihood per answer token, at the weights before
  // the step. Policy gradient: the negated surrogate objective (per token).
  double loss = 0;
  double reward = 0;         // policy gradient: the batch's mean reward (0 for supervised steps)
  double gradient_norm = 0;  // policy gradient: before clipping (0 for supervised steps)
};

class RealSteps {
 public:
  // Steps from `weights` (WarmUpWeights', or any of the model's); errors name a bad option or a
  // size that does not match the model.
  static Result<std::unique_ptr<RealSteps>> Create(const RealStepsOptions& options,
                                                   std::vector<float> weights);

  // One optimiser step.
  Result<RealStep> Step();
  // The mean negative log-likelihood per answer token on options.held_out_problems problems,
  // drawn once at Create (the same for every RealSteps with the same seed); no step.
  Result<double> HeldOutLoss() const;

  const TinyLmLayout& layout() const { return layout_; }
  const std::vector<float>& weights() const { return weights_; }
  // The weights as the publisher takes them (views, valid until the next Step).
  std::vector<sync::MasterTensor> Master() const { return layout_.Master(weights_); }
  Optimizer& optimizer() { return *optimizer_; }
  int steps_taken() const { return steps_taken_; }

 private:
  RealSteps(const RealStepsOptions& options, std::vector<float> weights);

  RealStepsOptions options_;
  ArithmeticTask task_;
  TinyLmLayout layout_;
  std::vector<float> weights_;
  std::unique_ptr<Optimizer> optimizer_;
  std::mt19937_64 rng_;
  std::vector<std::string> held_out_;
  int steps_taken_ = 0;
};

}  // namespace weft::examples
