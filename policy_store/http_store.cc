#include "policy_store/http_store.h"

#include <curl/curl.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace weft::policy_store {
namespace {

using Json = nlohmann::json;

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t Collect(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::vector<uint8_t>*>(user);
  body->insert(body->end(), reinterpret_cast<uint8_t*>(data), reinterpret_cast<uint8_t*>(data) + size * count);
  return size * count;
}

// The server's message from a JSON error body, or the raw text.
std::string Message(const HttpStore::Reply& reply) {
  Json body = Json::parse(reply.body.begin(), reply.body.end(), nullptr, false);
  if (body.is_object() && body.contains("error") && body["error"].is_string()) return body["error"].get<std::string>();
  return std::string(reply.body.begin(), reply.body.begin() + std::min<size_t>(reply.body.size(), 200));
}

Status StatusOf(const HttpStore::Reply& reply, const std::string& what) {
  if (reply.status >= 200 && reply.status < 300) return Status::Ok();
  std::string text = what + ": HTTP " + std::to_string(reply.status) + ": " + Message(reply);
  switch (reply.status) {
    case 404: return NotFound(text);
    case 409: return Conflict(text);
    case 504: return Timeout(text);
    default: return reply.status >= 500 ? Unavailable(text) : InvalidArgument(text);
  }
}

}  // namespace

HttpStore::HttpStore(std::string base_url, std::string writer_token, HttpStoreOptions options)
    : base_url_(std::move(base_url)), writer_token_(std::move(writer_token)), options_(options) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
  for (const char* host : {"://127.", "://localhost", "://[::1]"}) {
    if (base_url_.find(host) != std::string::npos) loopback_ = true;
  }
  InitCurlOnce();
}

Result<HttpStore::Reply> HttpStore::Request(const std::string& method, const std::string& path,
                                            std::span<const uint8_t> body, bool authorize) {
  const std::string url = base_url_ + path;
  std::string last_error;
  std::chrono::milliseconds backoff = options_.first_backoff;
  for (int attempt = 1; attempt <= options_.attempts; ++attempt) {
    if (attempt > 1) {
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return Internal("cannot create an HTTP request");
    Reply reply;
    curl_slist* headers = nullptr;
    std::string authorization = "Authorization: Bearer " + writer_token_;
    if (authorize) headers = curl_slist_append(headers, authorization.c_str());
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    // Loopback never goes through a proxy, whatever the environment says; other hosts honour
    // the usual proxy variables.
    if (loopback_) curl_easy_setopt(curl, CURLOPT_PROXY, "");
    if (method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
      if (method == "PUT" || method == "POST") {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(body.data()));
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      }
    }
    CURLcode code = curl_easy_perform(curl);
    if (code == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if (code != CURLE_OK) {
      last_error = curl_easy_strerror(code);
      continue;
    }
    if (reply.status >= 500 && reply.status != 501) {
      last_error = "HTTP " + std::to_string(reply.status) + ": " + Message(reply);
      continue;
    }
    return reply;
  }
  return Unavailable(method + " " + url + ": " + last_error + " (after " + std::to_string(options_.attempts) + " attempts)");
}

Result<std::vector<uint8_t>> HttpStore::Get(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("GET", "/v1/objects/" + key, {}, false));
  WEFT_RETURN_IF_ERROR(StatusOf(reply, "GET " + base_url_ + "/v1/objects/" + key));
  return std::move(reply.body);
}

Result<bool> HttpStore::Exists(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("HEAD", "/v1/objects/" + key, {}, false));
  if (reply.status == 404) return false;
  WEFT_RETURN_IF_ERROR(StatusOf(reply, "HEAD " + base_url_ + "/v1/objects/" + key));
  return true;
}

Result<std::vector<std::string>> HttpStore::List(const std::string& prefix) {
  if (prefix.empty() || prefix.back() != '/') return InvalidArgument("list prefix must end in '/'");
  WEFT_RETURN_IF_ERROR(ValidateKey(prefix.substr(0, prefix.size() - 1)));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("GET", "/v1/list/" + prefix, {}, false));
  WEFT_RETURN_IF_ERROR(StatusOf(reply, "GET " + base_url_ + "/v1/list/" + prefix));
  Json body = Json::parse(reply.body.begin(), reply.body.end(), nullptr, false);
  if (!body.is_object() || !body.contains("keys") || !body["keys"].is_array()) {
    return DataLoss(base_url_ + ": malformed listing");
  }
  std::vector<std::string> keys;
  for (const Json& key : body["keys"]) {
    if (!key.is_string() || !ValidateKey(key.get<std::string>()).ok()) return DataLoss(base_url_ + ": malformed key in listing");
    keys.push_back(key.get<std::string>());
  }
  return keys;
}

Status HttpStore::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("PUT", "/v1/objects/" + key, bytes, true));
  return StatusOf(reply, "PUT " + base_url_ + "/v1/objects/" + key);
}

Status HttpStore::CompareAndSwap(const std::string& key, std::optional<std::string> expected, const std::string& desired) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  Json body = {{"expected", expected ? Json(*expected) : Json(nullptr)}, {"desired", desired}};
  std::string text = body.dump();
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("POST", "/v1/cas/" + key, {reinterpret_cast<const uint8_t*>(text.data()), text.size()}, true));
  return StatusOf(reply, "POST " + base_url_ + "/v1/cas/" + key);
}

Status HttpStore::Delete(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("DELETE", "/v1/objects/" + key, {}, true));
  return StatusOf(reply, "DELETE " + base_url_ + "/v1/objects/" + key);
}

}  // namespace weft::policy_store
