#include "rollout_worker/replica_api.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/byte_io.h"
#include "common/http_client.h"
#include "common/logging.h"
#include "common/mutex.h"

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
        load_(options.url, ClientOptions(options.load_timeout, 3)),
        health_(options.url, ClientOptions(options.health_timeout, 1)) {}

  const std::string& url() const { return options_.url; }

  // kLoad: the call that loads weights, bounded by the load timeout (a load that hangs, as SGLang's
  // disk load waiting for requests kept across the pause, fails at it).
  enum class Channel { kGenerate, kControl, kLoad, kHealth };

  // The reply's body as JSON (null for an empty body); non-2xx answers are errors.
  Result<Json> Call(Channel channel, const std::string& method, const std::string& path,
                    const Json* body) {
    const std::string text = body ? body->dump() : std::string();
    std::vector<std::string> headers;
    if (body) headers.push_back("Content-Type: application/json");
    if (!options_.api_key.empty()) headers.push_back("Authorization: Bearer " + options_.api_key);
    HttpClient& client = channel == Channel::kGenerate  ? requests_
                         : channel == Channel::kControl ? control_
                         : channel == Channel::kLoad    ? load_
                                                        : health_;
    const std::string what = options_.url + " " + method + " " + path;
    WEFT_ASSIGN_OR_RETURN(HttpReply reply,
                          client.Request(method, path, TextBytes(text), headers, method == "GET"));
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
  HttpClient requests_, control_, load_, health_;
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

// The context length /v1/models gives (max_model_len of the base model, the card without a
// parent); 0 where it gives none.
Result<int64_t> ContextLength(JsonCalls& calls) {
  Result<Json> listed = calls.Call(Channel::kControl, "GET", "/v1/models", nullptr);
  if (listed.status().code() == StatusCode::kNotFound) return 0;
  WEFT_ASSIGN_OR_RETURN(Json models, std::move(listed));
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array()) return 0;
  for (const Json& m : models["data"]) {
    if (!m.is_object() || (m.contains("parent") && !m["parent"].is_null())) continue;
    if (m.contains("max_model_len") && m["max_model_len"].is_number_integer())
      return m["max_model_len"].get<int64_t>();
  }
  return 0;
}

// The token limit a request may ask for: the configured one, cut to what the context leaves after
// a prompt of token ids (`strict`: the engine refuses prompt + limit equal to the context, as
// SGLang does; vLLM allows it). An error when the prompt leaves no room. A cut completion cannot
// reach its stop token, so the first cut is logged (`warned` then set): it usually means a model
// whose context is just the task's sequence length.
Result<int> TokenLimit(const Sampling& sampling, const Prompt& prompt, int64_t context, bool strict,
                       const std::string& url, std::atomic<bool>& warned) {
  if (context <= 0 || prompt.is_text()) return sampling.max_tokens;
  const int64_t room = context - static_cast<int64_t>(prompt.tokens.size()) - (strict ? 1 : 0);
  if (room < 1) {
    return InvalidArgument(url + ": a prompt of " + std::to_string(prompt.tokens.size()) +
                           " tokens leaves no room in the model's context of " +
                           std::to_string(context) + " tokens");
  }
  if (room < sampling.max_tokens && !warned.exchange(true)) {
    WEFT_LOG(kWarning) << "engine replica " << url << ": its context of " << context
                       << " tokens leaves room for " << room << " of the " << sampling.max_tokens
                       << " completion tokens asked after a prompt of " << prompt.tokens.size()
                       << (strict ? " (this engine needs prompt + completion below the context)"
                                  : "")
                       << "; such completions are cut short (logged once per replica)";
  }
  return static_cast<int>(std::min<int64_t>(sampling.max_tokens, room));
}

// What a score request sends (ReplicaApi::Score): prompt + target, checked to fit the context with
// the one position both engines need past it (SGLang refuses a request whose input reaches the
// context even with no token to generate; vLLM generates one token).
Result<std::vector<int>> ScoredInput(const std::vector<int>& prompt, const std::vector<int>& target,
                                     int64_t context, const std::string& url) {
  if (prompt.empty())
    return InvalidArgument(url +
                           ": cannot score tokens after an empty prompt (nothing to condition "
                           "the first one on)");
  const int64_t total = static_cast<int64_t>(prompt.size() + target.size());
  if (context > 0 && total + 1 > context) {
    return InvalidArgument(url + ": a prompt of " + std::to_string(prompt.size()) +
                           " tokens and a target of " + std::to_string(target.size()) +
                           " tokens do not fit the model's context of " + std::to_string(context) +
                           " tokens (scoring needs one position past them)");
  }
  std::vector<int> input = prompt;
  input.insert(input.end(), target.begin(), target.end());
  return input;
}

// Sampling settings of a score request: temperature 1 (what the logprobs are taken at, whatever the
// engine's logprobs mode) and `max_tokens` tokens.
Sampling ScoreSampling(int max_tokens) {
  Sampling sampling;
  sampling.temperature = 1.0f;
  sampling.top_p = 1.0f;
  sampling.max_tokens = max_tokens;
  return sampling;
}

// The logprobs probe (ReplicaApi::Info): the first token after three ordinary token ids, with the
// best few alternatives' logprobs, at temperature 1 and 1/2 (top-p 1).
const std::vector<int> kProbePrompt = {1, 2, 3};
constexpr int kProbeAlternatives = 5;

Sampling ProbeSampling(float temperature) {
  Sampling sampling;
  sampling.temperature = temperature;
  sampling.max_tokens = 1;
  return sampling;
}

// Fills info.logprobs from `top` (the best alternatives' logprobs at a temperature). A probe that
// fails leaves kUnknown and says why: a replica is not refused for what could not be told.
template <typename Top>
void ProbeLogprobs(Top&& top, ReplicaInfo& info) {
  Result<std::vector<float>> one = top(1.0f);
  Result<std::vector<float>> half = one.ok() ? top(0.5f) : one;
  if (!half.ok()) {
    info.logprobs_probe = std::string(half.status().message());
    return;
  }
  info.logprobs = ClassifyLogprobs(std::move(*one), std::move(*half));
  if (info.logprobs == LogprobsKind::kUnknown)
    info.logprobs_probe = "the alternatives it gave were too close to tell";
}

// Caches a replica's Info: read once (again after Forget, when the replica came back).
class InfoCache {
 public:
  template <typename Read>
  Result<ReplicaInfo> Get(Read&& read) EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      if (info_) return *info_;
    }
    WEFT_ASSIGN_OR_RETURN(ReplicaInfo info, read());
    MutexLock lock(mutex_);
    info_ = info;
    return info;
  }
  void Forget() EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    info_.reset();
  }

 private:
  Mutex mutex_;
  std::optional<ReplicaInfo> info_ GUARDED_BY(mutex_);
};

// What the SGLang and VLLM replicas share: their JSON calls, the Info they read once, the mode of
// their last pause (which their loads depend on) and the health route.
class JsonReplica : public ReplicaApi {
 public:
  explicit JsonReplica(const ReplicaOptions& options) : calls_(options) {}
  const std::string& url() const override { return calls_.url(); }
  Status Health() override {
    return calls_.Call(Channel::kHealth, "GET", "/health", nullptr).status();
  }
  void ForgetInfo() override { info_.Forget(); }

 protected:
  void SetPauseMode(const std::string& mode) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    mode_ = mode;
  }
  std::string PauseMode() EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return mode_;
  }

  JsonCalls calls_;
  InfoCache info_;
  std::atomic<bool> cut_warned_{false};  // TokenLimit logged a cut completion
  Mutex mutex_;

 private:
  std::string mode_ GUARDED_BY(mutex_) = "abort";  // the pause mode of the last pause
};

// ------------------------------------------------------------------------------------------------
// SGLang: the native API of `python -m sglang.launch_server`.
class SglangReplica : public JsonReplica {
 public:
  using JsonReplica::JsonReplica;

  Result<std::string> ModelPath() override {
    WEFT_ASSIGN_OR_RETURN(Json info, ModelInfo());
    return Member<std::string>(info, "model_path", url() + " /model_info");
  }

  Result<std::string> WeightVersion() override {
    WEFT_ASSIGN_OR_RETURN(Json info, ModelInfo());
    return Member<std::string>(info, "weight_version", url() + " /model_info");
  }

  Result<ReplicaInfo> Info() override {
    return info_.Get([&]() -> Result<ReplicaInfo> {
      Result<Json> server = calls_.Call(Channel::kControl, "GET", "/server_info", nullptr);
      // Builds before /server_info have only /get_server_info.
      if (server.status().code() == StatusCode::kNotFound)
        server = calls_.Call(Channel::kControl, "GET", "/get_server_info", nullptr);
      // A build with neither says nothing of itself: the defaults (no deterministic inference).
      if (!server.ok() && server.status().code() != StatusCode::kNotFound) return server.status();
      ReplicaInfo info;
      if (server.ok() && server->is_object()) {
        info.version = server->value("version", std::string());
        const Json flag = server->value("enable_deterministic_inference", Json(false));
        info.deterministic = flag.is_boolean() && flag.get<bool>();
      }
      WEFT_ASSIGN_OR_RETURN(info.context_length, ContextLength(calls_));
      (void)Resume(true);
      ProbeLogprobs([&](float t) { return TopLogprobs(t); }, info);
      return info;
    });
  }

  Status Pause(const std::string& mode) override {
    SetPauseMode(mode);
    const Json body = {{"mode", mode}};
    return calls_.Call(Channel::kControl, "POST", "/pause_generation", &body).status();
  }

  Status Load(const std::string& dir, const std::string& version) override {
    // Paused first, so the update does not wait for requests to finish. The prefix cache holds
    // keys and values of the old weights, so it goes, except where requests stay resident across
    // the pause (in_place, retract): SGLang cannot flush under them (the load would fail), and they
    // go on with the keys and values they have.
    const std::string mode = PauseMode();
    const bool flush = mode != "in_place" && mode != "retract";
    const Json body = {{"model_path", dir}, {"weight_version", version}, {"flush_cache", flush}};
    WEFT_ASSIGN_OR_RETURN(Json answer,
                          calls_.Call(Channel::kLoad, "POST", "/update_weights_from_disk", &body));
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
    WEFT_ASSIGN_OR_RETURN(const ReplicaInfo info, Info());
    Json params = SamplingFields(sampling, "max_new_tokens");
    WEFT_ASSIGN_OR_RETURN(
        params["max_new_tokens"],
        TokenLimit(sampling, prompt, info.context_length, true, url(), cut_warned_));
    if (n > 1) {
      params["n"] = n;
    } else if (info.deterministic) {
      // SGLang reads sampling_seed only under --enable-deterministic-inference, and has kept it
      // in an int32 tensor: a seed within that range.
      params["sampling_seed"] = sampling.seed & 0x7fffffffull;
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

  Result<ReplicaOutput> Score(const std::vector<int>& prompt,
                              const std::vector<int>& target) override {
    WEFT_ASSIGN_OR_RETURN(const ReplicaInfo info, Info());
    WEFT_ASSIGN_OR_RETURN(const std::vector<int> input,
                          ScoredInput(prompt, target, info.context_length, url()));
    // input_token_logprobs start at logprob_start_len, the first entry always null: from the
    // prompt's last token on, entries 1.. are the target's.
    const size_t start = prompt.size() - 1;
    const Json body = {{"input_ids", input},
                       {"sampling_params", SamplingFields(ScoreSampling(0), "max_new_tokens")},
                       {"return_logprob", true},
                       {"logprob_start_len", start}};
    WEFT_ASSIGN_OR_RETURN(Json answer, calls_.Call(Channel::kGenerate, "POST", "/generate", &body));
    if (answer.is_array() && answer.size() == 1) answer = Json(answer[0]);
    if (!answer.is_object() || !answer.contains("meta_info") || !answer["meta_info"].is_object())
      return Malformed(url(), "/generate", "a result without meta_info");
    const Json& meta = answer["meta_info"];
    ReplicaOutput out;
    out.tokens = target;
    if (meta.contains("weight_version") && meta["weight_version"].is_string())
      out.version = meta["weight_version"].get<std::string>();
    if (meta.contains("finish_reason") && meta["finish_reason"].is_object() &&
        meta["finish_reason"].value("type", std::string()) == "abort") {
      out.aborted = true;  // a pause ended it: scored again
      return out;
    }
    const Json* entries =
        meta.contains("input_token_logprobs") ? &meta["input_token_logprobs"] : nullptr;
    if (entries == nullptr || !entries->is_array() || entries->size() != target.size() + 1) {
      return Malformed(url(), "/generate",
                       "not " + std::to_string(target.size() + 1) +
                           " meta_info.input_token_logprobs from logprob_start_len " +
                           std::to_string(start));
    }
    for (size_t i = 0; i < entries->size(); ++i) {
      // [logprob or null, token id, text or null]
      const Json& e = (*entries)[i];
      if (!e.is_array() || e.size() < 2 || !e[1].is_number_integer() ||
          e[1].get<int64_t>() != input[start + i] || (i > 0 && !e[0].is_number())) {
        return Malformed(url(), "/generate",
                         "input_token_logprobs entry " + std::to_string(i) +
                             " is not [logprob, id] of input token " + std::to_string(start + i));
      }
      if (i > 0) out.logprobs.push_back(e[0].get<float>());
    }
    return out;
  }

 private:
  // The best alternatives' logprobs for the first token after the probe prompt at `temperature`.
  Result<std::vector<float>> TopLogprobs(float temperature) {
    const Json body = {
        {"input_ids", kProbePrompt},
        {"sampling_params", SamplingFields(ProbeSampling(temperature), "max_new_tokens")},
        {"return_logprob", true},
        {"top_logprobs_num", kProbeAlternatives}};
    WEFT_ASSIGN_OR_RETURN(Json answer, calls_.Call(Channel::kControl, "POST", "/generate", &body));
    if (answer.is_array() && answer.size() == 1) answer = answer[0];
    const Json* top = nullptr;
    if (answer.is_object() && answer.contains("meta_info") && answer["meta_info"].is_object() &&
        answer["meta_info"].contains("output_top_logprobs")) {
      top = &answer["meta_info"]["output_top_logprobs"];
    }
    if (top == nullptr || !top->is_array() || top->empty() || !(*top)[0].is_array())
      return Malformed(url(), "/generate", "no meta_info.output_top_logprobs for the first token");
    std::vector<float> values;
    for (const Json& entry : (*top)[0]) {
      // [logprob, token id, text or null]
      if (!entry.is_array() || entry.empty() || !entry[0].is_number())
        return Malformed(url(), "/generate", "an output_top_logprobs entry is not [logprob, id]");
      values.push_back(entry[0].get<float>());
    }
    return values;
  }

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
};

// ------------------------------------------------------------------------------------------------
// vLLM: the OpenAI-compatible server, with the routes VLLM_SERVER_DEV_MODE=1 adds.
class VllmReplica : public JsonReplica {
 public:
  using JsonReplica::JsonReplica;

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
        MutexLock lock(mutex_);
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

  Result<ReplicaInfo> Info() override {
    return info_.Get([&]() -> Result<ReplicaInfo> {
      ReplicaInfo info;
      Result<Json> version = calls_.Call(Channel::kControl, "GET", "/version", nullptr);
      if (!version.ok() && version.status().code() != StatusCode::kNotFound)
        return version.status();
      if (version.ok() && version->is_object())
        info.version = version->value("version", std::string());
      // The routes weft pauses, loads and reads versions by exist only with
      // VLLM_SERVER_DEV_MODE=1: /is_paused is one of them, and harmless to ask.
      Result<Json> paused = calls_.Call(Channel::kControl, "GET", "/is_paused", nullptr);
      if (!paused.ok() && paused.status().code() != StatusCode::kNotFound) return paused.status();
      info.control_routes = paused.ok();
      WEFT_ASSIGN_OR_RETURN(info.context_length, ContextLength(calls_));
      if (info.control_routes) (void)Resume(true);
      ProbeLogprobs([&](float t) { return TopLogprobs(t); }, info);
      return info;
    });
  }

  Status Pause(const std::string& mode) override {
    SetPauseMode(mode);
    return calls_.Call(Channel::kControl, "POST", "/pause?mode=" + mode, nullptr).status();
  }

  Status Load(const std::string& dir, const std::string& version) override {
    // No weight-transfer backend is needed: every worker process reloads the checkpoint directory
    // (and takes it as its model path); then the prefix cache of the old weights goes, and the
    // version is recorded.
    const Json reload = {{"method", "reload_weights"},
                         {"args", Json::array()},
                         {"kwargs", {{"weights_path", dir}, {"is_checkpoint_format", true}}}};
    Status reloaded = calls_.Call(Channel::kLoad, "POST", "/collective_rpc", &reload).status();
    if (!reloaded.ok() && reloaded.message().find("weights_path") != std::string::npos) {
      return InvalidArgument(
          url() + ": this vLLM's workers cannot reload weights from a path " +
          "(reload_weights takes no weights_path before vLLM 0.15): " + reloaded.message());
    }
    WEFT_RETURN_IF_ERROR(reloaded);
    WEFT_RETURN_IF_ERROR(ResetPrefixCache());
    const Json body = {{"new_version", version}};
    return calls_.Call(Channel::kControl, "POST", "/update_weight_version", &body).status();
  }

  Status Resume(bool quick) override {
    return calls_.Call(quick ? Channel::kHealth : Channel::kControl, "POST", "/resume", nullptr)
        .status();
  }

  // The prefix cache of the old weights goes. Requests kept across the pause (mode keep) hold
  // cache blocks, so they are reset too (they recompute their keys and values on the new
  // weights). vLLM builds answer a reset three ways: 200 with an empty body, whether or not it
  // happened (current builds, which is why keep asks for the running requests' reset at once);
  // 200 {"success": false}; or 409 when it could not. The last two are tried again with the
  // running requests reset, and fail the load if that fails too.
  Status ResetPrefixCache() {
    const bool keep = PauseMode() == "keep";
    const std::string all = "/reset_prefix_cache?reset_running_requests=true";
    auto failed = [](const Result<Json>& answer) {
      if (!answer.ok()) return answer.status().code() == StatusCode::kConflict;
      return answer->is_object() && answer->contains("success") && (*answer)["success"] == false;
    };
    Result<Json> reset =
        calls_.Call(Channel::kControl, "POST", keep ? all : "/reset_prefix_cache", nullptr);
    if (failed(reset) && !keep) reset = calls_.Call(Channel::kControl, "POST", all, nullptr);
    if (failed(reset)) {
      return Unavailable(url() + " /reset_prefix_cache: the prefix cache could not be reset" +
                         (reset.ok() ? std::string() : ": " + reset.status().message()));
    }
    return reset.status();
  }

  Result<std::vector<ReplicaOutput>> Generate(const Prompt& prompt, const Sampling& sampling,
                                              int n) override {
    WEFT_ASSIGN_OR_RETURN(const ReplicaInfo info, Info());
    Json body = SamplingFields(sampling, "max_tokens");
    WEFT_ASSIGN_OR_RETURN(body["max_tokens"], TokenLimit(sampling, prompt, info.context_length,
                                                         false, url(), cut_warned_));
    body.update(Json{{"n", n},
                     {"logprobs", 0},
                     {"return_tokens_as_token_ids", true},
                     {"return_token_ids", true},
                     {"seed", sampling.seed & 0x7fffffffffffffffull}});
    NameModel(body);
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

  Result<ReplicaOutput> Score(const std::vector<int>& prompt,
                              const std::vector<int>& target) override {
    WEFT_ASSIGN_OR_RETURN(const ReplicaInfo info, Info());
    WEFT_ASSIGN_OR_RETURN(const std::vector<int> input,
                          ScoredInput(prompt, target, info.context_length, url()));
    // prompt_logprobs 0: at each position of the prompt (the first null), the token there by its
    // id, with no alternatives. The one token generated is not used.
    Json body = SamplingFields(ScoreSampling(1), "max_tokens");
    body.update(Json{
        {"n", 1}, {"prompt", input}, {"prompt_logprobs", 0}, {"return_tokens_as_token_ids", true}});
    NameModel(body);
    WEFT_ASSIGN_OR_RETURN(Json answer,
                          calls_.Call(Channel::kGenerate, "POST", "/v1/completions", &body));
    if (!answer.is_object() || !answer.contains("choices") || !answer["choices"].is_array() ||
        answer["choices"].size() != 1 || !answer["choices"][0].is_object()) {
      return Malformed(url(), "/v1/completions", "not one choice");
    }
    const Json& choice = answer["choices"][0];
    ReplicaOutput out;
    out.tokens = target;
    if (choice.value("finish_reason", Json()) == "abort") {
      out.aborted = true;  // a pause ended it: scored again
      return out;
    }
    const Json* positions =
        choice.contains("prompt_logprobs") ? &choice["prompt_logprobs"] : nullptr;
    if (positions == nullptr || !positions->is_array() || positions->size() != input.size())
      return Malformed(url(), "/v1/completions",
                       "not " + std::to_string(input.size()) + " prompt_logprobs");
    for (size_t i = prompt.size(); i < input.size(); ++i) {
      // {"<token id>": {"logprob": x, "rank": r, "decoded_token": t}, ...}
      const Json& at = (*positions)[i];
      const std::string id = std::to_string(input[i]);
      if (!at.is_object() || !at.contains(id) || !at[id].is_object() ||
          !at[id].contains("logprob") || !at[id]["logprob"].is_number()) {
        return Malformed(
            url(), "/v1/completions",
            "prompt_logprobs position " + std::to_string(i) + " has no logprob for token " + id);
      }
      out.logprobs.push_back(at[id]["logprob"].get<float>());
    }
    return out;
  }

 private:
  // Sets body["model"] to the served model's name (older builds require it), learnt once from
  // /v1/models.
  void NameModel(Json& body) {
    bool known;
    {
      MutexLock lock(mutex_);
      known = !model_id_.empty();
    }
    if (!known) (void)ModelPath();
    MutexLock lock(mutex_);
    if (!model_id_.empty()) body["model"] = model_id_;
  }

  // The best alternatives' logprobs for the first token after the probe prompt at `temperature`
  // (vLLM lists the sampled token among them even when it is not one of the best).
  Result<std::vector<float>> TopLogprobs(float temperature) {
    Json body = SamplingFields(ProbeSampling(temperature), "max_tokens");
    body.update(Json{{"prompt", kProbePrompt},
                     {"logprobs", kProbeAlternatives},
                     {"return_tokens_as_token_ids", true}});
    NameModel(body);
    WEFT_ASSIGN_OR_RETURN(Json answer,
                          calls_.Call(Channel::kControl, "POST", "/v1/completions", &body));
    const Json* top = nullptr;
    if (answer.is_object() && answer.contains("choices") && answer["choices"].is_array() &&
        answer["choices"].size() == 1 && answer["choices"][0].is_object()) {
      const Json& choice = answer["choices"][0];
      if (choice.contains("logprobs") && choice["logprobs"].is_object() &&
          choice["logprobs"].contains("top_logprobs"))
        top = &choice["logprobs"]["top_logprobs"];
    }
    if (top == nullptr || !top->is_array() || top->empty() || !(*top)[0].is_object())
      return Malformed(url(), "/v1/completions", "no logprobs.top_logprobs for the first token");
    std::vector<float> values;
    for (const auto& [token, value] : (*top)[0].items()) {
      if (!value.is_number())
        return Malformed(url(), "/v1/completions", "a top_logprobs value that is not a number");
      values.push_back(value.get<float>());
    }
    // The sampled token may be listed past the best: only the best few are compared.
    std::sort(values.begin(), values.end(), std::greater<float>());
    if (values.size() > static_cast<size_t>(kProbeAlternatives)) values.resize(kProbeAlternatives);
    return values;
  }

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

  // The served model's name, once ModelPath has read it.
  std::string model_id_ GUARDED_BY(mutex_);
};

}  // namespace

const char* LogprobsKindName(LogprobsKind kind) {
  switch (kind) {
    case LogprobsKind::kTemperatureOne:
      return "at temperature 1";
    case LogprobsKind::kAfterTemperature:
      return "after temperature";
    case LogprobsKind::kNotLogprobs:
      return "not log-probabilities";
    case LogprobsKind::kUnknown:
      break;
  }
  return "unknown";
}

LogprobsKind ClassifyLogprobs(std::vector<float> at_one, std::vector<float> at_half) {
  std::sort(at_one.begin(), at_one.end(), std::greater<float>());
  std::sort(at_half.begin(), at_half.end(), std::greater<float>());
  const size_t k = std::min(at_one.size(), at_half.size());
  if (k < 2) return LogprobsKind::kUnknown;
  for (const std::vector<float>* values : {&at_one, &at_half}) {
    double probability = 0.0;
    for (size_t i = 0; i < k; ++i) {
      if (!std::isfinite((*values)[i]) && (*values)[i] > 0) return LogprobsKind::kNotLogprobs;
      probability += std::exp(static_cast<double>((*values)[i]));
    }
    if (probability > 1.01) return LogprobsKind::kNotLogprobs;
  }
  // The widest gap among the best k: from the best to the k-th (the order is the same at any
  // temperature). Too narrow a gap, and noise between two requests decides.
  const double gap_one = static_cast<double>(at_one[0]) - at_one[k - 1];
  const double gap_half = static_cast<double>(at_half[0]) - at_half[k - 1];
  if (!std::isfinite(gap_one) || !std::isfinite(gap_half) || gap_one < 0.05)
    return LogprobsKind::kUnknown;
  const double ratio = gap_half / gap_one;
  if (ratio > 0.8 && ratio < 1.25) return LogprobsKind::kTemperatureOne;
  if (ratio > 1.6 && ratio < 2.5) return LogprobsKind::kAfterTemperature;
  return LogprobsKind::kUnknown;
}

std::optional<std::array<int, 3>> ParseRelease(const std::string& version) {
  std::array<int, 3> parts{0, 0, 0};
  size_t at = 0;
  int count = 0;
  while (count < 3) {
    size_t end = at;
    while (end < version.size() && end - at < 6 &&
           std::isdigit(static_cast<unsigned char>(version[end])))
      ++end;
    if (end == at) break;
    parts[count++] = std::stoi(version.substr(at, end - at));
    if (end >= version.size() || version[end] != '.') break;
    at = end + 1;
  }
  if (count < 2) return std::nullopt;  // at least MAJOR.MINOR
  return parts;
}

namespace {

// Logprobs the trainer cannot use are refused, naming `fix` (the engine's setting for
// log-probabilities at temperature 1).
Status CheckLogprobs(const std::string& url, const ReplicaInfo& info, const std::string& fix) {
  if (info.logprobs == LogprobsKind::kAfterTemperature) {
    return InvalidArgument(url + ": its logprobs are taken after temperature, not at temperature " +
                           "1 as the trainer computes them (a probe at temperatures 1 and 0.5 " +
                           "gave gaps twice as wide at 0.5): " + fix);
  }
  if (info.logprobs == LogprobsKind::kNotLogprobs) {
    return InvalidArgument(url + ": what it returns as logprobs are not log-probabilities (the " +
                           "best alternatives add up to more than 1; logits?): " + fix);
  }
  return Status::Ok();
}

// SGLang before 0.5.6 takes no pause mode: its /pause_generation always aborts. By default it
// returns logprobs after temperature.
Status CheckSglang(const std::string& url, const ReplicaInfo& info, const std::string& mode) {
  WEFT_RETURN_IF_ERROR(CheckLogprobs(
      url, info, "start it with SGLANG_RETURN_ORIGINAL_LOGPROB=1 in its environment"));
  const std::optional<std::array<int, 3>> release = ParseRelease(info.version);
  if (mode != "abort" && release && *release < std::array<int, 3>{0, 5, 6}) {
    return InvalidArgument(url + ": SGLang " + info.version + " takes no pause mode (its " +
                           "/pause_generation always aborts; modes need 0.5.6 or newer): set " +
                           "engine.pause: abort, not " + mode);
  }
  return Status::Ok();
}

// vLLM before 0.15 cannot reload weights from a path; without dev mode it has no route to. Its
// --logprobs-mode can make logprobs processed ones or logits.
Status CheckVllm(const std::string& url, const ReplicaInfo& info, const std::string&) {
  WEFT_RETURN_IF_ERROR(CheckLogprobs(
      url, info,
      "start it with --logprobs-mode raw_logprobs (the default), not processed_*, *_logits"));
  if (!info.control_routes) {
    return InvalidArgument(url + ": this vLLM runs without VLLM_SERVER_DEV_MODE=1, so the routes " +
                           "weft pauses, loads and reads versions by (/pause, /collective_rpc, " +
                           "/weight_info, ...) do not exist: start it with VLLM_SERVER_DEV_MODE=1");
  }
  const std::optional<std::array<int, 3>> release = ParseRelease(info.version);
  if (release && *release < std::array<int, 3>{0, 15, 0}) {
    return InvalidArgument(url + ": vLLM " + info.version +
                           " cannot reload weights from a path (its workers define "
                           "reload_weights(self), without weights_path): weft needs vLLM 0.15 or "
                           "newer (docs/engines.md, \"Compatibility\")");
  }
  return Status::Ok();
}

template <typename Replica>
std::unique_ptr<ReplicaApi> Make(const ReplicaOptions& options) {
  return std::make_unique<Replica>(options);
}

}  // namespace

const std::vector<EngineApi>& EngineApis() {
  static const std::vector<EngineApi> apis = {
      {"sglang", {"abort", "retract", "in_place"}, &Make<SglangReplica>, &CheckSglang},
      {"vllm", {"abort", "wait", "keep"}, &Make<VllmReplica>, &CheckVllm},
  };
  return apis;
}

Status EngineApi::CheckPauseModeName(const std::string& mode, const std::string& key) const {
  if (std::find(pause_modes.begin(), pause_modes.end(), mode) != pause_modes.end())
    return Status::Ok();
  std::string known;
  for (const std::string& m : pause_modes) known += (known.empty() ? "" : ", ") + m;
  return InvalidArgument(key + ": '" + mode + "' is not a pause mode of " + name + " (" + known +
                         ")");
}

Result<const EngineApi*> FindEngineApi(const std::string& name) {
  std::string known;
  for (const EngineApi& api : EngineApis()) {
    if (api.name == name) return &api;
    known += (known.empty() ? "" : ", ") + api.name;
  }
  return InvalidArgument("no engine API named '" + name + "' (known: " + known + ")");
}

Result<std::unique_ptr<ReplicaApi>> MakeReplicaApi(const EngineApi& api,
                                                   const ReplicaOptions& options) {
  if (options.url.rfind("http://", 0) != 0 && options.url.rfind("https://", 0) != 0)
    return InvalidArgument("engine URL '" + options.url + "' must start with http:// or https://");
  return api.make(options);
}

}  // namespace weft::rollout_worker
