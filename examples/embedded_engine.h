// EmbeddedEngine: the rollout_worker::Engine that runs the example policy (TinyLm) on the CPU.
//
// It serves BF16 (or FP16) weights: the served model's tensors, widened exactly to FP32 for the
// arithmetic (as GPU kernels accumulate BF16 products in FP32). Stage() converts a verified
// served model into a new weight set while generation goes on; Commit() swaps it in (a pointer
// swap under a lock: the pause is microseconds). Generations that span a commit switch at their
// next token and report the version segments. Thread-safe.
//
// Text prompts are tokenised with the arithmetic task's character tokenizer (ArithmeticTask:
// the begin token, then one token per digit, '+' or '='), so that tasks at the text level (`kind:
// http`, `kind: trainer`) run on it; text with any other character is refused, naming it. Every
// completion carries its text: its tokens decoded (ArithmeticTask::Decode), less the stop token
// that ended it, as serving engines leave it out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
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
      const std::vector<rollout_worker::Prompt>& prompts,
      const rollout_worker::Sampling& sampling) override;
  rollout_worker::EngineHealth Health() const override;
  // A forward pass over each target after the prompt, at the weights current when it starts.
  Result<Scores> Score(const std::vector<int>& prompt,
                       const std::vector<std::vector<int>>& targets) override;

  const TinyLmLayout& layout() const { return layout_; }

  // Text -> token ids as the engine sees it (the begin token first); errors name the first
  // character outside the vocabulary and where it is.
  static Result<std::vector<int>> Tokenize(const std::string& text);
  // A completion's text: its tokens decoded, without a last token equal to `stop_token`.
  static std::string CompletionText(const std::vector<int>& tokens, int stop_token);

 private:
  std::shared_ptr<const VersionedWeights> Current() const;

  TinyLmLayout layout_;
  int threads_;
  mutable Mutex mutex_;
  std::shared_ptr<const VersionedWeights> current_ GUARDED_BY(mutex_), staged_ GUARDED_BY(mutex_);
};

}  // namespace weft::examples
