// A JSONL prompt dataset (docs/formats.md, "Prompt datasets"): one JSON object per line,
// {"prompt": text or [token ids], "samples": n, "metadata": any JSON, "id": string or integer},
// all but `prompt` optional (`weft generate` needs the id), blank lines ignored. A trainer reads it
// once and queues its prompts as jobs, with their metadata, in the file's order. Everything is
// checked as it is read, so that a bad line fails before any job is queued; errors name the file
// and the line ("prompts.jsonl:7: ...").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/status.h"
#include "orchestrator/client.h"

namespace weft::trainer_adapter {

struct DatasetPrompt {
  nlohmann::json prompt;            // a non-empty string, or a non-empty array of token ids
  std::optional<uint32_t> samples;  // 1 to 4096; absent: the trainer's own number
  nlohmann::json metadata;          // null: none
  nlohmann::json id;                // a string or non-negative integer; null: none
  size_t line = 0;                  // its line in the file, from 1

  // The job to queue, with `default_samples` when the line gives none.
  orchestrator::NewJob Job(uint32_t default_samples) const {
    orchestrator::NewJob job;
    job.prompt = prompt;
    job.samples = samples.value_or(default_samples);
    job.metadata = metadata;
    return job;
  }
};

// The prompts of the file at `path`, in order. kNotFound when it cannot be read; kInvalidArgument
// naming the file and line for a line that is not such an object (not JSON, a key repeated, an
// unknown key, a prompt that is neither, samples out of range, metadata over 64 KiB as text), and
// for a file without a prompt.
// A line longer than limits.max_line_bytes, or a file longer than limits.max_total_bytes, is a
// kInvalidArgument found having read no further.
Result<std::vector<DatasetPrompt>> ReadPromptDataset(const std::string& path,
                                                     const LineLimits& limits = {});

}  // namespace weft::trainer_adapter
