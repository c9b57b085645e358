#include "policy_store/store_server.h"

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "common/http_server.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using Json = nlohmann::json;
using Request = weft::http::Request;
using Response = weft::http::Response;

using weft::http::ErrorResponse;
using weft::http::JsonResponse;

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

// Writes need the writer token (compared in constant time).
std::optional<Response> CheckWriter(const Shared& shared, const Request& request) {
  if (shared.options.writer_token.empty())
    return ErrorResponse(request, http::status::forbidden, "this store server is read-only");
  if (!weft::http::BearerMatches(request, shared.options.writer_token)) {
    return ErrorResponse(request, http::status::unauthorized,
                         "writes need the writer token (Authorization: Bearer ...)");
  }
  return std::nullopt;
}

Response HandleObject(const Shared& shared, const Request& request, const std::string& key) {
  switch (request.method()) {
    case http::verb::get:
    case http::verb::head: {
      Result<std::vector<uint8_t>> object = shared.backend.Get(key);
      if (!object.ok()) return ErrorResponse(request, object.status());
      const uint64_t size = object->size();
      Response response(http::status::ok, request.version());
      response.set(http::field::content_type, "application/octet-stream");
      response.set(http::field::accept_ranges, "bytes");
      const std::string etag =
          "\"" + (key.rfind("blobs/", 0) == 0 ? key.substr(6) : Sha256Hex(*object)) + "\"";
      response.set(http::field::etag, etag);
      response.set(http::field::cache_control,
                   ImmutableKey(key) ? "public, max-age=31536000, immutable" : "no-cache");
      if (request[http::field::if_none_match] == etag) {
        response.result(http::status::not_modified);
        return response;
      }
      uint64_t first = 0, last = size == 0 ? 0 : size - 1;
      // If-Range: a range of a different version of the object is refused by sending it whole.
      const bool same_object =
          request.count(http::field::if_range) == 0 || request[http::field::if_range] == etag;
      if (request.count(http::field::range) > 0 && same_object) {
        const auto header = request[http::field::range];
        auto range = ParseRange(std::string_view(header.data(), header.size()), size);
        if (!range) {
          Response refused = ErrorResponse(request, http::status::range_not_satisfiable,
                                           "unsatisfiable or unsupported range");
          refused.set(http::field::content_range, "bytes */" + std::to_string(size));
          return refused;
        }
        std::tie(first, last) = *range;
        response.result(http::status::partial_content);
        response.set(http::field::content_range, "bytes " + std::to_string(first) + "-" +
                                                     std::to_string(last) + "/" +
                                                     std::to_string(size));
      }
      if (first == 0 && last + 1 == size) {
        response.body() = std::move(*object);
      } else if (size > 0) {
        response.body().assign(object->begin() + static_cast<long>(first),
                               object->begin() + static_cast<long>(last) + 1);
      }
      response.prepare_payload();
      if (request.method() == http::verb::head) response.body().clear();
      return response;
    }
    case http::verb::put: {
      if (auto refused = CheckWriter(shared, request)) return *refused;
      Status status = shared.backend.PutImmutable(key, request.body());
      if (!status.ok()) return ErrorResponse(request, status);
      return JsonResponse(request, http::status::created, Json{{"key", key}});
    }
    case http::verb::delete_: {
      if (auto refused = CheckWriter(shared, request)) return *refused;
      Status status = shared.backend.Delete(key);
      if (!status.ok()) return ErrorResponse(request, status);
      return JsonResponse(request, http::status::ok, Json{{"key", key}});
    }
    default:
      return ErrorResponse(request, http::status::method_not_allowed,
                           "objects take GET, HEAD, PUT and DELETE");
  }
}

Response Handle(const Shared& shared, const Request& request) {
  try {
    const std::string target(request.target());
    if (target.find_first_of("?%#") != std::string::npos)
      return ErrorResponse(request, http::status::bad_request,
                           "query strings and escapes are not supported");
    if (target == "/livez") return JsonResponse(request, http::status::ok, Json{{"ok", true}});
    if (target == "/v1/stats" && shared.options.stats) {
      return JsonResponse(request, http::status::ok,
                          Json::parse(shared.options.stats(), nullptr, false));
    }
    auto keyed = [&](const std::string& prefix, std::string* key) {
      if (target.rfind(prefix, 0) != 0) return false;
      *key = target.substr(prefix.size());
      return true;
    };
    std::string key;
    if (keyed("/v1/objects/", &key)) {
      Status valid = ValidateKey(key);
      if (!valid.ok()) return ErrorResponse(request, valid);
      return HandleObject(shared, request, key);
    }
    if (keyed("/v1/cas/", &key)) {
      Status valid = ValidateKey(key);
      if (!valid.ok()) return ErrorResponse(request, valid);
      if (request.method() != http::verb::post)
        return ErrorResponse(request, http::status::method_not_allowed,
                             "compare-and-swap takes POST");
      if (auto refused = CheckWriter(shared, request)) return *refused;
      Json body = Json::parse(request.body().begin(), request.body().end(), nullptr, false);
      if (body.is_discarded() || !body.is_object() || !body.contains("desired") ||
          !body["desired"].is_string() || !body.contains("expected") ||
          !(body["expected"].is_null() || body["expected"].is_string()) || body.size() != 2) {
        return ErrorResponse(
            request, http::status::bad_request,
            "expected a JSON object {\"expected\": string or null, \"desired\": string}");
      }
      std::optional<std::string> expected;
      if (body["expected"].is_string()) expected = body["expected"].get<std::string>();
      Status status =
          shared.backend.CompareAndSwap(key, expected, body["desired"].get<std::string>());
      if (!status.ok()) return ErrorResponse(request, status);
      return JsonResponse(request, http::status::ok, Json{{"key", key}});
    }
    if (keyed("/v1/list/", &key)) {
      if (request.method() != http::verb::get)
        return ErrorResponse(request, http::status::method_not_allowed, "listing takes GET");
      Result<std::vector<std::string>> keys = shared.backend.List(key);
      if (!keys.ok()) return ErrorResponse(request, keys.status());
      return JsonResponse(request, http::status::ok, Json{{"keys", *keys}});
    }
    return ErrorResponse(request, http::status::not_found, "no such endpoint: " + target);
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
      impl->server, weft::http::HttpServer::Start(
                        server_options, [shared](Request request, weft::http::Responder respond) {
                          Response response = Handle(*shared, request);
                          respond(std::move(response));
                        }));
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { Stop(); }

uint16_t StoreServer::port() const { return impl_->server->port(); }

void StoreServer::Stop() {
  if (impl_ && impl_->server) impl_->server->Stop();
}

}  // namespace weft::policy_store
