#include "cli/trainer_channel.h"

#include <cmath>
#include <filesystem>

namespace weft::cli {
namespace {

using Json = nlohmann::json;

// Progress counts are integers a double holds exactly (JSON numbers from any language).
constexpr double kLargestCount = 9007199254740992.0;  // 2^53

// Copies `from[key]` into `to[key]` when present and not null, checked as a count or a number.
// `where` prefixes the field's name in errors.
Status CopyCount(const Json& from, Json& to, const char* key, const std::string& where,
                 bool required = false) {
  if (!from.contains(key) || from[key].is_null()) {
    return required ? InvalidArgument(where + key + " is missing") : Status::Ok();
  }
  const Json& value = from[key];
  const double number = value.is_number() ? value.get<double>() : -1;
  if (!value.is_number() || number < 0 || number > kLargestCount || std::floor(number) != number)
    return InvalidArgument(where + key + " must be a non-negative integer, not " + value.dump());
  to[key] = value.is_number_float() ? static_cast<uint64_t>(number) : value.get<uint64_t>();
  return Status::Ok();
}

Status CopyNumber(const Json& from, Json& to, const char* key, const std::string& where,
                  bool required = false) {
  if (!from.contains(key) || from[key].is_null()) {
    return required ? InvalidArgument(where + key + " is missing") : Status::Ok();
  }
  const Json& value = from[key];
  if (!value.is_number())
    return InvalidArgument(where + key + " must be a number, not " + value.dump());
  to[key] = value.get<double>();
  return Status::Ok();
}

}  // namespace

std::string ShellQuote(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,"
                             "+@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

const std::vector<std::string>& TrainerChannelVariables() {
  static const std::vector<std::string> names = {
      kRunIdVariable,    kRunDirVariable,       kConfigVariable,       kStoreVariable,
      kStoreUrlVariable, kOrchestratorVariable, kTrainerTokenVariable, kMaxStalenessVariable,
      kProgressVariable, kSettingsVariable};
  return names;
}

std::string TrainerProgressPath(const std::string& run_dir) { return run_dir + "/trainer.json"; }
std::string TrainerSettingsPath(const std::string& run_dir) {
  return run_dir + "/trainer-settings.json";
}

std::map<std::string, std::string> TrainerChannelEnvironment(const RunConfig& config,
                                                             const std::string& run_dir,
                                                             const std::string& config_path) {
  return {{kRunIdVariable, config.run_id},
          {kRunDirVariable, run_dir},
          {kConfigVariable, config_path},
          {kStoreVariable, config.publish_store(run_dir)},
          {kStoreUrlVariable, config.store_url()},
          {kOrchestratorVariable, config.orchestrator_url()},
          {kTrainerTokenVariable, config.orchestrator.service.trainer_token},
          {kMaxStalenessVariable, std::to_string(config.orchestrator.core.max_staleness)},
          {kProgressVariable, TrainerProgressPath(run_dir)},
          {kSettingsVariable, TrainerSettingsPath(run_dir)}};
}

Json TrainerSettingsJson(const RunConfig& config) {
  const TrainerSettings& t = config.trainer;
  const Json dataset =
      t.dataset.empty() ? Json(nullptr) : Json(std::filesystem::absolute(t.dataset).string());
  const auto seconds = [](std::chrono::milliseconds d) {
    return std::chrono::duration<double>(d).count();
  };
  return Json{{"run_id", config.run_id},
              {"max_staleness", config.orchestrator.core.max_staleness},
              {"serving", "bf16"},
              {"model",
               {{"vocab", t.model.vocab},
                {"d_model", t.model.d_model},
                {"layers", t.model.layers},
                {"heads", t.model.heads},
                {"d_ff", t.model.d_ff},
                {"max_seq", config.model_positions()}}},
              {"task",
               {{"kind", config.task},
                {"digits", t.digits},
                {"dataset", dataset},
                {"max_prompt_tokens", config.task_limits.max_prompt_tokens},
                {"max_tokens", config.task_limits.max_completion_tokens},
                {"stop_token", config.task_limits.stop_token}}},
              {"trainer",
               {{"seed", t.seed},
                {"threads", t.threads},
                {"warmup",
                 {{"steps", t.warmup_steps},
                  {"batch", t.warmup_batch},
                  {"learning_rate", t.warmup_learning_rate}}},
                {"steps", t.steps},
                {"prompts_per_step", t.prompts_per_step},
                {"samples_per_prompt", t.samples_per_prompt},
                {"steps_ahead", t.steps_ahead},
                {"optimizer", t.optimizer},
                {"learning_rate", t.learning_rate},
                {"truncation", t.truncation},
                {"eval_problems", t.eval_problems},
                {"keyframe_interval", t.keyframe_interval},
                {"keyframe_budget", t.keyframe_budget},
                {"delta_mode", std::string(sync::DeltaModeName(t.delta_mode))},
                {"stall_after_s", seconds(t.stall_after)},
                {"min_step_time_s", seconds(t.min_step_time)},
                {"algorithm", t.algorithm}}}};
}

std::string TrainerDescription(const RunConfig& config) {
  if (config.trainer_command.empty()) return "built-in";
  std::string line;
  for (const std::string& word : config.trainer_command)
    line += (line.empty() ? "" : " ") + ShellQuote(word);
  return line;
}

Result<Json> CheckProgress(const Json& progress) {
  if (!progress.is_object()) return InvalidArgument("the progress file is not a JSON object");
  Json checked = Json::object();
  if (!progress.contains("phase")) return InvalidArgument("phase is missing");
  const Json& phase = progress["phase"];
  if (!phase.is_string() || (phase != "starting" && phase != "teacher" && phase != "warm-up" &&
                             phase != "rl" && phase != "done")) {
    return InvalidArgument(
        "phase must be \"starting\", \"teacher\", \"warm-up\", \"rl\" or \"done\", not " +
        phase.dump());
  }
  checked["phase"] = phase;
  for (const char* key : {"warmup_step", "warmup_steps", "steps_total", "versions_published",
                          "served_bytes", "parameters", "bytes_published", "groups_stale_delivered",
                          "staleness_violations", "groups_scored"}) {
    WEFT_RETURN_IF_ERROR(CopyCount(progress, checked, key, ""));
  }
  for (const char* key :
       {"warmup_loss", "eval_accuracy_before", "eval_accuracy_after", "random_policy_reward",
        "initial_reward", "final_reward", "teacher_accuracy"}) {
    WEFT_RETURN_IF_ERROR(CopyNumber(progress, checked, key, ""));
  }
  if (progress.contains("algorithm")) {
    if (!progress["algorithm"].is_string())
      return InvalidArgument("algorithm must be a string, not " + progress["algorithm"].dump());
    checked["algorithm"] = progress["algorithm"];
  }
  if (!progress.contains("steps")) return InvalidArgument("steps is missing");
  if (!progress["steps"].is_array()) return InvalidArgument("steps must be an array");
  checked["steps"] = Json::array();
  for (size_t i = 0; i < progress["steps"].size(); ++i) {
    const Json& step = progress["steps"][i];
    const std::string where = "steps[" + std::to_string(i) + "].";
    if (!step.is_object())
      return InvalidArgument("steps[" + std::to_string(i) + "] is not an object");
    Json record = Json::object();
    WEFT_RETURN_IF_ERROR(CopyCount(step, record, "step", where, true));
    WEFT_RETURN_IF_ERROR(CopyCount(step, record, "version", where, true));
    WEFT_RETURN_IF_ERROR(CopyNumber(step, record, "reward", where, true));
    for (const char* key :
         {"groups", "samples", "max_lag", "delta_bytes", "keyframe_bytes", "changed_elements"}) {
      WEFT_RETURN_IF_ERROR(CopyCount(step, record, key, where));
    }
    for (const char* key : {"mean_lag", "density", "mean_ratio", "truncated", "seconds",
                            "wait_seconds", "survivors", "reverse_kl"})
      WEFT_RETURN_IF_ERROR(CopyNumber(step, record, key, where));
    checked["steps"].push_back(std::move(record));
  }
  return checked;
}

}  // namespace weft::cli
