#include "common/http_server.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast.hpp>
#include <boost/beast/ssl.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace weft::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

// Whether the server still runs, and the sessions waiting for their handler's answer.
//
// A late answer (from a long poll or a journal callback) must not reach a session whose
// io_context is gone. Nor may a session be destroyed after that: its socket and timer belong to
// the context. So the server, not the responders, owns the sessions that wait for an answer:
// responders hold them weakly, and Stop() releases the waiting ones on its own thread before it
// destroys the context. A responder that outlives the server (parked in a queue, a callback not
// yet run) then holds nothing of the context.
struct Liveness {
  std::mutex mutex;
  bool alive = true;
  std::map<const void*, std::shared_ptr<void>> waiting;  // session -> itself, until answered
};

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One connection: plain (beast::tcp_stream) or TLS (TlsStream, which first shakes hands).
template <typename Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, const ServerOptions& options, const Handler& handler,
          std::shared_ptr<Liveness> liveness)
      : stream_(std::move(stream)),
        options_(options),
        handler_(handler),
        liveness_(std::move(liveness)) {}

  void Run() {
    asio::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->Socket().expires_after(self->options_.read_timeout);
        self->stream_.async_handshake(
            asio::ssl::stream_base::server, [self](beast::error_code error) {
              if (error) return self->Socket().close();  // not TLS, a bad certificate, a timeout
              self->Read();
            });
      } else {
        self->Read();
      }
    });
  }

 private:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  beast::tcp_stream& Socket() { return beast::get_lowest_layer(stream_); }
  std::shared_ptr<Session> Self() { return this->shared_from_this(); }

  void Read() {
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(16 * 1024);
    Socket().expires_after(options_.read_timeout);
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&Session::OnRead, Self()));
  }

  void OnRead(beast::error_code error, size_t) {
    if (error == bhttp::error::body_limit || error == bhttp::error::header_limit) {
      Request request;
      request.version(11);
      return Send(ErrorResponse(request, bhttp::status::payload_too_large,
                                "request larger than the server's limit"),
                  true);
    }
    if (error) return Close();  // end of stream, timeout or a broken connection
    Request request = parser_->release();
    const bool keep_alive = request.keep_alive();
    // No deadline while the handler works (a long poll waits on purpose); the answer comes back
    // on this session's strand, whichever thread gives it.
    Socket().expires_never();
    {
      std::lock_guard<std::mutex> lock(liveness_->mutex);
      liveness_->waiting.emplace(this, Self());
    }
    Responder respond = [weak = std::weak_ptr<Session>(Self()), liveness = liveness_,
                         keep_alive](Response response) {
      std::lock_guard<std::mutex> lock(liveness->mutex);
      if (!liveness->alive) return;
      std::shared_ptr<Session> self = weak.lock();
      if (!self) return;
      liveness->waiting.erase(self.get());  // the posted answer holds it now
      asio::post(self->stream_.get_executor(),
                 [self, keep_alive, response = std::move(response)]() mutable {
                   response.keep_alive(keep_alive);
                   self->Send(std::move(response), !keep_alive);
                 });
    };
    try {
      handler_(std::move(request), std::move(respond));
    } catch (const std::exception& failure) {
      {
        std::lock_guard<std::mutex> lock(liveness_->mutex);
        liveness_->waiting.erase(this);
      }
      Request context;
      context.version(11);
      Send(ErrorResponse(context, bhttp::status::internal_server_error, failure.what()), true);
    }
  }

  void Send(Response response, bool close) {
    response_ = std::make_shared<Response>(std::move(response));
    if (close) response_->keep_alive(false);
    Socket().expires_after(options_.read_timeout);
    bhttp::async_write(stream_, *response_,
                       beast::bind_front_handler(&Session::OnWrite, Self(), close));
  }

  void OnWrite(bool close, beast::error_code error, size_t) {
    if (error || close) return Close();
    response_.reset();
    Read();
  }

  void Close() {
    if constexpr (kTls) {
      // close_notify, then the socket goes with the session (whatever the peer answers).
      Socket().expires_after(options_.read_timeout);
      stream_.async_shutdown([self = Self()](beast::error_code) { self->Socket().close(); });
    } else {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::vector_body<uint8_t>>> parser_;
  std::shared_ptr<Response> response_;
  const ServerOptions& options_;
  const Handler& handler_;
  std::shared_ptr<Liveness> liveness_;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& context, tcp::acceptor acceptor, const ServerOptions& options,
           const Handler& handler, std::shared_ptr<Liveness> liveness, asio::ssl::context* tls)
      : context_(context),
        acceptor_(std::move(acceptor)),
        options_(options),
        handler_(handler),
        liveness_(std::move(liveness)),
        tls_(tls) {}

  void Accept() {
    acceptor_.async_accept(asio::make_strand(context_),
                           beast::bind_front_handler(&Listener::OnAccept, shared_from_this()));
  }
  void Close() {
    beast::error_code ignored;
    acceptor_.close(ignored);
  }

 private:
  void OnAccept(beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted) return;
    if (!error && tls_ != nullptr) {
      std::make_shared<Session<TlsStream>>(TlsStream(std::move(socket), *tls_), options_, handler_,
                                           liveness_)
          ->Run();
    } else if (!error) {
      std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), options_,
                                                   handler_, liveness_)
          ->Run();
    }
    Accept();
  }

  asio::io_context& context_;
  tcp::acceptor acceptor_;
  const ServerOptions& options_;
  const Handler& handler_;
  std::shared_ptr<Liveness> liveness_;
  asio::ssl::context* tls_;
};

// The server side of TLS from a PEM certificate chain and private key, TLS 1.2 or newer.
Result<std::unique_ptr<asio::ssl::context>> TlsContext(const ServerOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return InvalidArgument("TLS needs both a certificate file and a key file");
  }
  if (options.tls_cert_file.empty()) return std::unique_ptr<asio::ssl::context>();
  auto tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
  beast::error_code error;
  tls->use_certificate_chain_file(options.tls_cert_file, error);
  if (error)
    return InvalidArgument("TLS certificate '" + options.tls_cert_file + "': " + error.message());
  tls->use_private_key_file(options.tls_key_file, asio::ssl::context::pem, error);
  if (error) {
    return InvalidArgument("TLS key '" + options.tls_key_file + "': " + error.message() +
                           " (it must be the PEM private key of the certificate '" +
                           options.tls_cert_file + "', and must match it)");
  }
  return tls;
}

}  // namespace

struct HttpServer::Impl {
  Impl(const ServerOptions& options, Handler handler)
      : options(options),
        handler(std::move(handler)),
        context(std::make_unique<asio::io_context>(std::max(1, options.threads))) {}
  ServerOptions options;
  Handler handler;
  // Sessions live in the context's pending handlers: destroying the context closes them all.
  std::unique_ptr<asio::io_context> context;
  std::unique_ptr<asio::ssl::context> tls;  // HTTPS when set
  std::shared_ptr<Listener> listener;
  std::shared_ptr<Liveness> liveness = std::make_shared<Liveness>();
  std::vector<std::thread> threads;
  uint16_t port = 0;
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options,
                                                      Handler handler) {
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  WEFT_ASSIGN_OR_RETURN(impl->tls, TlsContext(options));
  beast::error_code error;
  auto address = asio::ip::make_address(options.address, error);
  if (error)
    return InvalidArgument("cannot listen on '" + options.address + "': not an IP address");
  tcp::acceptor acceptor(*impl->context);
  tcp::endpoint endpoint(address, options.port);
  acceptor.open(endpoint.protocol(), error);
  if (!error) acceptor.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) acceptor.bind(endpoint, error);
  if (!error) acceptor.listen(asio::socket_base::max_listen_connections, error);
  if (error)
    return Unavailable("cannot listen on " + options.address + ":" + std::to_string(options.port) +
                       ": " + error.message());
  impl->port = acceptor.local_endpoint().port();
  impl->listener = std::make_shared<Listener>(*impl->context, std::move(acceptor), impl->options,
                                              impl->handler, impl->liveness, impl->tls.get());
  impl->listener->Accept();
  for (int t = 0; t < std::max(1, options.threads); ++t)
    impl->threads.emplace_back([context = impl->context.get()] { context->run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

uint16_t HttpServer::port() const { return impl_->port; }

boost::asio::io_context& HttpServer::context() { return *impl_->context; }

void HttpServer::Stop() {
  if (!impl_ || !impl_->context) return;
  {
    std::lock_guard<std::mutex> lock(impl_->liveness->mutex);
    impl_->liveness->alive = false;  // late answers are dropped from now on
  }
  // Stop the threads first; then nothing else touches the listener or the sessions, so the
  // listening socket is closed here (new connections are refused at once) and destroying the
  // context destroys every session with its socket.
  impl_->context->stop();
  for (auto& thread : impl_->threads) thread.join();
  impl_->threads.clear();
  impl_->listener->Close();
  impl_->listener.reset();
  std::map<const void*, std::shared_ptr<void>> waiting;
  {
    std::lock_guard<std::mutex> lock(impl_->liveness->mutex);
    waiting.swap(impl_->liveness->waiting);
  }
  waiting.clear();  // sessions still waiting for an answer go here, while their context lives
  impl_->context.reset();
}

bhttp::status HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return bhttp::status::ok;
    case StatusCode::kInvalidArgument:
      return bhttp::status::bad_request;
    case StatusCode::kNotFound:
      return bhttp::status::not_found;
    case StatusCode::kConflict:
      return bhttp::status::conflict;
    case StatusCode::kUnavailable:
      return bhttp::status::service_unavailable;
    case StatusCode::kTimeout:
      return bhttp::status::gateway_timeout;
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
      return bhttp::status::internal_server_error;
  }
  return bhttp::status::internal_server_error;
}

Response JsonResponse(const Request& request, bhttp::status status, const nlohmann::json& body) {
  return JsonTextResponse(request, status, body.dump());
}

Response JsonTextResponse(const Request& request, bhttp::status status, std::string_view text) {
  Response response(status, request.version());
  response.set(bhttp::field::content_type, "application/json");
  response.body().assign(text.begin(), text.end());
  response.prepare_payload();
  return response;
}

Response ErrorResponse(const Request& request, bhttp::status status, const std::string& message) {
  return JsonResponse(request, status, nlohmann::json{{"error", message}});
}

Response ErrorResponse(const Request& request, const Status& status) {
  return ErrorResponse(request, HttpStatusFor(status.code()), status.message());
}

bool BearerMatches(const Request& request, const std::string& token) {
  if (token.empty()) return false;
  const auto header = request[bhttp::field::authorization];
  const std::string prefix = "Bearer ";
  std::string given = header.substr(0, prefix.size()) == prefix
                          ? std::string(header.substr(prefix.size()))
                          : std::string();
  if (given.empty()) return false;
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

}  // namespace weft::http
