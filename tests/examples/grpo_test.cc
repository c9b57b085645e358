// The example trainer's learning rules.
#include "examples/grpo.h"

#include <doctest/doctest.h>

#include "tests/examples/small_model.h"

namespace weft::examples {
namespace {

TinyLmLayout SmallLayout(int max_seq = 12) {
  return TinyLmLayout(testing::SmallTinyLm(1, max_seq));
}

// The sum of the log-probabilities `weights` give `tokens` after `prompt`.
double LogProb(const TinyLmLayout& layout, const std::vector<float>& weights,
               const std::vector<int>& prompt, const std::vector<int>& tokens) {
  std::vector<int> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::vector<float> scores = Decoder(layout, weights).Score(all).value();
  double sum = 0;
  for (size_t i = prompt.size() - 1; i < scores.size(); ++i) sum += scores[i];
  return sum;
}

Sample OnPolicy(const TinyLmLayout& layout, const std::vector<float>& weights,
                const std::vector<int>& prompt, std::vector<int> tokens, double reward) {
  std::vector<int> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  const std::vector<float> scores = Decoder(layout, weights).Score(all).value();
  Sample s{std::move(tokens), {}, reward};
  s.logprobs.assign(scores.begin() + static_cast<long>(prompt.size()) - 1, scores.end());
  return s;
}

TEST_CASE("policy gradient: the rewarded sample gains probability, the other loses it") {
  const TinyLmLayout layout = SmallLayout();
  std::vector<float> w = layout.Initialize(5);
  AdamWConfig adam;
  adam.learning_rate = 1e-2;
  AdamW optimizer(layout, adam);
  const std::vector<int> prompt = {13, 1, 10, 2, 11}, good = {3, 12}, bad = {4, 12};
  Group group{prompt,
              {OnPolicy(layout, w, prompt, good, 1.0), OnPolicy(layout, w, prompt, bad, 0.0)}};
  const double good_before = LogProb(layout, w, prompt, good),
               bad_before = LogProb(layout, w, prompt, bad);
  const StepStats stats =
      PolicyGradientStep(layout, w, optimizer, {group}, PolicyGradientConfig{}, 2).value();
  CHECK(stats.groups_used == 1);
  CHECK(stats.tokens == 4);
  CHECK(stats.mean_ratio == doctest::Approx(1.0).epsilon(1e-4));  // on-policy
  CHECK(stats.truncated == 0.0);
  CHECK(LogProb(layout, w, prompt, good) > good_before);
  CHECK(LogProb(layout, w, prompt, bad) < bad_before);
}

TEST_CASE(
    "policy gradient: groups without a signal change nothing; stale samples are truncated; bad "
    "samples are named") {
  const TinyLmLayout layout = SmallLayout();
  std::vector<float> w = layout.Initialize(6);
  AdamW optimizer(layout, AdamWConfig{});
  const std::vector<int> prompt = {13, 1, 10, 2, 11};
  Group same{
      prompt,
      {OnPolicy(layout, w, prompt, {3, 12}, 1.0), OnPolicy(layout, w, prompt, {4, 12}, 1.0)}};
  const std::vector<float> before = w;
  const StepStats none =
      PolicyGradientStep(layout, w, optimizer, {same}, PolicyGradientConfig{}, 1).value();
  CHECK(none.groups_used == 0);
  CHECK(w == before);

  // Behaviour logprobs far below the current policy's: every ratio is over the truncation.
  Group stale{
      prompt,
      {OnPolicy(layout, w, prompt, {3, 12}, 1.0), OnPolicy(layout, w, prompt, {4, 12}, 0.0)}};
  for (Sample& s : stale.samples) {
    for (float& l : s.logprobs) l -= 5.0f;
  }
  const StepStats truncated =
      PolicyGradientStep(layout, w, optimizer, {stale}, PolicyGradientConfig{2.0}, 1).value();
  CHECK(truncated.truncated == doctest::Approx(1.0));
  CHECK(truncated.mean_ratio > 100.0);
  CHECK(truncated.max_log_ratio == doctest::Approx(5.0).epsilon(1e-3));

  Group broken{prompt, {Sample{{3, 12}, {-1.0f}, 1.0}, OnPolicy(layout, w, prompt, {4, 12}, 0.0)}};
  auto refused =
      PolicyGradientStep(layout, w, optimizer, {same, broken}, PolicyGradientConfig{}, 1);
  REQUIRE(!refused.ok());
  CHECK(refused.status().message() ==
        "group 1 sample 0: 2 tokens but 1 logprobs (at least one of each needed)");
}

TEST_CASE("supervised warm-up step and greedy accuracy") {
  const ArithmeticTask task(1);
  const TinyLmLayout layout = SmallLayout(task.max_length());
  std::vector<float> w = layout.Initialize(7);
  AdamWConfig adam;
  adam.learning_rate = 3e-3;
  AdamW optimizer(layout, adam);
  std::mt19937_64 rng(1);
  const double first = SupervisedStep(layout, w, optimizer, task, rng, 32, 2).value();
  double last = first;
  for (int i = 0; i < 40; ++i)
    last = SupervisedStep(layout, w, optimizer, task, rng, 32, 2).value();
  CHECK(last < first);  // the answer tokens' NLL falls
  const double accuracy = GreedyAccuracy(layout, w, task, {"1+2=", "3+4="}, 1).value();
  CHECK(accuracy >= 0.0);
  CHECK(accuracy <= 1.0);
  CHECK(!GreedyAccuracy(layout, w, task, {}, 1).ok());
  CHECK(!GreedyAccuracy(layout, w, task, {"1+x="}, 1).ok());
}

}  // namespace
}  // namespace weft::examples

namespace weft::examples {
namespace {

TEST_CASE("rejection sampling: only the accepted samples are learnt; none accepted, no change") {
  const TinyLmLayout layout = SmallLayout();
  std::vector<float> w = layout.Initialize(5);
  AdamWConfig adam;
  adam.learning_rate = 1e-2;
  AdamW optimizer(layout, adam);
  const std::vector<int> prompt = {13, 1, 10, 2, 11}, good = {3, 12}, bad = {4, 12};
  Group group{prompt,
              {OnPolicy(layout, w, prompt, good, 1.0), OnPolicy(layout, w, prompt, bad, 0.0)}};
  const std::vector<float> before = w;
  Group rejected{prompt, {OnPolicy(layout, w, prompt, bad, 0.0)}};
  StepStats none = RejectionSamplingStep(layout, w, optimizer, {rejected}, 1.0, 1).value();
  CHECK(none.survivors == 0.0);
  CHECK(w == before);
  const double good_before = LogProb(layout, w, prompt, good);
  StepStats stats = RejectionSamplingStep(layout, w, optimizer, {group}, 1.0, 2).value();
  CHECK(stats.survivors == 0.5);
  CHECK(stats.tokens == 2);
  CHECK(stats.groups_used == 1);
  CHECK(LogProb(layout, w, prompt, good) > good_before);
}

TEST_CASE("distillation: tokens the teacher finds likelier gain; the reverse KL is measured") {
  const TinyLmLayout layout = SmallLayout();
  std::vector<float> w = layout.Initialize(5);
  AdamWConfig adam;
  adam.learning_rate = 1e-2;
  AdamW optimizer(layout, adam);
  const std::vector<int> prompt = {13, 1, 10, 2, 11}, liked = {3, 12}, disliked = {4, 12};
  Sample a = OnPolicy(layout, w, prompt, liked, 0.0), b = OnPolicy(layout, w, prompt, disliked, 0);
  // The teacher: the first sample's tokens far likelier than the policy finds them, the second's
  // far less likely.
  for (float lp : a.logprobs) a.teacher_logprobs.push_back(lp + 1.0f);
  for (float lp : b.logprobs) b.teacher_logprobs.push_back(lp - 1.0f);
  const double liked_before = LogProb(layout, w, prompt, liked),
               disliked_before = LogProb(layout, w, prompt, disliked);
  StepStats stats =
      DistillationStep(layout, w, optimizer, {Group{prompt, {a, b}}}, PolicyGradientConfig{}, 2)
          .value();
  CHECK(stats.reverse_kl == doctest::Approx(0.0).epsilon(1e-6));  // +1 and -1 per token
  CHECK(stats.mean_ratio == doctest::Approx(1.0).epsilon(1e-4));
  CHECK(LogProb(layout, w, prompt, liked) > liked_before);
  CHECK(LogProb(layout, w, prompt, disliked) < disliked_before);
  // A sample without the teacher's logprobs is named.
  Sample unscored = OnPolicy(layout, w, prompt, liked, 0.0);
  CHECK(
      DistillationStep(layout, w, optimizer, {Group{prompt, {unscored}}}, PolicyGradientConfig{}, 1)
          .status()
          .message() == "group 0 sample 0: 2 tokens but 0 teacher logprobs");
}

}  // namespace
}  // namespace weft::examples
