// The channel between `weft run` and the trainer it starts, whichever it is (the built-in example
// trainer or the program `trainer.command` names), specified in docs/run.md, "The trainer":
//   - environment variables naming the run, its store, the orchestrator and the files below;
//   - the settings file: the model, task and trainer settings of the run config, resolved (every
//     default filled in), as JSON, so that a trainer in another language need not read YAML;
//   - the progress file the trainer rewrites, which the progress line and the report read.
// Pure functions of their inputs, no I/O.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/run_config.h"
#include "common/status.h"

namespace weft::cli {

// The variables weft run sets in the trainer's environment.
inline constexpr char kRunIdVariable[] = "WEFT_RUN_ID";
inline constexpr char kRunDirVariable[] = "WEFT_RUN_DIR";
inline constexpr char kConfigVariable[] = "WEFT_CONFIG";
inline constexpr char kStoreVariable[] = "WEFT_STORE";
inline constexpr char kStoreUrlVariable[] = "WEFT_STORE_URL";
inline constexpr char kOrchestratorVariable[] = "WEFT_ORCHESTRATOR";
inline constexpr char kTrainerTokenVariable[] = "WEFT_TRAINER_TOKEN";
inline constexpr char kMaxStalenessVariable[] = "WEFT_MAX_STALENESS";
inline constexpr char kProgressVariable[] = "WEFT_PROGRESS";
inline constexpr char kSettingsVariable[] = "WEFT_SETTINGS";
const std::vector<std::string>& TrainerChannelVariables();

// The files of the channel inside the run directory.
std::string TrainerProgressPath(const std::string& run_dir);  // RUN_DIR/trainer.json
std::string TrainerSettingsPath(const std::string& run_dir);  // RUN_DIR/trainer-settings.json

// The channel variables for a run in `run_dir` (absolute) from the config at `config_path`
// (absolute).
std::map<std::string, std::string> TrainerChannelEnvironment(const RunConfig& config,
                                                             const std::string& run_dir,
                                                             const std::string& config_path);

// The settings file's content: the config's TrainerSettings, the task's lengths and the run's.
nlohmann::json TrainerSettingsJson(const RunConfig& config);

// `word` quoted for a POSIX shell (as it is when it needs no quoting).
std::string ShellQuote(const std::string& word);

// "built-in", or the trainer's command line (arguments quoted as a shell would need them).
std::string TrainerDescription(const RunConfig& config);

// A progress file's JSON, checked against its schema: the documented fields, with their types
// (counts are non-negative integers), required ones present. Returns them alone (unknown fields
// dropped, null optional fields left out, counts as unsigned integers), or an error naming the
// first field that is wrong.
Result<nlohmann::json> CheckProgress(const nlohmann::json& progress);

}  // namespace weft::cli
