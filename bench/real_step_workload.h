// The real optimiser steps codec_bench and context_model_bench measure, made in one place so that
// both measure the same steps: the example policy (TinyLm, `d_model` wide with a 4 x d_model
// feed-forward layer) trained in-process on the arithmetic task (300 supervised AdamW warm-up
// steps at 3e-3, 100 with `quick`), then fine-tuned from those weights with AdamW at 1e-6, 3e-6
// and 3e-5. For each rate, the weights after `first`, first + 1, ..., first + count - 1
// fine-tuning steps. An error ends the program, named `program` in the message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "examples/real_steps.h"

namespace weft::bench {

struct RealStepVersions {
  double learning_rate = 0;
  std::vector<std::vector<float>> weights;  // flat (layout order), one per version
};

struct RealStepWorkload {
  examples::TinyLmLayout layout;
  std::vector<RealStepVersions> rates;
};

inline RealStepWorkload MakeRealStepWorkload(const char* program, bool quick, int d_model,
                                             int threads, int first, int count) {
  examples::RealStepsOptions options;
  options.model.d_model = d_model;
  options.model.d_ff = 4 * d_model;
  options.threads = threads;
  options.warmup_steps = quick ? 100 : 300;
  auto fail = [&](const Status& status) {
    std::fprintf(stderr, "%s: real steps: %s\n", program, status.ToString().c_str());
    std::exit(1);
  };
  std::fprintf(stderr, "%s: warming up the real-steps model (%d steps)...\n", program,
               options.warmup_steps);
  Result<std::vector<float>> warm = examples::WarmUpWeights(options);
  if (!warm.ok()) fail(warm.status());
  RealStepWorkload workload{examples::RealStepsLayout(options), {}};
  // BF16 at 1-3% density; FP8's coarser grid needs a larger step for the same.
  for (double lr : {1e-6, 3e-6, 3e-5}) {
    options.optimizer_config.learning_rate = lr;
    auto steps = examples::RealSteps::Create(options, *warm);
    if (!steps.ok()) fail(steps.status());
    RealStepVersions run{lr, {}};
    for (int taken = 0;; ++taken) {
      if (taken >= first) run.weights.push_back((*steps)->weights());
      if (taken == first + count - 1) break;
      Result<examples::RealStep> step = (*steps)->Step();
      if (!step.ok()) fail(step.status());
    }
    workload.rates.push_back(std::move(run));
  }
  return workload;
}

}  // namespace weft::bench
