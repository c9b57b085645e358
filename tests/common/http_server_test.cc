// The shared HTTP server and client: plain and TLS.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_io.h"
#include "common/http_client.h"
#include "common/http_server.h"
#include "tests/http_test_util.h"
#include "tests/process_stats.h"
#include "tests/temp_path.h"
#include "tests/tls_test_util.h"

namespace weft {
namespace {

namespace bhttp = boost::beast::http;
using testing::RawConnection;
using testing::StatusOf;

std::unique_ptr<http::HttpServer> EchoServer(http::ServerOptions options) {
  auto server =
      http::HttpServer::Start(options, [](http::Request request, http::Responder respond) {
        respond(http::JsonResponse(
            request, bhttp::status::ok,
            {{"path", std::string(request.target())}, {"bytes", request.body().size()}}));
      });
  REQUIRE_MESSAGE(server.ok(), server.status().ToString());
  return std::move(server).value();
}

// The body of the first answer in `text`.
std::string BodyOf(const std::string& text) {
  const size_t end = text.find("\r\n\r\n");
  return end == std::string::npos ? "" : text.substr(end + 4);
}

HttpClientOptions Quick() {
  HttpClientOptions options;
  options.deadline = std::chrono::milliseconds(3000);
  options.first_backoff = std::chrono::milliseconds(20);
  return options;
}

TEST_CASE("HTTPS: a client that trusts the certificate talks to the server; others are refused") {
  const std::string dir = testing::TempPath("tls");
  std::filesystem::create_directories(dir);
  const testing::TestCertificate cert = testing::MakeCertificate(dir, "server");
  http::ServerOptions options;
  options.tls_cert_file = cert.cert;
  options.tls_key_file = cert.key;
  auto server = EchoServer(options);
  const std::string https = "https://127.0.0.1:" + std::to_string(server->port());

  HttpClientOptions trusting = Quick();
  trusting.ca_file = cert.cert;
  HttpClient client(https, trusting);
  const std::string body(100000, 'x');
  for (int i = 0; i < 3; ++i) {  // the connection is kept alive across requests
    auto reply = client.Request("POST", "/v1/echo", TextBytes(body), {});
    REQUIRE_MESSAGE(reply.ok(), reply.status().ToString());
    CHECK(reply->status == 200);
    CHECK(std::string(reply->body.begin(), reply->body.end()) ==
          R"({"bytes":100000,"path":"/v1/echo"})");
  }

  SUBCASE("a client that does not trust it fails at once, saying why") {
    const testing::TestCertificate other = testing::MakeCertificate(dir, "other");
    HttpClientOptions wrong = Quick();
    wrong.ca_file = other.cert;
    auto reply = HttpClient(https, wrong).Request("GET", "/v1/x", {}, {});
    REQUIRE(!reply.ok());
    CHECK(reply.status().message().find("certificate") != std::string::npos);
    CHECK(reply.status().message().find(other.cert) != std::string::npos);
  }
  SUBCASE("plain HTTP to the TLS port gets no answer") {
    HttpClientOptions plain = Quick();
    plain.attempts = 1;
    auto reply = HttpClient("http://127.0.0.1:" + std::to_string(server->port()), plain)
                     .Request("GET", "/v1/x", {}, {});
    CHECK(!(reply.ok() && reply->status == 200));
  }
  server->Stop();
  std::filesystem::remove_all(dir);
}

TEST_CASE("HTTPS: bad certificate settings are clear errors at start") {
  const std::string dir = testing::TempPath("tls_bad");
  std::filesystem::create_directories(dir);
  const testing::TestCertificate a = testing::MakeCertificate(dir, "a");
  const testing::TestCertificate b = testing::MakeCertificate(dir, "b");
  auto start = [](http::ServerOptions options) {
    return http::HttpServer::Start(options, [](http::Request, http::Responder) {}).status();
  };
  http::ServerOptions options;
  options.tls_cert_file = a.cert;
  Status only_cert = start(options);
  CHECK(only_cert.message().find("both a certificate file and a key file") != std::string::npos);
  options.tls_key_file = b.key;
  Status mismatch = start(options);
  INFO(mismatch.message());
  CHECK(mismatch.message().find("must match it") != std::string::npos);
  options.tls_cert_file = dir + "/missing.crt";
  Status missing = start(options);
  CHECK(missing.message().find("missing.crt") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("HTTP: an answer still held when the server stops is harmless to give or drop later") {
  // A long poll parks its responder outside the server; the server stops before it answers.
  std::mutex mutex;
  std::condition_variable parked_cv;
  std::vector<http::Responder> parked;
  auto server = http::HttpServer::Start({}, [&](http::Request, http::Responder respond) {
    std::lock_guard<std::mutex> lock(mutex);
    parked.push_back(std::move(respond));
    parked_cv.notify_all();
  });
  REQUIRE(server.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->port());
  std::thread client([&] {
    HttpClientOptions once = Quick();
    once.attempts = 1;
    (void)HttpClient(url, once).Request("GET", "/v1/wait", {}, {});
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(parked_cv.wait_for(lock, std::chrono::seconds(5), [&] { return parked.size() == 1; }));
  }
  (*server)->Stop();
  server->reset();
  // The connection and its io_context are gone: answering, then dropping the responder, must
  // touch neither (under AddressSanitizer, a session kept alive by the responder would be freed
  // here, after its context).
  http::Request request;
  request.version(11);
  parked[0](http::JsonResponse(request, bhttp::status::ok, {{"late", true}}));
  parked.clear();
  client.join();
}

// A source whose pieces come from another thread: each Read parks its callback for the test.
class ParkedSource : public http::BodySource {
 public:
  explicit ParkedSource(std::function<void(Done)> park) : park_(std::move(park)) {}
  void Read(size_t, Done done) override { park_(std::move(done)); }

 private:
  std::function<void(Done)> park_;
};

TEST_CASE("HTTP: answers and body pieces given from other threads while the server stops") {
  // Answers (whole, or pieces of streamed bodies) arrive on threads of their own at the moment the
  // server stops. Whichever wins, each session named must be let go while its context lives: under
  // AddressSanitizer a session freed after its context is a use after free. Many givers at once,
  // more than there are cores, so that some are preempted while they hold a session.
  constexpr int kConnections = 32, kGivers = 16;
  for (int round = 0; round < 240; ++round) {
    const bool stream = round % 2 == 1;
    CAPTURE(round);
    std::mutex mutex;
    std::condition_variable parked_cv;
    std::vector<std::function<void()>> gives;  // what the givers do, one per connection
    auto server = http::HttpServer::Start({}, [&](http::Request request, http::Responder respond) {
      if (!stream) {
        std::lock_guard<std::mutex> lock(mutex);
        gives.push_back(
            [respond, request] { respond(http::JsonResponse(request, bhttp::status::ok, {})); });
        parked_cv.notify_all();
        return;
      }
      http::Response head(bhttp::status::ok, request.version());
      respond.Stream(std::move(head), 1000, std::make_unique<ParkedSource>([&](auto done) {
                       std::lock_guard<std::mutex> lock(mutex);
                       gives.push_back([done] {
                         static const std::vector<uint8_t> piece(1000, 7);
                         done(std::span<const uint8_t>(piece));
                       });
                       parked_cv.notify_all();
                     }));
    });
    REQUIRE(server.ok());
    const std::string url = "http://127.0.0.1:" + std::to_string((*server)->port());
    std::vector<std::thread> clients;
    for (int c = 0; c < kConnections; ++c) {
      clients.emplace_back([&] {
        HttpClientOptions once = Quick();
        once.attempts = 1;
        (void)HttpClient(url, once).Request("GET", "/", {}, {});
      });
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      REQUIRE(parked_cv.wait_for(lock, std::chrono::seconds(10),
                                 [&] { return gives.size() == kConnections; }));
    }
    std::atomic<bool> go{false};
    std::vector<std::thread> givers;
    for (int g = 0; g < kGivers; ++g) {
      givers.emplace_back([&, g] {
        while (!go.load()) std::this_thread::yield();
        for (size_t i = g; i < gives.size(); i += kGivers) gives[i]();
      });
    }
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(10 * (round % 16)));
    (*server)->Stop();
    for (std::thread& giver : givers) giver.join();
    server->reset();
    for (std::thread& client : clients) client.join();
  }
}

TEST_CASE("HTTP: the plain server answers, and a server that is gone is reported with the URL") {
  auto server = EchoServer({});
  const std::string url = "http://127.0.0.1:" + std::to_string(server->port());
  auto reply = HttpClient(url, Quick()).Request("GET", "/v1/y", {}, {});
  REQUIRE(reply.ok());
  CHECK(reply->status == 200);
  server->Stop();
  HttpClientOptions once = Quick();
  once.deadline = std::chrono::milliseconds(300);
  auto gone = HttpClient(url, once).Request("GET", "/v1/y", {}, {});
  REQUIRE(!gone.ok());
  CHECK(gone.status().message().find(url + "/v1/y") != std::string::npos);
}

// Waits (2 s at most) until `done` holds.
template <typename Done>
bool Eventually(Done done) {
  for (int i = 0; i < 200 && !done(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

TEST_CASE("HTTP: past max_connections a connection is answered 503 at once, and counted") {
  http::ServerOptions options;
  options.max_connections = 3;
  auto server = EchoServer(options);
  CHECK(server->connection_stats().limit == 3);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 3; ++i)
    idle.push_back(std::make_unique<RawConnection>(server->port(), std::chrono::seconds(2)));
  REQUIRE(Eventually([&] { return server->connection_stats().open == 3; }));
  RawConnection extra(server->port(), std::chrono::seconds(2));
  const std::string refused = extra.ReadAll();
  CHECK(StatusOf(refused) == 503);
  CHECK(refused.find("Retry-After: 1") != std::string::npos);
  CHECK(BodyOf(refused).find("connection limit") != std::string::npos);
  CHECK(server->connection_stats().refused == 1);
  const std::string metrics = http::ConnectionMetrics("weft_x", server->connection_stats());
  CHECK(metrics.find("\nweft_x_connections_refused_total 1\n") != std::string::npos);
  CHECK(metrics.find("\nweft_x_connections_open 3\n") != std::string::npos);
  CHECK(metrics.find("# TYPE weft_x_accept_errors_total counter") != std::string::npos);
  // One leaves; the next is served.
  idle.pop_back();
  REQUIRE(Eventually([&] { return server->connection_stats().open == 2; }));
  RawConnection served(server->port(), std::chrono::seconds(2));
  served.Send("GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  CHECK(StatusOf(served.ReadAll()) == 200);
  // The default: the open-file limit less 64.
  rlimit files{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
  auto automatic = EchoServer({});
  if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur > 80)
    CHECK(automatic->connection_stats().limit == files.rlim_cur - 64);
}

TEST_CASE("HTTP: out of descriptors, the listener waits before it accepts again, not spins") {
  // A server in a child process whose descriptors are all taken; connections queue behind it.
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    rlimit files{256, 256};
    setrlimit(RLIMIT_NOFILE, &files);
    http::ServerOptions options;
    options.max_connections = 10000;
    options.threads = 1;
    auto started =
        http::HttpServer::Start(options, [](http::Request request, http::Responder respond) {
          respond(http::JsonResponse(request, bhttp::status::ok, {{"ok", true}}));
        });
    if (!started.ok()) _exit(2);
    const uint16_t port = (*started)->port();
    while (dup(0) >= 0) {
    }
    (void)!write(pipe_fds[1], &port, sizeof(port));
    std::this_thread::sleep_for(std::chrono::seconds(10));
    _exit(0);
  }
  close(pipe_fds[1]);
  uint16_t port = 0;
  REQUIRE(read(pipe_fds[0], &port, sizeof(port)) == sizeof(port));
  close(pipe_fds[0]);
  std::vector<std::unique_ptr<RawConnection>> waiting;
  for (int i = 0; i < 20; ++i)
    waiting.push_back(std::make_unique<RawConnection>(port, std::chrono::milliseconds(100)));
  const double before = testing::CpuSecondsOf(child);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = testing::CpuSecondsOf(child) - before;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  CAPTURE(used);
  // Retrying at once burns a core (about 2 s of CPU in these 2 s); waiting costs next to nothing.
  CHECK(used < 0.3);
}

TEST_CASE("HTTP: the header check answers before the body is read, and sets the body's limit") {
  std::atomic<int> handled{0};
  std::atomic<int> checked{0};
  auto server = http::HttpServer::Start(
      {},
      [&](http::Request request, http::Responder respond) {
        handled++;
        respond(http::JsonResponse(request, bhttp::status::ok, {{"bytes", request.body().size()}}));
      },
      [&](const http::RequestHeader& header,
          uint64_t* body_limit) -> std::optional<http::Response> {
        checked++;
        if (!http::BearerMatches(header, "token"))
          return http::ErrorResponse(header, bhttp::status::unauthorized, "no token");
        *body_limit = 10;
        return std::nullopt;
      });
  REQUIRE(server.ok());
  const uint16_t port = (*server)->port();

  SUBCASE("refused from the header: the 100 MB announced are never waited for") {
    RawConnection connection(port);
    connection.Send("PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100000000\r\n\r\n");
    const std::string answer = connection.ReadAll();
    CHECK(StatusOf(answer) == 401);
    CHECK(BodyOf(answer) == R"({"error":"no token"})");
    CHECK(connection.closed());
    CHECK(handled == 0);
  }
  SUBCASE("the limit the check set: a longer Content-Length is 413 at once") {
    RawConnection connection(port);
    connection.Send(
        "PUT /x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer token\r\nContent-Length: 11\r\n\r\n");
    CHECK(StatusOf(connection.ReadAll()) == 413);
    CHECK(handled == 0);
  }
  SUBCASE("the limit the check set: a longer chunked body is 413 once it passes the limit") {
    RawConnection connection(port);
    connection.Send(
        "PUT /x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer token\r\n"
        "Transfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n");
    const std::string answer = connection.ReadAll();
    CHECK(StatusOf(answer) == 413);
    CHECK(BodyOf(answer).find("limit of 10 bytes") != std::string::npos);
    CHECK(handled == 0);
  }
  SUBCASE("let through: the body is read and handled") {
    RawConnection connection(port);
    connection.Send(
        "PUT /x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer token\r\nConnection: close\r\n"
        "Content-Length: 4\r\n\r\nabcd");
    const std::string answer = connection.ReadAll();
    CHECK(StatusOf(answer) == 200);
    CHECK(BodyOf(answer) == R"({"bytes":4})");
    CHECK(handled == 1);
  }
  SUBCASE("Expect: 100-continue is answered 100 once the header passed, then the request") {
    RawConnection connection(port);
    connection.Send(
        "PUT /x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer token\r\nConnection: close\r\n"
        "Expect: 100-continue\r\nContent-Length: 4\r\n\r\n");
    CHECK(connection.ReadSome() == "HTTP/1.1 100 Continue\r\n\r\n");
    connection.Send("abcd");
    CHECK(StatusOf(connection.ReadAll()) == 200);
    CHECK(handled == 1);
  }
  CHECK(checked == 1);
}

// A body sink that keeps what it is given, and reports how it went.
struct SinkLog {
  std::mutex mutex;
  std::string bytes;
  int pieces = 0;
  int finished = 0;
  int destroyed = 0;
};

class RecordingSink : public http::BodySink {
 public:
  explicit RecordingSink(std::shared_ptr<SinkLog> log) : log_(std::move(log)) {}
  ~RecordingSink() override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->destroyed++;
  }
  Status Write(std::span<const uint8_t> piece) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->bytes.append(piece.begin(), piece.end());
    log_->pieces++;
    if (log_->bytes.find("FAIL") != std::string::npos) return Unavailable("the disk is full");
    return Status::Ok();
  }
  void Finish(const http::RequestHeader& header, http::Responder respond) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->finished++;
    respond(http::JsonResponse(header, bhttp::status::created, {{"bytes", log_->bytes.size()}}));
  }

 private:
  std::shared_ptr<SinkLog> log_;
};

TEST_CASE("HTTP: a body routed to a sink streams to it in pieces, within the limit") {
  auto log = std::make_shared<SinkLog>();
  std::atomic<int> handled{0};
  http::ServerOptions options;
  options.max_body_bytes = 4 << 20;
  auto server = http::HttpServer::Start(
      options,
      [&](http::Request request, http::Responder respond) {
        handled++;
        respond(http::JsonResponse(request, bhttp::status::ok, {{"memory", true}}));
      },
      nullptr,
      [&](const http::RequestHeader& header) -> std::unique_ptr<http::BodySink> {
        if (header.method() != bhttp::verb::put) return nullptr;
        return std::make_unique<RecordingSink>(log);
      });
  REQUIRE(server.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->port());

  std::string body(3 << 20, 'x');
  for (size_t i = 0; i < body.size(); i += 4093) body[i] = static_cast<char>('a' + i % 26);
  // (A generous deadline: under a sanitizer, three megabytes in pieces take a while.)
  HttpClientOptions patient = Quick();
  patient.deadline = std::chrono::seconds(60);
  auto reply = HttpClient(url, patient).Request("PUT", "/up", TextBytes(body), {});
  REQUIRE_MESSAGE(reply.ok(), reply.status().ToString());
  CHECK(reply->status == 201);
  {
    std::lock_guard<std::mutex> lock(log->mutex);
    CHECK(log->bytes == body);
    CHECK(log->pieces > 1);
    CHECK(log->finished == 1);
    CHECK(log->destroyed == 1);
  }
  CHECK(handled == 0);
  // Other requests still go to the handler, in memory.
  auto other = HttpClient(url, Quick()).Request("POST", "/other", {}, {});
  REQUIRE(other.ok());
  CHECK(other->status == 200);
  CHECK(handled == 1);

  SUBCASE("a chunked body over the limit: 413, the sink dropped without Finish") {
    // The answer is read while the body is still being sent: the server answers once the limit
    // is passed, and closes soon after (a slow sender could otherwise meet a reset instead).
    RawConnection connection((*server)->port(), std::chrono::seconds(30));
    std::string answer;
    std::thread reader([&] { answer = connection.ReadAll(); });
    connection.Send("PUT /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
    const std::string chunk(1 << 20, 'y');
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
    for (int i = 0; i < 5; ++i) connection.Send(size + chunk + "\r\n");
    reader.join();
    CHECK(StatusOf(answer) == 413);
  }
  SUBCASE("a Write that fails: its error is the answer, the sink dropped without Finish") {
    RawConnection connection((*server)->port());
    connection.Send("PUT /up HTTP/1.1\r\nHost: h\r\nContent-Length: 8\r\n\r\nabcdFAIL");
    const std::string answer = connection.ReadAll();
    CHECK(StatusOf(answer) == 503);
    CHECK(BodyOf(answer) == R"({"error":"the disk is full"})");
  }
  SUBCASE("a body cut off: no answer, the sink dropped without Finish") {
    RawConnection connection((*server)->port());
    connection.Send("PUT /up HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabcd");
  }
  // The session lets go of its sink once it ends (under a sanitizer, that takes a while).
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lock(log->mutex);
      if (log->destroyed == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::lock_guard<std::mutex> lock(log->mutex);
  CHECK(log->finished == 1);
  CHECK(log->destroyed == 2);
  CHECK(handled == 1);
}

// A source that gives `left` bytes of a pattern (byte i is i * 7 % 251), at most `max` a piece,
// each from a thread of its own.
class PatternSource : public http::BodySource {
 public:
  explicit PatternSource(uint64_t length) : left_(length) {}
  void Read(size_t max, Done done) override {
    const size_t size = static_cast<size_t>(std::min<uint64_t>(max, left_));
    piece_.resize(size);
    for (size_t i = 0; i < size; ++i) piece_[i] = static_cast<uint8_t>((offset_ + i) * 7 % 251);
    offset_ += size;
    left_ -= size;
    std::thread([this, done] { done(std::span<const uint8_t>(piece_)); }).detach();
  }

 private:
  uint64_t left_, offset_ = 0;
  std::vector<uint8_t> piece_;
};

TEST_CASE("HTTPS: bodies streamed both ways in pieces, and HEAD, over one kept-alive connection") {
  const std::string dir = testing::TempPath("tls_stream");
  std::filesystem::create_directories(dir);
  const testing::TestCertificate cert = testing::MakeCertificate(dir, "server");
  auto log = std::make_shared<SinkLog>();
  constexpr uint64_t kAnswerBytes = 5 << 20;  // several pieces of a streamed answer
  http::ServerOptions options;
  options.tls_cert_file = cert.cert;
  options.tls_key_file = cert.key;
  options.max_body_bytes = 4 << 20;
  auto server = http::HttpServer::Start(
      options,
      [&](http::Request request, http::Responder respond) {
        http::Response head(bhttp::status::ok, request.version());
        respond.Stream(std::move(head), kAnswerBytes,
                       std::make_unique<PatternSource>(kAnswerBytes));
      },
      nullptr,
      [&](const http::RequestHeader& header) -> std::unique_ptr<http::BodySink> {
        if (header.method() != bhttp::verb::put) return nullptr;
        return std::make_unique<RecordingSink>(log);
      });
  REQUIRE_MESSAGE(server.ok(), server.status().ToString());
  HttpClientOptions trusting = Quick();
  trusting.ca_file = cert.cert;
  trusting.deadline = std::chrono::seconds(60);  // megabytes in pieces, under a sanitizer
  HttpClient client("https://127.0.0.1:" + std::to_string((*server)->port()), trusting);

  std::string body(3 << 20, 'x');
  for (size_t i = 0; i < body.size(); i += 4093) body[i] = static_cast<char>('a' + i % 26);
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    auto up = client.Request("PUT", "/up", TextBytes(body), {});
    REQUIRE_MESSAGE(up.ok(), up.status().ToString());
    CHECK(up->status == 201);
    auto down = client.Request("GET", "/down", {}, {});
    REQUIRE_MESSAGE(down.ok(), down.status().ToString());
    CHECK(down->status == 200);
    REQUIRE(down->body.size() == kAnswerBytes);
    bool same = true;
    for (size_t i = 0; i < down->body.size() && same; ++i)
      same = down->body[i] == static_cast<uint8_t>(i * 7 % 251);
    CHECK(same);
    auto head = client.Request("HEAD", "/down", {}, {});
    REQUIRE_MESSAGE(head.ok(), head.status().ToString());
    CHECK(head->status == 200);
    CHECK(head->body.empty());
  }
  {
    std::lock_guard<std::mutex> lock(log->mutex);
    CHECK(log->bytes == body + body);
    CHECK(log->pieces > 2);
    CHECK(log->finished == 2);
  }
  (*server)->Stop();
  std::filesystem::remove_all(dir);
}

TEST_CASE("HTTP: a malformed request is answered 400 with a JSON error, then closed") {
  std::atomic<int> handled{0};
  auto server = http::HttpServer::Start({}, [&](http::Request request, http::Responder respond) {
    handled++;
    respond(http::JsonResponse(request, bhttp::status::ok, {{"ok", true}}));
  });
  REQUIRE(server.ok());
  for (const char* malformed : {
           "NOT A REQUEST\r\n\r\n",
           "GET /x HTTP/1.1\r\nHost h\r\n\r\n",               // a field without a colon
           "GET /x HTTP/1.1\r\nContent-Length: 12x\r\n\r\n",  // a bad length
           "GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
           "PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
           "PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
       }) {
    CAPTURE(malformed);
    RawConnection connection((*server)->port());
    connection.Send(malformed);
    const std::string answer = connection.ReadAll();
    CHECK(StatusOf(answer) == 400);
    CHECK(BodyOf(answer).rfind(R"({"error":"malformed request: )", 0) == 0);
    CHECK(answer.find("Connection: close") != std::string::npos);
    CHECK(connection.closed());
  }
  CHECK(handled == 0);
  // An answer that echoes bytes that are not UTF-8 (here the encoding named) is still an answer,
  // and the server lives on.
  {
    RawConnection connection((*server)->port());
    connection.Send(
        "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\xff\r\nContent-Length: 0\r\n\r\n");
    CHECK(StatusOf(connection.ReadAll()) == 501);
  }
  RawConnection alive((*server)->port());
  alive.Send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(StatusOf(alive.ReadSome()) == 200);
}

TEST_CASE("HTTP: a Transfer-Encoding other than a lone chunked is answered 501 unhandled") {
  std::atomic<int> handled{0};
  auto server = http::HttpServer::Start({}, [&](http::Request request, http::Responder respond) {
    handled++;
    respond(http::JsonResponse(request, bhttp::status::ok, {{"bytes", request.body().size()}}));
  });
  REQUIRE(server.ok());
  for (const char* coding : {"gzip", "gzip, chunked", "chunked, gzip", "identity"}) {
    CAPTURE(coding);
    RawConnection connection((*server)->port());
    connection.Send(std::string("PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: ") + coding +
                    "\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    const std::string answer = connection.ReadAll();
    CHECK(StatusOf(answer) == 501);
    CHECK(BodyOf(answer).find("is not supported (only chunked)") != std::string::npos);
    CHECK(connection.closed());
  }
  CHECK(handled == 0);
  RawConnection chunked((*server)->port());
  chunked.Send(
      "PUT /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n0\r\n\r\n");
  const std::string answer = chunked.ReadAll();
  CHECK(StatusOf(answer) == 200);
  CHECK(BodyOf(answer) == R"({"bytes":5})");
}

TEST_CASE("HTTP: the answer to a HEAD has the headers of the GET and no body") {
  auto server = EchoServer({});
  RawConnection connection(server->port());
  connection.Send(
      "HEAD /abc HTTP/1.1\r\nHost: h\r\n\r\nGET /abc HTTP/1.1\r\nHost: h\r\n"
      "Connection: close\r\n\r\n");
  const std::string answers = connection.ReadAll();
  const std::string get = R"({"bytes":0,"path":"/abc"})";
  // The HEAD's answer ends at its header; the GET's follows at once.
  const size_t first_end = answers.find("\r\n\r\n");
  REQUIRE(first_end != std::string::npos);
  CHECK(answers.substr(0, first_end).find("Content-Length: " + std::to_string(get.size())) !=
        std::string::npos);
  CHECK(answers.substr(first_end + 4, 8) == "HTTP/1.1");
  CHECK(answers.substr(answers.size() - get.size()) == get);
}

}  // namespace
}  // namespace weft
