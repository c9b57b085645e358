// The embedded engine at the text level: text prompts through the arithmetic task's character
// tokenizer, completions with their text.
#include "examples/embedded_engine.h"

#include <doctest/doctest.h>

#include <random>

#include "examples/arithmetic_task.h"
#include "sync/served_model.h"

namespace weft::examples {
namespace {

TEST_CASE("embedded engine: text prompts are tokenised as the arithmetic task encodes problems") {
  const ArithmeticTask task(2);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 50; ++i) {
    const std::string problem = task.Problem(rng);
    Result<std::vector<int>> tokens = EmbeddedEngine::Tokenize(problem);
    REQUIRE(tokens.ok());
    CHECK(*tokens == task.Encode(problem).value());
  }
  // Any text of the vocabulary, not only problems.
  CHECK(EmbeddedEngine::Tokenize("1+=").value() == std::vector<int>{ArithmeticTask::kBegin, 1,
                                                                    ArithmeticTask::kPlus,
                                                                    ArithmeticTask::kEquals});
  CHECK(EmbeddedEngine::Tokenize("12 + 34=").status().message() ==
        "the prompt's character ' ' at offset 2 is not in the embedded engine's vocabulary (the "
        "digits, '+' and '=')");
  CHECK(EmbeddedEngine::Tokenize("7\xc3\xa9").status().message() ==
        "the prompt's character byte 195 at offset 1 is not in the embedded engine's vocabulary "
        "(the digits, '+' and '=')");
  CHECK(EmbeddedEngine::Tokenize("").status().message() == "the prompt is empty text");
  // A completion's text leaves out the stop token that ended it.
  CHECK(EmbeddedEngine::CompletionText({4, 6, ArithmeticTask::kEnd}, ArithmeticTask::kEnd) == "46");
  CHECK(EmbeddedEngine::CompletionText({4, 6}, ArithmeticTask::kEnd) == "46");
  CHECK(EmbeddedEngine::CompletionText({4, 6, ArithmeticTask::kEnd}, -1) == "46$");
  CHECK(EmbeddedEngine::CompletionText({ArithmeticTask::kEnd, 4}, ArithmeticTask::kEnd) == "$4");
  CHECK(EmbeddedEngine::CompletionText({}, ArithmeticTask::kEnd).empty());
}

TEST_CASE("embedded engine: a text prompt generates as its tokens do, and completions carry text") {
  TinyLmConfig config;
  config.d_model = 16;
  config.layers = 1;
  config.heads = 2;
  config.d_ff = 16;
  config.max_seq = ArithmeticTask(2).max_length();
  EmbeddedEngine engine(config, 1);
  const TinyLmLayout& layout = engine.layout();
  const std::vector<float> weights = layout.Initialize(5);
  REQUIRE(engine
              .Stage(std::move(sync::ServedModel::FromMaster(layout.Master(weights),
                                                             sync::ServingPlan{}, 1))
                         .value(),
                     0)
              .ok());
  REQUIRE(engine.Commit().ok());
  rollout_worker::Sampling sampling;
  sampling.max_tokens = 4;
  sampling.seed = 11;
  sampling.stop_token = ArithmeticTask::kEnd;
  rollout_worker::Prompt text;
  text.text = "12+34=";
  rollout_worker::Prompt ids;
  ids.tokens = ArithmeticTask(2).Encode("12+34=").value();
  auto from_text = engine.Generate({text, text}, sampling);
  auto from_ids = engine.Generate({ids, ids}, sampling);
  REQUIRE(from_text.ok());
  REQUIRE(from_ids.ok());
  for (size_t i = 0; i < 2; ++i) {
    CHECK((*from_text)[i].tokens == (*from_ids)[i].tokens);
    CHECK((*from_text)[i].logprobs == (*from_ids)[i].logprobs);
    CHECK((*from_text)[i].text ==
          EmbeddedEngine::CompletionText((*from_text)[i].tokens, ArithmeticTask::kEnd));
    CHECK((*from_ids)[i].text == (*from_text)[i].text);
  }
  // Text outside the vocabulary: refused, naming the prompt and the character.
  rollout_worker::Prompt bad;
  bad.text = "12+x=";
  auto refused = engine.Generate({text, bad}, sampling);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message().rfind("prompt 1: the prompt's character 'x' at offset 3", 0) ==
        0);
}

}  // namespace
}  // namespace weft::examples
