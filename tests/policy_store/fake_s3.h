// FakeS3: an in-memory S3 service on a loopback port for the S3 backend's unit tests, speaking the
// parts of the S3 API the backend uses: objects (PUT, GET with ranges, HEAD, DELETE) with
// If-None-Match / If-Match on PUT and on completing multipart uploads, multipart uploads,
// ListObjectsV2 with pagination and ListMultipartUploads. It checks every request's SigV4
// signature against its own key, and injects faults on demand: SlowDown answers, connections cut
// mid-body, services that ignore conditional writes. One connection at a time (Connection: close).
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/hex.h"
#include "policy_store/manifest.h"
#include "policy_store/s3_signer.h"
#include "tests/http_test_util.h"

namespace weft::policy_store::testing {

class FakeS3 {
 public:
  static constexpr const char* kAccessKey = "AKIDFAKE";
  static constexpr const char* kSecretKey = "fake-secret-key";

  FakeS3() {
    listener_ = ::weft::testing::ListenOnLoopback(64, &port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeS3() {
    stop_ = true;
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Faults and behaviours, settable at any time.
  std::atomic<int> slow_down{0};  // the next this many requests get 503 SlowDown
  std::atomic<int> cut_gets{0};   // the next this many GETs are cut after half the body
  std::atomic<bool> honour_conditions{true};
  std::atomic<bool> honour_multipart_conditions{true};
  std::atomic<int> fail_parts{0};  // the next this many part uploads get 500
  // The next this many upload completions get 409 ConditionalRequestConflict, as AWS answers a
  // completion that races another write of the key.
  std::atomic<int> conflict_completions{0};
  // A failed condition answered 500 UnknownError instead of 412, as Ceph RGW answers the loser of
  // a race on the condition.
  std::atomic<bool> condition_failures_as_500{false};
  std::atomic<int> requests{0};

  // What it holds (keys are full S3 keys).
  std::map<std::string, std::string> Objects() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::map<std::string, std::string> out;
    for (const auto& [key, object] : objects_) out[key] = object.bytes;
    return out;
  }
  size_t Uploads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return uploads_.size();
  }
  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }

 private:
  struct Object {
    std::string bytes, etag;       // etag quoted
    std::string modified = Now();  // ISO 8601, as listings give it
  };
  struct Upload {
    std::string key;
    std::map<int, std::string> parts;
  };
  struct Request {
    std::string method, path, query_text;
    std::vector<std::pair<std::string, std::string>> query;
    std::map<std::string, std::string> headers;  // lowercase names
    std::string body;
    std::string Query(const std::string& name) const {
      for (const auto& [n, v] : query)
        if (n == name) return v;
      return "";
    }
    bool Has(const std::string& name) const {
      for (const auto& [n, v] : query)
        if (n == name) return true;
      return false;
    }
  };

  static std::string Md5(const std::string& bytes) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_md5(), nullptr);
    return HexEncode({digest, length});
  }
  static std::string Unquote(std::string etag) {
    if (etag.size() >= 2 && etag.front() == '"') etag = etag.substr(1, etag.size() - 2);
    return etag;
  }
  static std::string Answer(int status, const std::string& body,
                            const std::vector<std::string>& headers = {}) {
    std::string text = "HTTP/1.1 " + std::to_string(status) + " X\r\nConnection: close\r\n";
    for (const std::string& h : headers) text += h + "\r\n";
    text += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    return text;
  }
  static std::string Now() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char text[32];
    std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
    return text;
  }
  static std::string Error(int status, const std::string& code) {
    return Answer(status, "<?xml version=\"1.0\"?><Error><Code>" + code + "</Code><Message>fake " +
                              code + "</Message></Error>");
  }

  void Serve() {
    while (!stop_) {
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      std::string data;
      char buffer[65536];
      size_t head = std::string::npos;
      while ((head = data.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t got = read(fd, buffer, sizeof(buffer));
        if (got <= 0) break;
        data.append(buffer, static_cast<size_t>(got));
      }
      if (head == std::string::npos) {
        close(fd);
        continue;
      }
      Request request;
      std::istringstream in(data.substr(0, head));
      std::string line;
      std::getline(in, line);
      std::string target;
      std::istringstream first(line);
      first >> request.method >> target;
      const size_t question = target.find('?');
      request.path = target.substr(0, question);
      if (question != std::string::npos) {
        request.query_text = target.substr(question + 1);
        std::stringstream items(request.query_text);
        for (std::string item; std::getline(items, item, '&');) {
          const size_t equals = item.find('=');
          request.query.emplace_back(
              s3::UriDecode(item.substr(0, equals)),
              equals == std::string::npos ? "" : s3::UriDecode(item.substr(equals + 1)));
        }
      }
      while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string name = line.substr(0, colon);
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value[0] == ' ') value.erase(value.begin());
        request.headers[name] = value;
      }
      const size_t length = std::stoul(
          request.headers.count("content-length") ? request.headers["content-length"] : "0");
      request.body = data.substr(head + 4);
      while (request.body.size() < length) {
        const ssize_t got = read(fd, buffer, sizeof(buffer));
        if (got <= 0) break;
        request.body.append(buffer, static_cast<size_t>(got));
      }
      std::string answer = Handle(request);
      bool cut = false;
      if (request.method == "GET" && answer.rfind("HTTP/1.1 20", 0) == 0 && cut_gets.load() > 0) {
        cut_gets.fetch_sub(1);
        const size_t body = answer.find("\r\n\r\n") + 4;
        if (answer.size() - body > 2) {
          answer.resize(body + (answer.size() - body) / 2);
          cut = true;
        }
      }
      (void)!write(fd, answer.data(), answer.size());
      if (cut) shutdown(fd, SHUT_RDWR);
      close(fd);
    }
  }

  // Whether the request carries a valid signature by kAccessKey over what it sends.
  bool Signed(const Request& request) {
    const std::string authorization =
        request.headers.count("authorization") ? request.headers.at("authorization") : "";
    const size_t credential = authorization.find("Credential=");
    const size_t signed_at = authorization.find("SignedHeaders=");
    const size_t signature_at = authorization.find(", Signature=");
    if (credential == std::string::npos || signed_at == std::string::npos ||
        signature_at == std::string::npos)
      return false;
    const std::string scope = authorization.substr(credential + 11, signed_at - credential - 13);
    std::vector<std::string> parts;
    std::stringstream scope_items(scope);
    for (std::string part; std::getline(scope_items, part, '/');) parts.push_back(part);
    if (parts.size() != 5 || parts[0] != kAccessKey) return false;
    s3::SigningInput input;
    input.method = request.method;
    input.path = request.path;
    input.query = request.query;
    input.region = parts[2];
    input.amz_date = request.headers.count("x-amz-date") ? request.headers.at("x-amz-date") : "";
    input.payload_hash = request.headers.count("x-amz-content-sha256")
                             ? request.headers.at("x-amz-content-sha256")
                             : "";
    std::stringstream names(authorization.substr(signed_at + 14, signature_at - signed_at - 14));
    for (std::string name; std::getline(names, name, ';');)
      input.headers.emplace_back(name, request.headers.count(name) ? request.headers.at(name) : "");
    const s3::Signature expected = s3::SignV4(input, {kAccessKey, kSecretKey, ""});
    // The payload must be what was signed.
    const std::string hash =
        Sha256Hex({reinterpret_cast<const uint8_t*>(request.body.data()), request.body.size()});
    return expected.authorization == authorization && input.payload_hash == hash;
  }

  std::string Handle(const Request& request) {
    requests.fetch_add(1);
    std::lock_guard<std::mutex> lock(mutex_);
    log_.push_back(request.method + " " + request.path +
                   (request.query_text.empty() ? "" : "?" + request.query_text));
    if (!Signed(request)) return Error(403, "SignatureDoesNotMatch");
    if (slow_down.load() > 0) {
      slow_down.fetch_sub(1);
      return Error(503, "SlowDown");
    }
    // Path-style: /BUCKET[/KEY].
    const size_t slash = request.path.find('/', 1);
    const std::string key =
        slash == std::string::npos ? "" : s3::UriDecode(request.path.substr(slash + 1));
    const std::string if_none =
        request.headers.count("if-none-match") ? request.headers.at("if-none-match") : "";
    const std::string if_match =
        request.headers.count("if-match") ? request.headers.at("if-match") : "";
    auto conditions = [&](bool honoured) -> int {
      if (!honoured) return 0;
      auto it = objects_.find(key);
      if (if_none == "*" && it != objects_.end()) return 412;
      if (!if_match.empty()) {
        if (it == objects_.end()) return 404;
        if (Unquote(if_match) != Unquote(it->second.etag)) return 412;
      }
      return 0;
    };
    if (key.empty() && request.method == "GET" && request.Has("uploads")) {
      std::string xml = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>";
      for (const auto& [id, upload] : uploads_) {
        xml += "<Upload><Key>" + upload.key + "</Key><UploadId>" + id +
               "</UploadId><Initiated>2020-01-01T00:00:00.000Z</Initiated></Upload>";
      }
      return Answer(200, xml + "</ListMultipartUploadsResult>");
    }
    if (key.empty() && request.method == "GET") {
      const std::string prefix = request.Query("prefix");
      const size_t max_keys =
          request.Has("max-keys") ? std::stoul(request.Query("max-keys")) : 1000;
      const std::string after = request.Query("continuation-token");
      std::string xml = "<ListBucketResult>";
      size_t count = 0;
      bool truncated = false;
      std::string last;
      for (const auto& [name, object] : objects_) {
        if (name.rfind(prefix, 0) != 0 || (!after.empty() && name <= after)) continue;
        if (count == max_keys) {
          truncated = true;
          break;
        }
        xml += "<Contents><Key>" + s3::UriEncode(name, true) + "</Key><LastModified>" +
               object.modified + "</LastModified><Size>" + std::to_string(object.bytes.size()) +
               "</Size></Contents>";
        last = name;
        ++count;
      }
      xml += std::string("<IsTruncated>") + (truncated ? "true" : "false") + "</IsTruncated>";
      if (truncated) xml += "<NextContinuationToken>" + last + "</NextContinuationToken>";
      return Answer(200, xml + "</ListBucketResult>");
    }
    if (request.method == "POST" && request.Has("uploads")) {
      const std::string id = "upload-" + std::to_string(next_upload_++);
      uploads_[id] = Upload{key, {}};
      return Answer(200, "<InitiateMultipartUploadResult><UploadId>" + id +
                             "</UploadId></InitiateMultipartUploadResult>");
    }
    if (request.Has("uploadId")) {
      auto upload = uploads_.find(request.Query("uploadId"));
      if (upload == uploads_.end()) return Error(404, "NoSuchUpload");
      if (request.method == "PUT") {
        if (fail_parts.load() > 0) {
          fail_parts.fetch_sub(1);
          return Error(500, "InternalError");
        }
        const int number = std::stoi(request.Query("partNumber"));
        upload->second.parts[number] = request.body;
        return Answer(200, "", {"ETag: \"" + Md5(request.body) + "\""});
      }
      if (request.method == "DELETE") {
        uploads_.erase(upload);
        return Answer(204, "");
      }
      // POST: complete, with the parts in order.
      if (conflict_completions.load() > 0) {
        conflict_completions.fetch_sub(1);
        return Error(409, "ConditionalRequestConflict");
      }
      if (int failed = conditions(honour_multipart_conditions.load()); failed != 0)
        return Error(failed, failed == 412 ? "PreconditionFailed" : "NoSuchKey");
      // S3's ETag of a completed upload: the MD5 of the parts' binary MD5s, "-", their count.
      std::string bytes, digests;
      for (const auto& [number, part] : upload->second.parts) {
        bytes += part;
        unsigned char digest[EVP_MAX_MD_SIZE];
        unsigned int size = 0;
        EVP_Digest(part.data(), part.size(), digest, &size, EVP_md5(), nullptr);
        digests.append(reinterpret_cast<const char*>(digest), size);
      }
      const std::string etag =
          "\"" + Md5(digests) + "-" + std::to_string(upload->second.parts.size()) + "\"";
      objects_[key] = Object{bytes, etag};
      uploads_.erase(upload);
      return Answer(200, "<CompleteMultipartUploadResult><ETag>" + etag +
                             "</ETag></CompleteMultipartUploadResult>");
    }
    auto it = objects_.find(key);
    if (request.method == "PUT") {
      if (int failed = conditions(honour_conditions.load()); failed != 0) {
        if (condition_failures_as_500.load()) return Error(500, "UnknownError");
        return Error(failed, failed == 412 ? "PreconditionFailed" : "NoSuchKey");
      }
      const std::string etag = "\"" + Md5(request.body) + "\"";
      objects_[key] = Object{request.body, etag};
      return Answer(200, "", {"ETag: " + etag});
    }
    if (request.method == "DELETE") {
      if (it != objects_.end()) objects_.erase(it);
      return Answer(204, "");
    }
    if (it == objects_.end())
      return request.method == "HEAD" ? Answer(404, "") : Error(404, "NoSuchKey");
    const Object& object = it->second;
    if (request.method == "HEAD") {
      return "HTTP/1.1 200 X\r\nConnection: close\r\nETag: " + object.etag +
             "\r\nContent-Length: " + std::to_string(object.bytes.size()) + "\r\n\r\n";
    }
    const std::string range = request.headers.count("range") ? request.headers.at("range") : "";
    if (range.rfind("bytes=", 0) == 0) {
      const size_t dash = range.find('-');
      const uint64_t first = std::stoull(range.substr(6, dash - 6));
      uint64_t last =
          dash + 1 < range.size() ? std::stoull(range.substr(dash + 1)) : object.bytes.size() - 1;
      if (first >= object.bytes.size()) return Error(416, "InvalidRange");
      last = std::min<uint64_t>(last, object.bytes.size() - 1);
      return Answer(206, object.bytes.substr(first, last - first + 1),
                    {"ETag: " + object.etag, "Content-Range: bytes " + std::to_string(first) + "-" +
                                                 std::to_string(last) + "/" +
                                                 std::to_string(object.bytes.size())});
    }
    return Answer(200, object.bytes, {"ETag: " + object.etag});
  }

  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::map<std::string, Object> objects_;
  std::map<std::string, Upload> uploads_;
  int next_upload_ = 1;
  std::vector<std::string> log_;
};

}  // namespace weft::policy_store::testing
