// Contract tests of the engine adapters (rollout_worker/http_engine.h) against the test servers
// of tests/engines/fake_engine.h, which speak SGLang's and vLLM's HTTP APIs over the example
// policy: generation and logprobs, text prompts, every pause mode with a weight update landing
// mid-generation (each token's logprob checked against the weights of the version it is tagged
// with), a model mismatch refused, replicas that die and come back, and rolling reloads that
// never pause every replica at once.
#include "rollout_worker/http_engine.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "examples/arithmetic_task.h"
#include "examples/tiny_lm.h"
#include "policy_store/object_store.h"
#include "policy_store/reader.h"
#include "rollout_worker/weight_sink.h"
#include "sync/convert.h"
#include "tests/engines/fake_engine.h"
#include "tests/temp_path.h"
#include "trainer_adapter/publisher.h"

namespace weft::rollout_worker {
namespace {

using examples::TinyLmConfig;
using examples::TinyLmLayout;
using fake_engine::Api;
using fake_engine::FakeEngine;

TinyLmConfig Config(int d_model = 16) {
  TinyLmConfig c;
  c.vocab = 16;
  c.d_model = d_model;
  c.layers = 2;
  c.heads = 2;
  c.d_ff = 32;
  c.max_seq = 24;
  return c;
}

sync::ServedModel Served(const TinyLmLayout& layout, const std::vector<float>& weights) {
  return std::move(sync::ServedModel::FromMaster(layout.Master(weights), sync::ServingPlan{}, 1))
      .value();
}

// The weights an engine computes with after loading `served` (BF16 widened exactly).
std::vector<float> Widened(const TinyLmLayout& layout, const sync::ServedModel& served) {
  std::vector<float> out(layout.size());
  for (const examples::ParameterInfo& p : layout.parameters()) {
    sync::ConvertToFloat(served.Find(p.name)->spec.dtype, served.Find(p.name)->bytes,
                         std::span<float>(out).subspan(p.offset, p.size));
  }
  return out;
}

// Replicas of one API over a model directory holding `initial` weights, and an adapter over them.
struct Fixture {
  // `launch_scale` multiplies the launch model's weights: the initial ones give next tokens
  // nearly equal probabilities, larger ones a distribution with a shape.
  Fixture(Api api, int replicas, const std::string& name, TinyLmConfig engine_config = Config(),
          fake_engine::FakeEngineOptions base = {}, float launch_scale = 1.0f)
      : api(api), layout(Config()), dir(testing::TempPath(name)) {
    std::filesystem::create_directories(dir);
    const TinyLmLayout engine_layout(engine_config);
    std::vector<float> launch = engine_layout.Initialize(99);
    for (float& w : launch) w *= launch_scale;
    REQUIRE(
        fake_engine::WriteModelDirectory(dir + "/launch", engine_config, launch, sync::DType::kBF16)
            .ok());
    for (int i = 0; i < replicas; ++i) {
      fake_engine::FakeEngineOptions o = base;
      o.model_path = dir + "/launch";
      auto made = FakeEngine::Create(api, o);
      REQUIRE_MESSAGE(made.ok(), made.status().ToString());
      engines.push_back(std::move(*made));
    }
    options.api = std::string(fake_engine::ApiName(api));
    for (const auto& e : engines) options.urls.push_back(e->url());
    options.checkpoint_dir = dir + "/served";
    options.health_interval = std::chrono::milliseconds(50);
    options.request_timeout = std::chrono::milliseconds(20000);
    options.control_timeout = std::chrono::milliseconds(20000);
  }
  ~Fixture() {
    engine.reset();
    engines.clear();
    std::filesystem::remove_all(dir);
  }
  HttpEngine& Make() {
    auto made = HttpEngine::Create(options);
    REQUIRE_MESSAGE(made.ok(), made.status().ToString());
    engine = std::move(*made);
    return *engine;
  }
  // Publishes version `v` of weights from `seed` into the adapter; returns the widened weights.
  std::vector<float> Load(uint64_t v, uint64_t seed) {
    const sync::ServedModel served = Served(layout, layout.Initialize(seed));
    Status staged = engine->Stage(served, v);
    REQUIRE_MESSAGE(staged.ok(), staged.ToString());
    auto committed = engine->Commit();
    REQUIRE_MESSAGE(committed.ok(), committed.status().ToString());
    return Widened(layout, served);
  }

  Api api;
  TinyLmLayout layout;
  std::string dir;
  std::vector<std::unique_ptr<FakeEngine>> engines;
  HttpEngineOptions options;
  std::unique_ptr<HttpEngine> engine;
};

// Every token's logprob equals the decoder's under the weights of the version it is tagged with.
void CheckAgainstVersions(const TinyLmLayout& layout, const std::vector<int>& prompt,
                          const Completion& c,
                          const std::map<uint64_t, std::vector<float>>& weights) {
  REQUIRE(!c.segments.empty());
  REQUIRE(c.logprobs.size() == c.tokens.size());
  CHECK(c.segments.front().second == 0);
  std::vector<int> sequence = prompt;
  sequence.insert(sequence.end(), c.tokens.begin(), c.tokens.end());
  for (size_t s = 0; s < c.segments.size(); ++s) {
    const uint64_t version = c.segments[s].first;
    REQUIRE(weights.count(version));
    auto scored = examples::Decoder(layout, weights.at(version)).Score(sequence);
    REQUIRE(scored.ok());
    const size_t end = s + 1 < c.segments.size() ? c.segments[s + 1].second : c.tokens.size();
    for (size_t i = c.segments[s].second; i < end; ++i) {
      CAPTURE(i);
      CAPTURE(version);
      CHECK((*scored)[prompt.size() - 1 + i] == doctest::Approx(c.logprobs[i]).epsilon(1e-4));
    }
  }
}

const std::vector<int> kPrompt = {13, 1, 2, 10, 3, 4, 11};  // "^12+34="

TEST_CASE("http engine: generation, logprobs and text through both APIs, over two replicas") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 2, "http_engine_generate");
    HttpEngine& engine = f.Make();
    CHECK(!engine.version());
    CHECK(engine.Health().ready_replicas == 0);
    const std::vector<float> w1 = f.Load(1, 1);
    CHECK(engine.version() == 1);
    CHECK(engine.Health().ready_replicas == 2);
    for (const auto& e : f.engines) CHECK(e->state().weight_version == "1");
    // The served checkpoint directory holds the weights and the engine's configuration.
    CHECK(std::filesystem::exists(f.options.checkpoint_dir + "/model.safetensors"));
    CHECK(std::filesystem::exists(f.options.checkpoint_dir + "/config.json"));

    Sampling sampling;
    sampling.max_tokens = 8;
    sampling.seed = 7;
    std::vector<Prompt> prompts(6, Prompt{kPrompt, ""});
    // Slow enough that the six requests overlap (on a loaded machine a fast request could end
    // before the next thread picks a replica, and every request would find the first one idle).
    for (const auto& e : f.engines) e->SetTokenDelay(std::chrono::milliseconds(25));
    auto out = engine.Generate(prompts, sampling);
    for (const auto& e : f.engines) e->SetTokenDelay(std::chrono::milliseconds(0));
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    REQUIRE(out->size() == 6);
    for (const Completion& c : *out) {
      CHECK(c.tokens.size() == 8);
      CHECK(c.segments == std::vector<std::pair<uint64_t, uint64_t>>{{1, 0}});
      CHECK(c.version_start == 1);
      CHECK(c.version_end == 1);
      CheckAgainstVersions(f.layout, kPrompt, c, {{1, w1}});
    }
    // Requests went to both replicas.
    for (const auto& e : f.engines) {
      size_t generations = 0;
      for (const auto& call : e->calls())
        generations += call.target == "/generate" || call.target == "/v1/completions";
      CHECK(generations > 0);
    }
    // Greedy is deterministic; a stop token ends the completion (included).
    sampling.temperature = 0;
    auto greedy = engine.Generate({Prompt{kPrompt, ""}, Prompt{kPrompt, ""}}, sampling);
    REQUIRE(greedy.ok());
    CHECK((*greedy)[0].tokens == (*greedy)[1].tokens);
    sampling.stop_token = (*greedy)[0].tokens[2];
    auto stopped = engine.Generate({Prompt{kPrompt, ""}}, sampling);
    REQUIRE(stopped.ok());
    CHECK((*stopped)[0].tokens.size() <= 3);
    CHECK((*stopped)[0].tokens.back() == sampling.stop_token);
    // A text prompt, tokenised by the engine; the completion carries text.
    sampling.stop_token = -1;
    sampling.temperature = 1;
    auto text = engine.Generate({Prompt{{}, "12+34="}}, sampling);
    REQUIRE_MESSAGE(text.ok(), text.status().ToString());
    CHECK((*text)[0].tokens.size() == 8);
    CHECK((*text)[0].text == examples::ArithmeticTask::Decode((*text)[0].tokens));
    CheckAgainstVersions(f.layout, kPrompt, (*text)[0], {{1, w1}});
    // n samples in one request.
    f.engine.reset();
    f.options.n_per_request = true;
    HttpEngine& batched = f.Make();
    f.Load(2, 1);
    for (const auto& e : f.engines) e->ClearCalls();
    auto many = batched.Generate(std::vector<Prompt>(4, Prompt{kPrompt, ""}), sampling);
    REQUIRE(many.ok());
    REQUIRE(many->size() == 4);
    size_t requests = 0;
    for (const auto& e : f.engines) {
      for (const auto& call : e->calls())
        requests += call.target == "/generate" || call.target == "/v1/completions";
    }
    CHECK(requests == 1);
    for (const Completion& c : *many) CheckAgainstVersions(f.layout, kPrompt, c, {{2, w1}});
  }
}

TEST_CASE("http engine: a weight update mid-generation, in every pause mode, tags every token") {
  struct Case {
    Api api;
    std::string mode;
    bool spans;
    std::string reset_answers = "empty";  // vLLM: how a failed prefix-cache reset is answered
  };
  const std::vector<Case> cases = {{Api::kSglang, "abort", false},
                                   {Api::kSglang, "retract", true},
                                   {Api::kSglang, "in_place", true},
                                   {Api::kSglang, "in_place", false},
                                   {Api::kVllm, "abort", false},
                                   {Api::kVllm, "wait", false},
                                   {Api::kVllm, "keep", false},
                                   {Api::kVllm, "keep", false, "success"},
                                   {Api::kVllm, "keep", false, "conflict"}};
  for (const Case& k : cases) {
    CAPTURE(fake_engine::ApiName(k.api));
    CAPTURE(k.mode);
    CAPTURE(k.spans);
    CAPTURE(k.reset_answers);
    fake_engine::FakeEngineOptions base;
    base.reset_answers = k.reset_answers;
    Fixture f(k.api, 1, "http_engine_pause", Config(), base);
    f.options.pause_mode = k.mode;
    HttpEngine& engine = f.Make();
    const std::vector<float> w1 = f.Load(1, 1);
    for (const auto& e : f.engines) {
      e->SetTokenDelay(std::chrono::milliseconds(15));
      e->SetReportWeightVersions(k.spans);
    }
    Sampling sampling;
    sampling.max_tokens = 12;
    sampling.seed = 3;
    Result<std::vector<Completion>> out = Internal("not run");
    std::thread generate([&] {
      out = engine.Generate(std::vector<Prompt>(3, Prompt{kPrompt, ""}), sampling);
    });
    // The load lands once all three are generating (each has tokens, none has finished).
    for (int i = 0; i < 500; ++i) {
      const fake_engine::FakeEngineState state = f.engines[0]->state();
      if (state.in_flight == 3 && state.tokens >= 6) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const std::vector<float> w2 = f.Load(2, 2);
    generate.join();
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    const HttpEngineStats stats = engine.stats();
    size_t switched = 0;
    for (const Completion& c : *out) {
      CHECK(c.tokens.size() == 12);
      CheckAgainstVersions(f.layout, kPrompt, c, {{1, w1}, {2, w2}});
      CHECK(c.segments.size() <= 2);
      switched += c.segments.size() == 2;
    }
    if (k.mode == "abort" || k.spans) {
      // Exact switch points: continued after the abort, or reported by the engine.
      CHECK(switched == 3);
    } else if (k.mode == "wait") {
      CHECK(switched == 0);  // requests finish before the pause
      CHECK(stats.regenerated == 0);
    } else {
      // The switch point is unknown: the samples were generated again at the new version.
      CHECK(switched == 0);
      CHECK(stats.regenerated >= 3);
    }
    if (k.mode == "abort") CHECK(stats.continued >= 3);
    // SGLang cannot flush its cache under requests resident across the pause: those modes load
    // without flushing.
    if (k.api == Api::kSglang) {
      for (const auto& call : f.engines[0]->calls()) {
        if (call.target != "/update_weights_from_disk") continue;
        const bool flush = k.mode == "abort";
        CHECK(nlohmann::json::parse(call.body)["flush_cache"] == flush);
      }
    }
    REQUIRE(stats.replicas.size() == 1);
    CHECK(stats.replicas[0].loads == 2);
    CHECK(stats.replicas[0].last_pause_ms > 0);
  }
}

TEST_CASE("http engine: an engine serving another model is refused before anything is loaded") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 1, "http_engine_mismatch", Config(24));  // d_model 24, the policy's is 16
    HttpEngine& engine = f.Make();
    const sync::ServedModel served = Served(f.layout, f.layout.Initialize(1));
    Status staged = engine.Stage(served, 1);
    CHECK(staged.code() == StatusCode::kInvalidArgument);
    CHECK(staged.message().find("another model") != std::string::npos);
    CHECK(staged.message().find("shape [16, 24] in the engine's model, [16, 16] in the policy") !=
          std::string::npos);
    CHECK(!std::filesystem::exists(f.options.checkpoint_dir + "/model.safetensors"));
    for (const auto& call : f.engines[0]->calls()) {
      CHECK(call.target.find("update_weights") == std::string::npos);
      CHECK(call.target.find("collective_rpc") == std::string::npos);
    }
  }
}

TEST_CASE("http engine: replicas that die and come back; all dead is unavailable") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 2, "http_engine_die");
    HttpEngine& engine = f.Make();
    const std::vector<float> w1 = f.Load(1, 1);
    Sampling sampling;
    sampling.max_tokens = 6;
    f.engines[1]->Stop();
    // Requests that reach the dead replica go to the other one.
    auto out = engine.Generate(std::vector<Prompt>(8, Prompt{kPrompt, ""}), sampling);
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    for (const Completion& c : *out) CheckAgainstVersions(f.layout, kPrompt, c, {{1, w1}});
    for (int i = 0; i < 100 && engine.Health().ready_replicas != 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(engine.Health().ready_replicas == 1);
    CHECK(engine.Health().ok);
    // A version committed while it is down; it comes back serving its launch weights and is
    // loaded with the current version before it gets requests.
    const std::vector<float> w2 = f.Load(2, 2);
    REQUIRE(f.engines[1]->Start().ok());
    for (int i = 0; i < 200 && engine.Health().ready_replicas != 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(engine.Health().ready_replicas == 2);
    CHECK(f.engines[1]->state().weight_version == "2");
    // Every replica down: not healthy, and generation fails as unavailable (the worker then hands
    // the job back).
    for (const auto& e : f.engines) e->Stop();
    for (int i = 0; i < 100 && engine.Health().ok; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(!engine.Health().ok);
    const auto asked = std::chrono::steady_clock::now();
    auto none = engine.Generate({Prompt{kPrompt, ""}}, sampling);
    CHECK(none.status().code() == StatusCode::kUnavailable);
    // At once, not after the request timeout: the worker hands the job back.
    CHECK(std::chrono::steady_clock::now() - asked < std::chrono::milliseconds(1000));
    // Back: loaded again and serving.
    for (const auto& e : f.engines) REQUIRE(e->Start().ok());
    for (int i = 0; i < 200 && engine.Health().ready_replicas != 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(engine.Health().ready_replicas == 2);
    auto again = engine.Generate({Prompt{kPrompt, ""}}, sampling);
    REQUIRE(again.ok());
    CheckAgainstVersions(f.layout, kPrompt, (*again)[0], {{2, w2}});
  }
}

TEST_CASE("http engine: a rolling reload never pauses every replica; failures are reported") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 3, "http_engine_rolling");
    f.options.max_paused = 5;  // capped below the replica count
    HttpEngine& engine = f.Make();
    f.Load(1, 1);
    for (const auto& e : f.engines) {
      e->SetLoadDelay(std::chrono::milliseconds(50));
      e->ClearCalls();
    }
    f.Load(2, 2);
    // From the recorded calls: each replica's pause interval, from pausing to resuming.
    const std::string pause = api == Api::kSglang ? "/pause_generation" : "/pause?mode=abort";
    const std::string resume = api == Api::kSglang ? "/continue_generation" : "/resume";
    std::vector<
        std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>
        intervals;
    for (const auto& e : f.engines) {
      std::chrono::steady_clock::time_point from{}, to{};
      for (const auto& call : e->calls()) {
        if (call.target == pause) from = call.at;
        if (call.target == resume) to = call.at;
      }
      REQUIRE(from.time_since_epoch().count() > 0);
      REQUIRE(to > from);
      intervals.emplace_back(from, to);
    }
    // At every pause start, at least one replica is not paused.
    for (const auto& [start, end] : intervals) {
      int paused = 0;
      for (const auto& other : intervals) paused += other.first <= start && start < other.second;
      CHECK(paused < 3);
    }
    // A replica that refuses the load is reported and taken out; the others serve the version.
    f.engines[0]->FailNext(1, 500,
                           api == Api::kSglang ? "/update_weights_from_disk" : "/collective_rpc");
    f.Load(3, 3);
    const HttpEngineStats stats = engine.stats();
    CHECK(stats.replicas[0].failures >= 1);
    CHECK(f.engines[1]->state().weight_version == "3");
    CHECK(f.engines[2]->state().weight_version == "3");
    // The monitor finds it healthy and loads it.
    for (int i = 0; i < 200 && engine.Health().ready_replicas != 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(f.engines[0]->state().weight_version == "3");
  }
}

TEST_CASE("http engine: a pause that fails still resumes the replica; the commit is retried") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 1, "http_engine_pause_fails");
    HttpEngine& engine = f.Make();
    f.Load(1, 1);
    const std::string pause = api == Api::kSglang ? "/pause_generation" : "/pause";
    const std::string resume = api == Api::kSglang ? "/continue_generation" : "/resume";
    f.engines[0]->ClearCalls();
    f.engines[0]->FailNext(1, 500, pause);
    const sync::ServedModel served = Served(f.layout, f.layout.Initialize(2));
    REQUIRE(engine.Stage(served, 2).ok());
    CHECK(engine.Commit().status().code() == StatusCode::kUnavailable);
    bool resumed = false;
    for (const auto& call : f.engines[0]->calls()) resumed = resumed || call.target == resume;
    CHECK(resumed);
    CHECK(!f.engines[0]->state().paused);
    CHECK(engine.version() == 1);
    // The worker stages and commits again: it loads.
    REQUIRE(engine.Stage(served, 2).ok());
    REQUIRE(engine.Commit().ok());
    CHECK(engine.version() == 2);
    CHECK(f.engines[0]->state().weight_version == "2");
  }
}

TEST_CASE("http engine: a load past load_timeout fails; the replica is resumed and loaded later") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 2, "http_engine_load_timeout");
    f.options.load_timeout = std::chrono::milliseconds(400);
    HttpEngine& engine = f.Make();
    f.Load(1, 1);
    // Replica 0's load hangs (as SGLang's disk load behind requests kept across the pause).
    f.engines[0]->SetLoadDelay(std::chrono::milliseconds(4000));
    const auto start = std::chrono::steady_clock::now();
    f.Load(2, 2);  // replica 1 serves it
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(3500));
    HttpEngineStats stats = engine.stats();
    CHECK(stats.replicas[0].failures == 1);
    CHECK(!stats.replicas[0].ready);
    CHECK(!f.engines[0]->state().paused);  // resumed, though its load still runs
    CHECK(f.engines[1]->state().weight_version == "2");
    // Its loads quick again: the monitor loads it and it serves the version.
    f.engines[0]->SetLoadDelay(std::chrono::milliseconds(0));
    for (int i = 0; i < 400 && engine.Health().ready_replicas != 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(engine.Health().ready_replicas == 2);
    CHECK(engine.stats().replicas[0].version == 2u);
    // With one replica, the commit fails naming the timeout.
    Fixture one(api, 1, "http_engine_load_timeout_one");
    one.options.load_timeout = std::chrono::milliseconds(400);
    HttpEngine& alone = one.Make();
    one.Load(1, 1);
    one.engines[0]->SetLoadDelay(std::chrono::milliseconds(3000));
    REQUIRE(alone.Stage(Served(one.layout, one.layout.Initialize(2)), 2).ok());
    const Result<int64_t> failed = alone.Commit();
    CHECK(failed.status().code() == StatusCode::kUnavailable);
    CHECK(failed.status().message().find("did not finish within engine.load_timeout (400 ms)") !=
          std::string::npos);
    CHECK(!one.engines[0]->state().paused);
    CHECK(alone.version() == 1u);
  }
}

TEST_CASE("http engine: SGLang's disk load behind requests kept in place ends at load_timeout") {
  // Replica 0 is as released SGLang: its disk load waits for the requests an in_place pause kept,
  // which end only after a resume. The load fails at load_timeout instead of hanging; the replica
  // is resumed, its requests end, its load lands, and it serves again; every token is tagged right.
  fake_engine::FakeEngineOptions base;
  base.token_delay = std::chrono::milliseconds(20);
  Fixture f(Api::kSglang, 2, "http_engine_kept", Config(), base);
  fake_engine::FakeEngineOptions waits = base;
  waits.model_path = f.dir + "/launch";
  waits.pause_aware_disk_load = false;
  auto made = FakeEngine::Create(Api::kSglang, waits);
  REQUIRE(made.ok());
  f.engines[0] = std::move(*made);
  f.options.urls[0] = f.engines[0]->url();
  f.options.pause_mode = "in_place";
  f.options.load_timeout = std::chrono::milliseconds(500);
  HttpEngine& engine = f.Make();
  std::map<uint64_t, std::vector<float>> weights;
  weights[1] = f.Load(1, 1);
  const sync::ServedModel served = Served(f.layout, f.layout.Initialize(2));
  weights[2] = Widened(f.layout, served);
  REQUIRE(engine.Stage(served, 2).ok());
  Sampling sampling;
  sampling.max_tokens = 16;
  Result<std::vector<Completion>> out = Unavailable("not run");
  std::thread generating([&] {
    out = engine.Generate(std::vector<Prompt>(8, Prompt{kPrompt, ""}), sampling);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  const auto start = std::chrono::steady_clock::now();
  const Result<int64_t> committed = engine.Commit();
  const auto took = std::chrono::steady_clock::now() - start;
  generating.join();
  CHECK_MESSAGE(committed.ok(), committed.status().ToString());  // replica 1 loaded it
  CHECK(took < std::chrono::milliseconds(4000));
  CHECK(engine.stats().replicas[0].failures >= 1);
  CHECK(f.engines[1]->state().weight_version == "2");
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  for (const Completion& c : *out) CheckAgainstVersions(f.layout, kPrompt, c, weights);
  CHECK(engine.stats().regenerated > 0);  // the kept requests overlapped the pause
  for (int i = 0; i < 250 && engine.Health().ready_replicas != 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(engine.Health().ready_replicas == 2);
  CHECK(f.engines[0]->state().weight_version == "2");
  CHECK(!f.engines[0]->state().paused);
}

// Polls `done` every 20 ms for up to `seconds`.
template <typename Done>
bool WaitFor(Done&& done, double seconds = 5) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST_CASE("http engine: a replica killed mid-generation, or paused mid-load, comes back current") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    for (const std::string mode : {"abort", api == Api::kSglang ? "in_place" : "keep"}) {
      CAPTURE(fake_engine::ApiName(api));
      CAPTURE(mode);
      fake_engine::FakeEngineOptions base;
      base.token_delay = std::chrono::milliseconds(15);
      Fixture f(api, 2, "http_engine_crash", Config(), base);
      f.options.pause_mode = mode;
      HttpEngine& engine = f.Make();
      std::map<uint64_t, std::vector<float>> weights;
      weights[1] = f.Load(1, 1);
      Sampling sampling;
      sampling.max_tokens = 12;
      const std::vector<Prompt> prompts(8, Prompt{kPrompt, ""});

      // Killed mid-generation and restarted on the same port: its requests are sent again to the
      // other replica, and it comes back loaded with the current version (it restarts serving its
      // launch weights).
      Status restarted = Status::Ok();
      std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(60));
        f.engines[0]->Stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        restarted = f.engines[0]->Start();
      });
      auto out = engine.Generate(prompts, sampling);
      killer.join();
      REQUIRE(restarted.ok());
      REQUIRE_MESSAGE(out.ok(), out.status().ToString());
      for (const Completion& c : *out) CheckAgainstVersions(f.layout, kPrompt, c, weights);
      CHECK(WaitFor([&] { return engine.Health().ready_replicas == 2; }));
      CHECK(f.engines[0]->state().weight_version == "1");

      // Killed while paused for a load that hangs, with requests in flight (held by in_place and
      // keep, ended by abort): the commit goes on with the other replica, the samples are tagged
      // right, and the restarted replica is loaded with the new version and not left paused.
      f.engines[0]->SetLoadDelay(std::chrono::milliseconds(3000));
      const sync::ServedModel served = Served(f.layout, f.layout.Initialize(2));
      weights[2] = Widened(f.layout, served);
      REQUIRE(engine.Stage(served, 2).ok());
      Result<std::vector<Completion>> during = Unavailable("not run");
      std::thread generating([&] { during = engine.Generate(prompts, sampling); });
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      bool paused = false;
      std::thread killer2([&] {
        paused = WaitFor([&] { return f.engines[0]->state().paused; });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        f.engines[0]->Stop();
        f.engines[0]->SetLoadDelay(std::chrono::milliseconds(0));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        restarted = f.engines[0]->Start();
      });
      const Result<int64_t> committed = engine.Commit();
      killer2.join();
      generating.join();
      CHECK(paused);
      REQUIRE(restarted.ok());
      CHECK_MESSAGE(committed.ok(), committed.status().ToString());
      CHECK(f.engines[1]->state().weight_version == "2");
      REQUIRE_MESSAGE(during.ok(), during.status().ToString());
      for (const Completion& c : *during) CheckAgainstVersions(f.layout, kPrompt, c, weights);
      CHECK(WaitFor([&] { return engine.Health().ready_replicas == 2; }));
      CHECK(f.engines[0]->state().weight_version == "2");
      CHECK(!f.engines[0]->state().paused);
      // (The load in flight either failed, and the monitor loaded the replica once it was back, or
      // was sent again to the restarted replica.)
      CHECK(engine.stats().replicas[0].failures >= 1);
      auto after = engine.Generate(prompts, sampling);
      REQUIRE(after.ok());
      for (const Completion& c : *after)
        CheckAgainstVersions(f.layout, kPrompt, c, {{2, weights[2]}});
    }
  }
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);
}

TEST_CASE("http engine: replicas from a URL file; one restarted on a new port is taken up") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 2, "http_engine_urls_file");
    const std::string file = f.dir + "/replicas.txt";
    WriteText(file,
              "# the replicas\n" + f.engines[0]->url() + "/\n\n  " + f.engines[1]->url() + "  \n");
    f.options.urls.clear();
    f.options.urls_file = file;
    HttpEngine& engine = f.Make();
    f.Load(1, 1);
    CHECK(engine.Health().replicas == 2);
    CHECK(engine.Health().ready_replicas == 2);
    // Replica 1 dies; a version is published; it comes back on another port, and the launcher
    // rewrites the file.
    f.engines[1]->Stop();
    const std::vector<float> w2 = f.Load(2, 2);
    fake_engine::FakeEngineOptions o;
    o.model_path = f.dir + "/launch";
    auto moved = FakeEngine::Create(api, o);
    REQUIRE(moved.ok());
    REQUIRE((*moved)->url() != f.engines[1]->url());
    f.engines.push_back(std::move(*moved));
    WriteText(file, f.engines[0]->url() + "\n" + f.engines[2]->url() + "\n");
    CHECK(WaitFor([&] { return engine.Health().ready_replicas == 2; }));
    CHECK(f.engines[2]->state().weight_version == "2");
    const EngineHealth health = engine.Health();
    CHECK(health.replicas == 2);  // the old one is gone, not down
    REQUIRE(health.each.size() == 2);
    CHECK(health.each[1].url == f.engines[2]->url());
    const HttpEngineStats stats = engine.stats();
    REQUIRE(stats.replicas.size() == 3);
    CHECK(stats.replicas[1].retired);
    Sampling sampling;
    sampling.max_tokens = 4;
    auto out = engine.Generate(std::vector<Prompt>(6, Prompt{kPrompt, ""}), sampling);
    REQUIRE(out.ok());
    for (const Completion& c : *out) CheckAgainstVersions(f.layout, kPrompt, c, {{2, w2}});
    CHECK(f.engines[2]->state().tokens > 0);
    // A file that cannot be read, or is wrong, leaves the replicas as they are.
    WriteText(file, "not a url\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(engine.Health().replicas == 2);
    CHECK(engine.Health().ready_replicas == 2);
  }
}

TEST_CASE("replica URL files: comments, blanks, trailing slashes; errors name the line") {
  const std::string dir = testing::TempPath("urls_file");
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/urls";
  WriteText(file, "# comment\n\nhttp://a:1/\n\thttps://b:2 \n");
  auto urls = ReadReplicaUrls(file);
  REQUIRE(urls.ok());
  CHECK(*urls == std::vector<std::string>{"http://a:1", "https://b:2"});
  WriteText(file, "http://a:1\nftp://c:3\n");
  CHECK(ReadReplicaUrls(file).status().message() ==
        file + ":2: 'ftp://c:3' is not an http:// or https:// URL");
  WriteText(file, "http://a:1\nhttp://a:1/\n");
  CHECK(ReadReplicaUrls(file).status().message() == file + ":2: http://a:1 appears twice");
  CHECK(ReadReplicaUrls(dir + "/missing").status().code() == StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

// Every target's logprobs equal the decoder's at `weights` after the prompt and the target's
// tokens before it.
void CheckScores(const TinyLmLayout& layout, const std::vector<int>& prompt,
                 const std::vector<std::vector<int>>& targets,
                 const std::vector<std::vector<float>>& logprobs,
                 const std::vector<float>& weights) {
  REQUIRE(logprobs.size() == targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    CAPTURE(i);
    std::vector<int> sequence = prompt;
    sequence.insert(sequence.end(), targets[i].begin(), targets[i].end());
    auto expected = examples::Decoder(layout, weights).Score(sequence);
    REQUIRE(expected.ok());
    REQUIRE(logprobs[i].size() == targets[i].size());
    for (size_t t = 0; t < targets[i].size(); ++t) {
      CAPTURE(t);
      CHECK(logprobs[i][t] == doctest::Approx((*expected)[prompt.size() - 1 + t]).epsilon(1e-4));
    }
  }
}

TEST_CASE("http engine: score jobs through both APIs, each token's logprob the version's own") {
  for (Api api : {Api::kSglang, Api::kVllm}) {
    CAPTURE(fake_engine::ApiName(api));
    Fixture f(api, 2, "http_engine_score", Config(), {}, 4.0f);
    HttpEngine& engine = f.Make();
    const std::vector<float> w1 = f.Load(1, 1);
    f.engines[0]->ClearCalls();
    // The longest target leaves the one position past it both engines need (context 24).
    const std::vector<std::vector<int>> targets = {
        {5, 6, 12}, {1}, {2, 3, 4, 5, 6, 7, 8, 9, 0, 12}, std::vector<int>(16, 3)};
    Result<Engine::Scores> scores = engine.Score(kPrompt, targets);
    REQUIRE_MESSAGE(scores.ok(), scores.status().ToString());
    CHECK(scores->version == 1);
    CheckScores(f.layout, kPrompt, targets, scores->logprobs, w1);
    CHECK(engine.stats().scored == targets.size());
    // The requests the engines' own APIs define for it, and nothing generated.
    size_t requests = 0;
    for (const auto& call : f.engines[0]->calls()) {
      if (call.target != "/generate" && call.target != "/v1/completions") continue;
      ++requests;
      const nlohmann::json body = nlohmann::json::parse(call.body);
      if (api == Api::kSglang) {
        CHECK(body["logprob_start_len"] == kPrompt.size() - 1);
        CHECK(body["sampling_params"]["max_new_tokens"] == 0);
        CHECK(body["sampling_params"]["temperature"] == 1.0);
      } else {
        CHECK(body["prompt_logprobs"] == 0);
        CHECK(body["max_tokens"] == 1);
      }
    }
    CHECK(requests > 0);

    // Too long a target, or an empty prompt, is refused naming what was wrong.
    Result<Engine::Scores> long_target = engine.Score(kPrompt, {std::vector<int>(17, 3)});
    CHECK(long_target.status().code() == StatusCode::kInvalidArgument);
    CHECK(long_target.status().message().find("target 0") != std::string::npos);
    CHECK(long_target.status().message().find("context of 24 tokens") != std::string::npos);
    Result<Engine::Scores> no_prompt = engine.Score({}, {{1, 2}});
    CHECK(no_prompt.status().code() == StatusCode::kInvalidArgument);
    CHECK(no_prompt.status().message().find("empty prompt") != std::string::npos);

    // Scores taken while the replicas reload one by one: whatever version Score reports, every
    // target's logprobs are that version's. While the first replica is paused for its (slow) load,
    // the other still serves version 1, and scores there are version 1's.
    for (const auto& e : f.engines) e->SetLoadDelay(std::chrono::milliseconds(1000));
    const sync::ServedModel served2 = Served(f.layout, f.layout.Initialize(2));
    const std::vector<float> w2 = Widened(f.layout, served2);
    REQUIRE(engine.Stage(served2, 2).ok());
    std::atomic<bool> done{false};
    std::thread commit([&] {
      CHECK(engine.Commit().ok());
      done = true;
    });
    auto one_paused = [&] {
      for (const auto& e : f.engines) {
        if (e->state().paused) return true;
      }
      return false;
    };
    for (int i = 0; i < 2000 && !one_paused(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::set<uint64_t> seen;
    while (!done) {
      Result<Engine::Scores> during = engine.Score(kPrompt, targets);
      REQUIRE_MESSAGE(during.ok(), during.status().ToString());
      REQUIRE((during->version == 1 || during->version == 2));
      CheckScores(f.layout, kPrompt, targets, during->logprobs, during->version == 1 ? w1 : w2);
      seen.insert(during->version);
    }
    commit.join();
    CHECK(seen.count(1));
    MESSAGE(fake_engine::ApiName(api)
            << ": " << engine.stats().rescored << " targets scored again across the reload");
    Result<Engine::Scores> after = engine.Score(kPrompt, targets);
    REQUIRE(after.ok());
    CHECK(after->version == 2);
    CheckScores(f.layout, kPrompt, targets, after->logprobs, w2);
  }
}

TEST_CASE("http engine: seeds the engine reads, within its range; limits within the context") {
  for (const bool deterministic : {true, false}) {
    CAPTURE(deterministic);
    fake_engine::FakeEngineOptions base;
    base.deterministic_inference = deterministic;
    Fixture f(Api::kSglang, 1, "http_engine_seeds", Config(), base);
    HttpEngine& engine = f.Make();
    f.Load(1, 1);
    f.engines[0]->ClearCalls();  // the load's logprobs probe
    Sampling sampling;
    sampling.max_tokens = 64;  // past the context of 24: cut to what the prompt leaves
    sampling.seed = (uint64_t{1} << 62) + 7;
    Result<std::vector<Completion>> out = engine.Generate({Prompt{kPrompt, ""}}, sampling);
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    CHECK(out->at(0).tokens.size() <= 24 - kPrompt.size() - 1);
    bool seen = false;
    for (const auto& call : f.engines[0]->calls()) {
      if (call.target != "/generate") continue;
      seen = true;
      const nlohmann::json params = nlohmann::json::parse(call.body)["sampling_params"];
      CHECK(params["max_new_tokens"] == 24 - static_cast<int>(kPrompt.size()) - 1);
      // Sent only where SGLang reads it, and within the int32 it keeps it in.
      CHECK(params.contains("sampling_seed") == deterministic);
      if (deterministic) CHECK(params["sampling_seed"].get<uint64_t>() <= 0x7fffffffull);
    }
    CHECK(seen);
  }
  // vLLM: the limit may reach the context.
  Fixture f(Api::kVllm, 1, "http_engine_context");
  HttpEngine& engine = f.Make();
  f.Load(1, 1);
  f.engines[0]->ClearCalls();
  Sampling sampling;
  sampling.max_tokens = 64;
  REQUIRE(engine.Generate({Prompt{kPrompt, ""}}, sampling).ok());
  for (const auto& call : f.engines[0]->calls()) {
    if (call.target == "/v1/completions")
      CHECK(nlohmann::json::parse(call.body)["max_tokens"] ==
            24 - static_cast<int>(kPrompt.size()));
  }
}

TEST_CASE("http engine: the replicas loading now and the time they spent paused, in its health") {
  Fixture f(Api::kVllm, 2, "http_engine_pause_state");
  HttpEngine& engine = f.Make();
  f.Load(1, 1);
  const double after_first = engine.Health().paused_ms_total;
  CHECK(engine.Health().loading_replicas == 0);
  for (const auto& e : f.engines) e->SetLoadDelay(std::chrono::milliseconds(300));
  std::thread loading([&] { f.Load(2, 2); });
  int seen = 0;
  std::vector<orchestrator::ReplicaReport> during;
  for (int i = 0; i < 400 && seen == 0; ++i) {
    const EngineHealth health = engine.Health();
    seen = health.loading_replicas;
    during = health.each;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  loading.join();
  CHECK(seen == 1);  // one replica at a time: the other keeps serving
  // Each replica's own state: the one loading, the other serving version 1.
  REQUIRE(during.size() == 2);
  CHECK(during[0].url == f.engines[0]->url());
  CHECK(during[0].state == "loading");
  CHECK(during[1].state == "ready");
  CHECK(during[1].version == 1u);
  const EngineHealth after = engine.Health();
  CHECK(after.loading_replicas == 0);
  CHECK(after.paused_ms_total >= after_first + 2 * 300);
  REQUIRE(after.each.size() == 2);
  for (const orchestrator::ReplicaReport& r : after.each) {
    CAPTURE(r.url);
    CHECK(r.state == "ready");
    CHECK(r.version == 2u);
    CHECK(r.loads == 2);
    CHECK(r.last_pause_ms >= 300);
    CHECK(r.paused_ms_total >= r.last_pause_ms);
  }
  CHECK(after.each[0].paused_ms_total + after.each[1].paused_ms_total ==
        doctest::Approx(after.paused_ms_total));
}

TEST_CASE("http engine: too old a vLLM is refused before anything is loaded, naming the release") {
  fake_engine::FakeEngineOptions base;
  base.engine_version = "0.14.1";
  Fixture f(Api::kVllm, 1, "http_engine_old_vllm", Config(), base);
  HttpEngine& engine = f.Make();
  const Status staged = engine.Stage(Served(f.layout, f.layout.Initialize(1)), 1);
  CHECK(staged.code() == StatusCode::kInvalidArgument);
  CHECK(staged.message().find("vLLM 0.14.1 cannot reload weights from a path") !=
        std::string::npos);
  CHECK(staged.message().find("vLLM 0.15 or newer") != std::string::npos);
  CHECK(f.engines[0]->state().loads == 0);
  // Without dev mode, vLLM has none of the routes weft drives it by.
  fake_engine::FakeEngineOptions no_dev;
  no_dev.dev_mode = false;
  Fixture d(Api::kVllm, 1, "http_engine_vllm_no_dev", Config(), no_dev);
  const Status no_routes = d.Make().Stage(Served(d.layout, d.layout.Initialize(1)), 1);
  CHECK(no_routes.code() == StatusCode::kInvalidArgument);
  CHECK(no_routes.message().find("without VLLM_SERVER_DEV_MODE=1") != std::string::npos);
  CHECK(d.engines[0]->state().loads == 0);
  // SGLang before 0.5.6 takes no pause mode: only abort works.
  fake_engine::FakeEngineOptions sglang_old;
  sglang_old.engine_version = "0.5.5";
  Fixture g(Api::kSglang, 1, "http_engine_old_sglang", Config(), sglang_old);
  g.options.pause_mode = "retract";
  const Status refused = g.Make().Stage(Served(g.layout, g.layout.Initialize(1)), 1);
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("SGLang 0.5.5 takes no pause mode") != std::string::npos);
  CHECK(g.engines[0]->state().loads == 0);
  CHECK(ParseRelease("0.15.0rc2") == std::array<int, 3>{0, 15, 0});
  CHECK(ParseRelease("1.2") == std::array<int, 3>{1, 2, 0});
  CHECK(!ParseRelease("dev").has_value());
}

TEST_CASE("logprobs after temperature, or logits, are refused before a load, naming the setting") {
  struct Case {
    Api api;
    std::string mode;
    LogprobsKind kind;
    std::string fix;  // in the refusal; "" for none
    float scale = 8.0f;
  };
  const std::vector<Case> cases = {
      // The launch model's next tokens nearly equally likely: the probe cannot tell, and the
      // replica is not refused for it.
      {Api::kSglang, "processed_logprobs", LogprobsKind::kUnknown, "", 1.0f},
      {Api::kSglang, "raw_logprobs", LogprobsKind::kTemperatureOne, ""},
      {Api::kSglang, "processed_logprobs", LogprobsKind::kAfterTemperature,
       "SGLANG_RETURN_ORIGINAL_LOGPROB=1"},
      {Api::kVllm, "raw_logprobs", LogprobsKind::kTemperatureOne, ""},
      {Api::kVllm, "processed_logprobs", LogprobsKind::kAfterTemperature,
       "--logprobs-mode raw_logprobs"},
      {Api::kVllm, "raw_logits", LogprobsKind::kNotLogprobs, "--logprobs-mode raw_logprobs"},
  };
  for (const Case& c : cases) {
    CAPTURE(fake_engine::ApiName(c.api));
    CAPTURE(c.mode);
    fake_engine::FakeEngineOptions base;
    base.logprobs_mode = c.mode;
    Fixture f(c.api, 1, "http_engine_logprobs_mode", Config(), base, c.scale);
    ReplicaOptions options;
    options.url = f.engines[0]->url();
    auto replica =
        MakeReplicaApi(**FindEngineApi(std::string(fake_engine::ApiName(c.api))), options);
    REQUIRE(replica.ok());
    Result<ReplicaInfo> info = (*replica)->Info();
    REQUIRE_MESSAGE(info.ok(), info.status().ToString());
    CAPTURE(info->logprobs_probe);
    CHECK(LogprobsKindName(info->logprobs) == std::string(LogprobsKindName(c.kind)));
    const Status staged = f.Make().Stage(Served(f.layout, f.layout.Initialize(1)), 1);
    if (c.fix.empty()) {
      CHECK_MESSAGE(staged.ok(), staged.ToString());
      continue;
    }
    CHECK(staged.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(staged.message().find(c.fix) != std::string::npos, staged.message());
    CHECK(staged.message().find(f.engines[0]->url()) != std::string::npos);
    CHECK(f.engines[0]->state().loads == 0);
  }
}

TEST_CASE("logprobs probe: gaps that keep their width at temperature 1/2, or double, or logits") {
  const std::vector<float> one = {-0.7f, -1.5f, -2.0f, -3.0f, -4.0f};
  std::vector<float> half;  // the same distribution at temperature 1/2, normalised
  double sum = 0.0;
  for (float v : one) sum += std::exp(2.0 * v);
  for (float v : one) half.push_back(static_cast<float>(2.0 * v - std::log(sum)));
  CHECK(ClassifyLogprobs(one, one) == LogprobsKind::kTemperatureOne);
  CHECK(ClassifyLogprobs(one, {-0.71f, -1.49f, -2.01f, -3.0f, -4.02f}) ==
        LogprobsKind::kTemperatureOne);  // two requests' noise
  CHECK(ClassifyLogprobs(one, half) == LogprobsKind::kAfterTemperature);
  // Any order: vLLM lists the sampled token first.
  CHECK(ClassifyLogprobs({-2.0f, -0.7f, -4.0f, -1.5f, -3.0f}, half) ==
        LogprobsKind::kAfterTemperature);
  // Logits: the best add up to more than probability 1.
  CHECK(ClassifyLogprobs({12.0f, 11.0f, 9.5f}, {12.0f, 11.0f, 9.5f}) == LogprobsKind::kNotLogprobs);
  // A flat distribution, one alternative, or a ratio neither 1 nor 2: cannot tell.
  CHECK(ClassifyLogprobs({-2.30f, -2.31f, -2.32f}, {-2.30f, -2.31f, -2.32f}) ==
        LogprobsKind::kUnknown);
  CHECK(ClassifyLogprobs({-0.1f}, {-0.01f}) == LogprobsKind::kUnknown);
  CHECK(ClassifyLogprobs(one, {-0.7f, -5.0f, -6.0f, -8.0f, -12.0f}) == LogprobsKind::kUnknown);
}

TEST_CASE("served checkpoint: a whole write, then only changed tensors in place") {
  const std::string dir = testing::TempPath("served_checkpoint");
  const TinyLmLayout layout(Config());
  std::vector<float> w = layout.Initialize(1);
  ServedCheckpoint checkpoint(dir + "/served");
  std::filesystem::create_directories(dir + "/template");
  REQUIRE(
      fake_engine::WriteModelDirectory(dir + "/template", Config(), w, sync::DType::kBF16).ok());
  const sync::ServedModel v1 = Served(layout, w);
  REQUIRE(checkpoint.Write(v1, dir + "/template").ok());
  CHECK(checkpoint.last_write_whole());
  CHECK(std::filesystem::exists(dir + "/served/config.json"));
  CHECK(CheckModelDirectory(dir + "/served", v1).ok());
  // One tensor changes: one tensor's bytes are written, and the file reads back as v2.
  const examples::ParameterInfo& p = layout.parameters()[1];
  for (size_t i = 0; i < p.size; ++i) w[p.offset + i] += 0.5f;
  const sync::ServedModel v2 = Served(layout, w);
  REQUIRE(checkpoint.Write(v2, dir + "/template").ok());
  CHECK(!checkpoint.last_write_whole());
  CHECK(checkpoint.last_tensors_written() == 1);
  CHECK(checkpoint.last_bytes_written() == p.size * 2);
  auto file = sync::SafetensorsFile::Open(dir + "/served/model.safetensors");
  REQUIRE(file.ok());
  const sync::ServedModel read = sync::ServedModel::FromSafetensors(*file, 1);
  for (const auto& t : v2.tensors()) {
    CAPTURE(t.spec.name);
    CHECK(read.Find(t.spec.name)->bytes == t.bytes);
  }
  // Another model in the directory is refused, naming the differences.
  const TinyLmLayout other(Config(24));
  Status refused = CheckModelDirectory(dir + "/served", Served(other, other.Initialize(1)));
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message().find("tensor") != std::string::npos);
  CHECK(CheckModelDirectory(dir + "/nowhere", v1).code() == StatusCode::kNotFound);
  // The engine's own model directory is not overwritten: its weights are not the worker's to
  // delete.
  ServedCheckpoint in_place(dir + "/template");
  Status refused_dir = in_place.Write(v1, dir + "/template");
  CHECK(refused_dir.code() == StatusCode::kInvalidArgument);
  CHECK(refused_dir.message().find("the engine's own model directory") != std::string::npos);
  // An engine restarted from the worker's directory (after loads) is fine: a new worker writes it.
  ServedCheckpoint again(dir + "/served");
  CHECK(again.Write(v2, dir + "/served").ok());
  CHECK(again.last_write_whole());
  std::filesystem::remove_all(dir);
}

TEST_CASE("served checkpoint: a new file filled in place, put in place, then changed in place") {
  const std::string dir = testing::TempPath("served_checkpoint_new_file");
  const TinyLmLayout layout(Config());
  std::vector<float> w = layout.Initialize(1);
  std::filesystem::create_directories(dir + "/template");
  REQUIRE(
      fake_engine::WriteModelDirectory(dir + "/template", Config(), w, sync::DType::kBF16).ok());
  ServedCheckpoint checkpoint(dir + "/served");
  bool flushing = false;
  SUBCASE("as the directory's file system decides") {}
  SUBCASE("flushing each mapped write back, as on a network file system") {
    flushing = true;
    checkpoint.set_flush_mapped_writes(true);
  }
  sync::ServedModel publisher =
      std::move(sync::ServedModel::FromMaster(layout.Master(w), sync::ServingPlan{}, 1)).value();
  std::vector<sync::TensorSpec> specs;
  for (const auto& t : publisher.tensors()) specs.push_back(t.spec);
  auto temporaries = [&] {
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/served"))
      n += entry.path().filename().string().rfind(".model.safetensors.tmp-", 0) == 0;
    return n;
  };
  // A new file never put in place goes when the last reference to it does.
  {
    Result<std::shared_ptr<NewWeightsFile>> abandoned = checkpoint.NewFile(specs);
    REQUIRE(abandoned.ok());
    CHECK(temporaries() == 1);
    CHECK(checkpoint.flush_mapped_writes() ==
          (flushing ? true : OnNetworkFileSystem(dir + "/served").value()));
  }
  CHECK(temporaries() == 0);
  Result<std::shared_ptr<NewWeightsFile>> file = checkpoint.NewFile(specs);
  REQUIRE_MESSAGE(file.ok(), file.status().ToString());
  CHECK((*file)->Storage({"nope", sync::DType::kBF16, {2}}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK((*file)->Storage({specs[0].name, sync::DType::kBF16, {1, 2, 3}}).status().code() ==
        StatusCode::kInvalidArgument);
  // Filled as a keyframe would fill it, then put in place by the Write of its model.
  std::vector<sync::TensorStorage> storage;
  std::vector<sync::Digest> digests;
  for (const auto& t : publisher.tensors()) {
    Result<sync::TensorStorage> view = (*file)->Storage(t.spec);
    REQUIRE(view.ok());
    std::memcpy(view->data(), t.bytes.data(), t.bytes.size());
    storage.push_back(std::move(view).value());
    digests.push_back(t.digest);
  }
  sync::ServedModel copy = sync::ServedModel::FromStorage(specs, std::move(storage), digests);
  file->reset();  // the model's views hold it
  CHECK(!std::filesystem::exists(dir + "/served/model.safetensors"));
  REQUIRE(checkpoint.Write(copy, dir + "/template").ok());
  CHECK(checkpoint.last_write_whole());
  CHECK(temporaries() == 0);
  CHECK(std::filesystem::exists(dir + "/served/config.json"));
  auto read = [&] {
    auto in_file = sync::SafetensorsFile::Open(dir + "/served/model.safetensors");
    REQUIRE(in_file.ok());
    CHECK(in_file->metadata().count("weft_served_checkpoint") == 1);
    return sync::ServedModel::FromSafetensors(*in_file, 1);
  };
  const sync::ServedModel first = read();
  for (const auto& t : first.tensors()) CHECK(t.digest == publisher.Find(t.spec.name)->digest);
  // One tensor changes: the delta, applied to the copy, lands in the file itself, and the Write
  // that follows writes nothing.
  const examples::ParameterInfo& p = layout.parameters()[1];
  for (size_t i = 0; i < p.size; ++i) w[p.offset + i] += 0.5f;
  const sync::ModelDelta delta =
      std::move(publisher.Update(layout.Master(w), sync::CodecOptions{10, 1})).value();
  checkpoint.WillChangeInPlace();
  REQUIRE(copy.Apply(delta, 1).ok());
  const sync::ServedModel second = read();
  for (const auto& t : second.tensors()) {
    CAPTURE(t.spec.name);
    CHECK(t.digest == publisher.Find(t.spec.name)->digest);
  }
  REQUIRE(checkpoint.Write(copy, dir + "/template").ok());
  CHECK(!checkpoint.last_write_whole());
  CHECK(checkpoint.last_bytes_written() == 0);
  CHECK(checkpoint.last_tensors_written() == 1);
  // Changed in place again, then given another model (the copy was dropped): written whole, in a
  // new file; the copy still reads the bytes it had.
  checkpoint.WillChangeInPlace();
  const std::vector<uint8_t> before = copy.tensors()[0].bytes.ToVector();
  const sync::ServedModel other = Served(layout, layout.Initialize(2));
  REQUIRE(checkpoint.Write(other, dir + "/template").ok());
  CHECK(checkpoint.last_write_whole());
  CHECK(copy.tensors()[0].bytes == before);
  const sync::ServedModel rewritten = read();
  for (const auto& t : rewritten.tensors()) CHECK(t.digest == other.Find(t.spec.name)->digest);
  std::filesystem::remove_all(dir);
}

TEST_CASE("directory weight sink: the copy is the served checkpoint file; versions applied there") {
  Fixture f(Api::kSglang, 2, "directory_sink");
  HttpEngine& engine = f.Make();
  policy_store::OpenOptions create;
  create.create = true;
  auto store = std::move(policy_store::OpenStore(f.dir + "/store", create)).value();
  std::vector<float> w = f.layout.Initialize(3);
  auto publisher = std::move(trainer_adapter::Publisher::Start(*store, "r", f.layout.Master(w),
                                                               sync::ServingPlan{}, {}))
                       .value();
  policy_store::StoreReader reader(*store, "r", 1);
  DirectoryWeightSink sink(engine);

  // The first version: a keyframe, straight into a new file, put in place by Stage.
  auto first = sink.Pull(reader, 0, nullptr);
  REQUIRE_MESSAGE(first.ok(), first.status().ToString());
  CHECK(sink.mapped());
  REQUIRE(sink.Prove(first->manifest, 1).ok());
  REQUIRE(sink.Stage(0).ok());
  CHECK(engine.stats().last_bytes_written > 0);
  REQUIRE(sink.Commit().ok());

  // The next: a delta, applied to the file; the file holds it before Stage, which writes nothing.
  // Meanwhile the directory holds no version: a replica that comes back is not loaded from it
  // until the commit.
  f.engines[1]->Stop();
  for (int i = 0; i < 100 && engine.Health().ready_replicas != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(engine.Health().ready_replicas == 1);
  for (float& x : w) x *= 1.01f;
  REQUIRE(publisher->Publish(f.layout.Master(w)).ok());
  const policy_store::Manifest held = first->manifest;
  auto second = sink.Pull(reader, 1, &held);
  REQUIRE_MESSAGE(second.ok(), second.status().ToString());
  CHECK(second->from == std::optional<uint64_t>(0));
  REQUIRE(f.engines[1]->Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // ten health checks
  CHECK(engine.Health().ready_replicas == 1);
  CHECK(f.engines[1]->state().weight_version != "0");
  REQUIRE(sink.Prove(second->manifest, 2).ok());
  auto file = sync::SafetensorsFile::Open(f.options.checkpoint_dir + "/model.safetensors");
  REQUIRE(file.ok());
  CHECK(policy_store::CheckAgainstManifest(sync::ServedModel::FromSafetensors(*file, 1),
                                           second->manifest, nullptr, true, 1)
            .ok());
  REQUIRE(sink.Stage(1).ok());
  CHECK(engine.stats().last_bytes_written == 0);
  REQUIRE(sink.Commit().ok());
  for (const auto& e : f.engines) CHECK(e->state().weight_version == "1");
  Sampling sampling;
  sampling.max_tokens = 4;
  sampling.seed = 3;
  auto out = engine.Generate({Prompt{kPrompt, ""}}, sampling);
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  CheckAgainstVersions(f.layout, kPrompt, out->front(), {{1, Widened(f.layout, sink.copy())}});
  CHECK(sink.StateDigest().size() == 32);

  // A bit flips in the file: the proof finds it. Dropped, the copy leaves the directory holding
  // no version (a replica that restarts is not loaded from it), and comes back from a keyframe,
  // into a new file put in place whole.
  sink.CorruptForTest();
  CHECK(sink.Prove(second->manifest, 1).code() == StatusCode::kDataLoss);
  sink.Drop();
  CHECK(sink.empty());
  f.engines[1]->Stop();
  for (int i = 0; i < 100 && engine.Health().ready_replicas != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(engine.Health().ready_replicas == 1);
  REQUIRE(f.engines[1]->Start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(engine.Health().ready_replicas == 1);
  auto again = sink.Pull(reader, 1, nullptr);
  REQUIRE_MESSAGE(again.ok(), again.status().ToString());
  REQUIRE(sink.Prove(again->manifest, 1).ok());
  REQUIRE(sink.Stage(1).ok());
  CHECK(engine.stats().last_bytes_written > 0);
  CHECK(sink.mapped());
  REQUIRE(sink.Commit().ok());
  CHECK(engine.Health().ready_replicas == 2);
  auto whole = sync::SafetensorsFile::Open(f.options.checkpoint_dir + "/model.safetensors");
  REQUIRE(whole.ok());
  CHECK(policy_store::CheckAgainstManifest(sync::ServedModel::FromSafetensors(*whole, 1),
                                           again->manifest, nullptr, true, 1)
            .ok());
}

TEST_CASE("engine section: keys, defaults and errors that name the key") {
  auto parse = [](const std::string& yaml, const std::vector<std::string>& urls = {}) {
    return ParseEngineSection(YAML::Load(yaml)["engine"], "sglang", "us-1", urls);
  };
  auto ok = parse(
      "engine: {urls: [http://a:1, http://b:2], checkpoint_dir: \"/x/{cluster}/ckpt\", pause: "
      "in_place, max_paused: 2, request_timeout: 30s, load_timeout: 90s}");
  REQUIRE_MESSAGE(ok.ok(), ok.status().ToString());
  CHECK(ok->urls == std::vector<std::string>{"http://a:1", "http://b:2"});
  CHECK(ok->checkpoint_dir == "/x/us-1/ckpt");
  CHECK(ok->pause_mode == "in_place");
  CHECK(ok->max_paused == 2);
  CHECK(ok->request_timeout == std::chrono::seconds(30));
  CHECK(ok->load_timeout == std::chrono::seconds(90));
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x}")->load_timeout ==
        std::chrono::minutes(5));
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, load_timeout: 0s}")
            .status()
            .message()
            .find("engine.load_timeout must be positive") != std::string::npos);
  // A worker's own URLs replace engine.urls.
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x}", {"http://c:3"})->urls ==
        std::vector<std::string>{"http://c:3"});
  // The replicas from a file, per cluster; not with engine.urls; a worker's own URLs win.
  auto from_file = parse("engine: {urls_file: \"/run/{cluster}/replicas\", checkpoint_dir: /x}");
  REQUIRE_MESSAGE(from_file.ok(), from_file.status().ToString());
  CHECK(from_file->urls_file == "/run/us-1/replicas");
  CHECK(from_file->urls.empty());
  CHECK(parse("engine: {urls_file: /f, checkpoint_dir: /x}", {"http://c:3"})->urls_file.empty());
  CHECK(parse("engine: {urls: [http://a:1], urls_file: /f, checkpoint_dir: /x}")
            .status()
            .message()
            .find("engine.urls and engine.urls_file are both given") != std::string::npos);
  CHECK(parse("engine: {checkpoint_dir: /x}").status().message().find("replicas' URLs") !=
        std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1]}").status().message().find("engine.checkpoint_dir") !=
        std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, pause: keep}")
            .status()
            .message()
            .find("abort, retract, in_place") != std::string::npos);
  // Where the copy lives, and whether a mapped file is flushed before a load.
  CHECK(ok->copy_in_file);
  CHECK(!ok->flush_mapped_writes.has_value());
  auto memory =
      parse("engine: {urls: [http://a:1], checkpoint_dir: /x, copy: memory, flush: never}");
  REQUIRE_MESSAGE(memory.ok(), memory.status().ToString());
  CHECK(!memory->copy_in_file);
  CHECK(memory->flush_mapped_writes == false);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, flush: always}")
            ->flush_mapped_writes == true);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, copy: disk}")
            .status()
            .message()
            .find("engine.copy: 'disk' is not file or memory") != std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, flush: sometimes}")
            .status()
            .message()
            .find("engine.flush: 'sometimes' is not auto, always or never") != std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, colour: red}")
            .status()
            .message()
            .find("colour") != std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, api_key_env: WEFT_NO_SUCH_VAR}")
            .status()
            .message()
            .find("WEFT_NO_SUCH_VAR") != std::string::npos);
}

}  // namespace
}  // namespace weft::rollout_worker
