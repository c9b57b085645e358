// The example trainer: teaches TinyLm two-digit addition, first by a short supervised warm-up on
// its own, then by reinforcement learning from trajectories that rollout workers generate, all
// through the trainer adapter:
//   - version 0 is the warm-started policy; every RL step publishes the next version as a delta
//     (trainer_adapter::Publisher) and announces it to the orchestrator;
//   - it keeps `steps_ahead` steps of prompts queued at the orchestrator (each a job of
//     `samples_per_prompt` samples), so workers generate while it learns: generated problems, or
//     the prompts of a JSONL dataset (trainer_adapter/dataset.h) in order, cycling, each with its
//     metadata;
//   - a sample that comes without a reward (the workers' task leaves rewards to the trainer) is
//     scored here, with the arithmetic task;
//   - each step takes `prompts_per_step` groups with trainer_adapter::BatchClient (within the
//     staleness bound the orchestrator enforces) and applies a GRPO step with truncated
//     importance ratios against the behaviour logprobs (examples/grpo.h) at a fine-tuning
//     learning rate, with AdamW or Muon (examples/optimizers.h).
// The learning rule is GRPO, rejection-sampling fine-tuning (a supervised step on the samples the
// task's verifier accepted) or on-policy distillation: the policy's groups are sent, as score jobs,
// to a teacher (a fixed model other clusters serve, which this trainer makes by a longer
// supervised warm-up of a wider policy when its run has no version yet) and learnt from with the
// teacher's log-probabilities of their tokens (examples/grpo.h).
// It records per step: the batch's mean reward, the lag of its groups, the bytes of the version's
// delta and how many served elements changed.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "examples/grpo.h"
#include "examples/tiny_lm.h"
#include "trainer_adapter/publisher.h"

namespace weft::examples {

enum class Algorithm { kGrpo, kRft, kDistill };
// "grpo", "rft", "distill": the names the run config uses (trainer.algorithm).
const char* AlgorithmName(Algorithm algorithm);
std::optional<Algorithm> AlgorithmFromName(std::string_view name);

// On-policy distillation's teacher: a fixed model (its clusters register it by `name` and serve
// its store run `run`), made here when that run has no version: `warmup_steps` supervised steps of
// the example policy in the shape `model`.
struct TeacherOptions {
  std::string name, run;
  TinyLmConfig model;  // max_seq is set as the policy's
  int warmup_steps = 2000;
  int warmup_batch = 64;
  double warmup_learning_rate = 3e-3;
};

struct ExampleTrainerOptions {
  TinyLmConfig model;  // max_seq is set from sequence_length
  int digits = 2;      // the arithmetic task's operands (warm-up, evaluation, generated prompts)
  // The model's positions: the longest prompt plus completion of the workers' task, as their
  // engine sizes its model (the published tensors must have its shapes). 0: the arithmetic
  // task's longest problem and answer. At least that either way.
  int sequence_length = 0;
  // A JSONL prompt dataset (trainer_adapter/dataset.h) whose prompts are queued instead of
  // generated problems; empty: none.
  std::string dataset;
  uint64_t seed = 1;
  int threads = 1;
  // Supervised warm-up (local, before version 0).
  int warmup_steps = 500;
  int warmup_batch = 64;
  double warmup_learning_rate = 3e-3;
  // Reinforcement learning.
  int steps = 80;
  int prompts_per_step = 32;
  int samples_per_prompt = 8;
  int steps_ahead = 2;
  // The RL phase's optimiser and its settings, which Muon shares (examples/optimizers.h; how its
  // learning rate compares with AdamW's: docs/run.md, "Muon versus AdamW"). The warm-up always
  // uses AdamW.
  OptimizerKind optimizer_kind = OptimizerKind::kAdamW;
  AdamWConfig optimizer{2e-5, 0.9, 0.95, 1e-8, 0.0, 1.0};
  PolicyGradientConfig policy_gradient;
  Algorithm algorithm = Algorithm::kGrpo;
  double rft_threshold = 1.0;  // rejection sampling keeps samples rewarded at least this
  TeacherOptions teacher;      // distillation's
  int eval_problems = 500;
  // Where it publishes and whom it tells.
  std::string store;  // a store URI (directory or http)
  std::string run_id;
  std::string orchestrator;  // URL
  std::string trainer_token;
  uint64_t max_staleness = 2;  // the orchestrator's bound (for the batch client's accounting)
  trainer_adapter::PublisherOptions publisher;
  std::chrono::milliseconds deadline{120000};     // per orchestrator call, retries included
  std::chrono::milliseconds stall_after{300000};  // no trajectory for this long: give up
  // Each RL step takes at least this long (the trainer waits before taking the next batch):
  // emulates a model whose optimiser step is slow, for tests that need the run to last. 0: off.
  std::chrono::milliseconds min_step_time{0};

  // The policy's shape: `model` with max_seq from sequence_length (or the task's longest problem
  // and answer).
  TinyLmConfig PolicyShape() const;
};

struct StepRecord {
  int step = 0;
  uint64_t version = 0;  // published after this step
  double reward = 0;     // the batch's mean reward
  size_t groups = 0, samples = 0;
  double mean_lag = 0;  // trainer version - version_start, over the batch's groups
  uint64_t max_lag = 0;
  uint64_t delta_bytes = 0;     // this version's delta blob
  uint64_t keyframe_bytes = 0;  // ... and its keyframe, if it has one
  uint64_t changed_elements = 0;
  double density = 0;       // changed served elements / all served elements
  double mean_ratio = 0;    // importance ratio pi/mu over the batch's tokens
  double truncated = 0;     // fraction of tokens whose ratio was truncated
  double seconds = 0;       // since the RL phase began
  double wait_seconds = 0;  // in next_batch, waiting for the step's trajectories
  double survivors = 0;     // rejection sampling: the fraction of samples learnt from
  double reverse_kl = 0;    // distillation: mean over tokens of log mu - log teacher
};

struct TrainerSummary {
  std::string phase = "starting";  // starting, warm-up, rl, done
  int warmup_step = 0;
  double warmup_loss = 0;
  int warmup_steps = 0;  // the warm-up's and the RL phase's lengths (the progress denominators)
  int steps_total = 0;
  double eval_accuracy_before = 0;  // greedy accuracy of version 0 (after the warm-up)
  double eval_accuracy_after = 0;   // ... of the final version
  double random_policy_reward = 0;  // expected reward of a uniformly random policy
  std::vector<StepRecord> steps;
  uint64_t versions_published = 0;
  uint64_t served_bytes = 0;  // one full checkpoint in the serving format
  uint64_t parameters = 0;
  uint64_t bytes_published = 0;  // delta and keyframe blobs written by the trainer
  uint64_t groups_stale_delivered = 0, staleness_violations = 0;
  uint64_t groups_with_metadata = 0;            // groups that came back with their job's metadata
  uint64_t rewards_computed = 0;                // samples that came without a reward, scored here
  double initial_reward = 0, final_reward = 0;  // mean batch reward of the first / last steps
  std::string algorithm = "grpo";
  // Distillation: the teacher's greedy accuracy on the evaluation problems (when made here) and
  // the score jobs it answered.
  std::optional<double> teacher_accuracy;
  uint64_t groups_scored = 0;
  nlohmann::json ToJson() const;
};

// The example policy in `shape` trained by `steps` supervised steps (examples/grpo.h,
// SupervisedStep) from seed `seed`: how the trainer makes a distillation's teacher, and what
// `weft train --checkpoint` saves. Logs its loss every 250 steps under `name`; `on_step`, when
// given, is called with the step and its loss after every step.
Result<std::vector<float>> SupervisedPolicy(
    const TinyLmLayout& layout, const ArithmeticTask& task, uint64_t seed, int steps, int batch,
    double learning_rate, int threads, const std::string& name,
    const std::function<void(int step, double loss)>& on_step = nullptr);

// Runs the whole training; `progress` is called after every warm-up report and RL step.
Result<TrainerSummary> RunExampleTrainer(
    const ExampleTrainerOptions& options,
    const std::function<void(const TrainerSummary&)>& progress);

}  // namespace weft::examples
