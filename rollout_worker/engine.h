// Engine: what a rollout worker drives (docs/design.md, "The data path"). The embedded engine
// (examples/embedded_engine.h) runs the example policy on the CPU; adapters for serving engines
// speak their HTTP APIs behind the same interface.
//
// Weights arrive as a served model (sync::ServedModel, in the engine's own number format) that the
// worker has already verified against a version's digests. Loading stages them (the slow part,
// done while generation goes on at the old version); Commit makes them the ones generation uses
// (the short pause). A generation running across a commit continues at the new version from its
// next token on, and reports where that happened (per-token version segments).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "orchestrator/types.h"
#include "sync/served_model.h"

namespace weft::rollout_worker {

struct Sampling {
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;
  int max_tokens = 16;
  uint64_t seed = 0;
  int stop_token = -1;  // ends a generation (included); -1: none
};

// One prompt: token ids, or text that the engine tokenises (an engine without a tokenizer refuses
// text).
struct Prompt {
  std::vector<int> tokens;
  std::string text;  // used when `tokens` is empty
  bool is_text() const { return tokens.empty(); }
};

struct Completion {
  std::vector<int> tokens;
  std::string text;             // the completion's text, when the engine returns it
  std::vector<float> logprobs;  // behaviour log-probabilities, one per token
  uint64_t version_start = 0;
  uint64_t version_end = 0;
  // (version, first token index): where each version's tokens begin; the first is
  // (version_start, 0).
  std::vector<std::pair<uint64_t, uint64_t>> segments;
};

struct EngineHealth {
  bool ok = true;
  std::string detail;
  // Replicas behind the engine (data-parallel copies that serve the same weights), and how many
  // of them serve the current version now and can take requests. A worker leases jobs in
  // proportion to `ready_replicas`; none ready: not ready at all.
  int replicas = 1;
  int ready_replicas = 1;
  // Replicas paused for a load now, and the time every replica spent paused for loads since the
  // engine started (milliseconds; 0 for an engine that never pauses).
  int loading_replicas = 0;
  double paused_ms_total = 0;
  // Each replica, for engines that have several (empty otherwise).
  std::vector<orchestrator::ReplicaReport> each;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Stages `model` as `version` (checks that it fits the engine: names, shapes, number format).
  virtual Status Stage(const sync::ServedModel& model, uint64_t version) = 0;
  // Makes the staged weights current; returns the pause generation saw, in microseconds.
  virtual Result<int64_t> Commit() = 0;
  // The version generation uses now; nullopt before the first commit.
  virtual std::optional<uint64_t> version() const = 0;

  // Samples one completion per prompt; prompt i draws from seed sampling.seed + i. kUnavailable:
  // the engine cannot generate now (dead, unreachable, no weights); the job should go back.
  virtual Result<std::vector<Completion>> Generate(const std::vector<Prompt>& prompts,
                                                   const Sampling& sampling) = 0;

  virtual EngineHealth Health() const = 0;

  // The log-probability the weights give each token of each target, following `prompt` and the
  // target's tokens before it (teacher forcing): what a teacher tells of a student's samples. The
  // version is the one that scored them all. kUnavailable as for Generate; an engine that cannot
  // score refuses with kInvalidArgument.
  struct Scores {
    std::vector<std::vector<float>> logprobs;  // one per target token
    uint64_t version = 0;
  };
  virtual Result<Scores> Score(const std::vector<int>& prompt,
                               const std::vector<std::vector<int>>& targets);
};

}  // namespace weft::rollout_worker
