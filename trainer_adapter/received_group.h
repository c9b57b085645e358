// A delivered trajectory group as a trainer uses it: its trajectories decoded (docs/api.md,
// "Trajectories", orchestrator::wire::DecodeTrajectories) and checked against the group's version
// segments, every token tagged with the version that generated it. The Python package's
// weft.orchestrator parser gives the same answers and errors on the same bodies
// (tests/data/trajectories.json). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "orchestrator/types.h"

namespace weft::trainer_adapter {

struct ReceivedSample {
  std::vector<int> tokens;
  std::vector<float> logprobs;   // behaviour log-probabilities, one per token
  std::optional<double> reward;  // none: the trainer computes it
  std::optional<std::string> text;
  std::vector<uint64_t> versions;  // the version that generated each token
  nlohmann::json extra;            // members the format does not name (and the sample's segments)
};

struct ReceivedGroup {
  uint64_t job = 0;
  uint32_t attempt = 0;
  std::string cluster;
  nlohmann::json prompt;    // the job's prompt as queued
  nlohmann::json metadata;  // the job's metadata; null when it had none
  uint64_t version_start = 0, version_end = 0;
  std::vector<std::pair<uint64_t, uint64_t>> segments;  // (version, first token) over all samples
  bool stale = false;  // over the staleness bound, flagged by the orchestrator
  uint64_t lag = 0;    // the trainer's version when received minus version_start
  std::vector<ReceivedSample> samples;
};

// `delivered` for a trainer at `trainer_version`. kInvalidArgument naming the job, the sample and
// the member when the trajectories are malformed, or their tokens do not add up to the group's
// segments.
Result<ReceivedGroup> ParseGroup(const orchestrator::Delivered& delivered,
                                 uint64_t trainer_version);

}  // namespace weft::trainer_adapter
