// The example policy and task: gradients against finite differences, generation, learning.
#include "examples/tiny_lm.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <thread>

#include "examples/arithmetic_task.h"
#include "examples/embedded_engine.h"
#include "examples/optimizers.h"
#include "sync/served_model.h"

namespace weft::examples {
namespace {

TinyLmConfig TinyConfig() {
  TinyLmConfig c;
  c.vocab = 7;
  c.d_model = 8;
  c.layers = 2;
  c.heads = 2;
  c.d_ff = 12;
  c.max_seq = 6;
  return c;
}

TEST_CASE("tiny LM: gradients match finite differences") {
  const TinyLmLayout layout(TinyConfig());
  std::vector<float> w = layout.Initialize(3);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.4f);
  for (float& x : w) x += normal(rng);  // larger weights: every path carries gradient
  const std::vector<TrainingSequence> batch = {{{1, 2, 3, 4, 5, 6}, 2}, {{6, 0, 3}, 1}};
  // Objective: sum of weighted log-probabilities, with weights that differ per target.
  auto weigh = [](size_t i, std::span<const float>, std::span<float> out) {
    for (size_t t = 0; t < out.size(); ++t)
      out[t] = 0.5f + static_cast<float>(t) - static_cast<float>(i);
  };
  const Trainer trainer(layout);
  std::vector<float> grad(layout.size(), 0.0f);
  REQUIRE(trainer.Accumulate(w, batch, weigh, grad).ok());
  auto objective = [&](const std::vector<float>& weights) {
    std::vector<float> ignored(layout.size(), 0.0f);
    return *trainer.Accumulate(weights, batch, weigh, ignored);
  };
  int checked = 0;
  for (const ParameterInfo& p : layout.parameters()) {
    for (size_t k = 0; k < p.size; k += std::max<size_t>(1, p.size / 5)) {
      const size_t at = p.offset + k;
      // Central differences at two step sizes: a ReLU that flips within one step spoils that
      // estimate (the objective has a kink there), rarely both.
      auto numeric = [&](float h) {
        std::vector<float> plus = w, minus = w;
        plus[at] += h;
        minus[at] -= h;
        return (objective(plus) - objective(minus)) / (2.0 * h);
      };
      auto close = [&](double estimate) {
        return std::abs(grad[at] - estimate) <= 0.03 * std::max(1.0, std::abs(estimate));
      };
      const double coarse = numeric(1e-2f), fine = numeric(2e-3f);
      CAPTURE(p.name);
      CAPTURE(k);
      CAPTURE(grad[at]);
      CAPTURE(coarse);
      CAPTURE(fine);
      CHECK((close(coarse) || close(fine)));
      ++checked;
    }
  }
  CHECK(checked > 50);
}

TEST_CASE("tiny LM: the gradient does not depend on the thread count") {
  const TinyLmLayout layout(TinyConfig());
  const std::vector<float> w = layout.Initialize(9);
  std::vector<TrainingSequence> batch;
  for (int i = 0; i < 30; ++i) batch.push_back({{i % 7, (i + 1) % 7, (i * 3) % 7, 2}, 1});
  auto weigh = [](size_t, std::span<const float>, std::span<float> out) {
    std::fill(out.begin(), out.end(), 1.0f);
  };
  const Trainer trainer(layout);
  std::vector<float> one(layout.size(), 0.0f), four(layout.size(), 0.0f);
  REQUIRE(trainer.Accumulate(w, batch, weigh, one, 1).ok());
  REQUIRE(trainer.Accumulate(w, batch, weigh, four, 4).ok());
  CHECK(one == four);
}

TEST_CASE(
    "tiny LM: sampling is reproducible, its log-probabilities are the model's, bad input is "
    "refused") {
  const TinyLmLayout layout(TinyConfig());
  const std::vector<float> w = layout.Initialize(1);
  const Decoder decoder(layout, w);
  Sampling params;
  params.max_tokens = 4;
  params.seed = 11;
  auto a = decoder.Generate({{1, 2}, {3}}, params, 2);
  auto b = decoder.Generate({{1, 2}, {3}}, params, 1);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)[0].tokens == (*b)[0].tokens);
  CHECK((*a)[1].tokens.size() == 4);
  std::vector<int> full = {1, 2};
  full.insert(full.end(), (*a)[0].tokens.begin(), (*a)[0].tokens.end());
  auto scores = decoder.Score(full);
  REQUIRE(scores.ok());
  for (size_t i = 0; i < (*a)[0].logprobs.size(); ++i)
    CHECK((*a)[0].logprobs[i] == doctest::Approx((*scores)[i + 1]));
  // Greedy picks the most likely token.
  params.temperature = 0.0f;
  auto greedy = decoder.Generate({{1, 2}}, params);
  REQUIRE(greedy.ok());
  CHECK(decoder.Score({1, 2, (*greedy)[0].tokens[0]}).value()[1] ==
        doctest::Approx((*greedy)[0].logprobs[0]));
  // max_tokens is cut to what fits.
  params.max_tokens = 100;
  CHECK(decoder.Generate({{1, 2, 3}}, params).value()[0].tokens.size() == 3);
  CHECK(decoder.Generate({{1, 9}}, params).status().message().find("prompt 0: token 1 is 9") !=
        std::string::npos);
  CHECK(!decoder.Generate({{}}, params).ok());
  params.top_p = 0.0f;
  CHECK(!decoder.Generate({{1}}, params).ok());
}

TEST_CASE(
    "tiny LM: weights that change mid-generation are used from the next token on, and segmented") {
  const TinyLmLayout layout(TinyConfig());
  auto v3 = std::make_shared<VersionedWeights>(VersionedWeights{3, layout.Initialize(1)});
  auto v4 = std::make_shared<VersionedWeights>(VersionedWeights{4, layout.Initialize(2)});
  int calls = 0;
  // Asked once before the prompt, then before each token after the first: the third token is
  // the first sampled at version 4.
  WeightsNow source = [&]() -> std::shared_ptr<const VersionedWeights> {
    return ++calls <= 3 ? v3 : v4;
  };
  Sampling params;
  params.max_tokens = 5;
  auto out = Decoder::Generate(layout, source, {{1}}, params);
  REQUIRE(out.ok());
  REQUIRE((*out)[0].tokens.size() == 5);
  CHECK((*out)[0].segments == std::vector<std::pair<uint64_t, uint64_t>>{{3, 0}, {4, 3}});
  // The same tokens' log-probabilities: the first three under v3, the rest as the switch left them.
  std::vector<int> full = {1};
  full.insert(full.end(), (*out)[0].tokens.begin(), (*out)[0].tokens.end());
  auto at_v3 = Decoder(layout, v3->values).Score(full);
  REQUIRE(at_v3.ok());
  for (size_t i = 0; i < 3; ++i) CHECK((*out)[0].logprobs[i] == doctest::Approx((*at_v3)[i]));
  CHECK((*out)[0].logprobs[3] != doctest::Approx((*at_v3)[3]));
}

TEST_CASE("arithmetic task: tokens, answers, rewards, errors") {
  ArithmeticTask task(2);
  CHECK(task.Encode("37+5=").value() == std::vector<int>{ArithmeticTask::kBegin, 3, 7,
                                                         ArithmeticTask::kPlus, 5,
                                                         ArithmeticTask::kEquals});
  CHECK(task.Answer("37+5=").value() == std::vector<int>{4, 2, ArithmeticTask::kEnd});
  CHECK(task.Reward("99+99=", {1, 9, 8, ArithmeticTask::kEnd}) == 1.0);
  CHECK(task.Reward("99+99=", {1, 9, 8}) == 0.0);
  CHECK(task.Reward("99+99=", {1, 9, 8, ArithmeticTask::kEnd, 3}) == 0.0);
  CHECK(task.Encode("123+4=").status().message().find("'123' is not a number of 1 to 2 digits") !=
        std::string::npos);
  CHECK(!task.Encode("3*4=").ok());
  CHECK(ArithmeticTask::Decode({13, 1, 10, 2, 11, 3, 12}) == "^1+2=3$");
  CHECK(task.RandomPolicyReward("1+2=") == doctest::Approx(1.0 / 256));
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) {
    const std::string p = task.Problem(rng);
    REQUIRE(task.Encode(p).ok());
    CHECK(task.Encode(p)->size() + task.Answer(p)->size() <=
          static_cast<size_t>(task.max_length()));
  }
}

TEST_CASE("tiny LM: supervised steps teach it one-digit addition") {
  const ArithmeticTask task(1);
  TinyLmConfig config;
  config.d_model = 32;
  config.layers = 2;
  config.heads = 2;
  config.d_ff = 64;
  config.max_seq = task.max_length();
  const TinyLmLayout layout(config);
  std::vector<float> w = layout.Initialize(2);
  AdamWConfig adam;
  adam.learning_rate = 3e-3;
  AdamW optimizer(layout, adam);
  const Trainer trainer(layout);
  std::mt19937_64 rng(4);
  auto accuracy = [&] {
    std::vector<std::string> problems;
    std::vector<std::vector<int>> prompts;
    for (int a = 0; a < 10; ++a) {
      for (int b = 0; b < 10; ++b) {
        problems.push_back(std::to_string(a) + "+" + std::to_string(b) + "=");
        prompts.push_back(task.Encode(problems.back()).value());
      }
    }
    Sampling greedy;
    greedy.temperature = 0.0f;
    greedy.max_tokens = 3;
    greedy.stop_token = ArithmeticTask::kEnd;
    auto out = Decoder(layout, w).Generate(prompts, greedy, 2).value();
    double right = 0;
    for (size_t i = 0; i < out.size(); ++i) right += task.Reward(problems[i], out[i].tokens);
    return right / static_cast<double>(out.size());
  };
  const double before = accuracy();
  for (int step = 0; step < 300; ++step) {
    std::vector<TrainingSequence> batch;
    for (int i = 0; i < 32; ++i) {
      const std::string p = task.Problem(rng);
      TrainingSequence s{task.Encode(p).value(), 0};
      s.first_target = s.tokens.size();
      const std::vector<int> answer = task.Answer(p).value();
      s.tokens.insert(s.tokens.end(), answer.begin(), answer.end());
      batch.push_back(std::move(s));
    }
    std::vector<float> grad(layout.size(), 0.0f);
    auto weigh = [](size_t, std::span<const float>, std::span<float> out) {
      std::fill(out.begin(), out.end(), 1.0f / 32);
    };
    REQUIRE(trainer.Accumulate(w, batch, weigh, grad, 2).ok());
    for (float& g : grad) g = -g;  // maximise the log-likelihood
    optimizer.Step(w, grad);
  }
  const double after = accuracy();
  MESSAGE("one-digit addition, greedy accuracy: " << before << " before, " << after
                                                  << " after 300 supervised steps");
  CHECK(before < 0.2);
  CHECK(after > 0.9);
}

// The served model of `weights` in BF16, as a worker would hold it.
sync::ServedModel Served(const TinyLmLayout& layout, const std::vector<float>& weights) {
  return std::move(sync::ServedModel::FromMaster(layout.Master(weights), sync::ServingPlan{}, 1))
      .value();
}

TEST_CASE(
    "embedded engine: serves BF16 weights, commits between tokens and reports version segments") {
  TinyLmConfig config = TinyConfig();
  config.max_seq = 24;
  EmbeddedEngine engine(config, 2);
  const TinyLmLayout& layout = engine.layout();
  rollout_worker::Sampling sampling;
  sampling.max_tokens = 20;
  // Token-id prompts, as the engine takes them.
  auto prompts_of = [](const std::vector<std::vector<int>>& ids) {
    std::vector<rollout_worker::Prompt> prompts;
    for (const std::vector<int>& p : ids) prompts.push_back({p, ""});
    return prompts;
  };
  CHECK(!engine.Generate(prompts_of({{1}}), sampling).ok());  // no weights yet
  CHECK(!engine.Health().ok);
  const std::vector<float> v0 = layout.Initialize(1), v1 = layout.Initialize(2);
  REQUIRE(engine.Stage(Served(layout, v0), 0).ok());
  CHECK(!engine.version().has_value());  // staged, not committed
  REQUIRE(engine.Commit().ok());
  CHECK(engine.version() == 0);
  // Generation at version 0 equals the decoder's over the BF16-rounded weights.
  std::vector<float> rounded(layout.size());
  {
    const sync::ServedModel served = Served(layout, v0);
    for (const ParameterInfo& p : layout.parameters()) {
      sync::ConvertToFloat(sync::DType::kBF16, served.Find(p.name)->bytes,
                           std::span<float>(rounded).subspan(p.offset, p.size));
    }
  }
  auto out = engine.Generate(prompts_of({{1, 2}, {3}}), sampling);
  REQUIRE(out.ok());
  Sampling params;
  params.max_tokens = 20;
  auto expected = Decoder(layout, rounded).Generate({{1, 2}, {3}}, params);
  REQUIRE(expected.ok());
  CHECK((*out)[0].tokens == (*expected)[0].tokens);
  CHECK((*out)[0].segments == std::vector<std::pair<uint64_t, uint64_t>>{{0, 0}});
  CHECK((*out)[1].version_end == 0);
  // A commit while generations run: some of them switch mid-way, and say where.
  REQUIRE(engine.Stage(Served(layout, v1), 1).ok());
  std::vector<std::vector<int>> prompts(64, std::vector<int>{1, 2});
  std::thread committer([&] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    REQUIRE(engine.Commit().ok());
  });
  auto mixed = engine.Generate(prompts_of(prompts), sampling);
  committer.join();
  REQUIRE(mixed.ok());
  for (const rollout_worker::Completion& c : *mixed) {
    CHECK(c.segments.front() == std::make_pair(c.version_start, uint64_t{0}));
    CHECK(c.segments.back().first == c.version_end);
    CHECK(c.segments.size() <= 2);
    if (c.segments.size() == 2) {
      CHECK(c.segments[1].first == 1);
      CHECK(c.segments[1].second < c.tokens.size());
    }
  }
  CHECK(engine.version() == 1);
  // Weights that do not fit are refused.
  TinyLmConfig other = TinyConfig();
  other.d_model = 4;
  const TinyLmLayout other_layout(other);
  CHECK(engine.Stage(Served(other_layout, other_layout.Initialize(1)), 2)
            .message()
            .find("another shape") != std::string::npos);
}

}  // namespace
}  // namespace weft::examples
