// The configuration of a whole run (`weft run`, `weft worker`, `weft train`): one YAML file with
// the sections run, store, orchestrator (as for `weft orchestrator`), regions, worker, model, task
// and trainer (see configs/local.yaml and docs/run.md), the last naming the trainer's command, if
// not the built-in one. Unknown keys and bad values are errors
// naming the key and line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "examples/example_trainer.h"
#include "orchestrator/config.h"
#include "rollout_worker/task.h"

namespace weft::cli {

struct RegionConfig {
  std::string name;
  std::string relay_listen;              // ADDRESS:PORT of the region's relay
  uint64_t bandwidth = 0;                // bytes per second of the emulated WAN link (0: unlimited)
  std::chrono::microseconds latency{0};  // added to each request over it
  int workers = 2;
  // Per worker, the engine replicas it drives (empty: engine.urls; docs/run.md, "Configuration").
  std::vector<std::vector<std::string>> worker_engines;
};

struct WorkerSettings {
  std::string engine = "embedded";  // by name (rollout_worker/registry.h)
  uint32_t capacity = 1;            // jobs generated at once per worker
  int threads = 1;                  // engine threads per worker
  double temperature = 1.0;
  double top_p = 1.0;
  std::chrono::milliseconds heartbeat{1000};
  // Where a worker keeps the deltas of a catch-up too large to hold beside its copy (empty: the
  // temporary directory, TMPDIR): a local disk, not a memory file system.
  std::string spill_dir;
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
  WorkerSettings worker;
  std::string task = "arithmetic";         // task.kind, by name (rollout_worker/registry.h)
  rollout_worker::TaskLimits task_limits;  // the lengths the task gives workers
  // The model, task and trainer sections as the example trainer takes them (store and URLs unset);
  // whichever trainer runs gets them (cli/trainer_channel.h, the settings file).
  examples::ExampleTrainerOptions trainer;
  // trainer.command: the trainer's argv (empty: the built-in example trainer, `weft train`);
  // trainer.env: variables added to its environment.
  std::vector<std::string> trainer_command;
  std::map<std::string, std::string> trainer_env;
  YAML::Node document;  // the whole file, for the engine's and task's factories

  std::string orchestrator_listen() const;  // ADDRESS:PORT
  std::string orchestrator_url() const { return "http://" + orchestrator_listen(); }
  // Where relays and readers reach the store: store.uri, or the run's own store server.
  std::string store_url() const { return store_uri.empty() ? "http://" + store_listen : store_uri; }
  // Where the trainer publishes: store.uri, or the directory RUN_DIR/store (absolute).
  std::string publish_store(const std::string& run_dir) const {
    return store_uri.empty() ? run_dir + "/store" : store_uri;
  }
  const RegionConfig* FindRegion(const std::string& name) const;
};

Result<RunConfig> LoadRunConfig(const std::string& path);

// The `task:` keys every kind shares: `kind` (default arithmetic), and those the example trainers
// read, `digits` (their arithmetic task's operands) and `dataset` (a JSONL prompt dataset).
struct TaskSection {
  std::string kind = "arithmetic";
  int digits = 2;
  std::string dataset;  // empty: the example trainers generate problems
};
// The keys of `task:` that the trainers read and the workers' task kinds leave alone.
const std::set<std::string>& TrainerTaskKeys();

// The sections the example policy and task read (`model`, `task`), for the run config and the
// built-in engine and task alike. Errors name the key. ParseTaskSection reads the shared keys (and
// checks the keys of the arithmetic kind; the other kinds check their own when they are made):
// the key `name` of older configs is refused, saying to write `kind`, and an unknown kind is
// refused naming the known ones.
Status ParseModelSection(const YAML::Node& model, examples::TinyLmConfig* config);
Status ParseTaskSection(const YAML::Node& task, TaskSection* section);

}  // namespace weft::cli
