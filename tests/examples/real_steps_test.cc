// Real optimiser steps of the example policy: deterministic, the same problems for every
// optimiser, both kinds of step.
#include "examples/real_steps.h"

#include <doctest/doctest.h>

#include "tests/examples/small_model.h"

namespace weft::examples {
namespace {

RealStepsOptions SmallRun() {
  RealStepsOptions options;
  options.model = testing::SmallTinyLm(1, options.model.max_seq);
  options.digits = 1;
  options.warmup_steps = 5;
  options.warmup_batch = 8;
  options.batch = 8;
  options.prompts_per_step = 3;
  options.samples_per_prompt = 4;
  options.held_out_problems = 16;
  options.optimizer_config.learning_rate = 1e-3;
  return options;
}

std::vector<float> Run(const RealStepsOptions& options, const std::vector<float>& warm, int steps) {
  std::unique_ptr<RealSteps> run = RealSteps::Create(options, warm).value();
  for (int i = 0; i < steps; ++i) REQUIRE(run->Step().ok());
  CHECK(run->steps_taken() == steps);
  return run->weights();
}

TEST_CASE("real steps: deterministic, thread-count independent, optimisers on the same problems") {
  RealStepsOptions options = SmallRun();
  int reported = 0;
  const std::vector<float> warm =
      WarmUpWeights(options, [&](int step, double) { reported = step; }).value();
  CHECK(reported == 5);
  CHECK(warm.size() == RealStepsLayout(options).size());
  CHECK(warm != RealStepsLayout(options).Initialize(options.seed));

  const std::vector<float> adamw = Run(options, warm, 3);
  CHECK(adamw != warm);
  options.threads = 2;
  CHECK(Run(options, warm, 3) == adamw);
  options.optimizer = OptimizerKind::kMuon;
  const std::vector<float> muon = Run(options, warm, 3);
  CHECK(muon != adamw);
  options.threads = 1;
  CHECK(Run(options, warm, 3) == muon);
  options.threads = 2;

  // The batch losses at the start are the same problems' whatever the optimiser.
  std::unique_ptr<RealSteps> a = RealSteps::Create(options, warm).value();
  options.optimizer = OptimizerKind::kAdamW;
  std::unique_ptr<RealSteps> b = RealSteps::Create(options, warm).value();
  CHECK(a->Step().value().loss == b->Step().value().loss);
  CHECK(a->HeldOutLoss().value() != b->HeldOutLoss().value());
  CHECK(a->optimizer().kind() == OptimizerKind::kMuon);
  CHECK(a->Master().size() == a->layout().parameters().size());

  Result<std::unique_ptr<RealSteps>> wrong = RealSteps::Create(options, {1.0f, 2.0f});
  REQUIRE(!wrong.ok());
  CHECK(wrong.status().message().find("2 weights given; the model has") != std::string::npos);
  options.samples_per_prompt = 1;
  CHECK(!RealSteps::Create(options, warm).ok());
}

TEST_CASE("real steps: policy-gradient steps on sampled groups") {
  RealStepsOptions options = SmallRun();
  options.kind = RealStepKind::kPolicyGradient;
  options.prompts_per_step = 8;
  // Warm enough that some samples are right and some wrong: groups with a learning signal.
  options.warmup_steps = 60;
  options.warmup_batch = 16;
  options.warmup_learning_rate = 1e-2;
  const std::vector<float> warm = WarmUpWeights(options).value();
  std::unique_ptr<RealSteps> run = RealSteps::Create(options, warm).value();
  const RealStep step = run->Step().value();
  CHECK(step.step == 1);
  CHECK(step.reward > 0.0);
  CHECK(step.reward < 1.0);
  CHECK(step.gradient_norm > 0.0);
  CHECK(run->weights() != warm);
  options.threads = 2;
  std::unique_ptr<RealSteps> again = RealSteps::Create(options, warm).value();
  CHECK(again->Step().value().reward == step.reward);
  CHECK(again->weights() == run->weights());
}

}  // namespace
}  // namespace weft::examples
