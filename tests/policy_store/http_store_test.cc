#include "policy_store/http_store.h"
#include "tests/http_test_util.h"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "tests/policy_store/store_test_util.h"

namespace weft::policy_store {
namespace {

// A scripted HTTP server: answers each connection with the next canned response and records the
// requests it saw. "CUT" in a response means: send what came before, then close.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::string> responses) : responses_(std::move(responses)) {
    listener_ = weft::testing::ListenOnLoopback(8, &port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedServer() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void Serve() {
    for (const std::string& response : responses_) {
      int connection = accept(listener_, nullptr, nullptr);
      if (connection < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        ssize_t got = recv(connection, buffer, sizeof(buffer), 0);
        if (got <= 0) break;
        request.append(buffer, static_cast<size_t>(got));
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        requests_.push_back(request);
      }
      const std::string sent = response.substr(0, response.find("CUT"));
      (void)!send(connection, sent.data(), sent.size(), MSG_NOSIGNAL);
      close(connection);
    }
  }
  std::vector<std::string> responses_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::string> requests_;
};

TEST_CASE("HTTP store: a transfer cut midway resumes from the byte it reached") {
  const std::string body(1000, 'a');
  const std::string rest(600, 'b');
  ScriptedServer server({
      "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nETag: \"e1\"\r\nConnection: close\r\n\r\n" +
          std::string(400, 'a') + "CUT",
      "HTTP/1.1 206 Partial Content\r\nContent-Length: 600\r\nContent-Range: bytes "
      "400-999/1000\r\nETag: \"e1\"\r\n"
      "Connection: close\r\n\r\n" +
          rest,
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "", options);
  Result<std::vector<uint8_t>> got = store.Get("blobs/x");
  REQUIRE(got.ok());
  CHECK(std::string(got->begin(), got->end()) == std::string(400, 'a') + rest);
  CHECK(store.resumed() == 1);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[1].find("Range: bytes=400-") != std::string::npos);
  CHECK(requests[1].find("If-Range: \"e1\"") != std::string::npos);
}

TEST_CASE("HTTP store: a range cut midway resumes within the range") {
  const std::string part = std::string(400, 'a') + std::string(600, 'b');
  ScriptedServer server({
      "HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\nContent-Range: bytes "
      "1000-1999/5000\r\nETag: \"e1\"\r\nConnection: close\r\n\r\n" +
          part.substr(0, 400) + "CUT",
      "HTTP/1.1 206 Partial Content\r\nContent-Length: 600\r\nContent-Range: bytes "
      "1400-1999/5000\r\nETag: \"e1\"\r\nConnection: close\r\n\r\n" +
          part.substr(400),
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "", options);
  Result<ObjectRange> got = store.GetRange("blobs/x", 1000, 1000);
  REQUIRE_MESSAGE(got.ok(), got.status().ToString());
  CHECK(std::string(got->bytes.begin(), got->bytes.end()) == part);
  CHECK(got->object_size == 5000);
  CHECK(store.resumed() == 1);
  const auto requests = server.requests();
  REQUIRE(requests.size() == 2);
  CHECK(requests[0].find("Range: bytes=1000-1999") != std::string::npos);
  CHECK(requests[1].find("Range: bytes=1400-1999") != std::string::npos);
  CHECK(requests[1].find("If-Range: \"e1\"") != std::string::npos);
}

TEST_CASE(
    "HTTP store: a resumed object that changed is taken whole; a dead server fails at the "
    "deadline") {
  ScriptedServer server({
      "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: \"old\"\r\nConnection: close\r\n\r\n01234CUT",
      "HTTP/1.1 200 OK\r\nContent-Length: 8\r\nETag: \"new\"\r\nConnection: close\r\n\r\nabcdefgh",
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "", options);
  Result<std::vector<uint8_t>> got = store.Get("runs/r/latest");
  REQUIRE(got.ok());
  CHECK(std::string(got->begin(), got->end()) == "abcdefgh");

  // Nothing listens there any more: retried until the deadline, then a clear error.
  const std::string url = server.url();
  HttpStoreOptions short_deadline;
  short_deadline.first_backoff = std::chrono::milliseconds(50);
  short_deadline.attempts = 1000;
  short_deadline.deadline = std::chrono::milliseconds(600);
  HttpStore gone("http://127.0.0.1:1", "", short_deadline);
  const auto start = std::chrono::steady_clock::now();
  Status status = gone.Get("blobs/x").status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK(status.message().find("gave up after") != std::string::npos);
  CHECK(seconds >= 0.3);
  CHECK(seconds < 30);
}

TEST_CASE("HTTP store: a 4xx answer is final, never retried; a 5xx is retried") {
  auto answer = [](int status, const std::string& reason, const std::string& error) {
    const std::string body = "{\"error\": \"" + error + "\"}";
    return "HTTP/1.1 " + std::to_string(status) + " " + reason +
           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  };
  ScriptedServer server({
      answer(400, "Bad Request", "bad key"),
      answer(404, "Not Found", "no such object"),
      answer(412, "Precondition Failed", "already exists"),
      answer(409, "Conflict", "different bytes"),
      answer(503, "Service Unavailable", "busy"),
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "token", options);
  Status bad = store.Get("runs/a").status();
  CHECK(bad.code() == StatusCode::kInvalidArgument);
  CHECK(bad.message().find("bad key") != std::string::npos);
  CHECK(store.Get("runs/b").status().code() == StatusCode::kNotFound);
  CHECK(store.PutImmutable("runs/c", TextBytes("x")).code() == StatusCode::kInvalidArgument);
  CHECK(store.PutImmutable("runs/d", TextBytes("x")).code() == StatusCode::kConflict);
  CHECK(server.requests().size() == 4);  // one each
  CHECK(store.retries() == 0);
  auto got = store.Get("runs/e");  // 503, then 200
  REQUIRE(got.ok());
  CHECK(std::string(got->begin(), got->end()) == "ok");
  CHECK(store.retries() == 1);
}

TEST_CASE(
    "HTTP store: a 5xx marked final is not retried; it is kDataLoss naming what the server said") {
  const std::string body = "{\"error\": \"blob b arrived with SHA-256 x\"}";
  ScriptedServer server({
      "HTTP/1.1 502 Bad Gateway\r\nX-Weft-Error: blob-hash-mismatch\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body,
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  HttpStore store(server.url(), "", options);
  Result<ObjectRange> refused = store.GetRange("blobs/b", 0, 10);
  CHECK(refused.status().code() == StatusCode::kDataLoss);
  CHECK(refused.status().message().find("arrived with SHA-256 x") != std::string::npos);
  CHECK(store.retries() == 0);
  CHECK(server.requests().size() == 1);
}

TEST_CASE("HTTP store: a huge Content-Length reserves nothing of it; a range takes what it asked") {
  // 1 TiB announced; 300 bytes sent, the rest never comes.
  ScriptedServer server({
      "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\nConnection: close\r\n\r\n" +
          std::string(300, 'x') + "CUT",
      "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\nConnection: close\r\n\r\n" +
          std::string(300, 'y') + "CUT",
  });
  HttpStoreOptions options;
  options.first_backoff = std::chrono::milliseconds(1);
  options.attempts = 1;
  HttpStore store(server.url(), "", options);
  // A range of 100 bytes takes 100, whatever the server goes on sending.
  Result<ObjectRange> range = store.GetRange("blobs/x", 0, 100);
  REQUIRE_MESSAGE(range.ok(), range.status().ToString());
  CHECK(range->bytes == std::vector<uint8_t>(100, 'x'));
  CHECK(range->object_size == uint64_t{1} << 40);
  // A whole read of a body cut short fails as unavailable (no allocation of what was announced).
  Status whole = store.Get("blobs/x").status();
  CHECK(whole.code() == StatusCode::kUnavailable);
  CHECK(whole.message().find("300 bytes had arrived") != std::string::npos);
}

TEST_CASE("HTTP store: a cancelled client stops at once, not at its deadline") {
  // A server that takes connections and never answers.
  uint16_t port = 0;
  const int listener = weft::testing::ListenOnLoopback(8, &port);
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  HttpStoreOptions options;
  options.deadline = std::chrono::seconds(60);
  options.cancel = cancel;
  HttpStore store("http://127.0.0.1:" + std::to_string(port), "", options);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel->store(true);
  });
  const auto start = std::chrono::steady_clock::now();
  Status status = store.Get("blobs/x").status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  canceller.join();
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK(status.message().find("cancelled") != std::string::npos);
  CHECK(seconds < 5);
  // And none starts once it is set.
  CHECK(store.Get("blobs/y").status().message().find("cancelled") != std::string::npos);
  close(listener);
}

}  // namespace
}  // namespace weft::policy_store
