#include "policy_store/s3_signer.h"
#include "tests/http_test_util.h"

#include <curl/curl.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/byte_io.h"
#include "policy_store/manifest.h"
#include "tests/source_dir.h"

namespace weft::policy_store::s3 {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Hash(const std::string& text) { return Sha256Hex(TextBytes(text)); }

// "a=b&c" as decoded (name, value) pairs.
std::vector<std::pair<std::string, std::string>> ParseQuery(const std::string& query) {
  std::vector<std::pair<std::string, std::string>> items;
  size_t start = 0;
  while (start < query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string item = query.substr(start, end - start);
    const size_t equals = item.find('=');
    items.emplace_back(UriDecode(item.substr(0, equals)),
                       equals == std::string::npos ? "" : UriDecode(item.substr(equals + 1)));
    start = end + 1;
  }
  return items;
}

// One case of the published suite: the request as an HTTP text, signed with its context.
struct Case {
  SigningInput input;
  Credentials credentials;
};

Case LoadCase(const fs::path& dir) {
  Case c;
  Json context = Json::parse(ReadFile(dir / "context.json"));
  c.credentials.access_key = context["credentials"]["access_key_id"];
  c.credentials.secret_key = context["credentials"]["secret_access_key"];
  const bool token = context["credentials"].contains("token");
  c.input.region = context["region"];
  c.input.service = context["service"];
  std::string stamp = context["timestamp"];  // 2015-08-30T12:36:00Z
  std::string date;
  for (char ch : stamp)
    if (ch != '-' && ch != ':') date.push_back(ch);
  c.input.amz_date = date;

  const std::string request = ReadFile(dir / "request.txt");
  std::istringstream in(request);
  std::string line;
  std::getline(in, line);
  const size_t space = line.find(' ');
  const size_t last = line.rfind(' ');
  c.input.method = line.substr(0, space);
  std::string target = line.substr(space + 1, last - space - 1);
  const size_t question = target.find('?');
  const std::string path = target.substr(0, question);
  if (question != std::string::npos) c.input.query = ParseQuery(target.substr(question + 1));
  c.input.path = UriEncode(UriDecode(path), true);
  std::vector<std::pair<std::string, std::string>>& headers = c.input.headers;
  while (std::getline(in, line) && !line.empty()) {
    if ((line[0] == ' ' || line[0] == '\t') && !headers.empty()) {
      headers.back().second += "\n" + line;  // a folded value
      continue;
    }
    const size_t colon = line.find(':');
    headers.emplace_back(line.substr(0, colon), line.substr(colon + 1));
  }
  std::string body;
  for (std::string rest; std::getline(in, rest);) body += (body.empty() ? "" : "\n") + rest;
  c.input.payload_hash = Hash(body);
  if (context.value("sign_body", false))
    headers.emplace_back("x-amz-content-sha256", c.input.payload_hash);
  if (token) {
    c.credentials.session_token = context["credentials"]["token"];
    headers.emplace_back("x-amz-security-token", c.credentials.session_token);
  }
  headers.emplace_back("x-amz-date", c.input.amz_date);
  return c;
}

std::string Trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

TEST_CASE("SigV4: every applicable case of the published test suite") {
  const fs::path root = fs::path(weft::testing::TestDataDir()) / "sigv4";
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    CAPTURE(entry.path().filename().string());
    Case c = LoadCase(entry.path());
    const Signature signature = SignV4(c.input, c.credentials);
    CHECK(signature.canonical_request ==
          Trimmed(ReadFile(entry.path() / "header-canonical-request.txt")));
    CHECK(signature.string_to_sign ==
          Trimmed(ReadFile(entry.path() / "header-string-to-sign.txt")));
    CHECK(signature.signature == Trimmed(ReadFile(entry.path() / "header-signature.txt")));
    ++cases;
  }
  CHECK(cases >= 28);
}

// The examples of the S3 API reference ("Signature Calculations for the Authorization Header").
TEST_CASE("SigV4: the S3 API reference's examples") {
  Credentials credentials{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  const std::string empty = Hash("");
  SigningInput get;
  get.method = "GET";
  get.path = "/test.txt";
  get.region = "us-east-1";
  get.amz_date = "20130524T000000Z";
  get.payload_hash = empty;
  get.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                 {"Range", "bytes=0-9"},
                 {"x-amz-content-sha256", empty},
                 {"x-amz-date", "20130524T000000Z"}};
  Signature signature = SignV4(get, credentials);
  CHECK(signature.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  CHECK(signature.authorization ==
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");

  SigningInput put = get;
  put.method = "PUT";
  put.path = UriEncode("/test$file.text", true);
  CHECK(put.path == "/test%24file.text");
  put.payload_hash = Hash("Welcome to Amazon S3.");
  put.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                 {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                 {"x-amz-content-sha256", put.payload_hash},
                 {"x-amz-date", "20130524T000000Z"},
                 {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  CHECK(SignV4(put, credentials).signature ==
        "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");

  SigningInput lifecycle = get;
  lifecycle.path = "/";
  lifecycle.query = {{"lifecycle", ""}};
  lifecycle.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                       {"x-amz-content-sha256", empty},
                       {"x-amz-date", "20130524T000000Z"}};
  CHECK(SignV4(lifecycle, credentials).signature ==
        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");

  SigningInput list = lifecycle;
  list.query = {{"prefix", "J"}, {"max-keys", "2"}};  // given unsorted
  CHECK(CanonicalQuery(list.query) == "max-keys=2&prefix=J");
  CHECK(SignV4(list, credentials).signature ==
        "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST_CASE("SigV4: URI encoding, queries and dates as S3 signs them") {
  CHECK(UriEncode("a b/c~d_e.f-g", true) == "a%20b/c~d_e.f-g");
  CHECK(UriEncode("a b/c", false) == "a%20b%2Fc");
  CHECK(UriEncode("x+y=z&\xe1\x88\xb4", false) == "x%2By%3Dz%26%E1%88%B4");
  CHECK(UriDecode("a%20b%2Fc%e1%88%B4%zz%") == "a b/c\xe1\x88\xb4%zz%");
  CHECK(CanonicalQuery({{"uploads", ""}}) == "uploads=");
  CHECK(
      CanonicalQuery({{"prefix", "runs/r/"}, {"list-type", "2"}, {"continuation-token", "a+b="}}) ==
      "continuation-token=a%2Bb%3D&list-type=2&prefix=runs%2Fr%2F");
  // Sorted by name, then by value.
  CHECK(CanonicalQuery({{"b", "2"}, {"a", "z"}, {"b", "1"}}) == "a=z&b=1&b=2");
  CHECK(AmzDate(std::chrono::system_clock::from_time_t(1440938160)) == "20150830T123600Z");
}

TEST_CASE("SigV4: the secret and the token never appear in what is sent in the clear") {
  Credentials credentials{"AKID", "SECRET-never-shown", "TOKEN"};
  SigningInput input;
  input.method = "GET";
  input.path = "/b/k";
  input.region = "eu-west-1";
  input.amz_date = "20260101T000000Z";
  input.payload_hash = Hash("");
  input.headers = {{"host", "h"}};
  Signature signature = SignV4(input, credentials);
  CHECK(signature.authorization.find("SECRET") == std::string::npos);
  CHECK(signature.canonical_request.find("SECRET") == std::string::npos);
  CHECK(signature.string_to_sign.find("eu-west-1/s3/aws4_request") != std::string::npos);
}

// libcurl's own signer (CURLOPT_AWS_SIGV4) on requests where both follow the same rules: a
// pre-sorted query, the payload hash given as x-amz-content-sha256. The request it sends is
// captured by a one-shot server and signed again here.
std::string CaptureOne(int listener) {
  const int fd = accept(listener, nullptr, nullptr);
  std::string request;
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got <= 0) break;
    request.append(buffer, static_cast<size_t>(got));
  }
  const size_t head = request.find("\r\n\r\n");
  size_t length = 0;
  const size_t at = request.find("Content-Length: ");
  if (at != std::string::npos) length = std::stoul(request.substr(at + 16));
  while (head != std::string::npos && request.size() < head + 4 + length) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got <= 0) break;
    request.append(buffer, static_cast<size_t>(got));
  }
  const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  (void)!write(fd, answer.data(), answer.size());
  close(fd);
  return request;
}

TEST_CASE("SigV4: agrees with libcurl's signer where the two overlap") {
  uint16_t port = 0;
  const int listener = weft::testing::ListenOnLoopback(4, &port);
  const std::string host = "127.0.0.1:" + std::to_string(port);

  struct Probe {
    std::string method, target, body;
  };
  for (const Probe& probe : {Probe{"GET", "/bucket/runs/r-1/latest", ""},
                             Probe{"GET", "/bucket?list-type=2&prefix=runs", ""},
                             Probe{"PUT", "/bucket/blobs/0123abc", "some bytes\n"}}) {
    CAPTURE(probe.target);
    std::string captured;
    std::thread server([&] { captured = CaptureOne(listener); });
    CURL* curl = curl_easy_init();
    const std::string url = "http://" + host + probe.target;
    const std::string hash = Hash(probe.body);
    curl_slist* headers = curl_slist_append(nullptr, ("x-amz-content-sha256: " + hash).c_str());
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_PROXY, "");
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, "aws:amz:eu-central-1:s3");
    curl_easy_setopt(curl, CURLOPT_USERPWD, "AKIDCURL:curl-secret/+=");
    if (probe.method == "PUT") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, probe.body.c_str());
    }
    CHECK(curl_easy_perform(curl) == CURLE_OK);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    server.join();

    // The request line and the headers curl signed.
    std::map<std::string, std::string> sent;
    std::istringstream in(captured);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line) && line != "\r") {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value[0] == ' ') value.erase(value.begin());
      sent[name] = value;
    }
    const std::string authorization = sent["authorization"];
    const size_t signed_at = authorization.find("SignedHeaders=");
    const size_t signature_at = authorization.find(", Signature=");
    REQUIRE(signed_at != std::string::npos);
    REQUIRE(signature_at != std::string::npos);
    std::string list = authorization.substr(signed_at + 14, signature_at - signed_at - 14);
    SigningInput input;
    input.method = probe.method;
    const size_t question = probe.target.find('?');
    input.path = probe.target.substr(0, question);
    if (question != std::string::npos) input.query = ParseQuery(probe.target.substr(question + 1));
    input.region = "eu-central-1";
    input.amz_date = sent["x-amz-date"];
    input.payload_hash = hash;
    std::stringstream names(list);
    for (std::string name; std::getline(names, name, ';');)
      input.headers.emplace_back(name, sent[name]);
    const Signature ours = SignV4(input, {"AKIDCURL", "curl-secret/+=", ""});
    CHECK(ours.signed_headers == list);
    CHECK(ours.authorization == authorization);
  }
  close(listener);
}

}  // namespace
}  // namespace weft::policy_store::s3
