// The text-level tasks: prompts as the job gives them, rewards from the trainer (none from the
// worker) or from a reward service, here an in-process HTTP server that records every request and
// answers as each case scripts it.
#include "rollout_worker/http_task.h"

#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "common/http_server.h"

namespace weft::rollout_worker {
namespace {

namespace bhttp = boost::beast::http;
using Json = nlohmann::json;

struct Recorded {
  std::string method, target, content_type, authorization;
  Json body;
};

// A reward service on loopback: `answer(request, i)` answers the i-th request (from 0), or returns
// nullopt to leave it unanswered (a service that hangs) until the server stops.
class RewardServer {
 public:
  using Answer = std::function<std::optional<http::Response>(const http::Request&, int)>;

  explicit RewardServer(Answer answer) : answer_(std::move(answer)) {
    auto server =
        http::HttpServer::Start({}, [this](http::Request request, http::Responder respond) {
          int index = 0;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            index = static_cast<int>(requests_.size());
            requests_.push_back(
                {std::string(request.method_string()), std::string(request.target()),
                 std::string(request[bhttp::field::content_type]),
                 std::string(request[bhttp::field::authorization]),
                 Json::parse(request.body().begin(), request.body().end(), nullptr, false)});
          }
          std::optional<http::Response> response = answer_(request, index);
          if (response) {
            respond(std::move(*response));
          } else {
            std::lock_guard<std::mutex> lock(mutex_);
            parked_.push_back(std::move(respond));
          }
        });
    REQUIRE_MESSAGE(server.ok(), server.status().ToString());
    server_ = std::move(server).value();
  }
  ~RewardServer() { server_->Stop(); }

  std::string url(const std::string& path = "/score") const {
    return "http://127.0.0.1:" + std::to_string(server_->port()) + path;
  }
  std::vector<Recorded> requests() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  Answer answer_;
  mutable std::mutex mutex_;
  std::vector<Recorded> requests_;
  std::vector<http::Responder> parked_;
  std::unique_ptr<http::HttpServer> server_;
};

http::Response Reply(const http::Request& request, bhttp::status status, const Json& body) {
  return http::JsonResponse(request, status, body);
}

http::Response Text(const http::Request& request, const std::string& text) {
  return http::JsonTextResponse(request, bhttp::status::ok, text);
}

HttpTaskSettings Settings(const std::string& url) {
  HttpTaskSettings settings;
  settings.url = url;
  settings.timeout = std::chrono::milliseconds(5000);
  settings.retries = 3;
  settings.limits = {7, 4, 12};
  return settings;
}

Completion Answered(const std::string& text, std::vector<int> tokens) {
  Completion c;
  c.text = text;
  c.tokens = std::move(tokens);
  c.logprobs.assign(c.tokens.size(), -0.5f);
  return c;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("http task: one POST per completion with the prompt, metadata and completion") {
  RewardServer service([](const http::Request& request, int) {
    return Reply(request, bhttp::status::ok, {{"reward", 0.75}});
  });
  HttpTaskSettings settings = Settings(service.url("/v1/score?model=tiny"));
  settings.token = "s3cret";
  const HttpRewardTask task(settings);
  const Json metadata = {{"answer", "46"}, {"row", 7}};
  Result<std::optional<double>> reward =
      task.Reward(Json("12+34="), metadata, Answered("46", {4, 6, 12}));
  REQUIRE_MESSAGE(reward.ok(), reward.status().ToString());
  REQUIRE(reward->has_value());
  CHECK(**reward == 0.75);

  // Without metadata the service gets null; an empty completion text is sent as "".
  reward = task.Reward(Json::array({13, 1, 10, 2, 11}), Json(), Answered("", {12}));
  REQUIRE(reward.ok());
  CHECK(**reward == 0.75);

  const std::vector<Recorded> requests = service.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[0].method == "POST");
  CHECK(requests[0].target == "/v1/score?model=tiny");
  CHECK(requests[0].content_type == "application/json");
  CHECK(requests[0].authorization == "Bearer s3cret");
  CHECK(requests[0].body == Json{{"prompt", "12+34="},
                                 {"metadata", metadata},
                                 {"completion", {{"text", "46"}, {"tokens", {4, 6, 12}}}}});
  CHECK(requests[1].body == Json{{"prompt", {13, 1, 10, 2, 11}},
                                 {"metadata", nullptr},
                                 {"completion", {{"text", ""}, {"tokens", {12}}}}});
}

TEST_CASE("http task: 5xx answers are retried with backoff; 4xx answers are refused at once") {
  SUBCASE("503 then 200: the reward of the retry") {
    RewardServer service([](const http::Request& request, int index) {
      return index < 2 ? Reply(request, bhttp::status::service_unavailable, {{"error", "busy"}})
                       : Reply(request, bhttp::status::ok, {{"reward", 1}});
    });
    const HttpRewardTask task(Settings(service.url()));
    Result<std::optional<double>> reward = task.Reward(Json("1+2="), Json(), Answered("3", {3}));
    REQUIRE_MESSAGE(reward.ok(), reward.status().ToString());
    CHECK(**reward == 1.0);
    CHECK(service.requests().size() == 3);
  }
  SUBCASE("503 throughout: unavailable after 1 + retries tries, naming the URL") {
    RewardServer service([](const http::Request& request, int) {
      return Reply(request, bhttp::status::service_unavailable, {{"error", "busy"}});
    });
    HttpTaskSettings settings = Settings(service.url());
    settings.retries = 1;
    const HttpRewardTask task(settings);
    Result<std::optional<double>> reward = task.Reward(Json("1+2="), Json(), Answered("3", {3}));
    REQUIRE(!reward.ok());
    INFO(reward.status().message());
    CHECK(reward.status().code() == StatusCode::kUnavailable);
    CHECK(Contains(reward.status().message(), "reward service: POST " + service.url()));
    CHECK(Contains(reward.status().message(), "HTTP 503: busy"));
    CHECK(Contains(reward.status().message(), "2 tries"));
    CHECK(service.requests().size() == 2);
  }
  SUBCASE("400: refused with the service's message, not retried") {
    RewardServer service([](const http::Request& request, int) {
      return Reply(request, bhttp::status::bad_request, {{"error", "completion too long"}});
    });
    const HttpRewardTask task(Settings(service.url()));
    Result<std::optional<double>> reward = task.Reward(Json("1+2="), Json(), Answered("3", {3}));
    REQUIRE(!reward.ok());
    CHECK(reward.status().code() == StatusCode::kInvalidArgument);
    CHECK(reward.status().message() ==
          "reward service " + service.url() + ": HTTP 400: completion too long");
    CHECK(service.requests().size() == 1);
  }
}

TEST_CASE("http task: a service that does not answer in time, or cannot be reached") {
  SUBCASE("no answer: the timeout bounds the whole reward, retries included") {
    RewardServer service([](const http::Request&, int) { return std::optional<http::Response>(); });
    HttpTaskSettings settings = Settings(service.url());
    settings.timeout = std::chrono::milliseconds(300);
    const HttpRewardTask task(settings);
    const auto start = std::chrono::steady_clock::now();
    Result<std::optional<double>> reward = task.Reward(Json("1+2="), Json(), Answered("3", {3}));
    const auto took = std::chrono::steady_clock::now() - start;
    REQUIRE(!reward.ok());
    INFO(reward.status().message());
    CHECK(reward.status().code() == StatusCode::kUnavailable);
    CHECK(Contains(reward.status().message(), service.url()));
    CHECK(Contains(reward.status().message(), "Timeout"));
    CHECK(took < std::chrono::seconds(3));
  }
  SUBCASE("nothing listening: connection failures, retried, then unavailable") {
    std::string url;
    {
      RewardServer gone([](const http::Request& request, int) {
        return Reply(request, bhttp::status::ok, {{"reward", 1}});
      });
      url = gone.url();
    }
    HttpTaskSettings settings = Settings(url);
    settings.retries = 1;
    const HttpRewardTask task(settings);
    Result<std::optional<double>> reward = task.Reward(Json("1+2="), Json(), Answered("3", {3}));
    REQUIRE(!reward.ok());
    INFO(reward.status().message());
    CHECK(reward.status().code() == StatusCode::kUnavailable);
    CHECK(Contains(reward.status().message(), url));
    CHECK(Contains(reward.status().message(), "2 tries"));
  }
}

TEST_CASE("http task: an answer that is not {\"reward\": finite number} is an error naming it") {
  for (const std::string& answer :
       {std::string("not json"), std::string("{\"score\": 1}"), std::string("{\"reward\": \"1\"}"),
        std::string("{\"reward\": null}"), std::string("[1]"), std::string("{\"reward\": 1e400}"),
        std::string("")}) {
    CAPTURE(answer);
    RewardServer service([&](const http::Request& request, int) { return Text(request, answer); });
    const HttpRewardTask task(Settings(service.url()));
    Result<std::optional<double>> reward = task.Reward(Json("1+2="), Json(), Answered("3", {3}));
    REQUIRE(!reward.ok());
    CHECK(reward.status().code() == StatusCode::kInvalidArgument);
    CHECK(reward.status().message() ==
          "reward service " + service.url() +
              ": the answer must be {\"reward\": a finite number}, not " +
              (answer.empty() ? "an empty body" : "'" + answer + "'"));
    CHECK(service.requests().size() == 1);
  }
}

TEST_CASE("http task: concurrent rewards from several job threads") {
  std::atomic<int> served{0};
  RewardServer service([&](const http::Request& request, int) {
    ++served;
    const Json body = Json::parse(request.body().begin(), request.body().end());
    return Reply(request, bhttp::status::ok,
                 {{"reward", body["metadata"]["answer"] == body["completion"]["text"] ? 1 : 0}});
  });
  const HttpRewardTask task(Settings(service.url()));
  std::vector<std::thread> threads;
  std::atomic<int> right{0}, failed{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const std::string answer = std::to_string(t + i);
        Result<std::optional<double>> reward = task.Reward(
            Json("x"), Json{{"answer", answer}}, Answered(i % 2 == 0 ? answer : "no", {1}));
        if (!reward.ok()) {
          ++failed;
        } else if (**reward == 1.0) {
          ++right;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(right == 12);  // i = 0, 2, 4 of each thread
  CHECK(served == 20);
}

TEST_CASE("text-level prompts: text for the engine, token ids checked, anything else refused") {
  const TrainerRewardTask task({5, 4, -1});
  Result<Prompt> text = task.Encode(Json("12+34="));
  REQUIRE(text.ok());
  CHECK(text->is_text());
  CHECK(text->text == "12+34=");
  Result<Prompt> ids = task.Encode(Json::array({13, 1, 2, 10, 0}));
  REQUIRE(ids.ok());
  CHECK(ids->tokens == std::vector<int>{13, 1, 2, 10, 0});
  auto refused = [&](const Json& prompt) {
    Result<Prompt> encoded = task.Encode(prompt);
    REQUIRE(!encoded.ok());
    CHECK(encoded.status().code() == StatusCode::kInvalidArgument);
    return encoded.status().message();
  };
  CHECK(refused(Json::array({1, 2, 3, 4, 5, 6})) ==
        "the prompt has 6 token ids; task.max_prompt_tokens is 5");
  CHECK(refused(Json::array({1, -2})) ==
        "prompt[1] is -2: token ids are integers from 0 to 2147483647");
  CHECK(refused(Json::array({1, 2.5})) ==
        "prompt[1] is 2.5: token ids are integers from 0 to 2147483647");
  CHECK(refused(Json::array({4294967296ull})) ==
        "prompt[0] is 4294967296: token ids are integers from 0 to 2147483647");
  CHECK(refused(Json("")) == "the prompt is empty text");
  CHECK(refused(Json::array()).find("not []") != std::string::npos);
  CHECK(refused(Json{{"text", "1+2="}}) ==
        "a prompt is text (a JSON string) or token ids (a non-empty array of non-negative "
        "integers), not {\"text\":\"1+2=\"}");
  CHECK(refused(Json(12)).find("not 12") != std::string::npos);

  // The trainer scores every sample: no reward from the worker.
  Result<std::optional<double>> reward =
      task.Reward(Json("1+2="), Json{{"answer", "3"}}, Answered("3", {3, 12}));
  REQUIRE(reward.ok());
  CHECK(!reward->has_value());
  CHECK(task.limits().max_prompt_tokens == 5);
  CHECK(task.limits().max_completion_tokens == 4);
  CHECK(task.limits().stop_token == -1);
}

TEST_CASE("task sections: http and trainer kinds read their own keys; errors name the key") {
  const YAML::Node http = YAML::Load(
      "task: {kind: http, url: 'https://rewards.example/score', max_prompt_tokens: 7, "
      "max_tokens: 4, dataset: prompts.jsonl}")["task"];
  Result<HttpTaskSettings> settings = ParseHttpTaskSection(http, {"dataset"});
  REQUIRE_MESSAGE(settings.ok(), settings.status().ToString());
  CHECK(settings->url == "https://rewards.example/score");
  CHECK(settings->timeout == std::chrono::seconds(10));
  CHECK(settings->retries == 3);
  CHECK(settings->token.empty());
  CHECK(settings->limits.max_prompt_tokens == 7);
  CHECK(settings->limits.max_completion_tokens == 4);
  CHECK(settings->limits.stop_token == -1);
  // `dataset` belongs to the trainer: allowed only when the caller says so.
  CHECK(ParseHttpTaskSection(http).status().message().rfind("task.dataset: unknown key", 0) == 0);

  const YAML::Node full = YAML::Load(
      "task: {kind: http, url: 'http://127.0.0.1:9/s', timeout: 250ms, retries: 0, token: abc, "
      "max_prompt_tokens: 3, max_tokens: 2, stop_token: 12}")["task"];
  settings = ParseHttpTaskSection(full);
  REQUIRE(settings.ok());
  CHECK(settings->timeout == std::chrono::milliseconds(250));
  CHECK(settings->retries == 0);
  CHECK(settings->token == "abc");
  CHECK(settings->limits.stop_token == 12);

  auto http_error = [](const std::string& section) {
    Result<HttpTaskSettings> parsed = ParseHttpTaskSection(YAML::Load(section)["task"]);
    REQUIRE(!parsed.ok());
    return parsed.status().message();
  };
  const std::string lengths = ", max_prompt_tokens: 7, max_tokens: 4}";
  CHECK(http_error("task: {kind: http" + lengths) ==
        "task.url is needed for kind http (the reward service) (line 1)");
  CHECK(http_error("task: {kind: http, url: 'example.org/score'" + lengths) ==
        "task.url (line 1): 'example.org/score' is not an http:// or https:// URL");
  CHECK(http_error("task: {kind: http, url: 'http:///score'" + lengths) ==
        "task.url (line 1): 'http:///score' names no host");
  CHECK(http_error("task: {kind: http, url: 'http://a/s', timeout: 0s" + lengths) ==
        "task.timeout must be 1ms to 1h (line 1)");
  CHECK(http_error("task: {kind: http, url: 'http://a/s', timeout: 10" + lengths)
            .rfind("task.timeout", 0) == 0);
  CHECK(http_error("task: {kind: http, url: 'http://a/s', retries: -1" + lengths) ==
        "task.retries: '-1' is not a non-negative integer (line 1)");
  CHECK(http_error("task: {kind: http, url: 'http://a/s', max_prompt_tokens: 7}") ==
        "task.max_tokens is needed for kind http (the longest completion, in tokens) (line 1)");
  CHECK(http_error("task: {kind: http, url: 'http://a/s', max_prompt_tokens: 0, max_tokens: 4}") ==
        "task.max_prompt_tokens must be 1 to 1000000 (line 1)");
  CHECK(http_error("task: {kind: http, url: 'http://a/s', tokens: x" + lengths)
            .rfind("task.tokens: unknown key (line 1); known: kind, max_prompt_tokens", 0) == 0);

  Result<TaskLimits> limits = ParseTrainerTaskSection(YAML::Load(
      "task: {kind: trainer, max_prompt_tokens: 9, max_tokens: 3, stop_token: 2}")["task"]);
  REQUIRE(limits.ok());
  CHECK(limits->max_prompt_tokens == 9);
  CHECK(limits->max_completion_tokens == 3);
  CHECK(limits->stop_token == 2);
  CHECK(
      ParseTrainerTaskSection(
          YAML::Load("task: {kind: trainer, max_prompt_tokens: 9, max_tokens: 3, url: x}")["task"])
          .status()
          .message() ==
      "task.url: unknown key (line 1); known: kind, max_prompt_tokens, "
      "max_tokens, stop_token");
  CHECK(
      ParseTrainerTaskSection(
          YAML::Load(
              "task: {kind: trainer, max_prompt_tokens: 9, max_tokens: 3, stop_token: x}")["task"])
          .status()
          .message() ==
      "task.stop_token: 'x' is not a token id (0 or more) or -1 (no stop token) (line 1)");
}

}  // namespace
}  // namespace weft::rollout_worker
