#include "examples/arithmetic_task.h"

#include <cmath>

namespace weft::examples {
namespace {

// The two operands of "a+b=".
Result<std::pair<uint64_t, uint64_t>> Operands(const std::string& problem, int digits) {
  const size_t plus = problem.find('+');
  if (plus == std::string::npos || problem.empty() || problem.back() != '=') {
    return InvalidArgument("problem '" + problem + "' is not of the form A+B=");
  }
  auto number = [&](const std::string& text) -> Result<uint64_t> {
    if (text.empty() || text.size() > static_cast<size_t>(digits) ||
        text.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("problem '" + problem + "': '" + text + "' is not a number of 1 to " +
                             std::to_string(digits) + " digits");
    }
    return std::stoull(text);
  };
  WEFT_ASSIGN_OR_RETURN(uint64_t a, number(problem.substr(0, plus)));
  WEFT_ASSIGN_OR_RETURN(uint64_t b, number(problem.substr(plus + 1, problem.size() - plus - 2)));
  return std::make_pair(a, b);
}

}  // namespace

std::vector<std::string> ArithmeticTask::HeldOutProblems(uint64_t seed, int count) const {
  std::mt19937_64 rng(seed ^ 0xE7A1);
  std::vector<std::string> problems;
  for (int i = 0; i < count; ++i) problems.push_back(Problem(rng));
  return problems;
}

std::string ArithmeticTask::Problem(std::mt19937_64& rng) const {
  const uint64_t limit = static_cast<uint64_t>(std::pow(10, digits_));
  std::uniform_int_distribution<uint64_t> operand(0, limit - 1);
  const uint64_t a = operand(rng), b = operand(rng);
  return std::to_string(a) + "+" + std::to_string(b) + "=";
}

Result<std::vector<int>> ArithmeticTask::Encode(const std::string& problem) const {
  WEFT_RETURN_IF_ERROR(Operands(problem, digits_).status());
  std::vector<int> tokens = {kBegin};
  for (char c : problem) tokens.push_back(c == '+' ? kPlus : c == '=' ? kEquals : c - '0');
  return tokens;
}

Result<std::vector<int>> ArithmeticTask::Answer(const std::string& problem) const {
  WEFT_ASSIGN_OR_RETURN(auto operands, Operands(problem, digits_));
  std::vector<int> tokens;
  for (char c : std::to_string(operands.first + operands.second)) tokens.push_back(c - '0');
  tokens.push_back(kEnd);
  return tokens;
}

double ArithmeticTask::Reward(const std::string& problem,
                              const std::vector<int>& completion) const {
  Result<std::vector<int>> answer = Answer(problem);
  return answer.ok() && *answer == completion ? 1.0 : 0.0;
}

std::string ArithmeticTask::Decode(const std::vector<int>& tokens) {
  std::string text;
  for (int t : tokens) {
    text.push_back(t >= 0 && t <= 9 ? static_cast<char>('0' + t)
                   : t == kPlus     ? '+'
                   : t == kEquals   ? '='
                   : t == kEnd      ? '$'
                   : t == kBegin    ? '^'
                                    : '?');
  }
  return text;
}

double ArithmeticTask::RandomPolicyReward(const std::string& problem) const {
  Result<std::vector<int>> answer = Answer(problem);
  return answer.ok() ? std::pow(1.0 / kVocab, static_cast<double>(answer->size())) : 0.0;
}

Result<rollout_worker::Prompt> ArithmeticVerifier::Encode(const nlohmann::json& prompt) const {
  if (!prompt.is_string())
    return InvalidArgument("an arithmetic prompt is a string like \"12+34=\", not " +
                           prompt.dump());
  rollout_worker::Prompt encoded;
  WEFT_ASSIGN_OR_RETURN(encoded.tokens, task_.Encode(prompt.get<std::string>()));
  return encoded;
}

Result<std::optional<double>> ArithmeticVerifier::Reward(
    const nlohmann::json& prompt, const nlohmann::json& /*metadata*/,
    const rollout_worker::Completion& completion) const {
  if (!prompt.is_string())
    return InvalidArgument("an arithmetic prompt is a string like \"12+34=\", not " +
                           prompt.dump());
  WEFT_RETURN_IF_ERROR(task_.Answer(prompt.get<std::string>()).status());
  return std::optional<double>(task_.Reward(prompt.get<std::string>(), completion.tokens));
}

}  // namespace weft::examples
