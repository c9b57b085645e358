// HttpServer: the HTTP/1.1 plumbing every weft server shares (the store server, relays, the
// orchestrator): one listener, one session per connection on its own strand, an io_context run on
// `threads` threads, a deadline on every read and write, header and body size limits.
//
// A request is read in two steps. First its header (16 KiB at most, read within `read_timeout`):
// an optional HeaderCheck sees it before any of the body is read, and may answer at once (a wrong
// token, a wrong method, a read-only server) or lower the body limit. Then its body, each piece
// within `read_timeout` of the last (a large upload may take as long as it needs while it
// progresses): into memory for the handler, or, for the requests a BodyRoute picks, streamed to a
// BodySink that never holds it in memory.
//
// The handler is called on an I/O thread for each request and must call `respond` exactly once,
// either before it returns or later from any thread (a long poll parks the request and answers
// when there is something to say or its wait is over). Responding to a connection that has closed
// meanwhile does nothing. The server itself answers, without calling the handler, and then closes
// the connection (reading and discarding, for a few seconds at most, what the client still sends,
// so that it reads the answer rather than a reset):
//   - 400 a malformed request (request line, header field, Content-Length, chunk encoding);
//   - 413 a header or body over its limit;
//   - 501 a Transfer-Encoding other than a lone `chunked` (gzip, or chunked not last);
//   - 500 a handler, check or route that threw.
// Every such answer is the JSON error body of ErrorResponse. Any answer to a HEAD request goes
// without its body (its Content-Length still the body's). A client that sends
// `Expect: 100-continue` gets `100 Continue` once the check has let its request through.
//
// At most ServerOptions::max_connections connections are open at once: a connection past it is
// answered 503 (or closed, with TLS) and counted, with a warning in the log at most every 10
// seconds. When accepting fails for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS,
// ENOMEM), the listener waits before it tries again (10 ms, doubling to 1 s), rather than spin.
//
// Start() returns once the port is bound; Stop() (or the destructor) stops the threads, closes the
// listening socket and every connection. With a certificate and key it speaks TLS (1.2 or newer)
// only. Thread-safe, except that Stop() must not race with itself.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/http_server_options.h"
#include "common/status.h"

namespace weft::http {

using Request = boost::beast::http::request<boost::beast::http::vector_body<uint8_t>>;
using RequestHeader = boost::beast::http::request_header<>;
using Response = boost::beast::http::response<boost::beast::http::vector_body<uint8_t>>;

// A response body produced a piece at a time, for answers too large to hold (an object streamed
// from disk, or from a transfer still under way): see Responder::Stream. Read hands over the next
// bytes by calling `done` exactly once, from any thread (perhaps before it returns), with a span of
// at most `max` bytes that the source owns and keeps valid until its next Read or its destruction
// (at least one byte while the body is not complete), or with an error. Reads are never
// concurrent. A source destroyed while a Read is pending (the connection closed) must keep what
// that Read still uses alive itself; calling `done` then is harmless.
class BodySource {
 public:
  using Done = std::function<void(Result<std::span<const uint8_t>>)>;
  virtual ~BodySource() = default;
  virtual void Read(size_t max, Done done) = 0;
};

// Answers one request, once: with a whole response, or with a header and a streamed body.
// Copyable; a copy answers the same request. Calling it for a connection that has closed meanwhile
// does nothing.
class Responder {
 public:
  using Whole = std::function<void(Response)>;
  using Streamed = std::function<void(Response, uint64_t, std::unique_ptr<BodySource>)>;
  Responder() = default;
  Responder(std::nullptr_t) {}  // none: the request was answered elsewhere
  Responder(Whole whole, Streamed streamed = nullptr)
      : whole_(std::move(whole)), streamed_(std::move(streamed)) {}
  void operator()(Response response) const { whole_(std::move(response)); }
  // `head`'s status and headers with Content-Length `length`, then `length` bytes read from `body`
  // as the connection takes them, a piece of at most kStreamPieceBytes at a time (the memory a
  // streamed answer holds). A HEAD request's answer reads none. If `body` fails, or ends early,
  // the connection is closed before the body is complete: the client sees a transfer cut off.
  void Stream(Response head, uint64_t length, std::unique_ptr<BodySource> body) const;
  explicit operator bool() const { return static_cast<bool>(whole_); }

 private:
  Whole whole_;
  Streamed streamed_;
};

// The largest piece a streamed body is asked for at once.
inline constexpr size_t kStreamPieceBytes = 256 * 1024;

using Handler = std::function<void(Request, Responder)>;
// Called on an I/O thread once a request's header has arrived, before its body is read. Returns
// a response to answer at once without reading the body (the connection is closed after it), or
// nullopt to read the body, up to `*body_limit` bytes (preset to ServerOptions::max_body_bytes;
// the check may lower it). A body over the limit is answered 413 without calling the handler.
using HeaderCheck =
    std::function<std::optional<Response>(const RequestHeader& header, uint64_t* body_limit)>;

// Where the body of a request goes when it must not sit in memory (an upload of gigabytes): a
// BodyRoute, called on the I/O thread after the HeaderCheck let a request through, returns a sink
// for it, or null to read the body into memory for the handler as usual. For a request with a
// sink the server calls Write with each piece of the body, in order, then Finish once the whole
// body has arrived, both on the connection's I/O thread, and never calls the handler: Finish
// answers the request instead, calling `respond` exactly once as a handler does (`header` is valid
// during the call only). The body limit of the check holds: the sink never receives more. If the
// body is over the limit (413), malformed (400) or cut off, or a Write fails (its Status is
// answered with ErrorResponse), Finish is never called, the connection is closed, and the sink is
// destroyed: its destructor must discard whatever it had written.
class BodySink {
 public:
  virtual ~BodySink() = default;
  virtual Status Write(std::span<const uint8_t> piece) = 0;
  virtual void Finish(const RequestHeader& header, Responder respond) = 0;
};
using BodyRoute = std::function<std::unique_ptr<BodySink>(const RequestHeader& header)>;

// What a server's listener saw, for its /metrics.
struct ConnectionStats {
  uint64_t open = 0;           // connections open now
  uint64_t limit = 0;          // max_connections, as resolved
  uint64_t refused = 0;        // refused for being past the limit, since the start
  uint64_t accept_errors = 0;  // accepts that failed (out of descriptors, ...), since the start
};

// The Prometheus lines of `stats`, for a server whose metrics are named `prefix` ("weft_relay"):
// PREFIX_connections_open, PREFIX_connections_limit, PREFIX_connections_refused_total and
// PREFIX_accept_errors_total, each with its HELP and TYPE.
std::string ConnectionMetrics(const std::string& prefix, const ConnectionStats& stats);

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> Start(const ServerOptions& options, Handler handler,
                                                   HeaderCheck check = nullptr);
  // The same, with `route` choosing the requests whose body streams to a sink.
  static Result<std::unique_ptr<HttpServer>> Start(const ServerOptions& options, Handler handler,
                                                   HeaderCheck check, BodyRoute route);
  ~HttpServer();

  uint16_t port() const;
  ConnectionStats connection_stats() const;
  // The server's io_context, for timers that belong with it.
  boost::asio::io_context& context();
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A JSON response to `request` (its HTTP version), from a tree or from JSON text, and the JSON
// error body {"error": message} with the status code that fits a Status. A whole Request converts
// to its RequestHeader.
Response JsonResponse(const RequestHeader& request, boost::beast::http::status status,
                      const nlohmann::json& body);
Response JsonTextResponse(const RequestHeader& request, boost::beast::http::status status,
                          std::string_view text);
Response ErrorResponse(const RequestHeader& request, boost::beast::http::status status,
                       const std::string& message);
Response ErrorResponse(const RequestHeader& request, const Status& status);
// Whether `method` is one of the methods `allow` lists ("GET, HEAD", as an Allow header).
bool MethodAllowed(std::string_view allow, boost::beast::http::verb method);
// 405 with the Allow header `allow` ("GET, HEAD") and the JSON error body `message`.
Response MethodNotAllowed(const RequestHeader& request, std::string_view allow,
                          const std::string& message);
boost::beast::http::status HttpStatusFor(StatusCode code);

// The token of the request's "Authorization: Bearer <token>" ("" without one).
std::string_view BearerToken(const RequestHeader& request);

// A token kept as its SHA-256, so that comparing it takes the same time whatever it is compared
// with (and the length leaks neither). An empty token matches nothing, not even another empty one.
class TokenDigest {
 public:
  TokenDigest() = default;
  explicit TokenDigest(std::string_view token);
  bool Matches(const TokenDigest& given) const;

 private:
  bool set_ = false;
  std::array<unsigned char, 32> digest_{};
};

// Whether the request's bearer token equals `token`, compared as TokenDigests.
bool BearerMatches(const RequestHeader& request, const std::string& token);

}  // namespace weft::http
