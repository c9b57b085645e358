#include "policy_store/http_server.h"

#include <openssl/crypto.h>

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;
using Request = http::request<http::vector_body<uint8_t>>;
using Response = http::response<http::vector_body<uint8_t>>;

http::status HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return http::status::ok;
    case StatusCode::kInvalidArgument: return http::status::bad_request;
    case StatusCode::kNotFound: return http::status::not_found;
    case StatusCode::kConflict: return http::status::conflict;
    case StatusCode::kUnavailable: return http::status::service_unavailable;
    case StatusCode::kTimeout: return http::status::gateway_timeout;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal: return http::status::internal_server_error;
  }
  return http::status::internal_server_error;
}

Response JsonResponse(const Request& request, http::status status, const Json& body) {
  Response response(status, request.version());
  response.set(http::field::content_type, "application/json");
  std::string text = body.dump();
  response.body().assign(text.begin(), text.end());
  response.prepare_payload();
  return response;
}

Response Error(const Request& request, http::status status, const std::string& message) {
  return JsonResponse(request, status, Json{{"error", message}});
}

Response Error(const Request& request, const Status& status) {
  return Error(request, HttpStatusFor(status.code()), status.message());
}

bool ImmutableKey(const std::string& key) {
  return key.rfind("blobs/", 0) == 0 || (key.rfind("runs/", 0) == 0 && key.find("/versions/") != std::string::npos);
}

// Parses a single "bytes=a-b", "bytes=a-" or "bytes=-n" range against `size`.
std::optional<std::pair<uint64_t, uint64_t>> ParseRange(std::string_view header, uint64_t size) {
  if (header.rfind("bytes=", 0) != 0) return std::nullopt;
  std::string_view spec = header.substr(6);
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos || spec.find(',') != std::string_view::npos) return std::nullopt;
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

// Checks the writer token in constant time (both sides hashed, so length does not leak either).
std::optional<Response> CheckWriter(const Shared& shared, const Request& request) {
  if (shared.options.writer_token.empty()) return Error(request, http::status::forbidden, "this store server is read-only");
  std::string header(request[http::field::authorization]);
  const std::string prefix = "Bearer ";
  std::string given = header.rfind(prefix, 0) == 0 ? header.substr(prefix.size()) : std::string();
  std::string a = Sha256Hex({reinterpret_cast<const uint8_t*>(given.data()), given.size()});
  std::string b = Sha256Hex({reinterpret_cast<const uint8_t*>(shared.options.writer_token.data()), shared.options.writer_token.size()});
  if (given.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) != 0) {
    return Error(request, http::status::unauthorized, "writes need the writer token (Authorization: Bearer ...)");
  }
  return std::nullopt;
}

Response HandleObject(const Shared& shared, const Request& request, const std::string& key) {
  switch (request.method()) {
    case http::verb::get:
    case http::verb::head: {
      Result<std::vector<uint8_t>> object = shared.backend.Get(key);
      if (!object.ok()) return Error(request, object.status());
      const uint64_t size = object->size();
      Response response(http::status::ok, request.version());
      response.set(http::field::content_type, "application/octet-stream");
      response.set(http::field::accept_ranges, "bytes");
      const std::string etag = "\"" + (key.rfind("blobs/", 0) == 0 ? key.substr(6) : Sha256Hex(*object)) + "\"";
      response.set(http::field::etag, etag);
      response.set(http::field::cache_control, ImmutableKey(key) ? "public, max-age=31536000, immutable" : "no-cache");
      if (request[http::field::if_none_match] == etag) {
        response.result(http::status::not_modified);
        return response;
      }
      uint64_t first = 0, last = size == 0 ? 0 : size - 1;
      // If-Range: a range of a different version of the object is refused by sending it whole.
      const bool same_object = request.count(http::field::if_range) == 0 || request[http::field::if_range] == etag;
      if (request.count(http::field::range) > 0 && same_object) {
        const auto header = request[http::field::range];
        auto range = ParseRange(std::string_view(header.data(), header.size()), size);
        if (!range) {
          Response refused = Error(request, http::status::range_not_satisfiable, "unsatisfiable or unsupported range");
          refused.set(http::field::content_range, "bytes */" + std::to_string(size));
          return refused;
        }
        std::tie(first, last) = *range;
        response.result(http::status::partial_content);
        response.set(http::field::content_range, "bytes " + std::to_string(first) + "-" + std::to_string(last) + "/" + std::to_string(size));
      }
      if (first == 0 && last + 1 == size) {
        response.body() = std::move(*object);
      } else if (size > 0) {
        response.body().assign(object->begin() + static_cast<long>(first), object->begin() + static_cast<long>(last) + 1);
      }
      response.prepare_payload();
      if (request.method() == http::verb::head) response.body().clear();
      return response;
    }
    case http::verb::put: {
      if (auto refused = CheckWriter(shared, request)) return *refused;
      Status status = shared.backend.PutImmutable(key, request.body());
      if (!status.ok()) return Error(request, status);
      return JsonResponse(request, http::status::created, Json{{"key", key}});
    }
    case http::verb::delete_: {
      if (auto refused = CheckWriter(shared, request)) return *refused;
      Status status = shared.backend.Delete(key);
      if (!status.ok()) return Error(request, status);
      return JsonResponse(request, http::status::ok, Json{{"key", key}});
    }
    default: return Error(request, http::status::method_not_allowed, "objects take GET, HEAD, PUT and DELETE");
  }
}

Response Handle(const Shared& shared, const Request& request) {
  try {
    const std::string target(request.target());
    if (target.find_first_of("?%#") != std::string::npos) return Error(request, http::status::bad_request, "query strings and escapes are not supported");
    if (target == "/livez") return JsonResponse(request, http::status::ok, Json{{"ok", true}});
    if (target == "/v1/stats" && shared.options.stats) {
      return JsonResponse(request, http::status::ok, Json::parse(shared.options.stats(), nullptr, false));
    }
    auto keyed = [&](const std::string& prefix, std::string* key) {
      if (target.rfind(prefix, 0) != 0) return false;
      *key = target.substr(prefix.size());
      return true;
    };
    std::string key;
    if (keyed("/v1/objects/", &key)) {
      Status valid = ValidateKey(key);
      if (!valid.ok()) return Error(request, valid);
      return HandleObject(shared, request, key);
    }
    if (keyed("/v1/cas/", &key)) {
      Status valid = ValidateKey(key);
      if (!valid.ok()) return Error(request, valid);
      if (request.method() != http::verb::post) return Error(request, http::status::method_not_allowed, "compare-and-swap takes POST");
      if (auto refused = CheckWriter(shared, request)) return *refused;
      Json body = Json::parse(request.body().begin(), request.body().end(), nullptr, false);
      if (body.is_discarded() || !body.is_object() || !body.contains("desired") || !body["desired"].is_string() ||
          !body.contains("expected") || !(body["expected"].is_null() || body["expected"].is_string()) || body.size() != 2) {
        return Error(request, http::status::bad_request, "expected a JSON object {\"expected\": string or null, \"desired\": string}");
      }
      std::optional<std::string> expected;
      if (body["expected"].is_string()) expected = body["expected"].get<std::string>();
      Status status = shared.backend.CompareAndSwap(key, expected, body["desired"].get<std::string>());
      if (!status.ok()) return Error(request, status);
      return JsonResponse(request, http::status::ok, Json{{"key", key}});
    }
    if (keyed("/v1/list/", &key)) {
      if (request.method() != http::verb::get) return Error(request, http::status::method_not_allowed, "listing takes GET");
      Result<std::vector<std::string>> keys = shared.backend.List(key);
      if (!keys.ok()) return Error(request, keys.status());
      return JsonResponse(request, http::status::ok, Json{{"keys", *keys}});
    }
    return Error(request, http::status::not_found, "no such endpoint: " + target);
  } catch (const std::exception& error) {
    return Error(request, http::status::internal_server_error, error.what());
  }
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Shared& shared) : stream_(std::move(socket)), shared_(shared) {}

  void Run() { asio::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::Read, shared_from_this())); }

 private:
  void Read() {
    parser_.emplace();
    parser_->body_limit(shared_.options.max_body_bytes);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(shared_.options.read_timeout);
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code error, size_t) {
    if (error == http::error::body_limit || error == http::error::header_limit) {
      Request request;
      request.version(11);
      return Send(Error(request, http::status::payload_too_large, "request larger than the server's limit"), true);
    }
    if (error) return Close();  // end of stream, timeout or a broken connection
    Request request = parser_->release();
    Response response = Handle(shared_, request);
    response.keep_alive(request.keep_alive());
    Send(std::move(response), !request.keep_alive());
  }

  void Send(Response response, bool close) {
    response_ = std::make_shared<Response>(std::move(response));
    if (close) response_->keep_alive(false);
    stream_.expires_after(shared_.options.read_timeout);
    http::async_write(stream_, *response_, beast::bind_front_handler(&Session::OnWrite, shared_from_this(), close));
  }

  void OnWrite(bool close, beast::error_code error, size_t) {
    if (error || close) return Close();
    response_.reset();
    Read();
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::vector_body<uint8_t>>> parser_;
  std::shared_ptr<Response> response_;
  const Shared& shared_;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& context, tcp::acceptor acceptor, const Shared& shared)
      : context_(context), acceptor_(std::move(acceptor)), shared_(shared) {}

  void Accept() {
    acceptor_.async_accept(asio::make_strand(context_), beast::bind_front_handler(&Listener::OnAccept, shared_from_this()));
  }
  void Close() {
    beast::error_code ignored;
    acceptor_.close(ignored);
  }

 private:
  void OnAccept(beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted) return;
    if (!error) std::make_shared<Session>(std::move(socket), shared_)->Run();
    Accept();
  }

  asio::io_context& context_;
  tcp::acceptor acceptor_;
  const Shared& shared_;
};

}  // namespace

struct StoreServer::Impl {
  Impl(ObjectStore& backend, const StoreServerOptions& options)
      : shared{backend, options}, context(std::make_unique<asio::io_context>(std::max(1, options.threads))) {}
  Shared shared;
  // Sessions live in the context's pending handlers: destroying the context closes them all.
  std::unique_ptr<asio::io_context> context;
  std::shared_ptr<Listener> listener;
  std::vector<std::thread> threads;
  uint16_t port = 0;
};

Result<std::unique_ptr<StoreServer>> StoreServer::Start(ObjectStore& backend, const StoreServerOptions& options) {
  auto impl = std::make_unique<Impl>(backend, options);
  beast::error_code error;
  auto address = asio::ip::make_address(options.address, error);
  if (error) return InvalidArgument("cannot listen on '" + options.address + "': not an IP address");
  tcp::acceptor acceptor(*impl->context);
  tcp::endpoint endpoint(address, options.port);
  acceptor.open(endpoint.protocol(), error);
  if (!error) acceptor.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) acceptor.bind(endpoint, error);
  if (!error) acceptor.listen(asio::socket_base::max_listen_connections, error);
  if (error) {
    return Unavailable("cannot listen on " + options.address + ":" + std::to_string(options.port) + ": " + error.message());
  }
  impl->port = acceptor.local_endpoint().port();
  impl->listener = std::make_shared<Listener>(*impl->context, std::move(acceptor), impl->shared);
  impl->listener->Accept();
  for (int t = 0; t < std::max(1, options.threads); ++t) impl->threads.emplace_back([context = impl->context.get()] { context->run(); });
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { Stop(); }

uint16_t StoreServer::port() const { return impl_->port; }

void StoreServer::Stop() {
  if (!impl_ || !impl_->context) return;
  // Stop the threads first; then nothing else touches the listener or the sessions, so the
  // listening socket is closed here (new connections are refused at once) and destroying the
  // context destroys every session with its socket.
  impl_->context->stop();
  for (auto& thread : impl_->threads) thread.join();
  impl_->threads.clear();
  impl_->listener->Close();
  impl_->listener.reset();
  impl_->context.reset();
}

}  // namespace weft::policy_store
