// Task: what a rollout worker needs to know about the problems it generates for: how a job's
// prompt (the JSON the trainer queued) becomes token ids, the verifier that scores a completion,
// and the lengths it needs. Tasks are chosen by name (rollout_worker/registry.h); the example task
// is examples/arithmetic_task.h.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <vector>

#include "common/status.h"
#include "rollout_worker/engine.h"

namespace weft::rollout_worker {

// The lengths a task needs: the longest prompt it encodes and the longest completion it scores, in
// tokens, and the token that ends a completion (-1: none).
struct TaskLimits {
  int max_prompt_tokens = 0;
  int max_completion_tokens = 0;
  int stop_token = -1;
  // The longest sequence the task makes: prompt and completion.
  int sequence_tokens() const { return max_prompt_tokens + max_completion_tokens; }
};

class Task {
 public:
  virtual ~Task() = default;
  virtual TaskLimits limits() const = 0;
  // The prompt for the engine (token ids, or text the engine tokenises); errors say what is wrong
  // with the prompt.
  virtual Result<Prompt> Encode(const nlohmann::json& prompt) const = 0;
  // The reward of `completion` for `prompt`; `metadata` is the job's metadata (null without any).
  // nullopt: the task leaves rewards to the trainer (the sample goes without one).
  virtual Result<std::optional<double>> Reward(const nlohmann::json& prompt,
                                               const nlohmann::json& metadata,
                                               const Completion& completion) const = 0;
};

}  // namespace weft::rollout_worker
