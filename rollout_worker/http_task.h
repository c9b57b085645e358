// Tasks at the text level: the job's prompt goes to the engine as the trainer queued it, and the
// reward comes from elsewhere (docs/run.md, "task").
//   - PromptTask: a JSON string is text for the engine to tokenise, an array of non-negative
//     integers is token ids; anything else is refused. Its lengths come from the configuration.
//   - TrainerRewardTask (`kind: trainer`): no reward from the worker; the trainer computes it.
//   - HttpRewardTask (`kind: http`): one POST per completion to a reward service, answered
//     {"reward": finite number} (docs/api.md, "Reward service"). Connection failures and 5xx
//     answers are retried with backoff within `timeout`; 4xx answers are final.
// Each kind reads its own keys of the run's `task:` section; errors name the key and its line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "common/http_client.h"
#include "common/status.h"
#include "rollout_worker/task.h"

namespace weft::rollout_worker {

class PromptTask : public Task {
 public:
  explicit PromptTask(TaskLimits limits) : limits_(limits) {}
  TaskLimits limits() const override { return limits_; }
  // Text stays text (the engine tokenises it); token ids are checked against max_prompt_tokens.
  Result<Prompt> Encode(const nlohmann::json& prompt) const override;

 private:
  TaskLimits limits_;
};

// `kind: trainer`: every sample goes to the trainer without a reward.
class TrainerRewardTask : public PromptTask {
 public:
  using PromptTask::PromptTask;
  Result<std::optional<double>> Reward(const nlohmann::json& prompt, const nlohmann::json& metadata,
                                       const Completion& completion) const override;
};

struct HttpTaskSettings {
  std::string url;  // http:// or https://, with the path the service answers on
  std::chrono::milliseconds timeout{10000};  // per completion, retries included
  int retries = 3;                           // tries after the first
  std::string token;                         // bearer token sent to the service; empty: none
  TaskLimits limits;
};

// `kind: http`: each completion is scored by the reward service at `url`. Thread-safe.
class HttpRewardTask : public PromptTask {
 public:
  explicit HttpRewardTask(HttpTaskSettings settings);
  // POSTs {"prompt", "metadata", "completion": {"text", "tokens"}} and reads {"reward"}. Errors
  // name the URL and what was wrong: kUnavailable when the service could not be reached or kept
  // failing (5xx) until the timeout, kInvalidArgument for a 4xx answer or a malformed one.
  Result<std::optional<double>> Reward(const nlohmann::json& prompt, const nlohmann::json& metadata,
                                       const Completion& completion) const override;
  const HttpTaskSettings& settings() const { return settings_; }

 private:
  HttpTaskSettings settings_;
  std::string path_;  // the URL's path (and query), sent to the client's base URL
  std::unique_ptr<HttpClient> client_;
};

// Reads `task: {kind: http, url, timeout, retries, token, max_prompt_tokens, max_tokens,
// stop_token}` (url, max_prompt_tokens and max_tokens required); errors name the key and its line.
// `other_keys` are keys of the section that others read (the trainer's `dataset`, say): allowed
// beside the kind's own, and left alone.
Result<HttpTaskSettings> ParseHttpTaskSection(const YAML::Node& task,
                                              const std::set<std::string>& other_keys = {});
// Reads `task: {kind: trainer, max_prompt_tokens, max_tokens, stop_token}` (the first two
// required).
Result<TaskLimits> ParseTrainerTaskSection(const YAML::Node& task,
                                           const std::set<std::string>& other_keys = {});

}  // namespace weft::rollout_worker
