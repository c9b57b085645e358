// The SGLang and vLLM test servers, over plain HTTP: generation against the model's own scores,
// the engines' payloads, pauses and weight loads with requests in flight, the test switches, and
// the executable.
#include "tests/engines/fake_engine.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/byte_io.h"
#include "common/file_util.h"
#include "common/http_client.h"
#include "examples/arithmetic_task.h"
#include "sync/convert.h"
#include "sync/safetensors.h"
#include "tests/source_dir.h"
#include "tests/temp_path.h"

namespace weft::fake_engine {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

examples::TinyLmConfig Config() {
  examples::TinyLmConfig c;
  c.vocab = 16;
  c.d_model = 32;
  c.layers = 2;
  c.heads = 2;
  c.d_ff = 64;
  c.max_seq = 24;
  return c;
}

// A model directory of freshly initialised weights.
std::string Model(const std::string& name, uint64_t seed, sync::DType dtype = sync::DType::kBF16,
                  const examples::TinyLmConfig& config = Config()) {
  const std::string dir = testing::TempPath("fake_engine_" + name);
  const examples::TinyLmLayout layout(config);
  REQUIRE(WriteModelDirectory(dir, config, layout.Initialize(seed), dtype).ok());
  return dir;
}

std::unique_ptr<FakeEngine> Launch(Api api, const std::string& model,
                                   FakeEngineOptions options = {}) {
  options.model_path = model;
  Result<std::unique_ptr<FakeEngine>> engine = FakeEngine::Create(api, options);
  REQUIRE_MESSAGE(engine.ok(), engine.status().message());
  return std::move(*engine);
}

struct Answer {
  long status = 0;  // 0: no HTTP answer (see error); a 5xx answer has its error text too
  std::string text;
  json body;
  std::string error;
};

// One request, one try, no retry.
Answer Send(const std::string& url, const std::string& method, const std::string& path,
            const std::string& body = "", const std::vector<std::string>& headers = {}) {
  HttpClientOptions options;
  options.attempts = 1;
  options.deadline = std::chrono::seconds(20);
  HttpClient client(url, options);
  Result<HttpReply> reply = client.Request(method, path, TextBytes(body), headers, false);
  Answer answer;
  if (!reply.ok()) {
    // The client reports a 5xx answer as an error that names its status.
    answer.error = reply.status().message();
    const size_t at = answer.error.find(": HTTP 5");
    if (at != std::string::npos) answer.status = std::stol(answer.error.substr(at + 7, 3));
    return answer;
  }
  answer.status = reply->status;
  answer.text.assign(reply->body.begin(), reply->body.end());
  answer.body = json::parse(answer.text, nullptr, false);
  return answer;
}
// A POST of `body` (null: no body).
Answer Post(const FakeEngine& engine, const std::string& path, const json& body) {
  return Send(engine.url(), "POST", path, body.is_null() ? "" : body.dump());
}
Answer Get(const FakeEngine& engine, const std::string& path) {
  return Send(engine.url(), "GET", path);
}

// Waits (up to 10 s) until `done` holds.
void WaitUntil(const std::function<bool()>& done, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "timed out waiting: " << what);
    std::this_thread::sleep_for(milliseconds(2));
  }
}

std::vector<int> Prompt(const std::string& problem) {
  return examples::ArithmeticTask().Encode(problem).value();
}

// The model's log-probability of each of `tokens` after `prompt` at weights `w`.
std::vector<float> Scores(const FakeEngine& engine, const std::vector<float>& w,
                          const std::vector<int>& prompt, const std::vector<int>& tokens) {
  std::vector<int> sequence = prompt;
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  Result<std::vector<float>> scored = examples::Decoder(engine.layout(), w).Score(sequence);
  REQUIRE(scored.ok());
  return std::vector<float>(scored->end() - static_cast<long>(tokens.size()), scored->end());
}

std::vector<int> Ids(const json& list) { return list.get<std::vector<int>>(); }

// The logprobs of an SGLang answer's [logprob, token id, text] triples, checked against its ids.
std::vector<float> SglangLogprobs(const json& answer) {
  std::vector<float> out;
  const json& triples = answer["meta_info"]["output_token_logprobs"];
  REQUIRE(triples.size() == answer["output_ids"].size());
  for (size_t i = 0; i < triples.size(); ++i) {
    CHECK(triples[i][1] == answer["output_ids"][i]);
    out.push_back(triples[i][0].get<float>());
  }
  return out;
}

// Where the weights changed: tokens [0, k) scored at `before`, [k, n) at `after`.
void CheckSplit(const std::vector<float>& logprobs, const std::vector<float>& before,
                const std::vector<float>& after, size_t k) {
  REQUIRE(logprobs.size() == before.size());
  for (size_t i = 0; i < logprobs.size(); ++i) {
    CAPTURE(i);
    CHECK(logprobs[i] == (i < k ? before[i] : after[i]));
  }
}

TEST_CASE("model directories: written, read back, and checked tensor by tensor") {
  const examples::TinyLmLayout layout(Config());
  const std::vector<float> w = layout.Initialize(3);
  const std::string f32 = Model("dir_f32", 3, sync::DType::kF32);
  REQUIRE(ReadModelConfig(f32).ok());
  CHECK(ReadModelConfig(f32)->d_ff == Config().d_ff);
  CHECK(ReadModelWeights(f32, layout).value() == w);
  // BF16 reads back as the exact widening of the rounded values.
  const std::string bf16 = Model("dir_bf16", 3, sync::DType::kBF16);
  std::vector<uint16_t> narrow(w.size());
  sync::ConvertBf16(w, narrow);
  std::vector<float> widened(w.size());
  for (size_t i = 0; i < w.size(); ++i) widened[i] = sync::Bf16ToFloat(narrow[i]);
  CHECK(ReadModelWeights(bf16, layout).value() == widened);
  CHECK(ReadModelWeights(Model("dir_f16", 3, sync::DType::kF16), layout).ok());

  auto write = [&](const std::string& name,
                   const std::function<void(std::vector<sync::TensorToWrite>&)>& edit) {
    const std::string dir = testing::TempPath("fake_engine_" + name);
    std::filesystem::create_directories(dir);
    std::vector<sync::TensorToWrite> tensors;
    for (const examples::ParameterInfo& p : layout.parameters()) {
      tensors.push_back({p.name,
                         sync::DType::kF32,
                         p.shape,
                         {reinterpret_cast<const uint8_t*>(w.data() + p.offset), p.size * 4}});
    }
    edit(tensors);
    REQUIRE(sync::WriteSafetensors(dir + "/model.safetensors", tensors).ok());
    return dir;
  };
  Result<std::vector<float>> missing =
      ReadModelWeights(write("dir_missing", [](auto& t) { t.erase(t.begin() + 3); }), layout);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("'" + layout.parameters()[3].name + "' is missing") !=
        std::string::npos);
  const float extra_value = 1.0f;
  Result<std::vector<float>> extra =
      ReadModelWeights(write("dir_extra",
                             [&](auto& t) {
                               t.push_back({"lm_head.bias",
                                            sync::DType::kF32,
                                            {1},
                                            {reinterpret_cast<const uint8_t*>(&extra_value), 4}});
                             }),
                       layout);
  REQUIRE_FALSE(extra.ok());
  CHECK(extra.status().message().find("'lm_head.bias' is not a parameter") != std::string::npos);
  Result<std::vector<float>> shape =
      ReadModelWeights(write("dir_shape",
                             [](auto& t) {
                               t[0].shape = {t[0].shape[1], t[0].shape[0]};
                             }),
                       layout);
  REQUIRE_FALSE(shape.ok());
  CHECK(shape.status().message().find("'" + layout.parameters()[0].name + "' has shape") !=
        std::string::npos);
  // The same tensor in two files.
  const std::string twice = Model("dir_twice", 3);
  std::filesystem::copy_file(twice + "/model.safetensors", twice + "/more.safetensors");
  Result<std::vector<float>> repeated = ReadModelWeights(twice, layout);
  REQUIRE_FALSE(repeated.ok());
  CHECK(repeated.status().message().find("appears again") != std::string::npos);
  // A directory of another model.
  REQUIRE(WriteTextFileAtomic(twice + "/config.json", R"({"model_type": "llama"})").ok());
  CHECK_FALSE(ReadModelConfig(twice).ok());
}

TEST_CASE("sglang /generate: greedy and sampled tokens with the model's own logprobs") {
  const std::string model = Model("sg_generate", 1);
  FakeEngineOptions deterministic;
  deterministic.deterministic_inference = true;  // sampling_seed is read
  auto engine = Launch(Api::kSglang, model, deterministic);
  const std::vector<float> w = *engine->weights();
  const std::vector<int> prompt = Prompt("12+34=");

  // Greedy: the decoder's own greedy tokens, with the scores of the sequence.
  Answer greedy = Post(*engine, "/generate",
                       {{"input_ids", prompt},
                        {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 8}}},
                        {"return_logprob", true}});
  REQUIRE(greedy.status == 200);
  REQUIRE(greedy.body.is_object());
  const std::vector<int> tokens = Ids(greedy.body["output_ids"]);
  examples::Sampling sampling;
  sampling.temperature = 0;
  sampling.max_tokens = 8;
  CHECK(tokens ==
        examples::Decoder(engine->layout(), w).Generate({prompt}, sampling)->at(0).tokens);
  CHECK(SglangLogprobs(greedy.body) == Scores(*engine, w, prompt, tokens));
  const json& meta = greedy.body["meta_info"];
  CHECK(meta["finish_reason"] == json({{"type", "length"}, {"length", 8}}));
  CHECK(meta["prompt_tokens"] == prompt.size());
  CHECK(meta["completion_tokens"] == 8);
  CHECK(meta["cached_tokens"] == 0);
  CHECK(meta["weight_version"] == "default");
  CHECK_FALSE(meta.contains("weight_versions"));
  CHECK(meta["output_token_logprobs"][0][2].is_null());
  CHECK(meta["id"].get<std::string>().size() == 32);
  CHECK(greedy.body["text"] == examples::ArithmeticTask::Decode(tokens));

  // Sampled, seeded: the same seed gives the same tokens; logprobs are at temperature 1.
  const json sampled_request = {
      {"input_ids", prompt},
      {"sampling_params",
       {{"temperature", 0.7}, {"top_p", 0.9}, {"max_new_tokens", 10}, {"sampling_seed", 11}}},
      {"return_logprob", true},
      {"return_text_in_logprobs", true},
      {"rid", "mine"}};
  Answer sampled = Post(*engine, "/generate", sampled_request);
  REQUIRE(sampled.status == 200);
  const std::vector<int> sampled_tokens = Ids(sampled.body["output_ids"]);
  CHECK(SglangLogprobs(sampled.body) == Scores(*engine, w, prompt, sampled_tokens));
  CHECK(sampled.body["meta_info"]["id"] == "mine");
  CHECK(sampled.body["meta_info"]["output_token_logprobs"][0][2] ==
        examples::ArithmeticTask::Decode({sampled_tokens[0]}));
  CHECK(Ids(Post(*engine, "/generate", sampled_request).body["output_ids"]) == sampled_tokens);
  // The seed lives in an int32 tensor: a larger one fails the request.
  json too_large = sampled_request;
  too_large.erase("rid");
  too_large["sampling_params"]["sampling_seed"] = 1ull << 40;
  Answer overflow = Post(*engine, "/generate", too_large);
  CHECK(overflow.status == 400);
  CHECK(overflow.text.find("int32_t without overflow") != std::string::npos);

  // A stop token ends the output (kept in output_ids, trimmed from the text).
  const int stop = tokens[2];
  Answer stopped =
      Post(*engine, "/generate",
           {{"input_ids", prompt},
            {"sampling_params",
             {{"temperature", 0}, {"max_new_tokens", 8}, {"stop_token_ids", {stop}}}}});
  const std::vector<int> until = Ids(stopped.body["output_ids"]);
  REQUIRE(!until.empty());
  CHECK(until.back() == stop);
  CHECK(until.size() <= 3);
  CHECK(stopped.body["meta_info"]["finish_reason"] == json({{"type", "stop"}, {"matched", stop}}));
  CHECK(stopped.body["text"] ==
        examples::ArithmeticTask::Decode(std::vector<int>(until.begin(), until.end() - 1)));
  CHECK_FALSE(stopped.body["meta_info"].contains("output_token_logprobs"));

  // Scoring a sequence: no new tokens, the logprobs of the prompt's tokens from a position on.
  std::vector<int> sequence = prompt;
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  Answer scored = Post(*engine, "/generate",
                       {{"input_ids", sequence},
                        {"sampling_params", {{"max_new_tokens", 0}}},
                        {"return_logprob", true},
                        {"logprob_start_len", 0}});
  REQUIRE(scored.status == 200);
  CHECK(scored.body["output_ids"].empty());
  CHECK(scored.body["meta_info"]["finish_reason"] == json({{"type", "length"}, {"length", 0}}));
  const json& input = scored.body["meta_info"]["input_token_logprobs"];
  REQUIRE(input.size() == sequence.size());
  CHECK(input[0][0].is_null());
  const std::vector<float> expected =
      examples::Decoder(engine->layout(), w).Score(sequence).value();
  for (size_t i = 1; i < sequence.size(); ++i) {
    CHECK(input[i][1] == sequence[i]);
    CHECK(input[i][0].get<float>() == expected[i - 1]);
  }

  // No limit: up to the model's context.
  Answer unlimited =
      Post(*engine, "/generate",
           {{"input_ids", prompt}, {"sampling_params", {{"max_new_tokens", nullptr}}}});
  CHECK(unlimited.body["output_ids"].size() == Config().max_seq - prompt.size());
  CHECK(unlimited.body["meta_info"]["finish_reason"]["type"] == "length");
  // A prompt as long as the context is refused.
  Answer too_long = Post(*engine, "/generate", {{"input_ids", std::vector<int>(24, 1)}});
  CHECK(too_long.status == 400);
  CHECK(too_long.body["error"]["message"].get<std::string>().find("context length") !=
        std::string::npos);
}

TEST_CASE("logprobs modes: after temperature (SGLang's default, vLLM processed) and logits") {
  const std::string model = Model("logprobs_modes", 1);
  const std::vector<int> prompt = Prompt("12+34=");
  const json request = {
      {"input_ids", prompt},
      {"sampling_params", {{"temperature", 0.5}, {"max_new_tokens", 3}, {"sampling_seed", 5}}},
      {"return_logprob", true}};
  FakeEngineOptions seeded;
  seeded.deterministic_inference = true;  // sampling_seed is read
  auto raw = Launch(Api::kSglang, model, seeded);
  const Answer at_one = Post(*raw, "/generate", request);
  REQUIRE(at_one.status == 200);
  const std::vector<int> tokens = Ids(at_one.body["output_ids"]);
  const std::vector<float> scores = Scores(*raw, *raw->weights(), prompt, tokens);
  CHECK(SglangLogprobs(at_one.body) == scores);
  FakeEngineOptions processed = seeded;
  processed.logprobs_mode = "processed_logprobs";
  auto after = Launch(Api::kSglang, model, processed);
  const Answer at_half = Post(*after, "/generate", request);
  REQUIRE(at_half.status == 200);
  CHECK(Ids(at_half.body["output_ids"]) == tokens);  // the same draw, other logprobs
  // The first token's: log softmax(logits / 0.5), from the logprobs at temperature 1 of every
  // token after the prompt.
  double normaliser = 0.0;
  for (int v = 0; v < Config().vocab; ++v) {
    std::vector<int> next = {v};
    normaliser += std::exp(2.0 * Scores(*raw, *raw->weights(), prompt, next)[0]);
  }
  CHECK(SglangLogprobs(at_half.body)[0] ==
        doctest::Approx(2.0 * scores[0] - std::log(normaliser)).epsilon(1e-4));
  FakeEngineOptions logits;
  logits.logprobs_mode = "raw_logits";
  auto shifted = Launch(Api::kVllm, model, logits);
  const Answer vllm = Post(*shifted, "/v1/completions",
                           {{"prompt", prompt},
                            {"max_tokens", 1},
                            {"temperature", 0.5},
                            {"seed", 5},
                            {"logprobs", 0},
                            {"return_token_ids", true}});
  REQUIRE(vllm.status == 200);
  const json& choice = vllm.body["choices"][0];
  const std::vector<float> score = Scores(*raw, *raw->weights(), prompt, Ids(choice["token_ids"]));
  CHECK(choice["logprobs"]["token_logprobs"][0].get<double>() ==
        doctest::Approx(score[0] + 3.0).epsilon(1e-5));
  processed.logprobs_mode = "logits";
  processed.model_path = model;
  CHECK(FakeEngine::Create(Api::kVllm, processed).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("sglang /generate: text prompts, batches, and n > 1 prompt-major") {
  auto engine = Launch(Api::kSglang, Model("sg_batch", 2));
  Answer text =
      Post(*engine, "/generate", {{"text", "1+2="}, {"sampling_params", {{"max_new_tokens", 3}}}});
  REQUIRE(text.status == 200);
  CHECK(text.body["meta_info"]["prompt_tokens"] == 5);
  CHECK(text.body["text"] == examples::ArithmeticTask::Decode(Ids(text.body["output_ids"])));
  Answer bad = Post(*engine, "/generate", {{"text", "1*2="}});
  CHECK(bad.status == 400);
  CHECK(bad.body["error"]["message"].get<std::string>().find("'*'") != std::string::npos);

  Answer batch = Post(*engine, "/generate",
                      {{"text", {"1+2=", "33+4="}},
                       {"sampling_params", {{"n", 3}, {"max_new_tokens", 4}, {"sampling_seed", 5}}},
                       {"rid", "ignored"}});
  REQUIRE(batch.status == 200);
  REQUIRE(batch.body.is_array());
  REQUIRE(batch.body.size() == 6);
  std::set<std::string> ids;
  for (size_t i = 0; i < 6; ++i) {
    CHECK(batch.body[i]["meta_info"]["prompt_tokens"] == (i < 3 ? 5 : 6));
    ids.insert(batch.body[i]["meta_info"]["id"].get<std::string>());
  }
  CHECK(ids.size() == 6);  // fresh ids for n > 1
  // SGLang's seeded sampler draws from the seed and the position: n seeded copies agree.
  CHECK(batch.body[0]["output_ids"] == batch.body[2]["output_ids"]);

  Answer listed = Post(*engine, "/generate",
                       {{"input_ids", {Prompt("1+1="), Prompt("2+2=")}},
                        {"sampling_params", {{{"max_new_tokens", 1}}, {{"max_new_tokens", 2}}}},
                        {"rid", "r"},
                        {"return_logprob", {true, false}}});
  REQUIRE(listed.body.size() == 2);
  CHECK(listed.body[0]["meta_info"]["id"] == "r_0");
  CHECK(listed.body[1]["meta_info"]["id"] == "r_1");
  CHECK(listed.body[0]["output_ids"].size() == 1);
  CHECK(listed.body[1]["output_ids"].size() == 2);
  CHECK(listed.body[0]["meta_info"].contains("output_token_logprobs"));
  CHECK_FALSE(listed.body[1]["meta_info"].contains("output_token_logprobs"));
  CHECK(Post(*engine, "/generate", {{"input_ids", {Prompt("1+1=")}}, {"rid", {"a", "b"}}}).status ==
        400);
}

TEST_CASE("unknown and unsupported request fields are refused in each engine's error shape") {
  const std::string model = Model("refuse", 3);
  auto sglang = Launch(Api::kSglang, model);
  const std::vector<int> prompt = Prompt("1+1=");
  auto sg_error = [&](const json& body) {
    Answer a = Post(*sglang, "/generate", body);
    CHECK(a.status == 400);
    return a.body["error"]["message"].get<std::string>();
  };
  CHECK(sg_error({{"input_ids", prompt}, {"bogus", 1}}).find("'bogus'") != std::string::npos);
  CHECK(sg_error({{"input_ids", prompt}, {"sampling_params", {{"max_new_token", 3}}}})
            .find("'max_new_token'") != std::string::npos);
  CHECK(sg_error({{"input_ids", prompt}, {"stream", true}}) ==
        "streaming is not supported by the test server");
  CHECK(sg_error({{"input_ids", prompt}, {"sampling_params", {{"stop", "="}}}})
            .find("not supported") != std::string::npos);
  CHECK(sg_error({{"input_ids", json::array()}}) == "input_ids cannot be empty");
  CHECK(sg_error({{"input_ids", prompt}, {"text", "1+1="}}).find("Either") != std::string::npos);
  // Documented fields at their usual values are accepted.
  CHECK(Post(*sglang, "/generate",
             {{"input_ids", prompt},
              {"rid", "x"},
              {"stream", false},
              {"logprob_start_len", -1},
              {"top_logprobs_num", 0},
              {"return_text_in_logprobs", false},
              {"sampling_params",
               {{"top_k", -1},
                {"min_p", 0},
                {"ignore_eos", false},
                {"skip_special_tokens", true},
                {"max_new_tokens", 2}}}})
            .status == 200);

  auto vllm = Launch(Api::kVllm, model);
  auto vllm_error = [&](const json& body, long status) {
    Answer a = Post(*vllm, "/v1/completions", body);
    CHECK(a.status == status);
    CHECK(a.body["error"]["code"] == status);
    CHECK(a.body["error"]["type"] == (status == 400 ? "BadRequestError" : "NotFoundError"));
    return a.body["error"]["message"].get<std::string>();
  };
  CHECK(vllm_error({{"prompt", prompt}, {"bogus", 1}}, 400).find("'bogus'") != std::string::npos);
  CHECK(vllm_error({{"prompt", prompt}, {"stream", true}}, 400) ==
        "streaming is not supported by the test server");
  CHECK(vllm_error({{"prompt", prompt}, {"echo", true}}, 400).find("echo") != std::string::npos);
  CHECK(vllm_error({{"prompt", prompt}, {"top_k", 3}}, 400).find("top_k") != std::string::npos);
  CHECK(vllm_error({{"prompt", prompt}, {"model", "other"}}, 404) ==
        "The model `other` does not exist.");
  CHECK(Post(*vllm, "/v1/completions",
             {{"prompt", prompt},
              {"model", model},
              {"top_k", 0},
              {"stream", false},
              {"echo", false},
              {"ignore_eos", true},
              {"skip_special_tokens", true},
              {"request_id", "q"}})
            .status == 200);
}

TEST_CASE("vllm /v1/completions: token ids, logprobs, prompt-major choices, usage") {
  auto engine = Launch(Api::kVllm, Model("vl_completions", 4));
  const std::vector<float> w = *engine->weights();
  const std::vector<int> a = Prompt("12+3="), b = Prompt("4+56=");
  Answer answer = Post(*engine, "/v1/completions",
                       {{"prompt", {a, b}},
                        {"n", 2},
                        {"max_tokens", 5},
                        {"temperature", 0.8},
                        {"seed", 3},
                        {"logprobs", 0},
                        {"return_token_ids", true},
                        {"return_tokens_as_token_ids", true},
                        {"request_id", "abc"}});
  REQUIRE(answer.status == 200);
  const json& body = answer.body;
  CHECK(body["id"] == "cmpl-abc");
  CHECK(body["object"] == "text_completion");
  CHECK(body["model"] == engine->state().model_path);
  REQUIRE(body["choices"].size() == 4);
  size_t completion_tokens = 0;
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const json& choice = body["choices"][i];
    const std::vector<int>& prompt = i < 2 ? a : b;
    const std::vector<int> tokens = Ids(choice["token_ids"]);
    CHECK(choice["index"] == i);
    CHECK(Ids(choice["prompt_token_ids"]) == prompt);
    CHECK(choice["finish_reason"] == "length");
    CHECK(choice["stop_reason"].is_null());
    CHECK(tokens.size() == 5);
    completion_tokens += tokens.size();
    const json& logprobs = choice["logprobs"];
    CHECK(logprobs["tokens"][0] == "token_id:" + std::to_string(tokens[0]));
    CHECK(logprobs["token_logprobs"].get<std::vector<float>>() ==
          Scores(*engine, w, prompt, tokens));
    CHECK(logprobs["top_logprobs"][0].size() == 1);
    CHECK(logprobs["text_offset"].size() == 5);
    CHECK(choice["text"] == examples::ArithmeticTask::Decode(tokens));
  }
  CHECK(body["usage"]["prompt_tokens"] == a.size() + b.size());
  CHECK(body["usage"]["completion_tokens"] == completion_tokens);
  CHECK(body["usage"]["total_tokens"] == a.size() + b.size() + completion_tokens);

  // A text prompt, greedy, the default 16 tokens; the best alternatives.
  Answer text = Post(*engine, "/v1/completions",
                     {{"prompt", "5+5="},
                      {"temperature", 0},
                      {"logprobs", 2},
                      {"return_token_ids", true},
                      {"return_tokens_as_token_ids", true}});
  REQUIRE(text.status == 200);
  const json& choice = text.body["choices"][0];
  CHECK(Ids(choice["prompt_token_ids"]) == Prompt("5+5="));
  CHECK(choice["token_ids"].size() == 16);
  const json& top = choice["logprobs"]["top_logprobs"][0];
  CHECK(top.size() == 2);  // greedy: the sampled token is the best one
  CHECK(top.contains(choice["logprobs"]["tokens"][0].get<std::string>()));
  // Without return_token_ids, no ids.
  Answer plain = Post(*engine, "/v1/completions", {{"prompt", a}, {"max_tokens", 2}});
  CHECK(plain.body["choices"][0]["token_ids"].is_null());
  CHECK(plain.body["choices"][0]["logprobs"].is_null());
  CHECK(Get(*engine, "/v1/models").body["data"][0]["max_model_len"] == Config().max_seq);
}

TEST_CASE("vllm prompt_logprobs: each prompt token's logprob and rank, and the best alternatives") {
  auto engine = Launch(Api::kVllm, Model("vl_prompt_logprobs", 4));
  const std::vector<float> w = *engine->weights();
  const std::vector<int> prompt = Prompt("12+34=");
  for (const int k : {0, 2}) {
    CAPTURE(k);
    Answer answer = Post(*engine, "/v1/completions",
                         {{"prompt", prompt},
                          {"max_tokens", 1},
                          {"temperature", 0.5},
                          {"prompt_logprobs", k},
                          {"return_tokens_as_token_ids", true}});
    REQUIRE(answer.status == 200);
    const json& positions = answer.body["choices"][0]["prompt_logprobs"];
    REQUIRE(positions.size() == prompt.size());
    CHECK(positions[0].is_null());
    // At temperature 1 whatever the request's: the model's own log-probabilities.
    const std::vector<float> expected =
        Scores(*engine, w, {prompt[0]}, std::vector<int>(prompt.begin() + 1, prompt.end()));
    for (size_t i = 1; i < prompt.size(); ++i) {
      CAPTURE(i);
      const json& at = positions[i];
      const std::string id = std::to_string(prompt[i]);
      REQUIRE(at.contains(id));
      CHECK(at[id]["logprob"].get<float>() == doctest::Approx(expected[i - 1]).epsilon(1e-5));
      CHECK(at[id]["decoded_token"] == "token_id:" + id);
      // The token itself, and the best k (which may include it).
      CHECK(at.size() >= static_cast<size_t>(std::max(k, 1)));
      CHECK(at.size() <= static_cast<size_t>(k + 1));
      std::vector<std::pair<int, float>> ranked;  // by rank: the best k are 1 to k, in order
      for (const auto& [token, entry] : at.items()) {
        ranked.emplace_back(entry["rank"].get<int>(), entry["logprob"].get<float>());
        if (token != id) CHECK(ranked.back().first <= k);
      }
      std::sort(ranked.begin(), ranked.end());
      for (size_t r = 0; r < ranked.size(); ++r) {
        if (r < static_cast<size_t>(k)) CHECK(ranked[r].first == static_cast<int>(r) + 1);
        if (r > 0) CHECK(ranked[r].second <= ranked[r - 1].second);
      }
    }
  }
  Answer none = Post(*engine, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}});
  CHECK(none.body["choices"][0]["prompt_logprobs"].is_null());
  CHECK(Post(*engine, "/v1/completions", {{"prompt", prompt}, {"prompt_logprobs", 21}}).status ==
        400);
}

TEST_CASE("sglang: a weight load changes outputs and version; a failed one changes nothing") {
  const std::string a = Model("sg_load_a", 5), b = Model("sg_load_b", 6);
  examples::TinyLmConfig other = Config();
  other.d_ff = 48;
  const std::string wrong = Model("sg_load_wrong", 7, sync::DType::kBF16, other);
  auto engine = Launch(Api::kSglang, a);
  const std::vector<float> wa = *engine->weights();
  const std::vector<int> prompt = Prompt("7+8=");
  const json request = {{"input_ids", prompt},
                        {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 6}}},
                        {"return_logprob", true}};
  Answer before = Post(*engine, "/generate", request);
  CHECK(SglangLogprobs(before.body) == Scores(*engine, wa, prompt, Ids(before.body["output_ids"])));

  Answer loaded =
      Post(*engine, "/update_weights_from_disk", {{"model_path", b}, {"weight_version", "v1"}});
  REQUIRE(loaded.status == 200);
  CHECK(loaded.body["success"] == true);
  CHECK(loaded.body["num_paused_requests"] == 0);
  CHECK(loaded.body["message"].get<std::string>().find("v1") != std::string::npos);
  const std::vector<float> wb = *engine->weights();
  CHECK(wb != wa);
  Answer info = Get(*engine, "/model_info");
  CHECK(info.body["model_path"] == b);
  CHECK(info.body["tokenizer_path"] == a);
  CHECK(info.body["weight_version"] == "v1");
  CHECK(info.body["architectures"] == json({"WeftTinyLm"}));
  CHECK(Get(*engine, "/get_model_info").body == info.body);
  CHECK(Get(*engine, "/v1/models").body["data"][0]["id"] == b);
  Answer after = Post(*engine, "/generate", request);
  CHECK(after.body["meta_info"]["weight_version"] == "v1");
  CHECK(SglangLogprobs(after.body) == Scores(*engine, wb, prompt, Ids(after.body["output_ids"])));
  CHECK(SglangLogprobs(after.body) != SglangLogprobs(before.body));

  // Wrong shapes and a missing directory: 400, the old weights and version stay.
  Answer failed =
      Post(*engine, "/update_weights_from_disk", {{"model_path", wrong}, {"weight_version", "v2"}});
  CHECK(failed.status == 400);
  CHECK(failed.body["success"] == false);
  CHECK(failed.body["message"].get<std::string>().find("has shape") != std::string::npos);
  CHECK(Post(*engine, "/update_weights_from_disk", {{"model_path", "/nonexistent/model"}})
            .body["success"] == false);
  CHECK(Post(*engine, "/update_weights_from_disk", {{"model_path", b}, {"load_format", "gguf"}})
            .status == 400);
  CHECK(Post(*engine, "/update_weights_from_disk", {{"path", b}}).status == 400);
  CHECK(*engine->weights() == wb);
  CHECK(Get(*engine, "/model_info").body["weight_version"] == "v1");
  CHECK(Post(*engine, "/generate", request).body["output_ids"] == after.body["output_ids"]);
  CHECK(engine->state().loads == 1);
  // A load without a version keeps the version string.
  REQUIRE(Post(*engine, "/update_weights_from_disk", {{"model_path", a}}).status == 200);
  CHECK(Get(*engine, "/model_info").body["weight_version"] == "v1");
  CHECK(*engine->weights() == wa);
}

TEST_CASE("sglang: pause with abort ends in-flight requests with their partial output") {
  FakeEngineOptions options;
  options.token_delay = milliseconds(25);
  auto engine = Launch(Api::kSglang, Model("sg_abort", 8), options);
  const json request = {{"input_ids", Prompt("1+2=")},
                        {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 18}}},
                        {"return_logprob", true}};
  auto running =
      std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
  WaitUntil([&] { return engine->state().tokens >= 3; }, "tokens");
  Answer paused = Post(*engine, "/pause_generation", json::object());
  CHECK(paused.body == json({{"message", "Generation paused successfully."}, {"status", "ok"}}));
  Answer aborted = running.get();
  REQUIRE(aborted.status == 200);
  CHECK(aborted.body["meta_info"]["finish_reason"]["type"] == "abort");
  const size_t partial = aborted.body["output_ids"].size();
  CHECK(partial >= 3);
  CHECK(partial < 18);
  CHECK(aborted.body["meta_info"]["output_token_logprobs"].size() == partial);
  CHECK(engine->state().paused);

  // While paused a new request waits, and generation-based health fails.
  auto waiting =
      std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
  WaitUntil([&] { return engine->state().held == 1; }, "held");
  CHECK(waiting.wait_for(milliseconds(100)) == std::future_status::timeout);
  CHECK(Get(*engine, "/health_generate").status == 503);
  CHECK(Get(*engine, "/health").status == 200);
  CHECK(Send(engine->url(), "POST", "/flush_cache").status == 400);
  CHECK(Post(*engine, "/pause_generation", {{"mode", "sideways"}}).status == 400);
  Answer resumed = Post(*engine, "/continue_generation", json::object());
  CHECK(resumed.body["message"] == "Generation continued successfully.");
  Answer finished = waiting.get();
  CHECK(finished.body["meta_info"]["finish_reason"]["type"] == "length");
  CHECK(finished.body["output_ids"].size() == 18);
  CHECK(Send(engine->url(), "POST", "/flush_cache").status == 200);
}

TEST_CASE("sglang: in-place pause, load, continue: later tokens at the new version, spans") {
  const std::string a = Model("sg_inplace_a", 9), b = Model("sg_inplace_b", 10);
  FakeEngineOptions options;
  options.token_delay = milliseconds(20);
  options.report_weight_versions = true;
  auto engine = Launch(Api::kSglang, a, options);
  const std::vector<float> wa = *engine->weights();
  const std::vector<int> prompt = Prompt("3+4=");
  const json request = {
      {"input_ids", prompt},
      {"sampling_params", {{"temperature", 0.9}, {"max_new_tokens", 12}, {"sampling_seed", 1}}},
      {"return_logprob", true}};
  for (const std::string mode : {"in_place", "retract"}) {
    CAPTURE(mode);
    const uint64_t start = engine->state().tokens;
    auto running =
        std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
    WaitUntil([&] { return engine->state().tokens >= start + 4; }, "tokens");
    REQUIRE(Post(*engine, "/pause_generation", {{"mode", mode}}).status == 200);
    CHECK(engine->state().frozen);
    const size_t k = engine->state().tokens - start;
    const std::string version = mode == "in_place" ? "v2" : "v3";
    const std::string path = mode == "in_place" ? b : a;
    const std::vector<float> w_before = *engine->weights();
    Answer loaded = Post(*engine, "/update_weights_from_disk",
                         {{"model_path", path}, {"weight_version", version}});
    REQUIRE(loaded.status == 200);
    CHECK(loaded.body["num_paused_requests"] == 1);
    std::this_thread::sleep_for(milliseconds(60));
    CHECK(engine->state().tokens - start == k);  // frozen between tokens
    REQUIRE(Post(*engine, "/continue_generation", json::object()).status == 200);
    Answer done = running.get();
    REQUIRE(done.status == 200);
    const std::vector<int> tokens = Ids(done.body["output_ids"]);
    REQUIRE(tokens.size() == 12);
    const json& meta = done.body["meta_info"];
    CHECK(meta["weight_version"] == version);
    const std::string old_version = mode == "in_place" ? "default" : "v2";
    CHECK(meta["weight_versions"] == json({{{"version", old_version}, {"start", 0}, {"end", k}},
                                           {{"version", version}, {"start", k}, {"end", 12}}}));
    CheckSplit(SglangLogprobs(done.body), Scores(*engine, w_before, prompt, tokens),
               Scores(*engine, *engine->weights(), prompt, tokens), k);
    // Without the switch (older SGLang builds) only the version at the end is reported.
    engine->SetReportWeightVersions(false);
    CHECK_FALSE(Post(*engine, "/generate", request).body["meta_info"].contains("weight_versions"));
    engine->SetReportWeightVersions(true);
  }
}

TEST_CASE("sglang: a load without a pause waits for in-flight requests and holds new ones") {
  const std::string a = Model("sg_wait_a", 11), b = Model("sg_wait_b", 12);
  FakeEngineOptions options;
  options.token_delay = milliseconds(20);
  options.report_weight_versions = true;
  auto engine = Launch(Api::kSglang, a, options);
  const json request = {{"input_ids", Prompt("5+6=")},
                        {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 10}}}};
  auto first = std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
  WaitUntil([&] { return engine->state().tokens >= 2; }, "tokens");
  auto load = std::async(std::launch::async, [&] {
    return Post(*engine, "/update_weights_from_disk",
                {{"model_path", b}, {"weight_version", "v1"}});
  });
  std::this_thread::sleep_for(milliseconds(50));
  auto second = std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
  WaitUntil([&] { return engine->state().held == 1; }, "held");
  Answer loaded = load.get();
  CHECK(loaded.body["success"] == true);
  // The load waited for the first request, which ran entirely at the old version.
  CHECK(first.wait_for(std::chrono::seconds(2)) == std::future_status::ready);
  Answer one = first.get();
  CHECK(one.body["output_ids"].size() == 10);
  CHECK(one.body["meta_info"]["weight_version"] == "default");
  CHECK(one.body["meta_info"]["weight_versions"] ==
        json({{{"version", "default"}, {"start", 0}, {"end", 10}}}));
  // The held one ran after it, entirely at the new version.
  Answer two = second.get();
  CHECK(two.body["meta_info"]["weight_versions"] ==
        json({{{"version", "v1"}, {"start", 0}, {"end", 10}}}));

  // abort_all_requests: in-flight requests end at once, aborted.
  auto third = std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
  WaitUntil([&] { return engine->state().in_flight == 1 && engine->state().tokens >= 22; },
            "tokens");
  CHECK(Post(*engine, "/update_weights_from_disk",
             {{"model_path", a}, {"weight_version", "v2"}, {"abort_all_requests", true}})
            .body["success"] == true);
  Answer cut = third.get();
  CHECK(cut.body["meta_info"]["finish_reason"]["type"] == "abort");
  CHECK(cut.body["output_ids"].size() < 10);
  // /update_weight_version aborts in-flight requests by default, and sets the version.
  Answer named = Post(*engine, "/update_weight_version", {{"new_version", "v9"}});
  CHECK(named.body["success"] == true);
  CHECK(Get(*engine, "/model_info").body["weight_version"] == "v9");
}

TEST_CASE("engine facts: versions, deterministic inference, the context, old reload_weights") {
  const std::string model = Model("facts", 21);
  auto sglang = Launch(Api::kSglang, model);
  CHECK(Get(*sglang, "/server_info").body["version"] == "0.5.6");
  CHECK(Get(*sglang, "/get_server_info").body["enable_deterministic_inference"] == false);
  CHECK(Get(*sglang, "/v1/models").body["data"][0]["max_model_len"] == Config().max_seq);
  // Without deterministic inference a seed changes nothing, and so cannot overflow either.
  const std::vector<int> prompt = Prompt("1+2=");
  const int room = Config().max_seq - static_cast<int>(prompt.size());
  CHECK(Post(*sglang, "/generate",
             {{"input_ids", prompt},
              {"sampling_params", {{"max_new_tokens", 1}, {"sampling_seed", 1ull << 40}}}})
            .status == 200);
  // SGLang refuses a request that reaches the context; vLLM one that passes it.
  Answer reaching = Post(*sglang, "/generate",
                         {{"input_ids", prompt}, {"sampling_params", {{"max_new_tokens", room}}}});
  CHECK(reaching.status == 400);
  CHECK(reaching.text.find("exceeds the model's maximum context length") != std::string::npos);
  CHECK(Post(*sglang, "/generate",
             {{"input_ids", prompt}, {"sampling_params", {{"max_new_tokens", room - 1}}}})
            .status == 200);
  auto vllm = Launch(Api::kVllm, model);
  CHECK(Get(*vllm, "/version").body == json({{"version", "0.16.0"}}));
  CHECK(Post(*vllm, "/v1/completions", {{"prompt", prompt}, {"max_tokens", room}}).status == 200);
  Answer passing = Post(*vllm, "/v1/completions", {{"prompt", prompt}, {"max_tokens", room + 1}});
  CHECK(passing.status == 400);
  CHECK(passing.text.find("'max_tokens' or 'max_completion_tokens' is too large") !=
        std::string::npos);
  // vLLM before 0.15: reload_weights takes no weights_path.
  FakeEngineOptions old;
  old.engine_version = "0.14.1";
  auto older = Launch(Api::kVllm, model, old);
  Answer refused = Post(*older, "/collective_rpc",
                        {{"method", "reload_weights"}, {"kwargs", {{"weights_path", model}}}});
  CHECK(refused.status == 500);
  CHECK((refused.text + refused.error).find("unexpected keyword argument 'weights_path'") !=
        std::string::npos);
}

TEST_CASE("vllm /reset_prefix_cache: each build family's answer to a reset that failed") {
  const std::string model = Model("vl_reset", 22);
  for (const std::string family : {"empty", "success", "conflict"}) {
    CAPTURE(family);
    FakeEngineOptions options;
    options.token_delay = milliseconds(20);
    options.reset_answers = family;
    auto engine = Launch(Api::kVllm, model, options);
    const json request = {{"prompt", Prompt("9+9=")}, {"max_tokens", 3}, {"logprobs", 0}};
    auto running =
        std::async(std::launch::async, [&] { return Post(*engine, "/v1/completions", request); });
    WaitUntil([&] { return engine->state().tokens >= 1; }, "tokens");
    REQUIRE(Post(*engine, "/pause?mode=keep", json(nullptr)).status == 200);
    Answer failed = Post(*engine, "/reset_prefix_cache", json(nullptr));
    Answer all = Post(*engine, "/reset_prefix_cache?reset_running_requests=true", json(nullptr));
    if (family == "empty") {
      CHECK(failed.status == 200);
      CHECK(failed.text.empty());
      CHECK(all.text.empty());
    } else if (family == "success") {
      CHECK(failed.body == json({{"success", false}}));
      CHECK(all.body == json({{"success", true}}));
    } else {
      CHECK(failed.status == 409);
      CHECK(all.status == 200);
    }
    REQUIRE(Post(*engine, "/resume", json(nullptr)).status == 200);
    CHECK(running.get().status == 200);
  }
}

TEST_CASE("vllm: keep pause, reload and resume: the request goes on at the new weights") {
  const std::string a = Model("vl_keep_a", 13), b = Model("vl_keep_b", 14);
  FakeEngineOptions options;
  options.token_delay = milliseconds(20);
  auto engine = Launch(Api::kVllm, a, options);
  const std::vector<float> wa = *engine->weights();
  const std::vector<int> prompt = Prompt("9+9=");
  const json request = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 1.0},
                        {"seed", 4},        {"logprobs", 0},    {"return_token_ids", true}};
  auto running =
      std::async(std::launch::async, [&] { return Post(*engine, "/v1/completions", request); });
  WaitUntil([&] { return engine->state().tokens >= 4; }, "tokens");
  CHECK(Post(*engine, "/pause?mode=keep", json(nullptr)).body == json({{"status", "paused"}}));
  CHECK(Get(*engine, "/is_paused").body == json({{"is_paused", true}}));
  const size_t k = engine->state().tokens;
  Answer reloaded = Post(*engine, "/collective_rpc",
                         {{"method", "reload_weights"}, {"kwargs", {{"weights_path", b}}}});
  CHECK(reloaded.body == json({{"results", {nullptr}}}));
  const std::vector<float> wb = *engine->weights();
  CHECK(Post(*engine, "/reset_prefix_cache?reset_running_requests=true", json(nullptr)).status ==
        200);
  CHECK(Post(*engine, "/update_weight_version", {{"new_version", "v2"}}).body ==
        json({{"success", true}, {"new_version", "v2"}}));
  CHECK(Get(*engine, "/weight_info").body == json({{"weight_version", "v2"}}));
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(engine->state().tokens == k);
  CHECK(Post(*engine, "/resume", json(nullptr)).body == json({{"status", "resumed"}}));
  Answer done = running.get();
  REQUIRE(done.status == 200);
  const json& choice = done.body["choices"][0];
  const std::vector<int> tokens = Ids(choice["token_ids"]);
  REQUIRE(tokens.size() == 12);
  CheckSplit(choice["logprobs"]["token_logprobs"].get<std::vector<float>>(),
             Scores(*engine, wa, prompt, tokens), Scores(*engine, wb, prompt, tokens), k);
  CHECK_FALSE(choice.contains("weight_version"));
  // The model keeps its launch name and root; later reloads with no path read the new one.
  CHECK(Get(*engine, "/v1/models").body["data"][0]["root"] == a);
  CHECK(engine->state().model_path == b);
  CHECK(Post(*engine, "/collective_rpc", {{"method", "sleep"}}).status == 400);
  CHECK(Post(*engine, "/collective_rpc",
             {{"method", "reload_weights"}, {"kwargs", {{"weights_path", "/nonexistent"}}}})
            .status == 500);
}

TEST_CASE("vllm: pause modes wait and abort; a reload without a pause lands mid-request") {
  const std::string a = Model("vl_modes_a", 15), b = Model("vl_modes_b", 16);
  FakeEngineOptions options;
  options.token_delay = milliseconds(20);
  auto engine = Launch(Api::kVllm, a, options);
  const std::vector<float> wa = *engine->weights();
  const std::vector<int> prompt = Prompt("2+2=");
  const json request = {{"prompt", prompt},
                        {"max_tokens", 10},
                        {"temperature", 0},
                        {"logprobs", 0},
                        {"return_token_ids", true}};

  // wait: the pause returns once the request has finished; new ones wait for /resume.
  auto first =
      std::async(std::launch::async, [&] { return Post(*engine, "/v1/completions", request); });
  WaitUntil([&] { return engine->state().tokens >= 2; }, "tokens");
  CHECK(Post(*engine, "/pause?mode=wait", json(nullptr)).status == 200);
  CHECK(engine->state().in_flight == 0);
  Answer one = first.get();
  CHECK(one.body["choices"][0]["finish_reason"] == "length");
  CHECK(one.body["choices"][0]["token_ids"].size() == 10);
  auto held =
      std::async(std::launch::async, [&] { return Post(*engine, "/v1/completions", request); });
  WaitUntil([&] { return engine->state().held == 1; }, "held");
  CHECK(Post(*engine, "/resume", json(nullptr)).status == 200);
  CHECK(held.get().body["choices"][0]["token_ids"].size() == 10);

  // abort: partial output, finish_reason "abort".
  auto second =
      std::async(std::launch::async, [&] { return Post(*engine, "/v1/completions", request); });
  WaitUntil([&] { return engine->state().in_flight == 1 && engine->state().tokens >= 22; },
            "tokens");
  CHECK(Post(*engine, "/pause?mode=abort", json(nullptr)).status == 200);
  Answer cut = second.get();
  CHECK(cut.body["choices"][0]["finish_reason"] == "abort");
  CHECK(cut.body["choices"][0]["token_ids"].size() < 10);
  CHECK(Post(*engine, "/pause?mode=later", json(nullptr)).status == 400);
  CHECK(Post(*engine, "/pause?mdoe=abort", json(nullptr)).status == 400);
  CHECK(Post(*engine, "/resume", json(nullptr)).status == 200);

  // A reload without a pause: the request goes on, its later tokens at the new weights.
  const uint64_t start = engine->state().tokens;
  auto third =
      std::async(std::launch::async, [&] { return Post(*engine, "/v1/completions", request); });
  WaitUntil([&] { return engine->state().tokens >= start + 3; }, "tokens");
  const size_t before = engine->state().tokens - start;
  REQUIRE(Post(*engine, "/collective_rpc",
               {{"method", "reload_weights"}, {"kwargs", {{"weights_path", b}}}})
              .status == 200);
  const size_t after = engine->state().tokens - start;
  Answer mixed = third.get();
  const std::vector<int> tokens = Ids(mixed.body["choices"][0]["token_ids"]);
  REQUIRE(tokens.size() == 10);
  CHECK(after < 10);
  const std::vector<float> logprobs =
      mixed.body["choices"][0]["logprobs"]["token_logprobs"].get<std::vector<float>>();
  const std::vector<float> at_a = Scores(*engine, wa, prompt, tokens);
  const std::vector<float> at_b = Scores(*engine, *engine->weights(), prompt, tokens);
  // The reload landed between two tokens (a step under way finishes at the old weights).
  size_t split = 0;
  while (split < logprobs.size() && logprobs[split] == at_a[split]) ++split;
  CHECK(split >= before);
  CHECK(split <= after + 1);
  CheckSplit(logprobs, at_a, at_b, split);
}

TEST_CASE("vllm: without dev mode the RL routes do not exist") {
  FakeEngineOptions options;
  options.dev_mode = false;
  auto engine = Launch(Api::kVllm, Model("vl_nodev", 17), options);
  for (const char* path :
       {"/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version"}) {
    CAPTURE(path);
    Answer a = Post(*engine, path, json::object());
    CHECK(a.status == 404);
    CHECK(a.body == json({{"detail", "Not Found"}}));
  }
  CHECK(Get(*engine, "/weight_info").status == 404);
  CHECK(Get(*engine, "/is_paused").status == 404);
  CHECK(Post(*engine, "/v1/completions", {{"prompt", Prompt("1+1=")}, {"max_tokens", 1}}).status ==
        200);
  CHECK(Get(*engine, "/health").status == 200);
  engine->SetDevMode(true);
  CHECK(Get(*engine, "/is_paused").body == json({{"is_paused", false}}));
  CHECK(Get(*engine, "/weight_info").body == json({{"weight_version", "default"}}));
}

TEST_CASE("test switches: injected failures and disconnects, health, the API key, the record") {
  const std::string a = Model("switches_a", 18), b = Model("switches_b", 19);
  FakeEngineOptions options;
  options.api_key = "secret";
  auto engine = Launch(Api::kSglang, a, options);
  const std::string key = "Authorization: Bearer secret";
  const std::string request =
      json({{"input_ids", Prompt("1+1=")}, {"sampling_params", {{"max_new_tokens", 2}}}}).dump();
  auto generate = [&] { return Send(engine->url(), "POST", "/generate", request, {key}); };
  CHECK(Get(*engine, "/health").status == 200);
  CHECK(Get(*engine, "/model_info").status == 401);
  CHECK(Send(engine->url(), "GET", "/model_info", "", {key}).status == 200);
  CHECK(Send(engine->url(), "GET", "/model_info", "", {"x-api-key: secret"}).status == 200);
  CHECK(Send(engine->url(), "GET", "/model_info", "", {"Authorization: Bearer nope"}).status ==
        401);

  engine->FailNext(1, 503, "/generate");
  CHECK(Send(engine->url(), "GET", "/model_info", "", {key}).status == 200);
  Answer failed = generate();
  CHECK(failed.status == 503);
  CHECK(failed.error.find("injected failure") != std::string::npos);
  CHECK(generate().status == 200);

  // A disconnect closes the connection unanswered; the engine keeps its state.
  REQUIRE(Send(engine->url(), "POST", "/update_weights_from_disk",
               json({{"model_path", b}, {"weight_version", "v1"}}).dump(), {key})
              .status == 200);
  engine->ClearCalls();
  engine->DisconnectNext(1);
  // On a fresh connection (a new thread's): libcurl repeats a request once, unasked, when a
  // connection it reused closes before any answer.
  Answer dropped = std::async(std::launch::async, generate).get();
  CHECK(dropped.status == 0);
  CHECK(dropped.error.find("HTTP") == std::string::npos);
  WaitUntil([&] { return generate().status == 200; }, "the listener back");
  CHECK(Send(engine->url(), "GET", "/model_info", "", {key}).body["weight_version"] == "v1");
  const std::vector<RecordedCall> calls = engine->calls();
  // On a connection it reused, libcurl may repeat the request once (when the listener is back in
  // time): the second one is dropped too.
  REQUIRE(generate().status == 200);
  engine->DisconnectNext(2, "/generate");
  const size_t recorded_before = engine->calls().size();
  CHECK(generate().status == 0);
  CHECK(engine->calls().size() - recorded_before >= 1);
  CHECK(engine->calls().size() - recorded_before <= 2);
  WaitUntil([&] { return generate().status == 200; }, "the listener back");
  REQUIRE(calls.size() >= 3);
  CHECK(calls[0].method == "POST");
  CHECK(calls[0].target == "/generate");
  CHECK(calls[0].body == request);
  CHECK(calls[1].at >= calls[0].at);

  engine->SetHealthy(false);
  CHECK(Get(*engine, "/health").status == 503);
  CHECK(Get(*engine, "/health").text.empty());
  engine->SetHealthy(true);
  CHECK(Get(*engine, "/health").status == 200);

  // The same switches over HTTP.
  CHECK(Post(*engine, "/_test/faults", {{"fail_next", {{"count", 1}, {"status", 500}}}}).status ==
        200);
  CHECK(generate().status == 500);
  CHECK(Post(*engine, "/_test/faults", {{"healthy", false}, {"token_delay_ms", 1}}).status == 200);
  CHECK(Get(*engine, "/health").status == 503);
  CHECK(Post(*engine, "/_test/faults", {{"bogus", 1}}).status == 400);
  Answer recorded = Get(*engine, "/_test/calls");
  CHECK(recorded.body.back()["target"] == "/health");
  CHECK(Get(*engine, "/_test/state").body["weight_version"] == "v1");
  CHECK(Get(*engine, "/nowhere").status == 401);
  CHECK(Send(engine->url(), "GET", "/nowhere", "", {key}).status == 404);
  CHECK(Send(engine->url(), "GET", "/generate", "", {key}).status == 405);
}

TEST_CASE("stop and start: the engine dies and comes back on the same port as launched") {
  const std::string a = Model("restart_a", 20), b = Model("restart_b", 21);
  FakeEngineOptions options;
  options.token_delay = milliseconds(20);
  auto engine = Launch(Api::kSglang, a, options);
  const uint16_t port = engine->port();
  const std::vector<float> wa = *engine->weights();
  REQUIRE(Post(*engine, "/update_weights_from_disk", {{"model_path", b}, {"weight_version", "v1"}})
              .status == 200);
  REQUIRE(Post(*engine, "/pause_generation", {{"mode", "in_place"}}).status == 200);
  REQUIRE(Post(*engine, "/continue_generation", json::object()).status == 200);
  const json request = {{"input_ids", Prompt("4+4=")},
                        {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 16}}}};
  auto running =
      std::async(std::launch::async, [&] { return Post(*engine, "/generate", request); });
  WaitUntil([&] { return engine->state().tokens >= 2; }, "tokens");
  engine->Stop();
  Answer cut = running.get();
  CHECK(cut.status == 0);
  CHECK_FALSE(engine->state().running);
  CHECK(Get(*engine, "/health").status == 0);

  REQUIRE(engine->Start().ok());
  CHECK(engine->port() == port);
  CHECK(engine->state().running);
  Answer info = Get(*engine, "/model_info");
  CHECK(info.body["weight_version"] == "default");
  CHECK(info.body["model_path"] == a);
  CHECK(*engine->weights() == wa);
  CHECK(Post(*engine, "/generate", request).body["output_ids"].size() == 16);

  // Over HTTP: the answer comes first, then the engine is down for a while.
  CHECK(Post(*engine, "/_test/restart", {{"down_ms", 200}}).status == 200);
  WaitUntil([&] { return !engine->state().running; }, "down");
  CHECK(Get(*engine, "/health").status == 0);
  WaitUntil([&] { return Get(*engine, "/health").status == 200; }, "up again");
  CHECK(engine->port() == port);
}

#ifdef WEFT_FAKE_ENGINE_BINARY
TEST_CASE("the executable: init writes a model, serve answers until SIGTERM") {
  const std::string dir = testing::TempPath("fake_engine_exe");
  const std::string program = testing::BuildTreeProgram(WEFT_FAKE_ENGINE_BINARY);
  const std::string init = program + " init --dir " + dir +
                           " --d-model 32 --layers 2 --heads 2 --d-ff 64 --max-seq 20 --seed 3 "
                           "--dtype f16 > /dev/null";
  REQUIRE(std::system(init.c_str()) == 0);
  Result<examples::TinyLmConfig> config = ReadModelConfig(dir);
  REQUIRE(config.ok());
  CHECK(config->max_seq == 20);
  CHECK(ReadModelWeights(dir, examples::TinyLmLayout(*config)).ok());

  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl(program.c_str(), program.c_str(), "serve", "--api", "vllm", "--model-path", dir.c_str(),
          "--served-model-name", "tiny", nullptr);
    _exit(127);
  }
  close(out[1]);
  FILE* lines = fdopen(out[0], "r");
  char line[128] = {};
  REQUIRE(std::fgets(line, sizeof(line), lines) != nullptr);
  unsigned port = 0;
  REQUIRE(std::sscanf(line, "listening on %u", &port) == 1);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  CHECK(Send(url, "GET", "/health").status == 200);
  CHECK(Send(url, "GET", "/v1/models").body["data"][0]["id"] == "tiny");
  Answer completion = Send(url, "POST", "/v1/completions",
                           json({{"model", "tiny"}, {"prompt", "1+2="}, {"max_tokens", 3}}).dump());
  CHECK(completion.status == 200);
  CHECK(Send(url, "POST", "/_test/faults", json({{"healthy", false}}).dump()).status == 200);
  CHECK(Send(url, "GET", "/health").status == 503);
  kill(child, SIGTERM);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::fclose(lines);
}
#endif

}  // namespace
}  // namespace weft::fake_engine
