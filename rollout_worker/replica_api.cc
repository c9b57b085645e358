#include "rollout_worker/replica_api.h"

#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/http_client.h"

namespace weft::rollout_worker {
namespace {

using Json = nlohmann::json;

// The HTTP plumbing both APIs share: JSON in and out, a bearer token, errors naming the replica and
// the route. Generation and control calls are not idempotent: they are retried only when they
// surely never reached the engine (HttpClient's rule); health checks are tried once.
class JsonCalls {
 public:
  explicit JsonCalls(const ReplicaOptions& options)
      : options_(options),
        requests_(options.url, ClientOptions(options.request_timeout, 3)),
        control_(options.url, ClientOptions(options.control_timeout, 3)),
        health_(options.url, ClientOptions(options.health_timeout, 1)) {}

  const std::string& url() const { return options_.url; }

  enum class Channel { kGenerate, kControl, kHealth };

  // The reply's body as JSON (null for an empty body); non-2xx answers are errors.
  Result<Json> Call(Channel channel, const std::string& method, const std::string& path,
                    const Json* body) {
    const std::string text = body ? body->dump() : std::string();
    std::vector<std::string> headers;
    if (body) headers.push_back("Content-Type: application/json");
    if (!options_.api_key.empty()) headers.push_back("Authorization: Bearer " + options_.api_key);
    HttpClient& client = channel == Channel::kGenerate  ? requests_
                         : channel == Channel::kControl ? control_
                                                        : health_;
    const std::string what = options_.url + " " + method + " " + path;
    WEFT_ASSIGN_OR_RETURN(
        HttpReply reply,
        client.Request(
            method, path,
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
            headers, method == "GET"));
    WEFT_RETURN_IF_ERROR(StatusOfReply(reply, what));
    if (reply.body.empty()) return Json();
    Json json = Json::parse(reply.body.begin(), reply.body.end(), nullptr, false);
    if (json.is_discarded()) return InvalidArgument(what + ": the answer is not JSON");
    return json;
  }

 private:
  static HttpClientOptions ClientOptions(std::chrono::milliseconds deadline, int attempts) {
    HttpClientOptions o;
    o.deadline = deadline;
    o.attempts = attempts;
    o.connect_timeout = std::chrono::milliseconds(2000);
    // A generation or a load may be silent for a long time before it answers.
    o.stall_timeout = deadline;
    return o;
  }

  ReplicaOptions options_;
  HttpClient requests_, control_, health_;
};

using Channel = JsonCalls::Channel;

Status Malformed(const std::string& url, const std::string& route, const std::string& what) {
  return InvalidArgument(url + " " + route + ": unexpected answer: " + what);
}

// Reads a member that must be there with the given JSON kind.
template <typename T>
Result<T> Member(const Json& object, const std::string& key, const std::string& where) {
  if (!object.is_object() || !object.contains(key))
    return InvalidArgument(where + ": no '" + key + "'");
  try {
    return object.at(key).get<T>();
  } catch (const Json::exception&) {
    return InvalidArgument(where + ": '" + key + "' has the wrong type");
  }
}

// The sampling parameters both engines take under the same names, every one that shapes the
// distribution given explicitly: unset ones come from the model's generation_config.json (a top_k
// of 20, say), and the tokens would then be drawn from another distribution than the logprobs
// returned. `max_tokens_key` is the engine's name for the token limit.
Json SamplingFields(const Sampling& sampling, const char* max_tokens_key) {
  Json fields = {{max_tokens_key, sampling.max_tokens},
                 {"temperature", sampling.temperature},
                 {"top_p", sampling.top_p},
                 {"top_k", -1},
                 {"min_p", 0.0},
                 {"repetition_penalty", 1.0},
                 {"frequency_penalty", 0.0},
                 {"presence_penalty", 0.0}};
  if (sampling.stop_token >= 0) fields["stop_token_ids"] = {sampling.stop_token};
  return fields;
}

// ------------------------------------------------------------------------------------------------
// SGLang: the native API of `python -m sglang.launch_server`.
class SglangReplica : public ReplicaApi {
 public:
  explicit SglangReplica(const ReplicaOptions& options) : calls_(options) {}
  const std::string& url() const override { return calls_.url(); }

  Status Health() override {
    return calls_.Call(Channel::kHealth, "GET", "/health", nullptr).status();
  }

  Result<std::string> ModelPath() override {
    WEFT_ASSIGN_OR_RETURN(Json info, ModelInfo());
    return Member<std::string>(info, "model_path", url() + " /model_info");
  }

  Result<std::string> WeightVersion() override {
    WEFT_ASSIGN_OR_RETURN(Json info, ModelInfo());
    return Member<std::string>(info, "weight_version", url() + " /model_info");
  }

  Status Pause(const std::string& mode) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      mode_ = mode;
    }
    const Json body = {{"mode", mode}};
    return calls_.Call(Channel::kControl, "POST", "/pause_generation", &body).status();
  }

  Status Load(const std::string& dir, const std::string& version) override {
    // Paused first, so the update does not wait for requests to finish. The prefix cache holds
    // keys and values of the old weights, so it goes, except where requests stay resident across
    // the pause (in_place, retract): SGLang cannot flush under them (the load would fail), and they
    // go on with the keys and values they have.
    bool flush;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      flush = mode_ != "in_place" && mode_ != "retract";
    }
    const Json body = {{"model_path", dir}, {"weight_version", version}, {"flush_cache", flush}};
    WEFT_ASSIGN_OR_RETURN(
        Json answer, calls_.Call(Channel::kControl, "POST", "/update_weights_from_disk", &body));
    Result<bool> success = Member<bool>(answer, "success", url() + " /update_weights_from_disk");
    if (!success.ok()) return success.status();
    if (!*success) {
      return InvalidArgument(url() + " /update_weights_from_disk refused " + dir + ": " +
                             answer.value("message", std::string("no message")));
    }
    return Status::Ok();
  }

  Status Resume(bool quick) override {
    const Json body = Json::object();
    return calls_
        .Call(quick ? Channel::kHealth : Channel::kControl, "POST", "/continue_generation", &body)
        .status();
  }

  Result<std::vector<ReplicaOutput>> Generate(const Prompt& prompt, const Sampling& sampling,
                                              int n) override {
    Json params = SamplingFields(sampling, "max_new_tokens");
    if (n > 1) {
      params["n"] = n;
    } else {
      params["sampling_seed"] = sampling.seed & 0x7fffffffffffffffull;
    }
    Json body = {{"sampling_params", params}, {"return_logprob", true}};
    if (prompt.is_text()) {
      body["text"] = prompt.text;
    } else {
      body["input_ids"] = prompt.tokens;
    }
    WEFT_ASSIGN_OR_RETURN(Json answer, calls_.Call(Channel::kGenerate, "POST", "/generate", &body));
    // One object for one sample; an array, in order, for n of them.
    std::vector<Json> items;
    if (answer.is_array()) {
      for (Json& item : answer) items.push_back(std::move(item));
    } else {
      items.push_back(std::move(answer));
    }
    if (items.size() != static_cast<size_t>(n)) {
      return Malformed(
          url(), "/generate",
          std::to_string(items.size()) + " results for " + std::to_string(n) + " samples");
    }
    std::vector<ReplicaOutput> outputs;
    for (const Json& item : items) {
      WEFT_ASSIGN_OR_RETURN(ReplicaOutput out, ParseOutput(item));
      outputs.push_back(std::move(out));
    }
    return outputs;
  }

 private:
  Result<Json> ModelInfo() {
    Result<Json> info = calls_.Call(Channel::kControl, "GET", "/model_info", nullptr);
    // Builds before /model_info have only /get_model_info.
    if (info.status().code() == StatusCode::kNotFound)
      info = calls_.Call(Channel::kControl, "GET", "/get_model_info", nullptr);
    return info;
  }

  Result<ReplicaOutput> ParseOutput(const Json& item) const {
    const std::string where = url() + " /generate";
    if (!item.is_object() || !item.contains("meta_info") || !item["meta_info"].is_object())
      return Malformed(url(), "/generate", "a result without meta_info");
    const Json& meta = item["meta_info"];
    ReplicaOutput out;
    if (item.contains("text") && item["text"].is_string()) out.text = item["text"];
    if (!meta.contains("output_token_logprobs") || !meta["output_token_logprobs"].is_array())
      return Malformed(url(), "/generate", "no meta_info.output_token_logprobs");
    for (const Json& triple : meta["output_token_logprobs"]) {
      // [logprob, token id, text or null]
      if (!triple.is_array() || triple.size() < 2 || !triple[0].is_number() ||
          !triple[1].is_number_integer()) {
        return Malformed(url(), "/generate", "an output_token_logprobs entry is not [logprob, id]");
      }
      out.logprobs.push_back(triple[0].get<float>());
      out.tokens.push_back(triple[1].get<int>());
    }
    if (item.contains("output_ids") && item["output_ids"].is_array() &&
        item["output_ids"].get<std::vector<int>>() != out.tokens) {
      return Malformed(url(), "/generate", "output_ids and output_token_logprobs disagree");
    }
    if (meta.contains("weight_version") && meta["weight_version"].is_string())
      out.version = meta["weight_version"].get<std::string>();
    if (meta.contains("finish_reason") && meta["finish_reason"].is_object()) {
      const std::string type = meta["finish_reason"].value("type", std::string());
      out.aborted = type == "abort";
    }
    if (meta.contains("weight_versions") && meta["weight_versions"].is_array()) {
      for (const Json& span : meta["weight_versions"]) {
        if (!span.is_object() || !span.contains("version") || !span.contains("start") ||
            !span["version"].is_string() || !span["start"].is_number_unsigned()) {
          return Malformed(url(), "/generate", "a weight_versions entry is not {version, start}");
        }
        out.spans.emplace_back(span["version"].get<std::string>(), span["start"].get<uint64_t>());
      }
    }
    return out;
  }

  JsonCalls calls_;
  std::mutex mutex_;
  std::string mode_ = "abort";  // the pause mode of the last pause
};

// ------------------------------------------------------------------------------------------------
// vLLM: the OpenAI-compatible server, with the routes VLLM_SERVER_DEV_MODE=1 adds.
class VllmReplica : public ReplicaApi {
 public:
  explicit VllmReplica(const ReplicaOptions& options) : calls_(options) {}
  const std::string& url() const override { return calls_.url(); }

  Status Health() override {
    return calls_.Call(Channel::kHealth, "GET", "/health", nullptr).status();
  }

  Result<std::string> ModelPath() override {
    WEFT_ASSIGN_OR_RETURN(Json models,
                          calls_.Call(Channel::kControl, "GET", "/v1/models", nullptr));
    if (!models.is_object() || !models.contains("data") || !models["data"].is_array() ||
        models["data"].empty()) {
      return Malformed(url(), "/v1/models", "no model listed");
    }
    // The base model is the entry without a parent (LoRA adapters have one).
    for (const Json& m : models["data"]) {
      if (m.contains("parent") && !m["parent"].is_null()) continue;
      WEFT_ASSIGN_OR_RETURN(std::string id, Member<std::string>(m, "id", url() + " /v1/models"));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        model_id_ = id;
      }
      return Member<std::string>(m, "root", url() + " /v1/models");
    }
    return Malformed(url(), "/v1/models", "no base model listed");
  }

  Result<std::string> WeightVersion() override {
    WEFT_ASSIGN_OR_RETURN(Json info,
                          calls_.Call(Channel::kControl, "GET", "/weight_info", nullptr));
    return Member<std::string>(info, "weight_version", url() + " /weight_info");
  }

  Status Pause(const std::string& mode) override {
    return calls_.Call(Channel::kControl, "POST", "/pause?mode=" + mode, nullptr).status();
  }

  Status Load(const std::string& dir, const std::string& version) override {
    // No weight-transfer backend is needed: every worker process reloads the checkpoint directory
    // (and takes it as its model path); then the prefix cache of the old weights goes, and the
    // version is recorded.
    const Json reload = {{"method", "reload_weights"},
                         {"args", Json::array()},
                         {"kwargs", {{"weights_path", dir}, {"is_checkpoint_format", true}}}};
    WEFT_RETURN_IF_ERROR(
        calls_.Call(Channel::kControl, "POST", "/collective_rpc", &reload).status());
    WEFT_ASSIGN_OR_RETURN(Json reset,
                          calls_.Call(Channel::kControl, "POST", "/reset_prefix_cache", nullptr));
    if (reset.is_object() && reset.contains("success") && reset["success"] == false) {
      // Requests kept across the pause (mode keep) hold cache blocks: they are reset too, and
      // recompute their keys and values on the new weights.
      WEFT_ASSIGN_OR_RETURN(
          reset, calls_.Call(Channel::kControl, "POST",
                             "/reset_prefix_cache?reset_running_requests=true", nullptr));
      if (reset.is_object() && reset.contains("success") && reset["success"] == false)
        return Unavailable(url() + " /reset_prefix_cache: the prefix cache could not be reset");
    }
    const Json body = {{"new_version", version}};
    return calls_.Call(Channel::kControl, "POST", "/update_weight_version", &body).status();
  }

  Status Resume(bool quick) override {
    return calls_.Call(quick ? Channel::kHealth : Channel::kControl, "POST", "/resume", nullptr)
        .status();
  }

  Result<std::vector<ReplicaOutput>> Generate(const Prompt& prompt, const Sampling& sampling,
                                              int n) override {
    Json body = SamplingFields(sampling, "max_tokens");
    body.update(Json{{"n", n},
                     {"logprobs", 0},
                     {"return_tokens_as_token_ids", true},
                     {"return_token_ids", true},
                     {"seed", sampling.seed & 0x7fffffffffffffffull}});
    bool known;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      known = !model_id_.empty();
    }
    if (!known) (void)ModelPath();  // learns the served model's name (older builds require it)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!model_id_.empty()) body["model"] = model_id_;
    }
    if (prompt.is_text()) {
      body["prompt"] = prompt.text;
    } else {
      body["prompt"] = prompt.tokens;
    }
    WEFT_ASSIGN_OR_RETURN(Json answer,
                          calls_.Call(Channel::kGenerate, "POST", "/v1/completions", &body));
    if (!answer.is_object() || !answer.contains("choices") || !answer["choices"].is_array() ||
        answer["choices"].size() != static_cast<size_t>(n)) {
      return Malformed(url(), "/v1/completions", "not " + std::to_string(n) + " choices");
    }
    std::vector<ReplicaOutput> outputs;
    for (const Json& choice : answer["choices"]) {
      WEFT_ASSIGN_OR_RETURN(ReplicaOutput out, ParseChoice(choice));
      outputs.push_back(std::move(out));
    }
    return outputs;
  }

 private:
  Result<ReplicaOutput> ParseChoice(const Json& choice) const {
    ReplicaOutput out;
    if (!choice.is_object() || !choice.contains("token_ids") || !choice["token_ids"].is_array())
      return Malformed(url(), "/v1/completions", "a choice without token_ids");
    try {
      out.tokens = choice["token_ids"].get<std::vector<int>>();
      if (choice.contains("prompt_token_ids") && choice["prompt_token_ids"].is_array())
        out.prompt_tokens = choice["prompt_token_ids"].get<std::vector<int>>();
    } catch (const Json::exception&) {
      return Malformed(url(), "/v1/completions", "token ids that are not integers");
    }
    if (choice.contains("text") && choice["text"].is_string()) out.text = choice["text"];
    const Json* logprobs = choice.contains("logprobs") ? &choice["logprobs"] : nullptr;
    if (logprobs == nullptr || !logprobs->is_object() || !logprobs->contains("token_logprobs") ||
        !(*logprobs)["token_logprobs"].is_array() ||
        (*logprobs)["token_logprobs"].size() != out.tokens.size()) {
      return Malformed(url(), "/v1/completions", "no logprob per token");
    }
    for (const Json& lp : (*logprobs)["token_logprobs"]) {
      if (!lp.is_number())
        return Malformed(url(), "/v1/completions", "a token logprob that is not a number");
      out.logprobs.push_back(lp.get<float>());
    }
    out.aborted = choice.value("finish_reason", Json()) == "abort";
    return out;
  }

  JsonCalls calls_;
  std::mutex mutex_;
  std::string model_id_;  // the served model's name, once ModelPath has read it
};

}  // namespace

const std::vector<std::string>& PauseModes(const std::string& api) {
  static const std::vector<std::string> sglang = {"abort", "retract", "in_place"};
  static const std::vector<std::string> vllm = {"abort", "wait", "keep"};
  static const std::vector<std::string> none;
  return api == "sglang" ? sglang : api == "vllm" ? vllm : none;
}

Result<std::unique_ptr<ReplicaApi>> MakeReplicaApi(const std::string& api,
                                                   const ReplicaOptions& options) {
  if (options.url.rfind("http://", 0) != 0 && options.url.rfind("https://", 0) != 0)
    return InvalidArgument("engine URL '" + options.url + "' must start with http:// or https://");
  if (api == "sglang") return std::unique_ptr<ReplicaApi>(new SglangReplica(options));
  if (api == "vllm") return std::unique_ptr<ReplicaApi>(new VllmReplica(options));
  return InvalidArgument("no engine API named '" + api + "' (known: sglang, vllm)");
}

}  // namespace weft::rollout_worker
