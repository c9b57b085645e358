// The shared HTTP server and client: plain and TLS.
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/http_client.h"
#include "common/http_server.h"
#include "tests/temp_path.h"
#include "tests/tls_test_util.h"

namespace weft {
namespace {

namespace bhttp = boost::beast::http;

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
    auto reply = client.Request("POST", "/v1/echo",
                                {reinterpret_cast<const uint8_t*>(body.data()), body.size()}, {});
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

}  // namespace
}  // namespace weft
