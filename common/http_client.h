// HttpClient: requests to weft's HTTP servers (store servers, relays, the orchestrator) with
// retries, backoff and a deadline.
//
// Every operation has a deadline; connection failures, stalled transfers and 5xx answers are
// retried with exponential backoff until it passes, then reported as kUnavailable naming the URL,
// the last error, the tries and how many bytes had arrived. A request that is not idempotent is
// retried only when it surely never reached the server (no connection). A GET cut off mid-body
// resumes where it stopped (Range, with If-Range on the ETag, so a changed object restarts from
// the beginning). Connections are kept alive and reused per thread. Hooks let a caller shape the
// link (a wait before each request, a wait per received chunk). Thread-safe.
//
// Memory: a successful GET's body goes either into HttpReply::body, grown as bytes arrive (never
// reserved from a Content-Length past kMaxReserveBytes, whatever the server announces), or, with
// a BodyTarget, to the caller as it arrives (a file, a tensor, a hash: nothing is held). A ranged
// GET takes the range's bytes and no more, whatever the server sends (a server that ignores
// ranges sends the whole object; the bytes outside the range are skipped as they pass). The body
// of an answer that is not a success is kept up to kMaxErrorBodyBytes (it carries a message).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace weft {

struct HttpClientOptions {
  int attempts = 8;                              // at most this many tries per operation
  std::chrono::milliseconds first_backoff{100};  // doubles after every failed try, up to 5 s
  std::chrono::milliseconds deadline{120000};    // per operation, retries included
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds stall_timeout{15000};  // a try that receives nothing this long fails
  // For https:// URLs: a PEM file of the CA certificates to trust instead of the system's
  // (a private CA, or a self-signed server certificate). Certificates are always verified.
  std::string ca_file;
  std::function<void()> before_request;    // e.g. a link's latency
  std::function<void(uint64_t)> received;  // called per chunk of body received
  // Once it holds true, no request starts and those under way stop within about a second, with
  // kUnavailable (a server closing that must not wait on its upstream's deadline).
  std::shared_ptr<const std::atomic<bool>> cancel;
};

// Where the body of a successful GET goes as it arrives (HttpRequest::target), instead of
// HttpReply::body: the bytes of the range asked for (or of the whole object), in order. Write and
// Rewind are called on the thread of the request; an error from either stops the transfer and is
// the request's answer (not retried: it is the caller's).
class BodyTarget {
 public:
  virtual ~BodyTarget() = default;
  virtual Status Write(std::span<const uint8_t> bytes) = 0;
  // The bytes written so far are void (the object changed during a resumed transfer, so it is
  // read again from the start of the range); the next Write is the range's first byte again.
  virtual Status Rewind() = 0;
  // The whole object's size, once an answer has said it (before the answer's first Write).
  virtual Status ObjectSize(uint64_t bytes) { return Status::Ok(); }
};

// A 5xx answer with this header is the server's considered verdict (a relay that received bytes
// whose hash is not their name, say): the client returns it at once instead of retrying, since
// asking again cannot help. Its value names the error ("blob-hash-mismatch").
inline constexpr const char* kFinalErrorHeader = "X-Weft-Error";

struct HttpReply {
  long status = 0;
  std::vector<uint8_t> body;  // empty when the request's target took the body
  // For a GET: the whole object's size, when the answer said it (Content-Range's total, or a 200's
  // Content-Length), and how many bytes of the range (or object) were delivered.
  std::optional<uint64_t> object_size;
  uint64_t delivered = 0;
  // The final answer's headers: names lowercased, values without surrounding blanks (a name sent
  // twice keeps its last value).
  std::map<std::string, std::string> headers;
  // A header's value, or "" when the answer has none; `name` in lowercase.
  std::string Header(const std::string& name) const;
};

// One operation, for callers that need more than a method, a path and headers.
struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST or DELETE
  std::string path;            // starts with '/', the query included
  std::span<const uint8_t> body;
  std::vector<std::string> headers;  // "Name: value"
  bool idempotent = true;
  // False: a 5xx answer is returned as the reply, not retried (the caller decides what the
  // server's refusal means; a conditional write answered 5xx was not applied, say).
  bool retry_server_errors = true;
  // A GET of `length` bytes from byte `first` only; a try cut off resumes within the range. The
  // reply is 206 with the range's bytes (fewer where the object ends first), or 200 with the whole
  // object from a server that ignores ranges or when the object changed during a resumption.
  std::optional<std::pair<uint64_t, uint64_t>> range;  // (first, length), length > 0
  // Called before every try for headers that must be made afresh per try (a signature over the
  // request's date); they are added after `headers`.
  std::function<std::vector<std::string>()> sign;
  // A GET's body goes here as it arrives, instead of into HttpReply::body (see BodyTarget).
  BodyTarget* target = nullptr;
  // A successful GET whose body would be larger is refused (kInvalidArgument) as soon as its
  // Content-Length or its bytes say so, without reading the rest.
  uint64_t max_body_bytes = UINT64_MAX;
  // This request only (beside HttpClientOptions::cancel): once it holds true, the request stops
  // within about a second with kUnavailable (a long poll its caller no longer needs).
  const std::atomic<bool>* cancel = nullptr;
};

// At most this much is reserved up front for a body from its Content-Length; a larger body grows as
// it actually arrives.
inline constexpr uint64_t kMaxReserveBytes = uint64_t{64} << 20;
// The body of an answer that is not a success (an error message) is kept up to this size.
inline constexpr uint64_t kMaxErrorBodyBytes = uint64_t{1} << 20;

class HttpClient {
 public:
  // `base_url` like "http://127.0.0.1:8080" (a trailing slash is dropped).
  HttpClient(std::string base_url, HttpClientOptions options = {});

  // One operation with retries; `method` is GET, HEAD, PUT, POST or DELETE, `path` starts with '/'.
  // Any HTTP answer is returned as it is (see StatusOfReply); only transport failures and 5xx
  // after the last try are errors.
  Result<HttpReply> Request(const std::string& method, const std::string& path,
                            std::span<const uint8_t> body, const std::vector<std::string>& headers,
                            bool idempotent = true);
  Result<HttpReply> Request(const HttpRequest& request);

  const std::string& base_url() const { return base_url_; }
  const HttpClientOptions& options() const { return options_; }
  uint64_t bytes_received() const { return bytes_received_.load(); }
  uint64_t retries() const { return retries_.load(); }
  uint64_t resumed() const { return resumed_.load(); }

 private:
  std::string base_url_;
  HttpClientOptions options_;
  bool loopback_ = false;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> retries_{0};
  std::atomic<uint64_t> resumed_{0};
};

// The Status an answer means: 2xx Ok, 404 kNotFound, 409 kConflict, 504 kTimeout, a 5xx with
// kFinalErrorHeader kDataLoss (bytes that are not what their key names), other 5xx kUnavailable,
// other 4xx kInvalidArgument, with the server's JSON {"error"} message.
Status StatusOfReply(const HttpReply& reply, const std::string& what);
// The same mapping for an answer that is not 2xx, with `text` as the message.
Status StatusOfHttpCode(long status, std::string text);

}  // namespace weft
