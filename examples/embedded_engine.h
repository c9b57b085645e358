// EmbeddedEngine: the rollout_worker::Engine that runs the example policy (TinyLm) on the CPU.
//
// It serves BF16 (or FP16) weights: the served model's tensors, widened exactly to FP32 for the
// arithmetic (as GPU kernels accumulate BF16 products in FP32). Stage() converts a verified
// served model into a new weight set while generation goes on; Commit() swaps it in (a pointer
// swap under a lock: the pause is microseconds). Generations that span a commit switch at their
// next token and report the version segments. Thread-safe.
#pragma once

#include <memory>
#include <mutex>

#include "examples/tiny_lm.h"
#include "rollout_worker/engine.h"

namespace weft::examples {

class EmbeddedEngine : public rollout_worker::Engine {
 public:
  EmbeddedEngine(TinyLmConfig config, int threads) : layout_(config), threads_(threads) {}

  Status Stage(const sync::ServedModel& model, uint64_t version) override;
  Result<int64_t> Commit() override;
  std::optional<uint64_t> version() const override;
  Result<std::vector<rollout_worker::Completion>> Generate(
      const std::vector<std::vector<int>>& prompts,
      const rollout_worker::Sampling& sampling) override;
  rollout_worker::EngineHealth Health() const override;

  const TinyLmLayout& layout() const { return layout_; }

 private:
  std::shared_ptr<const VersionedWeights> Current() const;

  TinyLmLayout layout_;
  int threads_;
  mutable std::mutex mutex_;
  std::shared_ptr<const VersionedWeights> current_, staged_;
};

}  // namespace weft::examples
