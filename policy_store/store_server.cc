#include "policy_store/store_server.h"

#include <openssl/evp.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include "common/hex.h"
#include "common/http_server.h"
#include "common/json_fields.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using Json = nlohmann::json;
using Request = weft::http::Request;
using RequestHeader = weft::http::RequestHeader;
using Response = weft::http::Response;

using weft::http::ErrorResponse;
using weft::http::JsonResponse;

// The body of a request other than an object's PUT: a compare-and-swap's JSON, or nothing.
constexpr uint64_t kSmallBodyBytes = 64 * 1024;

bool ImmutableKey(const std::string& key) {
  return key.rfind("blobs/", 0) == 0 ||
         (key.rfind("runs/", 0) == 0 && key.find("/versions/") != std::string::npos);
}

// Parses a single "bytes=a-b", "bytes=a-" or "bytes=-n" range against `size`.
std::optional<std::pair<uint64_t, uint64_t>> ParseRange(std::string_view header, uint64_t size) {
  if (header.rfind("bytes=", 0) != 0) return std::nullopt;
  std::string_view spec = header.substr(6);
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos || spec.find(',') != std::string_view::npos)
    return std::nullopt;
  auto number = [](std::string_view text, uint64_t* out) {
    if (text.empty() || text.size() > 19) return false;
    uint64_t value = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    *out = value;
    return true;
  };
  uint64_t first = 0, last = 0;
  if (dash == 0) {  // suffix
    uint64_t suffix;
    if (!number(spec.substr(1), &suffix) || suffix == 0 || size == 0) return std::nullopt;
    first = suffix >= size ? 0 : size - suffix;
    last = size - 1;
  } else {
    if (!number(spec.substr(0, dash), &first)) return std::nullopt;
    if (dash + 1 == spec.size()) {
      last = size == 0 ? 0 : size - 1;
    } else if (!number(spec.substr(dash + 1), &last)) {
      return std::nullopt;
    }
    if (first >= size || last < first) return std::nullopt;
    last = std::min(last, size - 1);
  }
  return std::make_pair(first, last);
}

struct Shared {
  ObjectStore& backend;
  StoreServerOptions options;
};

enum class Endpoint { kLivez, kStats, kObject, kCas, kList };

// What a request's target names: an endpoint, and for objects, compare-and-swap and listings the
// key (a listing's prefix ends in '/').
struct Target {
  Endpoint endpoint;
  std::string key;
};

// The methods each endpoint takes, as its Allow header lists them.
std::string_view AllowedMethods(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kObject:
      return "GET, HEAD, PUT, DELETE";
    case Endpoint::kCas:
      return "POST";
    default:
      return "GET, HEAD";
  }
}

bool Allowed(Endpoint endpoint, http::verb method) {
  switch (endpoint) {
    case Endpoint::kObject:
      return method == http::verb::get || method == http::verb::head || method == http::verb::put ||
             method == http::verb::delete_;
    case Endpoint::kCas:
      return method == http::verb::post;
    default:
      return method == http::verb::get || method == http::verb::head;
  }
}

// A key as the API accepts it: the object-key rules, and no segment starting with '.', which name
// the store's own files (the lock of compare-and-swap, temporary files of writes in progress).
Status ValidateServedKey(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (key.front() == '.' || key.find("/.") != std::string::npos) {
    return InvalidArgument("object key '" + key +
                           "' has a segment starting with '.': such keys are the store's own "
                           "files, not objects");
  }
  return Status::Ok();
}

// The endpoint and key a request names, or the answer that refuses it.
std::variant<Target, Response> ParseTarget(const Shared& shared, const RequestHeader& request) {
  const std::string target(request.target());
  if (target.find_first_of("?%#") != std::string::npos) {
    return ErrorResponse(request, http::status::bad_request,
                         "query strings and escapes are not supported");
  }
  if (target == "/livez") return Target{Endpoint::kLivez, ""};
  if (target == "/v1/stats" && shared.options.stats) return Target{Endpoint::kStats, ""};
  const std::pair<std::string_view, Endpoint> keyed[] = {{"/v1/objects/", Endpoint::kObject},
                                                         {"/v1/cas/", Endpoint::kCas},
                                                         {"/v1/list/", Endpoint::kList}};
  for (const auto& [prefix, endpoint] : keyed) {
    if (target.rfind(prefix, 0) != 0) continue;
    std::string key = target.substr(prefix.size());
    if (endpoint == Endpoint::kList) {
      if (key.empty() || key.back() != '/') {
        return ErrorResponse(request, http::status::bad_request, "a listing's prefix ends in '/'");
      }
      key.pop_back();
    }
    Status valid = ValidateServedKey(key);
    if (!valid.ok()) return ErrorResponse(request, valid);
    if (endpoint == Endpoint::kList) key += '/';
    return Target{endpoint, std::move(key)};
  }
  return ErrorResponse(request, http::status::not_found, "no such endpoint: " + target);
}

// Writes need the writer token (compared in constant time).
std::optional<Response> CheckWriter(const Shared& shared, const RequestHeader& request) {
  if (shared.options.writer_token.empty())
    return ErrorResponse(request, http::status::forbidden, "this store server is read-only");
  if (!weft::http::BearerMatches(request, shared.options.writer_token)) {
    return ErrorResponse(request, http::status::unauthorized,
                         "writes need the writer token (Authorization: Bearer ...)");
  }
  return std::nullopt;
}

// Whether a PUT carries "If-None-Match: *" (store only if the key holds nothing yet).
bool MustCreate(const RequestHeader& request) {
  return request.count(http::field::if_none_match) > 0;
}

// Everything decided from the header, before any of the body is read: the endpoint and key, the
// method, the writer token, the form of a blob's key, a PUT's precondition, the body limit.
std::optional<Response> CheckHeader(const Shared& shared, const RequestHeader& request,
                                    uint64_t* body_limit) {
  std::variant<Target, Response> parsed = ParseTarget(shared, request);
  if (Response* refused = std::get_if<Response>(&parsed)) return std::move(*refused);
  const Target& target = std::get<Target>(parsed);
  if (!Allowed(target.endpoint, request.method())) {
    const std::string_view allow = AllowedMethods(target.endpoint);
    Response refused =
        ErrorResponse(request, http::status::method_not_allowed,
                      std::string(request.target()) + " takes " + std::string(allow));
    refused.set(http::field::allow, std::string(allow));
    return refused;
  }
  const http::verb method = request.method();
  const bool put = target.endpoint == Endpoint::kObject && method == http::verb::put;
  if (put || method == http::verb::delete_ || method == http::verb::post) {
    if (std::optional<Response> refused = CheckWriter(shared, request)) return refused;
  }
  if (!put) {
    *body_limit = std::min(*body_limit, kSmallBodyBytes);
    return std::nullopt;
  }
  if (target.key.rfind("blobs/", 0) == 0 && !IsSha256Hex(std::string_view(target.key).substr(6))) {
    return ErrorResponse(request, http::status::bad_request,
                         "a blob's key is blobs/ and the SHA-256 of its bytes in 64 lowercase "
                         "hex digits, not " +
                             target.key);
  }
  if (MustCreate(request)) {
    if (request[http::field::if_none_match] != "*") {
      return ErrorResponse(request, http::status::bad_request, "a PUT takes only If-None-Match: *");
    }
    Result<bool> exists = shared.backend.Exists(target.key);
    if (!exists.ok()) return ErrorResponse(request, exists.status());
    if (*exists) {
      return ErrorResponse(request, http::status::precondition_failed,
                           target.key + " already exists (If-None-Match: *)");
    }
  }
  return std::nullopt;
}

// An object's PUT: the body streams into a writer of the backend (a temporary file), hashed on
// the way when the key is a blob's, and is stored only once it has arrived whole and matched.
class PutSink : public weft::http::BodySink {
 public:
  PutSink(const Shared& shared, std::string key)
      : key_(std::move(key)),
        writer_(shared.backend.NewImmutableWriter(key_)),
        hash_(key_.rfind("blobs/", 0) == 0 ? EVP_MD_CTX_new() : nullptr) {
    if (hash_ != nullptr) EVP_DigestInit_ex(hash_, EVP_sha256(), nullptr);
  }
  ~PutSink() override { EVP_MD_CTX_free(hash_); }

  Status Write(std::span<const uint8_t> piece) override {
    if (!writer_.ok()) return writer_.status();
    if (hash_ != nullptr) EVP_DigestUpdate(hash_, piece.data(), piece.size());
    return (*writer_)->Write(piece);
  }

  void Finish(const RequestHeader& request, weft::http::Responder respond) override {
    respond(Store(request));
  }

 private:
  Response Store(const RequestHeader& request) {
    if (!writer_.ok()) return ErrorResponse(request, writer_.status());
    if (hash_ != nullptr) {
      unsigned char digest[EVP_MAX_MD_SIZE];
      unsigned int length = 0;
      EVP_DigestFinal_ex(hash_, digest, &length);
      const std::string actual = HexEncode({digest, length});
      const std::string expected = key_.substr(6);
      if (actual != expected) {
        return ErrorResponse(request, http::status::bad_request,
                             key_ + ": the bytes sent hash to " + actual + ", not to " + expected +
                                 " (SHA-256); nothing was stored");
      }
    }
    const bool must_create = MustCreate(request);
    Result<bool> created = (*writer_)->Commit();
    if (!created.ok()) return ErrorResponse(request, created.status());
    if (must_create && !*created) {
      return ErrorResponse(request, http::status::precondition_failed,
                           key_ + " already exists (If-None-Match: *)");
    }
    return JsonResponse(request, http::status::created, Json{{"key", key_}});
  }

  std::string key_;
  Result<std::unique_ptr<ObjectWriter>> writer_;
  EVP_MD_CTX* hash_;
};

// The requests whose body streams to disk: an object's PUT (CheckHeader has let it through).
std::unique_ptr<weft::http::BodySink> RouteBody(const Shared& shared,
                                                const RequestHeader& request) {
  if (request.method() != http::verb::put) return nullptr;
  std::variant<Target, Response> parsed = ParseTarget(shared, request);
  const Target* target = std::get_if<Target>(&parsed);
  if (target == nullptr || target->endpoint != Endpoint::kObject) return nullptr;
  return std::make_unique<PutSink>(shared, target->key);
}

Response GetObject(const Shared& shared, const Request& request, const std::string& key) {
  // A blob's ETag is its name; a range of it is read alone (ranges are how readers fetch parts of
  // a large blob at once). Other objects are small: read whole, ETag from their content.
  const bool blob = key.rfind("blobs/", 0) == 0;
  const std::string range_header =
      request.count(http::field::range) > 0 ? std::string(request[http::field::range]) : "";
  // If-Range: a range of a different version of the object is refused by sending it whole.
  auto same_object = [&](const std::string& etag) {
    return request.count(http::field::if_range) == 0 || request[http::field::if_range] == etag;
  };
  std::optional<ObjectRange> part;
  if (blob && !range_header.empty() && range_header.rfind("bytes=-", 0) != 0 &&
      same_object("\"" + key.substr(6) + "\"")) {
    if (auto wanted = ParseRange(range_header, UINT64_MAX)) {
      Result<ObjectRange> read =
          shared.backend.GetRange(key, wanted->first, wanted->second - wanted->first + 1);
      if (!read.ok()) return ErrorResponse(request, read.status());
      part = std::move(read).value();
    }
  }
  std::vector<uint8_t> object;
  if (!part) {
    Result<std::vector<uint8_t>> whole = shared.backend.Get(key);
    if (!whole.ok()) return ErrorResponse(request, whole.status());
    object = std::move(whole).value();
  }
  const uint64_t size = part ? part->object_size : object.size();
  Response response(http::status::ok, request.version());
  response.set(http::field::content_type, "application/octet-stream");
  response.set(http::field::accept_ranges, "bytes");
  const std::string etag = "\"" + (blob ? key.substr(6) : Sha256Hex(object)) + "\"";
  response.set(http::field::etag, etag);
  response.set(http::field::cache_control,
               ImmutableKey(key) ? "public, max-age=31536000, immutable" : "no-cache");
  if (request[http::field::if_none_match] == etag) {
    response.result(http::status::not_modified);
    return response;
  }
  uint64_t first = 0, last = size == 0 ? 0 : size - 1;
  if (!range_header.empty() && same_object(etag)) {
    auto range = ParseRange(range_header, size);
    if (!range) {
      Response refused = ErrorResponse(request, http::status::range_not_satisfiable,
                                       "unsatisfiable or unsupported range");
      refused.set(http::field::content_range, "bytes */" + std::to_string(size));
      return refused;
    }
    std::tie(first, last) = *range;
    response.result(http::status::partial_content);
    response.set(http::field::content_range, "bytes " + std::to_string(first) + "-" +
                                                 std::to_string(last) + "/" + std::to_string(size));
  }
  if (part) {
    if (part->bytes.size() != last - first + 1) {
      return ErrorResponse(request, DataLoss(key + ": changed while it was read"));
    }
    response.body() = std::move(part->bytes);
  } else if (first == 0 && last + 1 == size) {
    response.body() = std::move(object);
  } else if (size > 0) {
    response.body().assign(object.begin() + static_cast<long>(first),
                           object.begin() + static_cast<long>(last) + 1);
  }
  response.prepare_payload();
  return response;
}

Response CompareAndSwap(const Shared& shared, const Request& request, const std::string& key) {
  Result<Json> parsed = ParseStrict(
      {reinterpret_cast<const char*>(request.body().data()), request.body().size()}, "the body");
  if (!parsed.ok()) return ErrorResponse(request, parsed.status());
  Json body = std::move(parsed).value();
  if (!body.is_object() || !body.contains("desired") || !body["desired"].is_string() ||
      !body.contains("expected") || !(body["expected"].is_null() || body["expected"].is_string()) ||
      body.size() != 2) {
    return ErrorResponse(
        request, http::status::bad_request,
        "expected a JSON object {\"expected\": string or null, \"desired\": string}");
  }
  std::optional<std::string> expected;
  if (body["expected"].is_string()) expected = body["expected"].get<std::string>();
  Status status = shared.backend.CompareAndSwap(key, expected, body["desired"].get<std::string>());
  if (!status.ok()) return ErrorResponse(request, status);
  return JsonResponse(request, http::status::ok, Json{{"key", key}});
}

// Every request but an object's PUT, once CheckHeader has let it through and its body arrived.
Response Handle(const Shared& shared, const Request& request) {
  try {
    std::variant<Target, Response> parsed = ParseTarget(shared, request);
    if (Response* refused = std::get_if<Response>(&parsed)) return std::move(*refused);
    const Target& target = std::get<Target>(parsed);
    switch (target.endpoint) {
      case Endpoint::kLivez:
        return JsonResponse(request, http::status::ok, Json{{"ok", true}});
      case Endpoint::kStats:
        return JsonResponse(request, http::status::ok,
                            Json::parse(shared.options.stats(), nullptr, false));
      case Endpoint::kList: {
        Result<std::vector<std::string>> keys = shared.backend.List(target.key);
        if (!keys.ok()) return ErrorResponse(request, keys.status());
        return JsonResponse(request, http::status::ok, Json{{"keys", *keys}});
      }
      case Endpoint::kCas:
        return CompareAndSwap(shared, request, target.key);
      case Endpoint::kObject:
        if (request.method() == http::verb::delete_) {
          Status status = shared.backend.Delete(target.key);
          if (!status.ok()) return ErrorResponse(request, status);
          return JsonResponse(request, http::status::ok, Json{{"key", target.key}});
        }
        if (request.method() == http::verb::get || request.method() == http::verb::head)
          return GetObject(shared, request, target.key);
        break;  // a PUT streams to a PutSink
    }
    return ErrorResponse(request, http::status::internal_server_error,
                         "request not routed: " + std::string(request.target()));
  } catch (const std::exception& error) {
    return ErrorResponse(request, http::status::internal_server_error, error.what());
  }
}

}  // namespace

struct StoreServer::Impl {
  Impl(ObjectStore& backend, const StoreServerOptions& options) : shared{backend, options} {}
  Shared shared;
  std::unique_ptr<weft::http::HttpServer> server;
};

Result<std::unique_ptr<StoreServer>> StoreServer::Start(ObjectStore& backend,
                                                        const StoreServerOptions& options) {
  auto impl = std::make_unique<Impl>(backend, options);
  weft::http::ServerOptions server_options;
  server_options.address = options.address;
  server_options.port = options.port;
  server_options.max_body_bytes = options.max_body_bytes;
  server_options.threads = options.threads;
  server_options.read_timeout = options.read_timeout;
  const Shared* shared = &impl->shared;
  WEFT_ASSIGN_OR_RETURN(
      impl->server,
      weft::http::HttpServer::Start(
          server_options,
          [shared](Request request, weft::http::Responder respond) {
            respond(Handle(*shared, request));
          },
          [shared](const RequestHeader& request, uint64_t* body_limit) {
            return CheckHeader(*shared, request, body_limit);
          },
          [shared](const RequestHeader& request) { return RouteBody(*shared, request); }));
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { Stop(); }

uint16_t StoreServer::port() const { return impl_->server->port(); }

void StoreServer::Stop() {
  if (impl_ && impl_->server) impl_->server->Stop();
}

}  // namespace weft::policy_store
