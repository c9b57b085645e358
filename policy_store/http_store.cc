#include "policy_store/http_store.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/byte_io.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

using Json = nlohmann::json;

HttpClientOptions ClientOptions(const HttpStoreOptions& options) {
  HttpClientOptions client = options;
  ShapeClient(options.shaper, &client);
  return client;
}

}  // namespace

Result<ObjectRange> RangeOfReply(HttpReply reply, uint64_t first, uint64_t length,
                                 const std::string& what) {
  WEFT_ASSIGN_OR_RETURN(const uint64_t size, DeliveredRange(reply, first, length, what));
  if (reply.status == 416) return ObjectRange{{}, size};  // (its body is the server's message)
  return ObjectRange{std::move(reply.body), size};
}

Result<uint64_t> DeliveredRange(const HttpReply& reply, uint64_t first, uint64_t length,
                                const std::string& what) {
  if (!reply.object_size) {
    return DataLoss(what + ": HTTP " + std::to_string(reply.status) +
                    " without the object's size (Content-Range '" + reply.Header("content-range") +
                    "')");
  }
  const uint64_t size = *reply.object_size;
  const uint64_t expected = first >= size ? 0 : std::min(length, size - first);
  if (reply.status == 416) {
    if (expected != 0) return DataLoss(what + ": refused a range inside the object (HTTP 416)");
    return size;
  }
  if (reply.delivered != expected) {
    return DataLoss(what + ": HTTP " + std::to_string(reply.status) + " with " +
                    std::to_string(reply.delivered) + " bytes of an object of " +
                    std::to_string(size) + " for " + std::to_string(expected) + " bytes from " +
                    std::to_string(first));
  }
  return size;
}

HttpStore::HttpStore(std::string base_url, std::string writer_token, HttpStoreOptions options)
    : client_(std::move(base_url), ClientOptions(options)),
      writer_token_(std::move(writer_token)),
      reads_(options.reads) {}

Result<HttpStore::Reply> HttpStore::Request(const std::string& method, const std::string& path,
                                            std::span<const uint8_t> body, bool authorize) {
  std::vector<std::string> headers;
  if (authorize) headers.push_back("Authorization: Bearer " + writer_token_);
  // Every Store API request is idempotent: immutable puts, compare-and-swap, deletes.
  return client_.Request(method, path, body, headers);
}

Result<std::vector<uint8_t>> HttpStore::Get(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("GET", "/v1/objects/" + key, {}, false));
  WEFT_RETURN_IF_ERROR(StatusOfReply(reply, "GET " + client_.base_url() + "/v1/objects/" + key));
  return std::move(reply.body);
}

Result<ObjectRange> HttpStore::GetRange(const std::string& key, uint64_t first, uint64_t length) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  HttpRequest request;
  request.path = "/v1/objects/" + key;
  request.range = std::pair<uint64_t, uint64_t>{first, length};
  WEFT_ASSIGN_OR_RETURN(Reply reply, client_.Request(request));
  const std::string what = "GET " + client_.base_url() + request.path;
  if (reply.status != 416) WEFT_RETURN_IF_ERROR(StatusOfReply(reply, what));
  return RangeOfReply(std::move(reply), first, length, what);
}

Result<RangeRead> HttpStore::GetRangeInto(const std::string& key, uint64_t first,
                                          std::span<uint8_t> out) {
  return ReadInto(key, first, out);
}

Result<uint64_t> HttpStore::ReadTo(const std::string& key, uint64_t first, uint64_t length,
                                   BodyTarget& target) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (length == 0) return InvalidArgument(key + ": a range of no bytes");
  HttpRequest request;
  request.path = "/v1/objects/" + key;
  if (first > 0 || length != UINT64_MAX)
    request.range = std::pair<uint64_t, uint64_t>{first, std::min(length, UINT64_MAX - first)};
  request.target = &target;
  WEFT_ASSIGN_OR_RETURN(Reply reply, client_.Request(request));
  const std::string what = "GET " + client_.base_url() + request.path;
  if (reply.status != 416) WEFT_RETURN_IF_ERROR(StatusOfReply(reply, what));
  if (!request.range) {
    if (!reply.object_size || *reply.object_size != reply.delivered) {
      return DataLoss(what + ": " + std::to_string(reply.delivered) +
                      " bytes arrived of an object announced as " +
                      (reply.object_size ? std::to_string(*reply.object_size) : "unknown"));
    }
    return reply.delivered;
  }
  return DeliveredRange(reply, first, request.range->second, what);
}

std::string ObjectEtag(std::string_view bytes) { return "\"" + Sha256Hex(TextBytes(bytes)) + "\""; }

Result<ObjectWatch> HttpStore::WaitForChange(const std::string& key,
                                             const std::optional<std::string>& known,
                                             std::chrono::milliseconds wait,
                                             const std::atomic<bool>* cancel) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  HttpRequest request;
  request.path = "/v1/objects/" + key;
  // A long poll (docs/api.md, "Waiting for a change"): whole seconds, short enough that the
  // client's stall timeout never ends a wait that is going as it should.
  const int64_t longest = std::max<int64_t>(0, client_.options().stall_timeout.count() / 1000 - 5);
  const int64_t seconds = std::min<int64_t>(
      std::min<int64_t>(longest, kMaxWaitSeconds),
      std::chrono::ceil<std::chrono::seconds>(std::max(wait, std::chrono::milliseconds(0)))
          .count());
  request.headers.push_back("Prefer: wait=" + std::to_string(seconds));
  if (known) request.headers.push_back("If-None-Match: " + ObjectEtag(*known));
  request.cancel = cancel;
  request.max_body_bytes = kMaxWatchedBytes;
  WEFT_ASSIGN_OR_RETURN(Reply reply, client_.Request(request));
  const bool waited = reply.Header("preference-applied").rfind("wait=", 0) == 0;
  if (reply.status == 304) {
    if (!known) return DataLoss("GET " + client_.base_url() + request.path + ": 304 for no ETag");
    return ObjectWatch{known, waited};
  }
  if (reply.status == 404) return ObjectWatch{std::nullopt, waited};
  WEFT_RETURN_IF_ERROR(StatusOfReply(reply, "GET " + client_.base_url() + request.path));
  return ObjectWatch{std::string(reply.body.begin(), reply.body.end()), waited};
}

Result<bool> HttpStore::Exists(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("HEAD", "/v1/objects/" + key, {}, false));
  if (reply.status == 404) return false;
  WEFT_RETURN_IF_ERROR(StatusOfReply(reply, "HEAD " + client_.base_url() + "/v1/objects/" + key));
  return true;
}

Result<std::vector<std::string>> HttpStore::List(const std::string& prefix) {
  if (prefix.empty() || prefix.back() != '/') return InvalidArgument("list prefix must end in '/'");
  WEFT_RETURN_IF_ERROR(ValidateKey(prefix.substr(0, prefix.size() - 1)));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("GET", "/v1/list/" + prefix, {}, false));
  WEFT_RETURN_IF_ERROR(StatusOfReply(reply, "GET " + client_.base_url() + "/v1/list/" + prefix));
  Json body = Json::parse(reply.body.begin(), reply.body.end(), nullptr, false);
  if (!body.is_object() || !body.contains("keys") || !body["keys"].is_array()) {
    return DataLoss(client_.base_url() + ": malformed listing");
  }
  std::vector<std::string> keys;
  for (const Json& key : body["keys"]) {
    if (!key.is_string() || !ValidateKey(key.get<std::string>()).ok())
      return DataLoss(client_.base_url() + ": malformed key in listing");
    keys.push_back(key.get<std::string>());
  }
  return keys;
}

Status HttpStore::PutImmutable(const std::string& key, std::span<const uint8_t> bytes) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("PUT", "/v1/objects/" + key, bytes, true));
  return StatusOfReply(reply, "PUT " + client_.base_url() + "/v1/objects/" + key);
}

Status HttpStore::CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                                 const std::string& desired) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  Json body = {{"expected", expected ? Json(*expected) : Json(nullptr)}, {"desired", desired}};
  std::string text = body.dump();
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("POST", "/v1/cas/" + key, TextBytes(text), true));
  return StatusOfReply(reply, "POST " + client_.base_url() + "/v1/cas/" + key);
}

Status HttpStore::Delete(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  WEFT_ASSIGN_OR_RETURN(Reply reply, Request("DELETE", "/v1/objects/" + key, {}, true));
  return StatusOfReply(reply, "DELETE " + client_.base_url() + "/v1/objects/" + key);
}

}  // namespace weft::policy_store
