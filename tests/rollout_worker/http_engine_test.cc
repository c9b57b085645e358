// Contract tests of the engine adapters (rollout_worker/http_engine.h) against the test servers
// of tests/engines/fake_engine.h, which speak SGLang's and vLLM's HTTP APIs over the example
// policy: generation and logprobs, text prompts, every pause mode with a weight update landing
// mid-generation (each token's logprob checked against the weights of the version it is tagged
// with), a model mismatch refused, replicas that die and come back, and rolling reloads that
// never pause every replica at once.
#include "rollout_worker/http_engine.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <thread>

#include "examples/arithmetic_task.h"
#include "examples/tiny_lm.h"
#include "sync/convert.h"
#include "tests/engines/fake_engine.h"
#include "tests/temp_path.h"

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
  Fixture(Api api, int replicas, const std::string& name, TinyLmConfig engine_config = Config())
      : api(api), layout(Config()), dir(testing::TempPath(name)) {
    std::filesystem::create_directories(dir);
    const TinyLmLayout engine_layout(engine_config);
    REQUIRE(fake_engine::WriteModelDirectory(dir + "/launch", engine_config,
                                             engine_layout.Initialize(99), sync::DType::kBF16)
                .ok());
    for (int i = 0; i < replicas; ++i) {
      fake_engine::FakeEngineOptions o;
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
  };
  const std::vector<Case> cases = {
      {Api::kSglang, "abort", false},   {Api::kSglang, "retract", true},
      {Api::kSglang, "in_place", true}, {Api::kSglang, "in_place", false},
      {Api::kVllm, "abort", false},     {Api::kVllm, "wait", false},
      {Api::kVllm, "keep", false}};
  for (const Case& k : cases) {
    CAPTURE(fake_engine::ApiName(k.api));
    CAPTURE(k.mode);
    CAPTURE(k.spans);
    Fixture f(k.api, 1, "http_engine_pause");
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

TEST_CASE("http engine: the replicas loading now and the time they spent paused, in its health") {
  Fixture f(Api::kVllm, 2, "http_engine_pause_state");
  HttpEngine& engine = f.Make();
  f.Load(1, 1);
  const double after_first = engine.Health().paused_ms_total;
  CHECK(engine.Health().loading_replicas == 0);
  for (const auto& e : f.engines) e->SetLoadDelay(std::chrono::milliseconds(300));
  std::thread loading([&] { f.Load(2, 2); });
  int seen = 0;
  for (int i = 0; i < 400 && seen == 0; ++i) {
    seen = engine.Health().loading_replicas;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  loading.join();
  CHECK(seen == 1);  // one replica at a time: the other keeps serving
  CHECK(engine.Health().loading_replicas == 0);
  CHECK(engine.Health().paused_ms_total >= after_first + 2 * 300);
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

TEST_CASE("engine section: keys, defaults and errors that name the key") {
  auto parse = [](const std::string& yaml, const std::vector<std::string>& urls = {}) {
    return ParseEngineSection(YAML::Load(yaml)["engine"], "sglang", "us-1", urls);
  };
  auto ok = parse(
      "engine: {urls: [http://a:1, http://b:2], checkpoint_dir: \"/x/{cluster}/ckpt\", pause: "
      "in_place, max_paused: 2, request_timeout: 30s}");
  REQUIRE_MESSAGE(ok.ok(), ok.status().ToString());
  CHECK(ok->urls == std::vector<std::string>{"http://a:1", "http://b:2"});
  CHECK(ok->checkpoint_dir == "/x/us-1/ckpt");
  CHECK(ok->pause_mode == "in_place");
  CHECK(ok->max_paused == 2);
  CHECK(ok->request_timeout == std::chrono::seconds(30));
  // A worker's own URLs replace engine.urls.
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x}", {"http://c:3"})->urls ==
        std::vector<std::string>{"http://c:3"});
  CHECK(parse("engine: {checkpoint_dir: /x}").status().message().find("replicas' URLs") !=
        std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1]}").status().message().find("engine.checkpoint_dir") !=
        std::string::npos);
  CHECK(parse("engine: {urls: [http://a:1], checkpoint_dir: /x, pause: keep}")
            .status()
            .message()
            .find("abort, retract, in_place") != std::string::npos);
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
