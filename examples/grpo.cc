#include "examples/grpo.h"

#include <algorithm>
#include <cmath>

#include "common/parallel.h"

namespace weft::examples {

Result<StepStats> PolicyGradientStep(const TinyLmLayout& layout, std::vector<float>& weights,
                                     Optimizer& optimizer, const std::vector<Group>& groups,
                                     const PolicyGradientConfig& config, int threads) {
  std::vector<TrainingSequence> batch;
  std::vector<double> advantages;
  std::vector<const Sample*> sources;
  StepStats stats;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Group& group = groups[g];
    if (group.samples.empty()) continue;
    double mean = 0;
    for (const Sample& s : group.samples) mean += s.reward;
    mean /= static_cast<double>(group.samples.size());
    double variance = 0;
    for (const Sample& s : group.samples) variance += (s.reward - mean) * (s.reward - mean);
    const double std_dev = std::sqrt(variance / static_cast<double>(group.samples.size()));
    for (size_t i = 0; i < group.samples.size(); ++i) {
      const Sample& s = group.samples[i];
      if (s.tokens.empty() || s.tokens.size() != s.logprobs.size()) {
        return InvalidArgument("group " + std::to_string(g) + " sample " + std::to_string(i) +
                               ": " + std::to_string(s.tokens.size()) + " tokens but " +
                               std::to_string(s.logprobs.size()) +
                               " logprobs (at least one of each needed)");
      }
    }
    if (std_dev < config.min_std) continue;
    ++stats.groups_used;
    for (const Sample& s : group.samples) {
      TrainingSequence sequence{group.prompt, group.prompt.size()};
      sequence.tokens.insert(sequence.tokens.end(), s.tokens.begin(), s.tokens.end());
      batch.push_back(std::move(sequence));
      advantages.push_back((s.reward - mean) / std_dev);
      sources.push_back(&s);
      stats.tokens += s.tokens.size();
    }
  }
  if (batch.empty()) return stats;
  const double per_token = 1.0 / static_cast<double>(stats.tokens);
  // Ratio statistics per sequence (weigh runs concurrently for different sequences).
  std::vector<double> ratio_sums(batch.size(), 0), truncated(batch.size(), 0),
      max_log(batch.size(), 0);
  auto weigh = [&](size_t i, std::span<const float> logprobs, std::span<float> out) {
    const Sample& s = *sources[i];
    for (size_t t = 0; t < logprobs.size(); ++t) {
      const double log_ratio = static_cast<double>(logprobs[t]) - s.logprobs[t];
      const double ratio = std::exp(std::min(log_ratio, 50.0));
      ratio_sums[i] += ratio;
      max_log[i] = std::max(max_log[i], std::fabs(log_ratio));
      if (ratio > config.truncation) truncated[i] += 1;
      out[t] = static_cast<float>(advantages[i] * std::min(ratio, config.truncation) * per_token);
    }
  };
  std::vector<float> gradient(layout.size(), 0.0f);
  const Trainer trainer(layout);
  WEFT_ASSIGN_OR_RETURN(stats.objective,
                        trainer.Accumulate(weights, batch, weigh, gradient, threads));
  for (float& g : gradient) g = -g;  // the optimiser minimises; the objective is maximised
  stats.gradient_norm = optimizer.Step(weights, gradient);
  for (size_t i = 0; i < batch.size(); ++i) {
    stats.mean_ratio += ratio_sums[i] * per_token;
    stats.truncated += truncated[i] * per_token;
    stats.max_log_ratio = std::max(stats.max_log_ratio, max_log[i]);
  }
  return stats;
}

namespace {

// Checks that every sample has a logprob per token (and, for distillation, a teacher's); errors
// name the group and sample.
Status CheckSamples(const std::vector<Group>& groups, bool teacher) {
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].samples.size(); ++i) {
      const Sample& s = groups[g].samples[i];
      const std::string what = "group " + std::to_string(g) + " sample " + std::to_string(i);
      if (s.tokens.empty() || s.tokens.size() != s.logprobs.size())
        return InvalidArgument(what + ": " + std::to_string(s.tokens.size()) + " tokens but " +
                               std::to_string(s.logprobs.size()) +
                               " logprobs (at least one of each needed)");
      if (teacher && s.teacher_logprobs.size() != s.tokens.size())
        return InvalidArgument(what + ": " + std::to_string(s.tokens.size()) + " tokens but " +
                               std::to_string(s.teacher_logprobs.size()) + " teacher logprobs");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<StepStats> RejectionSamplingStep(const TinyLmLayout& layout, std::vector<float>& weights,
                                        Optimizer& optimizer, const std::vector<Group>& groups,
                                        double threshold, int threads) {
  WEFT_RETURN_IF_ERROR(CheckSamples(groups, false));
  std::vector<TrainingSequence> batch;
  StepStats stats;
  size_t samples = 0;
  for (const Group& group : groups) {
    bool used = false;
    for (const Sample& s : group.samples) {
      ++samples;
      if (s.reward < threshold) continue;
      TrainingSequence sequence{group.prompt, group.prompt.size()};
      sequence.tokens.insert(sequence.tokens.end(), s.tokens.begin(), s.tokens.end());
      batch.push_back(std::move(sequence));
      stats.tokens += s.tokens.size();
      used = true;
    }
    if (used) ++stats.groups_used;
  }
  stats.survivors = samples > 0 ? static_cast<double>(batch.size()) / samples : 0;
  if (batch.empty()) return stats;
  const auto per_token = static_cast<float>(1.0 / static_cast<double>(stats.tokens));
  auto weigh = [per_token](size_t, std::span<const float>, std::span<float> out) {
    std::fill(out.begin(), out.end(), per_token);
  };
  std::vector<float> gradient(layout.size(), 0.0f);
  const Trainer trainer(layout);
  WEFT_ASSIGN_OR_RETURN(stats.objective,
                        trainer.Accumulate(weights, batch, weigh, gradient, threads));
  for (float& g : gradient) g = -g;  // the log-likelihood is maximised
  stats.gradient_norm = optimizer.Step(weights, gradient);
  return stats;
}

Result<StepStats> DistillationStep(const TinyLmLayout& layout, std::vector<float>& weights,
                                   Optimizer& optimizer, const std::vector<Group>& groups,
                                   const PolicyGradientConfig& config, int threads) {
  WEFT_RETURN_IF_ERROR(CheckSamples(groups, true));
  std::vector<TrainingSequence> batch;
  std::vector<const Sample*> sources;
  StepStats stats;
  double kl = 0;
  for (const Group& group : groups) {
    if (!group.samples.empty()) ++stats.groups_used;
    for (const Sample& s : group.samples) {
      TrainingSequence sequence{group.prompt, group.prompt.size()};
      sequence.tokens.insert(sequence.tokens.end(), s.tokens.begin(), s.tokens.end());
      batch.push_back(std::move(sequence));
      sources.push_back(&s);
      stats.tokens += s.tokens.size();
      for (size_t t = 0; t < s.tokens.size(); ++t)
        kl += static_cast<double>(s.logprobs[t]) - s.teacher_logprobs[t];
    }
  }
  if (batch.empty()) return stats;
  const double per_token = 1.0 / static_cast<double>(stats.tokens);
  stats.reverse_kl = kl * per_token;
  std::vector<double> ratio_sums(batch.size(), 0), truncated(batch.size(), 0),
      max_log(batch.size(), 0);
  auto weigh = [&](size_t i, std::span<const float> logprobs, std::span<float> out) {
    const Sample& s = *sources[i];
    for (size_t t = 0; t < logprobs.size(); ++t) {
      const double log_ratio = static_cast<double>(logprobs[t]) - s.logprobs[t];
      const double ratio = std::exp(std::min(log_ratio, 50.0));
      ratio_sums[i] += ratio;
      max_log[i] = std::max(max_log[i], std::fabs(log_ratio));
      if (ratio > config.truncation) truncated[i] += 1;
      // The reverse KL's per-token advantage: how much likelier the teacher finds the token.
      const double advantage = static_cast<double>(s.teacher_logprobs[t]) - s.logprobs[t];
      out[t] = static_cast<float>(advantage * std::min(ratio, config.truncation) * per_token);
    }
  };
  std::vector<float> gradient(layout.size(), 0.0f);
  const Trainer trainer(layout);
  WEFT_ASSIGN_OR_RETURN(stats.objective,
                        trainer.Accumulate(weights, batch, weigh, gradient, threads));
  for (float& g : gradient) g = -g;
  stats.gradient_norm = optimizer.Step(weights, gradient);
  for (size_t i = 0; i < batch.size(); ++i) {
    stats.mean_ratio += ratio_sums[i] * per_token;
    stats.truncated += truncated[i] * per_token;
    stats.max_log_ratio = std::max(stats.max_log_ratio, max_log[i]);
  }
  return stats;
}

Result<double> SupervisedStep(const TinyLmLayout& layout, std::vector<float>& weights,
                              Optimizer& optimizer, const ArithmeticTask& task,
                              std::mt19937_64& rng, int batch_size, int threads) {
  std::vector<TrainingSequence> batch;
  size_t targets = 0;
  for (int i = 0; i < batch_size; ++i) {
    const std::string problem = task.Problem(rng);
    WEFT_ASSIGN_OR_RETURN(std::vector<int> tokens, task.Encode(problem));
    WEFT_ASSIGN_OR_RETURN(std::vector<int> answer, task.Answer(problem));
    TrainingSequence s{tokens, tokens.size()};
    s.tokens.insert(s.tokens.end(), answer.begin(), answer.end());
    targets += answer.size();
    batch.push_back(std::move(s));
  }
  const float weight = 1.0f / static_cast<float>(targets);
  auto weigh = [weight](size_t, std::span<const float>, std::span<float> out) {
    std::fill(out.begin(), out.end(), weight);
  };
  std::vector<float> gradient(layout.size(), 0.0f);
  const Trainer trainer(layout);
  WEFT_ASSIGN_OR_RETURN(double objective,
                        trainer.Accumulate(weights, batch, weigh, gradient, threads));
  for (float& g : gradient) g = -g;
  optimizer.Step(weights, gradient);
  return -objective;
}

Result<double> SupervisedLoss(const TinyLmLayout& layout, const std::vector<float>& weights,
                              const ArithmeticTask& task, const std::vector<std::string>& problems,
                              int threads) {
  if (problems.empty()) return InvalidArgument("no problems to measure the loss on");
  std::vector<std::vector<int>> sequences;
  std::vector<size_t> first_target;
  for (const std::string& p : problems) {
    WEFT_ASSIGN_OR_RETURN(std::vector<int> tokens, task.Encode(p));
    WEFT_ASSIGN_OR_RETURN(std::vector<int> answer, task.Answer(p));
    first_target.push_back(tokens.size());
    tokens.insert(tokens.end(), answer.begin(), answer.end());
    sequences.push_back(std::move(tokens));
  }
  // Per problem, then summed in order: the same for any thread count.
  std::vector<double> nll(problems.size(), 0.0);
  std::vector<Status> failed(problems.size(), Status::Ok());
  const Decoder decoder(layout, weights);
  ParallelFor(problems.size(), threads, [&](size_t i) {
    Result<std::vector<float>> scores = decoder.Score(sequences[i]);
    if (!scores.ok()) {
      failed[i] = scores.status().WithContext("problem '" + problems[i] + "'");
      return;
    }
    // scores[t] is the log-probability of token t + 1.
    for (size_t t = first_target[i] - 1; t < scores->size(); ++t) nll[i] -= (*scores)[t];
  });
  double total = 0;
  size_t targets = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    WEFT_RETURN_IF_ERROR(failed[i]);
    total += nll[i];
    targets += sequences[i].size() - first_target[i];
  }
  return total / static_cast<double>(targets);
}

Result<double> GreedyAccuracy(const TinyLmLayout& layout, const std::vector<float>& weights,
                              const ArithmeticTask& task, const std::vector<std::string>& problems,
                              int threads) {
  if (problems.empty()) return InvalidArgument("no problems to measure accuracy on");
  std::vector<std::vector<int>> prompts;
  for (const std::string& p : problems) {
    WEFT_ASSIGN_OR_RETURN(std::vector<int> tokens, task.Encode(p));
    prompts.push_back(std::move(tokens));
  }
  Sampling greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = task.digits() + 2;
  greedy.stop_token = ArithmeticTask::kEnd;
  WEFT_ASSIGN_OR_RETURN(std::vector<Completion> out,
                        Decoder(layout, weights).Generate(prompts, greedy, threads));
  double right = 0;
  for (size_t i = 0; i < out.size(); ++i) right += task.Reward(problems[i], out[i].tokens);
  return right / static_cast<double>(out.size());
}

}  // namespace weft::examples
