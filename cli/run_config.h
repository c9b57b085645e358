// The configuration of a whole run (`weft run`, `weft worker`, `weft train`): one YAML file with
// the sections run, store, orchestrator (as for `weft orchestrator`), regions, worker, model, task
// and trainer (see configs/local.yaml and docs/run.md), the last naming the trainer's command, if
// not the built-in one. Unknown keys and bad values are errors naming the key and line. This is the
// schema alone, whichever trainer runs: what the built-in example trainer makes of its settings
// (and what more it checks) is cli/example_trainer_config.h.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/builtins.h"
#include "cli/deploy_config.h"
#include "common/status.h"
#include "orchestrator/config.h"
#include "rollout_worker/task.h"
#include "sync/delta_codec.h"

namespace weft::cli {

struct RegionConfig {
  std::string name;
  std::string relay_listen;              // ADDRESS:PORT of the region's relay
  uint64_t bandwidth = 0;                // bytes per second of the emulated WAN link (0: unlimited)
  std::chrono::microseconds latency{0};  // added to each request over it
  int workers = 2;
  // Per worker, the engine replicas it drives (empty: engine.urls; docs/run.md, "Configuration").
  std::vector<std::vector<std::string>> worker_engines;
  // models: workers serving each fixed model (fixed_models), by its name, beside `workers`.
  std::map<std::string, int> model_workers;
  // model_engines: per fixed model, per worker of it, the engine replicas it drives (a model
  // without: engine.urls).
  std::map<std::string, std::vector<std::vector<std::string>>> model_engines;
};

// A fixed model of the run (fixed_models: in docs/run.md): a model that never changes, which
// clusters serve beside the policy and jobs name (a teacher, or the model `weft generate` runs).
struct FixedModelConfig {
  std::string name;  // as its clusters register it and jobs name it
  std::string run;   // the store run that holds it (its latest version when a worker starts)
  // Its engine's `model` section (the top-level one when not given) and that section read.
  YAML::Node model;
  ModelSection shape;
};

struct WorkerSettings {
  std::string engine = "embedded";  // by name (rollout_worker/registry.h)
  uint32_t capacity = 1;            // jobs generated at once per worker
  int threads = 1;                  // engine threads per worker
  double temperature = 1.0;
  double top_p = 1.0;
  std::chrono::milliseconds heartbeat{1000};
  // new_versions: push (wait on the store's latest with a long poll where the store supports it)
  // or poll (read it every 100 ms).
  bool push = true;
  // Where a worker keeps the deltas of a catch-up too large to hold beside its copy (empty: the
  // temporary directory, TMPDIR): a local disk, not a memory file system.
  std::string spill_dir;
};

// The settings every trainer is handed (cli/trainer_channel.h, the settings file): the `model`
// section, the keys of `task` that trainers read, and the `trainer` section but for its command
// and environment, with the defaults of docs/run.md, "Configuration".
struct TrainerSettings {
  ModelSection model;
  int digits = 2;       // task.digits
  std::string dataset;  // task.dataset (empty: none)
  uint64_t seed = 1;
  int threads = 1;
  int warmup_steps = 500;  // trainer.warmup.steps, batch and learning_rate
  int warmup_batch = 64;
  double warmup_learning_rate = 3e-3;
  int steps = 80;
  int prompts_per_step = 32;
  int samples_per_prompt = 8;
  int steps_ahead = 2;
  std::string optimizer = "adamw";  // "adamw" or "muon" (checked when the config is read)
  double learning_rate = 2e-5;      // the RL phase's
  double truncation = 2.0;
  int eval_problems = 500;
  uint64_t keyframe_interval = 50;
  double keyframe_budget = 0.5;
  sync::DeltaMode delta_mode = sync::DeltaMode::kPlain;
  std::chrono::milliseconds stall_after{300000};
  std::chrono::milliseconds min_step_time{0};
  // The learning rule: grpo, rft (rejection sampling: a supervised step on the samples whose
  // reward is at least rft_threshold) or distill (on-policy distillation from `teacher`, a fixed
  // model, by its per-token log-probabilities of the policy's samples).
  std::string algorithm = "grpo";
  double rft_threshold = 1.0;
  std::string teacher;  // trainer.teacher.model: a fixed model's name
  // trainer.teacher.warmup: how the built-in trainer makes the teacher when its run has no
  // version yet (supervised steps of the example policy in the fixed model's shape).
  int teacher_warmup_steps = 2000;
  int teacher_warmup_batch = 64;
  double teacher_warmup_learning_rate = 3e-3;
};

// The generate: section (`weft generate`; docs/run.md, "Generating datasets"): a run with no
// trainer, in which a fixed model's workers sample completions of a dataset's prompts.
struct GenerateSettings {
  bool present = false;
  std::string model;       // a fixed model's name (fixed_models)
  std::string checkpoint;  // safetensors published as the model's run when it has no version
  std::string dataset;     // JSONL prompts, each with an id
  uint32_t samples = 1;    // per prompt (a line's own `samples` overrides it)
  std::string output;      // the directory the records go to
  uint64_t shard_records = 100000;  // records per shard file
  std::optional<double>
      min_reward;             // the filter: a sample is kept when its reward is at least this
  uint32_t jobs_ahead = 256;  // jobs queued at the orchestrator at once
};

struct RunConfig {
  std::string path;  // the file it came from
  std::string run_id = "local";
  std::string dir = "runs/local";  // everything the run writes
  std::chrono::seconds time_limit{900};
  std::string store_listen = "127.0.0.1:8170";
  // store.uri: a store the run uses instead of its own (an s3:// store); empty: the run serves
  // RUN_DIR/store itself on store_listen.
  std::string store_uri;
  YAML::Node orchestrator_section;  // passed on to `weft orchestrator`
  orchestrator::OrchestratorConfig orchestrator;
  std::vector<RegionConfig> regions;
  std::vector<FixedModelConfig> fixed_models;
  WorkerSettings worker;
  std::string task = "arithmetic";         // task.kind, by name (rollout_worker/registry.h)
  rollout_worker::TaskLimits task_limits;  // the lengths the task gives workers
  TrainerSettings trainer;
  // trainer.command: the trainer's argv (empty: the built-in example trainer, `weft train`);
  // trainer.env: variables added to its environment.
  std::vector<std::string> trainer_command;
  std::map<std::string, std::string> trainer_env;
  YAML::Node document;        // the whole file, for the engine's and task's factories
  DeployConfig deploy;        // the deploy: section (weft deploy; weft run ignores it)
  GenerateSettings generate;  // the generate: section (weft generate; weft run ignores it)

  std::string orchestrator_listen() const;  // ADDRESS:PORT
  std::string orchestrator_url() const { return "http://" + orchestrator_listen(); }
  // Where relays and readers reach the store: store.uri, or the run's own store server.
  std::string store_url() const { return store_uri.empty() ? "http://" + store_listen : store_uri; }
  // Where the trainer publishes: store.uri, or the directory RUN_DIR/store (absolute).
  std::string publish_store(const std::string& run_dir) const {
    return store_uri.empty() ? run_dir + "/store" : store_uri;
  }
  const RegionConfig* FindRegion(const std::string& name) const;
  const FixedModelConfig* FindFixedModel(const std::string& name) const;
  // Ok when the config (or WEFT_*_TOKEN in the environment) gives the role tokens asked for:
  // `weft run` and the orchestrator need all three, a worker its own, a trainer its own.
  Status NeedTokens(bool worker, bool trainer, bool admin) const;
  // The workers' longest sequence, prompt and completion.
  int sequence_length() const { return task_limits.sequence_tokens(); }
  // The model's positions (model.context, at least sequence_length()): the embedded engine gives
  // its model these, and so must the trainer.
  int model_positions() const { return trainer.model.context; }
};

Result<RunConfig> LoadRunConfig(const std::string& path);

// The run's document as a fixed model's workers read it: its `model` section in place of the
// policy's, so that the engine a worker makes has the fixed model's shape (and, unless the section
// says otherwise, the policy's positions, model.context).
YAML::Node FixedModelDocument(const RunConfig& config, const FixedModelConfig& model);

// Whether `name` is an environment variable's name as the shell takes it: letters, digits and
// '_', not starting with a digit.
bool IsEnvironmentVariableName(const std::string& name);
// The port of an ADDRESS:PORT listen setting (one the config has checked).
int ListenPort(const std::string& listen);

}  // namespace weft::cli
