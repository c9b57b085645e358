// The example task: adding two numbers, written in digits, with a verifiable reward.
//
// A problem is text like "37+5=" (operands of 1 to `digits` digits); the answer is the sum's digits
// followed by the end token. The task's own tokenizer maps text to token ids: digits 0-9 are
// tokens 0-9, '+' is 10, '=' is 11, the end token 12, and every prompt starts with the begin
// token 13 (vocabulary 16; 14 and 15 unused). The reward is 1 for exactly the right digits then
// the end token, else 0. A policy that samples uniformly gets about 16^-(answer digits + 1), i.e.
// at most 1 in 4096 with 2-digit operands: the task is not solved by chance.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "rollout_worker/task.h"

namespace weft::examples {

class ArithmeticTask {
 public:
  static constexpr int kPlus = 10, kEquals = 11, kEnd = 12, kBegin = 13, kVocab = 16;

  explicit ArithmeticTask(int digits = 2) : digits_(digits) {}
  int digits() const { return digits_; }
  // The longest prompt plus answer, in tokens.
  int max_length() const { return 1 + 2 * digits_ + 2 + (digits_ + 1) + 1; }

  // A random problem, as text.
  std::string Problem(std::mt19937_64& rng) const;
  // The held-out problems of a run of seed `seed`: `count` problems from a stream of their own,
  // apart from the problems the run trains on (what the example trainers and RealSteps evaluate
  // on).
  std::vector<std::string> HeldOutProblems(uint64_t seed, int count) const;
  // Text -> token ids (the begin token first); errors name the offending character.
  Result<std::vector<int>> Encode(const std::string& problem) const;
  // The correct answer's tokens (digits, then the end token).
  Result<std::vector<int>> Answer(const std::string& problem) const;
  // 1 when `completion` is exactly the answer's tokens, else 0.
  double Reward(const std::string& problem, const std::vector<int>& completion) const;
  // Token ids -> text ('$' for the end token, '^' for begin, '?' for unused ids).
  static std::string Decode(const std::vector<int>& tokens);
  // The chance that a uniformly random policy answers `problem` right.
  double RandomPolicyReward(const std::string& problem) const;

 private:
  int digits_;
};

// The task as a rollout worker sees it: a job's prompt is the problem's text (a JSON string).
class ArithmeticVerifier : public rollout_worker::Task {
 public:
  explicit ArithmeticVerifier(ArithmeticTask task) : task_(task) {}
  // Prompts of a begin token, two operands, '+' and '='; answers of up to digits + 1 digits and
  // the end token.
  rollout_worker::TaskLimits limits() const override {
    return {2 * task_.digits() + 3, task_.digits() + 2, ArithmeticTask::kEnd};
  }
  Result<rollout_worker::Prompt> Encode(const nlohmann::json& prompt) const override;
  Result<std::optional<double>> Reward(const nlohmann::json& prompt, const nlohmann::json& metadata,
                                       const rollout_worker::Completion& completion) const override;

 private:
  ArithmeticTask task_;
};

}  // namespace weft::examples
