// The engines and tasks built into the weft binary, registered in one place: the engines "sglang"
// and "vllm" (rollout_worker/http_engine.h: serving engines behind HTTP, set by the run's `engine`
// section), the embedded engine
// (examples/embedded_engine.h, the example policy on the CPU; it serves the run's `model` section)
// as "embedded", and the tasks the run's `task` section chooses by `kind`: the addition task
// (examples/arithmetic_task.h) as "arithmetic", and the text-level tasks of
// rollout_worker/http_task.h as "http" (rewards from a reward service) and "trainer" (rewards from
// the trainer). Also the two sections of the run config these read, `model` and `task`, as plain
// settings: the run config (cli/run_config.h) reads them here too, so that both agree.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "common/status.h"
#include "rollout_worker/registry.h"

namespace weft::cli {

// The registry of `weft worker` and `weft run`, with the built-in engine and task.
const rollout_worker::Registry& Builtins();

// The `model:` section: the example policy's shape (examples/tiny_lm.h, whose defaults these are),
// which the embedded engine serves and every trainer is handed (docs/run.md, "The settings file").
struct ModelSection {
  int vocab = 16;  // not a key: the policy's vocabulary, the arithmetic task's tokens
  int d_model = 96;
  int layers = 3;
  int heads = 4;
  int d_ff = 384;
  // model.context: the model's positions, the longest sequence (prompt and completion) it takes;
  // 0: the task's longest sequence, just what the workers ask for. A serving engine that needs
  // room beyond prompt + completion (SGLang refuses a request that fills its context) wants more.
  int context = 0;
};

// The `task:` keys every kind shares: `kind` (default arithmetic), and those the example trainers
// read, `digits` (their arithmetic task's operands) and `dataset` (a JSONL prompt dataset).
struct TaskSection {
  std::string kind = "arithmetic";
  int digits = 2;
  std::string dataset;  // empty: the example trainers generate problems
};

// Errors name the key. ParseTaskSection reads the shared keys (and checks the keys of the
// arithmetic kind; the other kinds check their own when they are made): the key `name` of older
// configs is refused, saying to write `kind`, and an unknown kind is refused naming the known ones.
Status ParseModelSection(const YAML::Node& model, ModelSection* section);
Status ParseTaskSection(const YAML::Node& task, TaskSection* section);

// The positions of a model of `model` for a task giving sequences up to `limits`: model.context,
// or the task's longest sequence where it is 0. An error where model.context is shorter.
Result<int> ModelPositions(const ModelSection& model, const rollout_worker::TaskLimits& limits);

}  // namespace weft::cli
