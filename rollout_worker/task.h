// Task: what a rollout worker needs to know about the problems it generates for: how a job's
// prompt (the JSON the trainer queued) becomes token ids, and the verifier that scores a
// completion. The example task is examples/arithmetic_task.h.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "common/status.h"

namespace weft::rollout_worker {

class Task {
 public:
  virtual ~Task() = default;
  // The prompt's token ids; errors say what is wrong with the prompt.
  virtual Result<std::vector<int>> Encode(const nlohmann::json& prompt) const = 0;
  // The reward of `completion` (generated token ids) for `prompt`.
  virtual Result<double> Reward(const nlohmann::json& prompt,
                                const std::vector<int>& completion) const = 0;
};

}  // namespace weft::rollout_worker
