// The orchestrator's configuration: the `orchestrator:` section of a YAML file (docs/api.md,
// "Orchestrator configuration"). Unknown keys and bad values are errors naming the key and line;
// the environment variables WEFT_WORKER_TOKEN, WEFT_TRAINER_TOKEN and WEFT_ADMIN_TOKEN override
// the tokens in the file.
#pragma once

#include <yaml-cpp/yaml.h>
#include <string>
#include <utility>
#include <vector>

#include "common/file_util.h"
#include "orchestrator/core.h"
#include "orchestrator/durable_core.h"
#include "orchestrator/service.h"

namespace weft::orchestrator {

struct OrchestratorConfig {
  CoreConfig core;
  ServiceOptions service;
  DurableCore::Options durable;
  std::string journal = "orchestrator.journal";
  std::string
      dataset;  // JSONL prompts queued when the journal is new; empty: jobs come from the trainer
  LineLimits dataset_limits;  // dataset_max_line, dataset_max_bytes
};

Result<OrchestratorConfig> LoadOrchestratorConfig(const std::string& path);
// The `orchestrator:` section of an already loaded document (other top-level sections are the
// caller's to check); `path` names the file in errors. The orchestrator needs all three role
// tokens; a process that only calls it (a worker, a trainer) needs its own alone, and reads the
// section with `all_tokens` false: the tokens given must still differ.
Result<OrchestratorConfig> ParseOrchestratorConfig(const YAML::Node& root, const std::string& path,
                                                   bool all_tokens = true);

// The prompts of a JSONL dataset: one {"prompt": text or [token ids], "samples": n, "metadata":
// any JSON} per line (samples optional, default 1; metadata optional, as in POST /v1/jobs). Errors
// name the file and line; a line or a file past `limits` is refused having read no further.
Result<std::vector<JobSpec>> LoadPrompts(const std::string& path, const LineLimits& limits = {});

}  // namespace weft::orchestrator
