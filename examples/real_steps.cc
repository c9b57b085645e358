#include "examples/real_steps.h"

#include "examples/grpo.h"

namespace weft::examples {
namespace {

// Streams of the seed apart from the initial weights' and the warm-up's (which use it as it is).
constexpr uint64_t kStepStream = 0x5EED'57E9;

Status CheckOptions(const RealStepsOptions& o) {
  if (o.digits < 1 || o.digits > 6) return InvalidArgument("real steps: digits must be 1 to 6");
  if (o.threads < 1) return InvalidArgument("real steps: threads must be at least 1");
  if (o.warmup_steps < 0 || o.warmup_batch < 1 || !(o.warmup_learning_rate > 0)) {
    return InvalidArgument(
        "real steps: the warm-up needs steps >= 0, a batch >= 1 and a learning rate above 0");
  }
  if (!(o.optimizer_config.learning_rate >= 0))
    return InvalidArgument("real steps: the learning rate must be at least 0");
  if (o.batch < 1 || o.prompts_per_step < 1 || o.samples_per_prompt < 2 ||
      o.held_out_problems < 1) {
    return InvalidArgument(
        "real steps: batch, prompts_per_step and held_out_problems must be at least 1, "
        "samples_per_prompt at least 2");
  }
  return Status::Ok();
}

}  // namespace

TinyLmLayout RealStepsLayout(const RealStepsOptions& options) {
  TinyLmConfig model = options.model;
  model.max_seq = ArithmeticTask(options.digits).max_length();
  return TinyLmLayout(model);
}

Result<std::vector<float>> WarmUpWeights(const RealStepsOptions& options,
                                         const std::function<void(int, double)>& progress) {
  WEFT_RETURN_IF_ERROR(CheckOptions(options));
  const ArithmeticTask task(options.digits);
  const TinyLmLayout layout = RealStepsLayout(options);
  std::vector<float> weights = layout.Initialize(options.seed);
  AdamWConfig config;
  config.learning_rate = options.warmup_learning_rate;
  AdamW optimizer(layout, config);
  std::mt19937_64 rng(options.seed);
  for (int step = 1; step <= options.warmup_steps; ++step) {
    WEFT_ASSIGN_OR_RETURN(const double loss, SupervisedStep(layout, weights, optimizer, task, rng,
                                                            options.warmup_batch, options.threads));
    if (progress) progress(step, loss);
  }
  return weights;
}

RealSteps::RealSteps(const RealStepsOptions& options, std::vector<float> weights)
    : options_(options),
      task_(options.digits),
      layout_(RealStepsLayout(options)),
      weights_(std::move(weights)),
      optimizer_(
          MakeOptimizer(options.optimizer, layout_, options.optimizer_config, options.threads)),
      rng_(options.seed ^ kStepStream) {
  held_out_ = task_.HeldOutProblems(options.seed, options.held_out_problems);
}

Result<std::unique_ptr<RealSteps>> RealSteps::Create(const RealStepsOptions& options,
                                                     std::vector<float> weights) {
  WEFT_RETURN_IF_ERROR(CheckOptions(options));
  const size_t expected = RealStepsLayout(options).size();
  if (weights.size() != expected) {
    return InvalidArgument("real steps: " + std::to_string(weights.size()) +
                           " weights given; the model has " + std::to_string(expected));
  }
  return std::unique_ptr<RealSteps>(new RealSteps(options, std::move(weights)));
}

Result<RealStep> RealSteps::Step() {
  RealStep out;
  out.step = steps_taken_ + 1;
  if (options_.kind == RealStepKind::kSupervised) {
    WEFT_ASSIGN_OR_RETURN(out.loss, SupervisedStep(layout_, weights_, *optimizer_, task_, rng_,
                                                   options_.batch, options_.threads));
  } else {
    std::vector<std::string> problems;
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < options_.prompts_per_step; ++i) {
      problems.push_back(task_.Problem(rng_));
      WEFT_ASSIGN_OR_RETURN(std::vector<int> tokens, task_.Encode(problems.back()));
      // Each problem's samples are its prompt repeated, with seeds of their own.
      for (int s = 0; s < options_.samples_per_prompt; ++s) prompts.push_back(tokens);
    }
    Sampling sampling;
    sampling.max_tokens = task_.digits() + 2;
    sampling.stop_token = ArithmeticTask::kEnd;
    sampling.seed = rng_();
    WEFT_ASSIGN_OR_RETURN(std::vector<Completion> completions,
                          Decoder(layout_, weights_).Generate(prompts, sampling, options_.threads));
    std::vector<Group> groups;
    double rewards = 0;
    for (size_t p = 0; p < problems.size(); ++p) {
      Group group{prompts[p * static_cast<size_t>(options_.samples_per_prompt)], {}};
      for (int s = 0; s < options_.samples_per_prompt; ++s) {
        Completion& c = completions[p * static_cast<size_t>(options_.samples_per_prompt) +
                                    static_cast<size_t>(s)];
        const double reward = task_.Reward(problems[p], c.tokens);
        rewards += reward;
        group.samples.push_back(Sample{std::move(c.tokens), std::move(c.logprobs), reward});
      }
      groups.push_back(std::move(group));
    }
    WEFT_ASSIGN_OR_RETURN(StepStats stats,
                          PolicyGradientStep(layout_, weights_, *optimizer_, groups,
                                             PolicyGradientConfig{}, options_.threads));
    out.loss = -stats.objective;
    out.reward = rewards / static_cast<double>(completions.size());
    out.gradient_norm = stats.gradient_norm;
  }
  ++steps_taken_;
  return out;
}

Result<double> RealSteps::HeldOutLoss() const {
  return SupervisedLoss(layout_, weights_, task_, held_out_, options_.threads);
}

}  // namespace weft::examples
