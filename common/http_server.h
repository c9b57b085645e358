// HttpServer: the HTTP/1.1 plumbing every weft server shares (the store server, relays, the
// orchestrator): one listener, one session per connection on its own strand, an io_context run on
// `threads` threads, a deadline on every read and write, header and body size limits.
//
// The handler is called on an I/O thread for each request and must call `respond` exactly once,
// either before it returns or later from any thread (a long poll parks the request and answers
// when there is something to say or its wait is over). Responding to a connection that has closed
// meanwhile does nothing. Requests larger than the limits are answered 413 without calling the
// handler. Start() returns once the port is bound; Stop() (or the destructor) stops the threads,
// closes the listening socket and every connection. With a certificate and key it speaks TLS
// (1.2 or newer) only. Thread-safe, except that Stop() must not race with itself.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/http_server_options.h"
#include "common/status.h"

namespace weft::http {

using Request = boost::beast::http::request<boost::beast::http::vector_body<uint8_t>>;
using Response = boost::beast::http::response<boost::beast::http::vector_body<uint8_t>>;
using Responder = std::function<void(Response)>;
using Handler = std::function<void(Request, Responder)>;

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> Start(const ServerOptions& options, Handler handler);
  ~HttpServer();

  uint16_t port() const;
  // The server's io_context, for timers that belong with it.
  boost::asio::io_context& context();
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A JSON response to `request` (its HTTP version), from a tree or from JSON text, and the JSON
// error body {"error": message} with the status code that fits a Status.
Response JsonResponse(const Request& request, boost::beast::http::status status,
                      const nlohmann::json& body);
Response JsonTextResponse(const Request& request, boost::beast::http::status status,
                          std::string_view text);
Response ErrorResponse(const Request& request, boost::beast::http::status status,
                       const std::string& message);
Response ErrorResponse(const Request& request, const Status& status);
boost::beast::http::status HttpStatusFor(StatusCode code);

// Whether the request's "Authorization: Bearer <token>" equals `token`, compared in constant time
// (both sides hashed first, so the length does not leak either). An empty `token` matches nothing.
bool BearerMatches(const Request& request, const std::string& token);

}  // namespace weft::http
