#include "rollout_worker/http_task.h"

#include <climits>
#include <cmath>

#include "common/byte_io.h"
#include "common/yaml_fields.h"

namespace weft::rollout_worker {
namespace {

using Json = nlohmann::json;

constexpr int kMaxLength = 1000000;  // tokens of a prompt or a completion

// A JSON value for an error message: its text, cut short (strings that are not UTF-8 replaced).
std::string Brief(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// An answer's body for an error message: at most 200 bytes, control characters as '?'.
std::string Excerpt(const std::vector<uint8_t>& body) {
  if (body.empty()) return "an empty body";
  std::string text;
  for (size_t i = 0; i < body.size() && i < 200; ++i)
    text.push_back(body[i] < 0x20 || body[i] == 0x7f ? '?' : static_cast<char>(body[i]));
  return "'" + text + (body.size() > 200 ? "...'" : "'");
}

Status ReadLength(const YAML::Node& task, const std::string& kind, const std::string& key,
                  const std::string& meaning, int* out) {
  if (!task[key]) {
    return InvalidArgument("task." + key + " is needed for kind " + kind + " (" + meaning + ")" +
                           LineOf(task));
  }
  uint64_t value = 0;
  WEFT_RETURN_IF_ERROR(ReadUnsigned(task, "task", key, &value));
  if (value < 1 || value > static_cast<uint64_t>(kMaxLength)) {
    return InvalidArgument("task." + key + " must be 1 to " + std::to_string(kMaxLength) +
                           LineOf(task[key]));
  }
  *out = static_cast<int>(value);
  return Status::Ok();
}

// max_prompt_tokens and max_tokens (required), stop_token (a token id, or -1 for none).
Status ReadLimits(const YAML::Node& task, const std::string& kind, TaskLimits* limits) {
  WEFT_RETURN_IF_ERROR(ReadLength(task, kind, "max_prompt_tokens", "the longest prompt, in tokens",
                                  &limits->max_prompt_tokens));
  WEFT_RETURN_IF_ERROR(ReadLength(task, kind, "max_tokens", "the longest completion, in tokens",
                                  &limits->max_completion_tokens));
  std::string stop = std::to_string(limits->stop_token);
  WEFT_RETURN_IF_ERROR(ReadString(task, "task", "stop_token", &stop));
  char* end = nullptr;
  const long long id = std::strtoll(stop.c_str(), &end, 10);
  if (stop.empty() || *end != '\0' || id < -1 || id > INT_MAX) {
    return InvalidArgument("task.stop_token: '" + stop +
                           "' is not a token id (0 or more) or -1 (no stop token)" +
                           LineOf(task["stop_token"]));
  }
  limits->stop_token = static_cast<int>(id);
  return Status::Ok();
}

std::set<std::string> Keys(std::set<std::string> own, const std::set<std::string>& other) {
  own.insert(other.begin(), other.end());
  return own;
}

// "http://host:port/path?query" -> ("http://host:port", "/path?query"); errors say what is wrong.
Result<std::pair<std::string, std::string>> SplitUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const std::string name = scheme == std::string::npos ? "" : url.substr(0, scheme);
  if (name != "http" && name != "https")
    return InvalidArgument("'" + url + "' is not an http:// or https:// URL");
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return InvalidArgument("'" + url + "' holds white space or a control character");
  }
  if (url.find('#') != std::string::npos)
    return InvalidArgument("'" + url + "' has a fragment (#...); the service gets no fragment");
  const size_t path = url.find_first_of("/?", scheme + 3);
  const std::string base = url.substr(0, path);
  if (base.size() == scheme + 3) return InvalidArgument("'" + url + "' names no host");
  std::string rest = path == std::string::npos ? "/" : url.substr(path);
  if (rest[0] == '?') rest = "/" + rest;
  return std::make_pair(base, rest);
}

}  // namespace

Result<Prompt> PromptTask::Encode(const Json& prompt) const {
  Prompt encoded;
  if (prompt.is_string()) {
    encoded.text = prompt.get<std::string>();
    if (encoded.text.empty()) return InvalidArgument("the prompt is empty text");
    return encoded;
  }
  if (prompt.is_array() && !prompt.empty()) {
    if (prompt.size() > static_cast<size_t>(limits_.max_prompt_tokens)) {
      return InvalidArgument("the prompt has " + std::to_string(prompt.size()) +
                             " token ids; task.max_prompt_tokens is " +
                             std::to_string(limits_.max_prompt_tokens));
    }
    for (size_t i = 0; i < prompt.size(); ++i) {
      const Json& id = prompt[i];
      const bool fits = id.is_number_unsigned() ? id.get<uint64_t>() <= INT_MAX
                        : id.is_number_integer()
                            ? id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT_MAX
                            : false;
      if (!fits) {
        return InvalidArgument("prompt[" + std::to_string(i) + "] is " + Brief(id) +
                               ": token ids are integers from 0 to " + std::to_string(INT_MAX));
      }
      encoded.tokens.push_back(static_cast<int>(id.get<int64_t>()));
    }
    return encoded;
  }
  return InvalidArgument(
      "a prompt is text (a JSON string) or token ids (a non-empty array of non-negative "
      "integers), not " +
      Brief(prompt));
}

Result<std::optional<double>> TrainerRewardTask::Reward(const Json& /*prompt*/,
                                                        const Json& /*metadata*/,
                                                        const Completion& /*completion*/) const {
  return std::optional<double>();
}

HttpRewardTask::HttpRewardTask(HttpTaskSettings settings)
    : PromptTask(settings.limits), settings_(std::move(settings)) {
  Result<std::pair<std::string, std::string>> split = SplitUrl(settings_.url);
  std::string base = split.ok() ? split->first : settings_.url;
  path_ = split.ok() ? split->second : "/";
  HttpClientOptions options;
  options.attempts = settings_.retries + 1;
  options.deadline = settings_.timeout;
  options.connect_timeout = std::min(options.connect_timeout, settings_.timeout);
  options.stall_timeout = std::min(options.stall_timeout, settings_.timeout);
  client_ = std::make_unique<HttpClient>(std::move(base), options);
}

Result<std::optional<double>> HttpRewardTask::Reward(const Json& prompt, const Json& metadata,
                                                     const Completion& completion) const {
  const Json request = {{"prompt", prompt},
                        {"metadata", metadata},
                        {"completion", {{"text", completion.text}, {"tokens", completion.tokens}}}};
  // Text that is not UTF-8 (a tokenizer cutting a character in two) goes with replacement
  // characters rather than failing the completion.
  const std::string body = request.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::vector<std::string> headers = {"Content-Type: application/json", "Accept: application/json"};
  if (!settings_.token.empty()) headers.push_back("Authorization: Bearer " + settings_.token);
  // Scoring is a function of the request: repeating one the service may have seen is harmless.
  Result<HttpReply> reply = client_->Request("POST", path_, TextBytes(body), headers,
                                             /*idempotent=*/true);
  if (!reply.ok()) return reply.status().WithContext("reward service");
  const std::string what = "reward service " + settings_.url;
  WEFT_RETURN_IF_ERROR(StatusOfReply(*reply, what));
  const Json answer = Json::parse(reply->body.begin(), reply->body.end(), nullptr, false);
  if (answer.is_discarded() || !answer.is_object() || !answer.contains("reward") ||
      !answer["reward"].is_number() || !std::isfinite(answer["reward"].get<double>())) {
    return InvalidArgument(what + ": the answer must be {\"reward\": a finite number}, not " +
                           Excerpt(reply->body));
  }
  return std::optional<double>(answer["reward"].get<double>());
}

Result<HttpTaskSettings> ParseHttpTaskSection(const YAML::Node& task,
                                              const std::set<std::string>& other_keys) {
  if (!task)
    return InvalidArgument(
        "kind http needs a task section with url, max_prompt_tokens and max_tokens");
  WEFT_RETURN_IF_ERROR(CheckKeys(task, "task",
                                 Keys({"kind", "url", "timeout", "retries", "token",
                                       "max_prompt_tokens", "max_tokens", "stop_token"},
                                      other_keys)));
  HttpTaskSettings settings;
  if (!task["url"])
    return InvalidArgument("task.url is needed for kind http (the reward service)" + LineOf(task));
  WEFT_RETURN_IF_ERROR(ReadString(task, "task", "url", &settings.url));
  Status url = SplitUrl(settings.url).status();
  if (!url.ok()) return url.WithContext("task.url" + LineOf(task["url"]));
  std::chrono::microseconds timeout = settings.timeout;
  WEFT_RETURN_IF_ERROR(ReadDuration(task, "task", "timeout", &timeout));
  if (timeout < std::chrono::milliseconds(1) || timeout > std::chrono::hours(1))
    return InvalidArgument("task.timeout must be 1ms to 1h" + LineOf(task["timeout"]));
  settings.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  uint64_t retries = static_cast<uint64_t>(settings.retries);
  WEFT_RETURN_IF_ERROR(ReadUnsigned(task, "task", "retries", &retries));
  if (retries > 100)
    return InvalidArgument("task.retries must be 0 to 100" + LineOf(task["retries"]));
  settings.retries = static_cast<int>(retries);
  WEFT_RETURN_IF_ERROR(ReadString(task, "task", "token", &settings.token));
  for (char c : settings.token) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return InvalidArgument("task.token holds a control character" + LineOf(task["token"]));
  }
  WEFT_RETURN_IF_ERROR(ReadLimits(task, "http", &settings.limits));
  return settings;
}

Result<TaskLimits> ParseTrainerTaskSection(const YAML::Node& task,
                                           const std::set<std::string>& other_keys) {
  if (!task)
    return InvalidArgument(
        "kind trainer needs a task section with max_prompt_tokens and max_tokens");
  WEFT_RETURN_IF_ERROR(CheckKeys(
      task, "task", Keys({"kind", "max_prompt_tokens", "max_tokens", "stop_token"}, other_keys)));
  TaskLimits limits;
  WEFT_RETURN_IF_ERROR(ReadLimits(task, "trainer", &limits));
  return limits;
}

}  // namespace weft::rollout_worker
