#include "common/http_server.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/resource.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast.hpp>
#include <boost/beast/ssl.hpp>
#include <condition_variable>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"

namespace weft::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

constexpr uint32_t kHeaderLimit = 16 * 1024;
// How long a connection that is being closed with part of its request unread is drained, so that
// the client reads the answer instead of a reset (closing a socket with unread data resets it).
constexpr std::chrono::seconds kLingerLimit{5};
constexpr size_t kDrainBytes = 16 * 1024;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// What the server calls: the handler, and the optional header check and body route.
struct Hooks {
  Handler handler;
  HeaderCheck check;
  BodyRoute route;
};

// Whether the server still runs, and the sessions waiting for their handler's answer.
//
// A late answer (from a long poll or a journal callback) must not reach a session whose
// io_context is gone. Nor may a session be destroyed after that: its socket and timer belong to
// the context. So the server, not the responders, owns the sessions that wait for an answer:
// responders hold them weakly, and Stop() releases the waiting ones on its own thread before it
// destroys the context. A responder that outlives the server (parked in a queue, a callback not
// yet run) then holds nothing of the context. A responder that took its session back before
// Stop() (to post what came to the session's thread) holds it until it has posted: Stop() waits for
// those before it stops the context, so no session outlives the context on another thread.
struct Liveness {
  Mutex mutex;
  bool alive GUARDED_BY(mutex) = true;
  // session -> itself, until answered
  std::map<const void*, std::shared_ptr<void>> waiting GUARDED_BY(mutex);
  int delivering GUARDED_BY(mutex) = 0;  // responders that hold a session taken back, posting
  std::condition_variable delivered;     // delivering fell to 0
  // The connections: open now (sessions alive), the limit, and what the listener refused.
  std::atomic<uint64_t> open{0};
  uint64_t limit = 0;
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> accept_errors{0};
};

// The connection limit a server runs with: `configured`, or the open-file limit less 64.
uint64_t ConnectionLimit(uint32_t configured) {
  if (configured > 0) return configured;
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) return 65536;
  return std::max<uint64_t>(16, files.rlim_cur > 64 ? files.rlim_cur - 64 : 0);
}

// A warning at most every 10 seconds per `last` (the steady clock's count when last said).
bool TimeToWarn(std::atomic<int64_t>& last) {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t previous = last.load();
  const int64_t gap =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::seconds(10))
          .count();
  if (previous != 0 && now - previous < gap) return false;
  return last.compare_exchange_strong(previous, now);
}

// A connection's stream, plain TCP or TLS, whose reads and writes complete through one handler
// type.
//
// Beast's HTTP operations call a stream's async_read_some and async_write_some with a handler of
// their own type, one per operation and completion handler in the session, and instantiate the
// stream's operations for each. Here those complete through Completion, a move-only type-erased
// handler: the TCP and TLS operations are instantiated once for reads and once for writes, and
// the session's HTTP operations once, over this one stream type, whether the server speaks TLS or
// not (instantiating them over both stream types took a third of this file's compile time, and
// the TLS operations per handler had taken two thirds before that). The cost is one allocation
// per read or write, next to a system call. Reads and writes keep their contract (each moves
// some bytes of the buffers); a write passes the buffers on whole, so the socket still gathers
// them in one system call and the TLS layer small pieces into one record.
class Connection {
 public:
  using executor_type = beast::tcp_stream::executor_type;

  // TLS when `tls` is given (the connection then first shakes hands).
  Connection(tcp::socket socket, asio::ssl::context* tls) {
    if (tls != nullptr) {
      tls_.emplace(std::move(socket), *tls);
    } else {
      plain_.emplace(std::move(socket));
    }
  }

  bool tls() const { return tls_.has_value(); }
  executor_type get_executor() { return next_layer().get_executor(); }
  // For beast::get_lowest_layer: the TCP stream, with its deadlines (under the TLS layer if any).
  beast::tcp_stream& next_layer() { return tls_ ? tls_->next_layer() : *plain_; }

  // TLS only.
  template <typename Handler>
  void async_handshake(asio::ssl::stream_base::handshake_type type, Handler&& handler) {
    tls_->async_handshake(type, std::forward<Handler>(handler));
  }
  template <typename Handler>
  void async_shutdown(Handler&& handler) {
    tls_->async_shutdown(std::forward<Handler>(handler));
  }

  template <typename MutableBuffers, typename Handler>
  void async_read_some(const MutableBuffers& buffers, Handler&& handler) {
    ReadSome(First(buffers), Erase(std::forward<Handler>(handler)));
  }
  template <typename ConstBuffers, typename Handler>
  void async_write_some(const ConstBuffers& buffers, Handler&& handler) {
    std::vector<asio::const_buffer> pieces;
    for (const asio::const_buffer piece : beast::buffers_range_ref(buffers)) {
      if (piece.size() > 0) pieces.push_back(piece);
    }
    WriteSome(std::move(pieces), Erase(std::forward<Handler>(handler)));
  }

 private:
  // A handler of any type, called once with the operation's result on the executor it is bound
  // to (that of the handler it holds, or the stream's strand).
  class Completion {
   public:
    template <typename Handler>
    explicit Completion(Handler handler)
        : held_(std::make_unique<Held<Handler>>(std::move(handler))) {}
    void operator()(beast::error_code error, size_t bytes) {
      std::unique_ptr<Base> held = std::move(held_);
      held->Call(error, bytes);
    }

   private:
    struct Base {
      virtual ~Base() = default;
      virtual void Call(beast::error_code error, size_t bytes) = 0;
    };
    template <typename Handler>
    struct Held final : Base {
      explicit Held(Handler h) : handler(std::move(h)) {}
      void Call(beast::error_code error, size_t bytes) override {
        Handler h = std::move(handler);
        h(error, bytes);
      }
      Handler handler;
    };
    std::unique_ptr<Base> held_;
  };
  using Bound = asio::executor_binder<Completion, executor_type>;

  template <typename Handler>
  Bound Erase(Handler&& handler) {
    executor_type executor = asio::get_associated_executor(handler, get_executor());
    return asio::bind_executor(std::move(executor),
                               Completion(std::decay_t<Handler>(std::forward<Handler>(handler))));
  }
  // A read fills the first buffer with room (as a TLS read does whatever it is given).
  template <typename MutableBuffers>
  static asio::mutable_buffer First(const MutableBuffers& buffers) {
    for (const asio::mutable_buffer piece : beast::buffers_range_ref(buffers)) {
      if (piece.size() > 0) return piece;
    }
    return {};
  }

  void ReadSome(asio::mutable_buffer buffer, Bound completion) {
    if (tls_) return tls_->async_read_some(buffer, std::move(completion));
    plain_->async_read_some(buffer, std::move(completion));
  }
  void WriteSome(std::vector<asio::const_buffer> pieces, Bound completion) {
    if (tls_) return tls_->async_write_some(pieces, std::move(completion));
    plain_->async_write_some(pieces, std::move(completion));
  }

  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
};

// The body type of a request streamed to a BodySink: the parser hands each piece of the body
// (chunk encoding removed) to the sink as it arrives, and keeps none of it.
struct SinkBody {
  struct value_type {
    BodySink* sink = nullptr;
    Status failure;  // what a failed Write said
  };
  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(bhttp::header<isRequest, Fields>&, value_type& body) : body_(body) {}
    void init(const boost::optional<uint64_t>&, beast::error_code& error) { error = {}; }
    template <class ConstBufferSequence>
    size_t put(const ConstBufferSequence& buffers, beast::error_code& error) {
      size_t taken = 0;
      for (const asio::const_buffer piece : beast::buffers_range_ref(buffers)) {
        Status written =
            body_.sink->Write({static_cast<const uint8_t*>(piece.data()), piece.size()});
        if (!written.ok()) {
          body_.failure = std::move(written);
          error = boost::system::errc::make_error_code(boost::system::errc::io_error);
          return taken;
        }
        taken += piece.size();
      }
      error = {};
      return taken;
    }
    void finish(beast::error_code& error) { error = {}; }

   private:
    value_type& body_;
  };
};

// Whether a read failed because the request breaks HTTP/1.1's syntax (answered 400), rather than
// because the connection ended, stalled or broke (closed without an answer).
bool Malformed(const beast::error_code& error) {
  static constexpr bhttp::error kSyntax[] = {
      bhttp::error::bad_line_ending,    bhttp::error::bad_method,
      bhttp::error::bad_target,         bhttp::error::bad_version,
      bhttp::error::bad_field,          bhttp::error::bad_value,
      bhttp::error::bad_content_length, bhttp::error::bad_transfer_encoding,
      bhttp::error::bad_chunk,          bhttp::error::bad_chunk_extension,
      bhttp::error::bad_obs_fold};
  for (bhttp::error syntax : kSyntax) {
    if (error == syntax) return true;
  }
  return false;
}

// The Transfer-Encoding of a request, if it is one the server cannot decode: anything but a lone
// "chunked" (gzip, "gzip, chunked", or chunked not last).
std::optional<std::string> UnsupportedTransferEncoding(const RequestHeader& header) {
  auto [first, last] = header.equal_range(bhttp::field::transfer_encoding);
  if (first == last) return std::nullopt;
  std::string all;
  int codings = 0;
  bool chunked = true;
  for (auto field = first; field != last; ++field) {
    if (!all.empty()) all += ", ";
    all += std::string(field->value());
    for (const auto coding : bhttp::token_list(field->value())) {
      ++codings;
      chunked = chunked && beast::iequals(coding, "chunked");
    }
  }
  if (codings == 1 && chunked) return std::nullopt;
  return all;
}

// An answer being streamed from a BodySource. (At namespace scope: clang does not take a nested
// class with default member initialisers for default-constructible until the enclosing class is
// complete.)
struct StreamedAnswer {
  std::optional<bhttp::response<bhttp::buffer_body>> response;
  std::optional<bhttp::response_serializer<bhttp::buffer_body>> serializer;
  std::unique_ptr<BodySource> source;
  uint64_t left = 0;  // bytes of the body still to be asked for
  bool close = false;
};

// One connection, plain or TLS (which first shakes hands).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, asio::ssl::context* tls, const ServerOptions& options,
          const Hooks& hooks, std::shared_ptr<Liveness> liveness)
      : stream_(std::move(socket), tls),
        options_(options),
        hooks_(hooks),
        liveness_(std::move(liveness)) {
    liveness_->open.fetch_add(1);
  }
  ~Session() { liveness_->open.fetch_sub(1); }

  void Run() {
    asio::dispatch(stream_.get_executor(), [self = Self()] {
      if (self->stream_.tls()) {
        self->Socket().expires_after(self->options_.read_timeout);
        self->stream_.async_handshake(
            asio::ssl::stream_base::server, [self](beast::error_code error) {
              if (error) return self->Socket().close();  // not TLS, a bad certificate, a timeout
              self->ReadHeader();
            });
      } else {
        self->ReadHeader();
      }
    });
  }

 private:
  beast::tcp_stream& Socket() { return beast::get_lowest_layer(stream_); }
  std::shared_ptr<Session> Self() { return shared_from_this(); }

  // The header, within one read deadline; the body limit is applied once the check has set it.
  void ReadHeader() {
    header_parser_.emplace();
    header_parser_->header_limit(kHeaderLimit);
    // No limit yet (boost::none would be taken for a limit of 0 by Boost 1.74's parser).
    header_parser_->body_limit(std::numeric_limits<uint64_t>::max());
    version_ = 11;
    head_ = false;
    Socket().expires_after(options_.read_timeout);
    bhttp::async_read_header(stream_, buffer_, *header_parser_,
                             beast::bind_front_handler(&Session::OnHeader, Self()));
  }

  void OnHeader(beast::error_code error, size_t) {
    if (error) return Refuse(error);
    const RequestHeader& header = header_parser_->get();
    version_ = header.version();
    head_ = header.method() == bhttp::verb::head;
    if (std::optional<std::string> coding = UnsupportedTransferEncoding(header)) {
      return Answer(Error(bhttp::status::not_implemented,
                          "Transfer-Encoding '" + *coding + "' is not supported (only chunked)"));
    }
    body_limit_ = options_.max_body_bytes;
    try {
      if (hooks_.check) {
        std::optional<Response> answer = hooks_.check(header, &body_limit_);
        if (answer) return Answer(std::move(*answer));
      }
      const boost::optional<uint64_t> length = header_parser_->content_length();
      if (length && *length > body_limit_) return Answer(BodyTooLarge());
      if (hooks_.route) sink_ = hooks_.route(header);
    } catch (const std::exception& failure) {
      return Answer(Error(bhttp::status::internal_server_error, failure.what()));
    }
    if (!header_parser_->is_done() && version_ >= 11 &&
        beast::iequals(header[bhttp::field::expect], "100-continue")) {
      Socket().expires_after(options_.read_timeout);
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = Self()](beast::error_code error, size_t) {
                          if (error) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    if (sink_) {
      sink_parser_.emplace(std::move(*header_parser_));
      sink_parser_->body_limit(body_limit_);
      sink_parser_->get().body().sink = sink_.get();
    } else {
      body_parser_.emplace(std::move(*header_parser_));
      body_parser_->body_limit(body_limit_);
    }
    header_parser_.reset();
    ReadSomeBody();
  }

  bool BodyDone() const { return sink_parser_ ? sink_parser_->is_done() : body_parser_->is_done(); }

  // The body a piece at a time, each within the read deadline: an upload may take as long as it
  // needs while it progresses.
  void ReadSomeBody() {
    if (BodyDone()) return Dispatch();
    Socket().expires_after(options_.read_timeout);
    auto next = beast::bind_front_handler(&Session::OnBody, Self());
    if (sink_parser_) {
      bhttp::async_read_some(stream_, buffer_, *sink_parser_, std::move(next));
    } else {
      bhttp::async_read_some(stream_, buffer_, *body_parser_, std::move(next));
    }
  }

  void OnBody(beast::error_code error, size_t) {
    if (!error) return ReadSomeBody();
    if (sink_parser_ && !sink_parser_->get().body().failure.ok())
      return Answer(Error(sink_parser_->get().body().failure));
    Refuse(error);
  }

  // Hands the complete request to the handler, or to its sink.
  void Dispatch() {
    // No deadline while the handler works (a long poll waits on purpose); the answer comes back
    // on this session's strand, whichever thread gives it.
    Socket().expires_never();
    try {
      if (sink_parser_) {
        sink_->Finish(sink_parser_->get(), Waiting(sink_parser_->get().keep_alive()));
      } else {
        Request request = body_parser_->release();
        Responder respond = Waiting(request.keep_alive());
        hooks_.handler(std::move(request), std::move(respond));
      }
    } catch (const std::exception& failure) {
      {
        MutexLock lock(liveness_->mutex);
        liveness_->waiting.erase(this);
      }
      Send(Error(bhttp::status::internal_server_error, failure.what()), true, false);
    }
  }

  // The responder for the request being handled; the server holds the session until it answers.
  Responder Waiting(bool keep_alive) {
    Hold();
    auto whole = [weak = std::weak_ptr<Session>(Self()), liveness = liveness_,
                  keep_alive](Response response) {
      Deliver(weak, liveness, [&](std::shared_ptr<Session> self) {
        asio::post(self->stream_.get_executor(),
                   [self, keep_alive, response = std::move(response)]() mutable {
                     response.keep_alive(keep_alive);
                     self->Send(std::move(response), !keep_alive, false);
                   });
      });
    };
    auto streamed = [weak = std::weak_ptr<Session>(Self()), liveness = liveness_, keep_alive](
                        Response head, uint64_t length, std::unique_ptr<BodySource> body) {
      Deliver(weak, liveness, [&](std::shared_ptr<Session> self) {
        asio::post(self->stream_.get_executor(), [self, keep_alive, head = std::move(head), length,
                                                  body = std::move(body)]() mutable {
          head.keep_alive(keep_alive);
          self->SendStreamed(std::move(head), length, std::move(body), !keep_alive);
        });
      });
    };
    return Responder(std::move(whole), std::move(streamed));
  }

  // The server holds the session while it waits for something from another thread (an answer, a
  // piece of a streamed body), so that Stop() can release it while its context still runs.
  void Hold() {
    MutexLock lock(liveness_->mutex);
    liveness_->waiting.emplace(this, Self());
  }
  // What came for a held session (an answer, a piece of a body), acted on with the session taken
  // back: `act` gets it and posts to its thread. Nothing is done when the server stopped or the
  // session is gone. Stop() waits for the acts under way: the session taken back must not be let
  // go on this thread after the context is destroyed.
  template <typename Act>
  static void Deliver(const std::weak_ptr<Session>& weak, const std::shared_ptr<Liveness>& liveness,
                      Act&& act) {
    std::shared_ptr<Session> self;
    {
      MutexLock lock(liveness->mutex);
      if (!liveness->alive) return;
      self = weak.lock();
      if (!self) return;
      liveness->waiting.erase(self.get());  // what is posted next holds it now
      ++liveness->delivering;
    }
    act(std::move(self));
    MutexLock lock(liveness->mutex);
    if (--liveness->delivering == 0) liveness->delivered.notify_all();
  }

  // An answer whose body comes from a BodySource: the header, then a piece at a time, each asked
  // for once the last is written (so a slow client holds one piece, however large the body).
  void SendStreamed(Response head, uint64_t length, std::unique_ptr<BodySource> body, bool close) {
    if (head_ || length == 0) {
      head.body().clear();
      head.content_length(length);
      return Send(std::move(head), close, false);
    }
    header_parser_.reset();
    body_parser_.reset();
    sink_parser_.reset();
    sink_.reset();
    streamed_.emplace();
    streamed_->response.emplace(std::move(head.base()));
    streamed_->response->content_length(length);
    if (close) streamed_->response->keep_alive(false);
    streamed_->response->body().data = nullptr;
    streamed_->response->body().more = true;
    streamed_->serializer.emplace(*streamed_->response);
    streamed_->left = length;
    streamed_->source = std::move(body);
    streamed_->close = close;
    Socket().expires_after(options_.read_timeout);
    bhttp::async_write_header(stream_, *streamed_->serializer,
                              [self = Self()](beast::error_code error, size_t) {
                                if (error) return self->Close();
                                self->NextPiece();
                              });
  }

  void NextPiece() {
    StreamedAnswer& streamed = *streamed_;
    if (streamed.left == 0) {
      streamed.response->body().data = nullptr;
      streamed.response->body().size = 0;
      streamed.response->body().more = false;
      Socket().expires_after(options_.read_timeout);
      bhttp::async_write(stream_, *streamed.serializer,
                         [self = Self()](beast::error_code error, size_t) {
                           const bool close = self->streamed_->close;
                           self->streamed_.reset();
                           self->OnWrite(close, false, error, 0);
                         });
      return;
    }
    // No deadline while the source works (it may wait for an upstream transfer, with a deadline
    // of its own); the piece's write has one.
    Socket().expires_never();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(streamed.left, kStreamPieceBytes));
    Hold();
    streamed.source->Read(want, [weak = std::weak_ptr<Session>(Self()), liveness = liveness_,
                                 want](Result<std::span<const uint8_t>> piece) {
      Deliver(weak, liveness, [&](std::shared_ptr<Session> self) {
        asio::post(self->stream_.get_executor(),
                   [self, want, piece = std::move(piece)] { self->OnPiece(want, piece); });
      });
    });
  }

  void OnPiece(size_t want, const Result<std::span<const uint8_t>>& piece) {
    if (!streamed_) return;
    if (!piece.ok() || piece->empty() || piece->size() > want) {
      // The body cannot be completed: the client must see a transfer cut off, not a short one.
      streamed_.reset();
      return CloseNow();
    }
    StreamedAnswer& streamed = *streamed_;
    streamed.response->body().data = const_cast<uint8_t*>(piece->data());
    streamed.response->body().size = piece->size();
    streamed.response->body().more = true;
    streamed.left -= piece->size();
    Socket().expires_after(options_.read_timeout);
    bhttp::async_write(stream_, *streamed.serializer,
                       [self = Self()](beast::error_code error, size_t) {
                         if (error == bhttp::error::need_buffer) error = {};
                         if (error || !self->streamed_) {
                           self->streamed_.reset();
                           return self->CloseNow();
                         }
                         self->NextPiece();
                       });
  }

  Response Error(bhttp::status status, const std::string& message) const {
    RequestHeader context;
    context.version(version_);
    return ErrorResponse(context, status, message);
  }
  Response Error(const Status& status) const {
    return Error(HttpStatusFor(status.code()), status.message());
  }
  Response BodyTooLarge() const {
    return Error(
        bhttp::status::payload_too_large,
        "request body larger than the server's limit of " + std::to_string(body_limit_) + " bytes");
  }

  // A read that failed: answered when the request was at fault, closed otherwise.
  void Refuse(beast::error_code error) {
    if (error == bhttp::error::header_limit) {
      return Answer(Error(bhttp::status::payload_too_large,
                          "request header larger than the server's limit of " +
                              std::to_string(kHeaderLimit) + " bytes"));
    }
    if (error == bhttp::error::body_limit) return Answer(BodyTooLarge());
    if (Malformed(error)) {
      return Answer(Error(bhttp::status::bad_request, "malformed request: " + error.message()));
    }
    Close();  // end of stream, timeout or a broken connection
  }

  // Answers before the request has been read whole, then closes the connection.
  void Answer(Response response) { Send(std::move(response), true, true); }

  // `linger`: part of the request may still be on its way; drain it before closing.
  void Send(Response response, bool close, bool linger) {
    header_parser_.reset();
    body_parser_.reset();
    sink_parser_.reset();
    sink_.reset();
    response_ = std::make_shared<Response>(std::move(response));
    if (close) response_->keep_alive(false);
    if (head_) {
      // The headers of the answer a GET would get: Content-Length still the body's.
      if (response_->count(bhttp::field::content_length) == 0) response_->prepare_payload();
      response_->body().clear();
    }
    Socket().expires_after(options_.read_timeout);
    bhttp::async_write(stream_, *response_,
                       beast::bind_front_handler(&Session::OnWrite, Self(), close, linger));
  }

  void OnWrite(bool close, bool linger, beast::error_code error, size_t) {
    if (error) return Close();
    if (close) return linger ? Linger() : Close();
    response_.reset();
    ReadHeader();
  }

  // Reads and drops what the client still sends, until it closes or for kLingerLimit at most.
  void Linger() {
    if (!stream_.tls()) {
      beast::error_code ignored;
      Socket().socket().shutdown(tcp::socket::shutdown_send, ignored);  // the answer is complete
    }
    Socket().expires_after(
        std::min<std::chrono::steady_clock::duration>(options_.read_timeout, kLingerLimit));
    drain_ = std::make_unique<char[]>(kDrainBytes);
    Drain();
  }
  void Drain() {
    stream_.async_read_some(asio::buffer(drain_.get(), kDrainBytes),
                            [self = Self()](beast::error_code error, size_t) {
                              if (error) return self->Close();
                              self->Drain();
                            });
  }

  // Ends the connection at once, whatever was being sent (a body that cannot be completed).
  void CloseNow() {
    beast::error_code ignored;
    Socket().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close();
  }

  void Close() {
    if (stream_.tls()) {
      // close_notify, then the socket goes with the session (whatever the peer answers).
      Socket().expires_after(options_.read_timeout);
      stream_.async_shutdown([self = Self()](beast::error_code) { self->Socket().close(); });
    } else {
      beast::error_code ignored;
      Socket().socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
  }

  Connection stream_;
  beast::flat_buffer buffer_;
  unsigned version_ = 11;  // of the request being read, for the answers the server gives
  bool head_ = false;      // whether it is a HEAD, whose answer has no body
  uint64_t body_limit_ = 0;
  std::optional<bhttp::request_parser<bhttp::empty_body>> header_parser_;
  std::optional<bhttp::request_parser<bhttp::vector_body<uint8_t>>> body_parser_;
  std::optional<bhttp::request_parser<SinkBody>> sink_parser_;
  std::unique_ptr<BodySink> sink_;
  std::shared_ptr<Response> response_;
  std::optional<StreamedAnswer> streamed_;
  std::unique_ptr<char[]> drain_;
  const ServerOptions& options_;
  const Hooks& hooks_;
  std::shared_ptr<Liveness> liveness_;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& context, tcp::acceptor acceptor, const ServerOptions& options,
           const Hooks& hooks, std::shared_ptr<Liveness> liveness, asio::ssl::context* tls)
      : context_(context),
        acceptor_(std::move(acceptor)),
        retry_(context),
        options_(options),
        hooks_(hooks),
        liveness_(std::move(liveness)),
        tls_(tls) {}

  void Accept() {
    acceptor_.async_accept(asio::make_strand(context_),
                           beast::bind_front_handler(&Listener::OnAccept, shared_from_this()));
  }
  void Close() {
    beast::error_code ignored;
    acceptor_.close(ignored);
    retry_.cancel();
  }

 private:
  static constexpr std::chrono::milliseconds kFirstBackoff{10};
  static constexpr std::chrono::milliseconds kLastBackoff{1000};

  void OnAccept(beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted) return;
    if (error) {
      liveness_->accept_errors.fetch_add(1);
      // Out of descriptors or memory: accepting again at once would fail again at once (the
      // pending connection stays in the backlog), so wait, longer each time.
      const bool starved = error == asio::error::no_descriptors ||
                           error == boost::system::errc::too_many_files_open_in_system ||
                           error == asio::error::no_buffer_space || error == asio::error::no_memory;
      if (!starved) return Accept();
      backoff_ = std::clamp(backoff_ * 2, kFirstBackoff, kLastBackoff);
      if (TimeToWarn(last_warning_)) {
        WEFT_LOG(kWarning) << "HTTP server on port " << acceptor_.local_endpoint(error).port()
                           << ": cannot accept a connection (" << error.message() << ") with "
                           << liveness_->open.load()
                           << " open; trying again in at most 1 s (raise the open-file limit, "
                              "ulimit -n, or lower max_connections)";
      }
      retry_.expires_after(backoff_);
      retry_.async_wait([self = shared_from_this()](beast::error_code waited) {
        if (!waited) self->Accept();
      });
      return;
    }
    backoff_ = std::chrono::milliseconds(0);
    if (liveness_->open.load() >= liveness_->limit) {
      RefuseOverLimit(std::move(socket));
      return Accept();
    }
    // Answers go out at once: a small answer must not wait for the peer's delayed ACK.
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Session>(std::move(socket), tls_, options_, hooks_, liveness_)->Run();
    Accept();
  }

  // A connection past the limit: a 503 written without waiting (plain HTTP; a TLS client gets
  // the connection closed), then closed.
  void RefuseOverLimit(tcp::socket socket) {
    const uint64_t refused = liveness_->refused.fetch_add(1) + 1;
    if (TimeToWarn(last_warning_)) {
      WEFT_LOG(kWarning) << "HTTP server on port " << socket.local_endpoint().port() << ": "
                         << liveness_->open.load() << " connections open, at its limit of "
                         << liveness_->limit << " (max_connections); new connections are refused "
                         << "with 503 until some close (" << refused << " refused so far)";
    }
    beast::error_code ignored;
    if (tls_ == nullptr) {
      static const std::string kAnswer = [] {
        const std::string body =
            R"({"error":"too many connections: the server is at its connection limit; retry later"})";
        return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
               "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
      }();
      socket.non_blocking(true, ignored);
      socket.write_some(asio::buffer(kAnswer), ignored);
      socket.shutdown(tcp::socket::shutdown_send, ignored);
      // What the client already sent is read and dropped, so that closing does not reset the
      // connection before it reads the answer.
      char drain[4096];
      while (socket.available(ignored) > 0 && !ignored)
        socket.read_some(asio::buffer(drain), ignored);
    }
    socket.close(ignored);
  }

  asio::io_context& context_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::chrono::milliseconds backoff_{0};
  std::atomic<int64_t> last_warning_{0};
  const ServerOptions& options_;
  const Hooks& hooks_;
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
  Impl(const ServerOptions& options, Hooks hooks)
      : options(options),
        hooks(std::move(hooks)),
        context(std::make_unique<asio::io_context>(std::max(1, options.threads))) {}
  ServerOptions options;
  Hooks hooks;
  // Sessions live in the context's pending handlers: destroying the context closes them all.
  std::unique_ptr<asio::io_context> context;
  std::unique_ptr<asio::ssl::context> tls;  // HTTPS when set
  std::shared_ptr<Listener> listener;
  std::shared_ptr<Liveness> liveness = std::make_shared<Liveness>();
  std::vector<std::thread> threads;
  uint16_t port = 0;
};

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options, Handler handler,
                                                      HeaderCheck check) {
  return Start(options, std::move(handler), std::move(check), nullptr);
}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options, Handler handler,
                                                      HeaderCheck check, BodyRoute route) {
  auto impl = std::make_unique<Impl>(options,
                                     Hooks{std::move(handler), std::move(check), std::move(route)});
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
  impl->liveness->limit = ConnectionLimit(options.max_connections);
  impl->listener = std::make_shared<Listener>(*impl->context, std::move(acceptor), impl->options,
                                              impl->hooks, impl->liveness, impl->tls.get());
  impl->listener->Accept();
  for (int t = 0; t < std::max(1, options.threads); ++t)
    impl->threads.emplace_back([context = impl->context.get()] { context->run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

uint16_t HttpServer::port() const { return impl_->port; }

ConnectionStats HttpServer::connection_stats() const {
  const Liveness& l = *impl_->liveness;
  return {l.open.load(), l.limit, l.refused.load(), l.accept_errors.load()};
}

std::string ConnectionMetrics(const std::string& prefix, const ConnectionStats& stats) {
  std::string text;
  auto line = [&](const std::string& name, const char* type, const char* help, uint64_t value) {
    text += "# HELP " + prefix + "_" + name + " " + help + "\n# TYPE " + prefix + "_" + name + " " +
            type + "\n" + prefix + "_" + name + " " + std::to_string(value) + "\n";
  };
  line("connections_open", "gauge", "HTTP connections open now.", stats.open);
  line("connections_limit", "gauge", "The most HTTP connections open at once (max_connections).",
       stats.limit);
  line("connections_refused_total", "counter",
       "HTTP connections refused (503) for being past the limit.", stats.refused);
  line("accept_errors_total", "counter",
       "Failed accepts of HTTP connections (out of descriptors or memory, ...).",
       stats.accept_errors);
  return text;
}

boost::asio::io_context& HttpServer::context() { return *impl_->context; }

void HttpServer::Stop() {
  if (!impl_ || !impl_->context) return;
  {
    Liveness& liveness = *impl_->liveness;
    MutexLock lock(liveness.mutex);
    liveness.alive = false;  // late answers are dropped from now on
    // Answers that came just before are being posted; they let their sessions go at once.
    liveness.delivered.wait(lock.native(),
                            [&]() REQUIRES(liveness.mutex) { return liveness.delivering == 0; });
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
    MutexLock lock(impl_->liveness->mutex);
    waiting.swap(impl_->liveness->waiting);
  }
  waiting.clear();  // sessions still waiting for an answer go here, while their context lives
  impl_->context.reset();
}

void Responder::Stream(Response head, uint64_t length, std::unique_ptr<BodySource> body) const {
  if (streamed_) return streamed_(std::move(head), length, std::move(body));
  // A responder without a connection behind it that can stream (a test's own).
  RequestHeader context;
  context.version(head.version());
  (*this)(ErrorResponse(context, bhttp::status::internal_server_error,
                        "this responder cannot stream a body"));
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

Response JsonResponse(const RequestHeader& request, bhttp::status status,
                      const nlohmann::json& body) {
  // Strings may echo what a client sent (a key, a path): bytes that are not UTF-8 are replaced,
  // never thrown over.
  return JsonTextResponse(request, status,
                          body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

Response JsonTextResponse(const RequestHeader& request, bhttp::status status,
                          std::string_view text) {
  Response response(status, request.version());
  response.set(bhttp::field::content_type, "application/json");
  response.body().assign(text.begin(), text.end());
  response.prepare_payload();
  return response;
}

Response ErrorResponse(const RequestHeader& request, bhttp::status status,
                       const std::string& message) {
  return JsonResponse(request, status, nlohmann::json{{"error", message}});
}

Response ErrorResponse(const RequestHeader& request, const Status& status) {
  return ErrorResponse(request, HttpStatusFor(status.code()), status.message());
}

bool MethodAllowed(std::string_view allow, bhttp::verb method) {
  const auto name = bhttp::to_string(method);
  for (const auto item : bhttp::token_list(beast::string_view(allow.data(), allow.size()))) {
    if (item == name) return true;
  }
  return false;
}

Response MethodNotAllowed(const RequestHeader& request, std::string_view allow,
                          const std::string& message) {
  Response response = ErrorResponse(request, bhttp::status::method_not_allowed, message);
  response.set(bhttp::field::allow, std::string(allow));
  return response;
}

std::string_view BearerToken(const RequestHeader& request) {
  const auto field = request[bhttp::field::authorization];
  const std::string_view header(field.data(), field.size());
  return header.starts_with("Bearer ") ? header.substr(7) : std::string_view();
}

TokenDigest::TokenDigest(std::string_view token) : set_(!token.empty()) {
  static_assert(sizeof(digest_) == SHA256_DIGEST_LENGTH);
  if (set_)
    SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest_.data());
}

bool TokenDigest::Matches(const TokenDigest& given) const {
  return set_ && given.set_ && CRYPTO_memcmp(digest_.data(), given.digest_.data(), 32) == 0;
}

bool BearerMatches(const RequestHeader& request, const std::string& token) {
  return TokenDigest(token).Matches(TokenDigest(BearerToken(request)));
}

}  // namespace weft::http
