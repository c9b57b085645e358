#include "common/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace weft {
namespace {

using Json = nlohmann::json;

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// A body kept in memory (HttpReply::body), reserved from what the answer announces up to
// kMaxReserveBytes and grown as it arrives beyond that.
class VectorTarget : public BodyTarget {
 public:
  explicit VectorTarget(std::vector<uint8_t>* bytes) : bytes_(bytes) {}
  Status Write(std::span<const uint8_t> piece) override {
    bytes_->insert(bytes_->end(), piece.begin(), piece.end());
    return Status::Ok();
  }
  Status Rewind() override {
    bytes_->clear();
    return Status::Ok();
  }
  void Reserve(uint64_t more) {
    bytes_->reserve(bytes_->size() + std::min(more, kMaxReserveBytes));
  }

 private:
  std::vector<uint8_t>* bytes_;
};

// A number of decimal digits, or nullopt (empty, a sign, overflow).
std::optional<uint64_t> ParseCount(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

// "bytes A-B/TOTAL" (or "bytes */TOTAL"): A (nullopt for '*') and TOTAL (nullopt for '*').
struct ContentRange {
  std::optional<uint64_t> first;
  std::optional<uint64_t> total;
  bool valid = false;
};
ContentRange ParseContentRange(const std::string& value) {
  ContentRange range;
  if (value.rfind("bytes ", 0) != 0) return range;
  const std::string_view spec = std::string_view(value).substr(6);
  const size_t slash = spec.rfind('/');
  if (slash == std::string_view::npos) return range;
  const std::string_view span = spec.substr(0, slash), total = spec.substr(slash + 1);
  if (total != "*") {
    range.total = ParseCount(total);
    if (!range.total) return range;
  }
  if (span != "*") {
    const size_t dash = span.find('-');
    if (dash == std::string_view::npos) return range;
    range.first = ParseCount(span.substr(0, dash));
    if (!range.first || !ParseCount(span.substr(dash + 1))) return range;
  }
  range.valid = true;
  return range;
}

// What one request collects across its tries: the wanted window of the object (a range, or all of
// it), how much of it has been delivered to the target, and per try the answer's status line,
// headers and what its body is: the object's bytes (content) or a message.
struct Transfer {
  // For the whole request.
  bool get = false;
  BodyTarget* target = nullptr;
  VectorTarget* vector = nullptr;  // the target, when it is HttpReply::body
  const std::function<void(uint64_t)>* received = nullptr;
  std::atomic<uint64_t>* counter = nullptr;
  uint64_t window_first = 0;
  std::optional<uint64_t> window_length;
  uint64_t max_body = UINT64_MAX;
  uint64_t delivered = 0;

  // For one try.
  enum class Body { kUndecided, kContent, kMessage };
  long status = 0;
  std::map<std::string, std::string>* headers = nullptr;
  std::string etag;
  Body body = Body::kUndecided;
  uint64_t skip = 0;      // bytes of this answer before the next one wanted
  bool complete = false;  // every wanted byte is in; what the server sends beyond is not read
  Status failure;         // the target's, or a check's: ends the request
  std::vector<uint8_t> message;

  void StartTry() {
    status = 0;
    headers->clear();
    etag.clear();
    body = Body::kUndecided;
    skip = 0;
    complete = false;
    message.clear();
  }

  std::string Header(const std::string& name) const {
    auto it = headers->find(name);
    return it == headers->end() ? std::string() : it->second;
  }

  // Decides, at the answer's first body byte, what the body is; for the object's bytes, where
  // they start and how much of them is wanted.
  void Decide() {
    body = get && status >= 200 && status < 300 ? Body::kContent : Body::kMessage;
    if (body != Body::kContent) return;
    uint64_t answer_first = 0;
    std::optional<uint64_t> total;
    if (status == 206) {
      const ContentRange range = ParseContentRange(Header("content-range"));
      if (!range.valid || !range.first) {
        failure = DataLoss("a 206 answer without a valid Content-Range ('" +
                           Header("content-range") + "')");
        return;
      }
      answer_first = *range.first;
      total = range.total;
    } else {
      total = ParseCount(Header("content-length"));
      if (delivered > 0) {
        // The whole object again (it changed, or the server ignores ranges): from the start.
        failure = target->Rewind();
        delivered = 0;
        if (!failure.ok()) return;
      }
    }
    const uint64_t next = window_first + delivered;
    if (answer_first > next) {
      failure = DataLoss("the answer starts at byte " + std::to_string(answer_first) +
                         ", after byte " + std::to_string(next) + " that was asked for");
      return;
    }
    skip = next - answer_first;
    if (total) {
      if (!window_length && *total > max_body) {
        failure =
            InvalidArgument("the object is " + std::to_string(*total) + " bytes, more than the " +
                            std::to_string(max_body) + " this request takes");
        return;
      }
      failure = target->ObjectSize(*total);
      if (!failure.ok()) return;
    }
    if (vector != nullptr) {
      uint64_t expected = total ? (*total > next ? *total - next : 0) : 0;
      if (window_length) expected = std::min(expected, *window_length - delivered);
      vector->Reserve(expected);
    }
  }

  // Takes a piece of the answer's body; false stops the transfer.
  bool Take(std::span<const uint8_t> piece) {
    if (body == Body::kUndecided) Decide();
    if (!failure.ok()) return false;
    if (body == Body::kMessage) {
      const uint64_t limit = status >= 200 && status < 300 ? max_body : kMaxErrorBodyBytes;
      if (message.size() < limit) {
        const uint64_t kept = std::min<uint64_t>(piece.size(), limit - message.size());
        message.insert(message.end(), piece.begin(), piece.begin() + static_cast<long>(kept));
      } else if (limit == max_body && !piece.empty()) {
        failure = InvalidArgument("the answer is more than the " + std::to_string(max_body) +
                                  " bytes this request takes");
        return false;
      }
      return true;
    }
    const uint64_t skipped = std::min<uint64_t>(skip, piece.size());
    skip -= skipped;
    piece = piece.subspan(skipped);
    bool beyond = false;
    if (window_length) {
      const uint64_t wanted = *window_length - delivered;
      if (piece.size() > wanted) {
        piece = piece.first(wanted);
        beyond = true;
      }
    }
    if (delivered + piece.size() > max_body) {
      failure = InvalidArgument("the answer is more than the " + std::to_string(max_body) +
                                " bytes this request takes");
      return false;
    }
    if (!piece.empty()) {
      failure = target->Write(piece);
      if (!failure.ok()) return false;
      delivered += piece.size();
    }
    if (beyond) {
      complete = true;  // the range is whole; the rest of the object is not read
      return false;
    }
    return true;
  }
};

// The whole object's size, as the last answer said it: Content-Range's total (206, 416), a 200's
// Content-Length, or the bytes of a 200 read to its end.
std::optional<uint64_t> ObjectSizeOf(const Transfer& transfer, bool read_to_end) {
  if (transfer.status == 206 || transfer.status == 416)
    return ParseContentRange(transfer.Header("content-range")).total;
  if (!transfer.get || transfer.status != 200) return std::nullopt;
  if (std::optional<uint64_t> length = ParseCount(transfer.Header("content-length"))) return length;
  if (read_to_end && !transfer.window_length) return transfer.delivered;
  return std::nullopt;
}

size_t Collect(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  transfer->counter->fetch_add(bytes);
  if (transfer->received != nullptr && *transfer->received) (*transfer->received)(bytes);
  const bool go_on = transfer->Take({reinterpret_cast<const uint8_t*>(data), bytes});
  return go_on ? bytes : 0;
}

size_t CollectHeader(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  std::string line(data, size * count);
  std::string lower;
  for (char c : line)
    lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.rfind("http/", 0) == 0) {
    // A new response (after a redirect or 100) starts over.
    transfer->StartTry();
    const size_t space = line.find(' ');
    if (space != std::string::npos)
      transfer->status = std::strtol(line.c_str() + space + 1, nullptr, 10);
    return size * count;
  }
  if (const size_t colon = lower.find(':'); colon != std::string::npos) {
    auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
    size_t begin = colon + 1, end = line.size();
    while (begin < end && blank(line[begin])) ++begin;
    while (end > begin && blank(line[end - 1])) --end;
    const std::string name = lower.substr(0, colon);
    (*transfer->headers)[name] = line.substr(begin, end - begin);
    if (name == "etag") transfer->etag = line.substr(begin, end - begin);
  }
  return size * count;
}

// The flags that stop a request under way: the client's and the request's own.
struct Cancels {
  const std::atomic<bool>* client = nullptr;
  const std::atomic<bool>* request = nullptr;
  bool Set() const {
    return (client != nullptr && client->load()) || (request != nullptr && request->load());
  }
};

// One libcurl handle per thread, reset before each use: its connection cache keeps connections to
// the server alive between requests.
CURL* ThreadHandle() {
  struct Handle {
    CURL* curl = curl_easy_init();
    ~Handle() {
      if (curl != nullptr) curl_easy_cleanup(curl);
    }
  };
  thread_local Handle handle;
  if (handle.curl != nullptr) curl_easy_reset(handle.curl);
  return handle.curl;
}

// The server's message from a JSON error body, or the raw text.
std::string Message(const HttpReply& reply) {
  Json body = Json::parse(reply.body.begin(), reply.body.end(), nullptr, false);
  if (body.is_object() && body.contains("error") && body["error"].is_string())
    return body["error"].get<std::string>();
  return std::string(reply.body.begin(),
                     reply.body.begin() + std::min<size_t>(reply.body.size(), 200));
}

}  // namespace

HttpClient::HttpClient(std::string base_url, HttpClientOptions options)
    : base_url_(std::move(base_url)), options_(std::move(options)) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
  for (const char* host : {"://127.", "://localhost", "://[::1]"}) {
    if (base_url_.find(host) != std::string::npos) loopback_ = true;
  }
  InitCurlOnce();
}

std::string HttpReply::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

Result<HttpReply> HttpClient::Request(const std::string& method, const std::string& path,
                                      std::span<const uint8_t> body,
                                      const std::vector<std::string>& extra_headers,
                                      bool idempotent) {
  HttpRequest request;
  request.method = method;
  request.path = path;
  request.body = body;
  request.headers = extra_headers;
  request.idempotent = idempotent;
  return Request(request);
}

Result<HttpReply> HttpClient::Request(const HttpRequest& request) {
  using Clock = std::chrono::steady_clock;
  const std::string& method = request.method;
  const std::span<const uint8_t> body = request.body;
  const bool idempotent = request.idempotent;
  const std::string url = base_url_ + request.path;
  if (request.range && (method != "GET" || request.range->second == 0))
    return Internal(method + " " + url + ": a byte range is for a GET of at least one byte");
  if (request.target != nullptr && method != "GET")
    return Internal(method + " " + url + ": a body target is for a GET");
  const Clock::time_point deadline = Clock::now() + options_.deadline;
  std::string last_error;
  std::chrono::milliseconds backoff = options_.first_backoff;
  HttpReply reply;
  std::vector<uint8_t> content;  // the object's bytes, without a target of the caller's
  VectorTarget vector(&content);
  Transfer transfer;
  transfer.get = method == "GET";
  transfer.target = request.target != nullptr ? request.target : &vector;
  transfer.vector = request.target != nullptr ? nullptr : &vector;
  transfer.received = &options_.received;
  transfer.counter = &bytes_received_;
  transfer.headers = &reply.headers;
  transfer.max_body = request.max_body_bytes;
  if (request.range) {
    transfer.window_first = request.range->first;
    transfer.window_length = request.range->second;
  }
  std::string etag;  // of the part of the object delivered, for a resumed GET
  const Cancels cancels{options_.cancel.get(), request.cancel};
  int attempt = 0;
  while (true) {
    ++attempt;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (request.cancel != nullptr && request.cancel->load())
      return Unavailable(method + " " + url + ": cancelled by its caller");
    if (options_.cancel && options_.cancel->load())
      return Unavailable(method + " " + url + ": cancelled (the client is closing)");
    CURL* curl = ThreadHandle();
    if (curl == nullptr) return Internal("cannot create an HTTP request");
    if (options_.before_request) options_.before_request();
    const bool resume = transfer.get && transfer.delivered > 0 && !etag.empty();
    if (!resume && transfer.delivered > 0) {
      WEFT_RETURN_IF_ERROR(transfer.target->Rewind());
      transfer.delivered = 0;
    }
    transfer.StartTry();
    curl_slist* headers = nullptr;
    for (const std::string& header : request.headers)
      headers = curl_slist_append(headers, header.c_str());
    if (request.sign) {
      for (const std::string& header : request.sign())
        headers = curl_slist_append(headers, header.c_str());
    }
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    std::string if_range = "If-Range: " + etag;
    if (resume) {
      headers = curl_slist_append(headers, if_range.c_str());
      resumed_.fetch_add(1);
    }
    std::string range;  // bytes first-last, inclusive
    if (resume || request.range) {
      range = std::to_string(transfer.window_first + transfer.delivered) + "-";
      // (A range to the end of any object is left open: "bytes=N-".)
      if (request.range && *transfer.window_length < (uint64_t{1} << 62))
        range += std::to_string(transfer.window_first + *transfer.window_length - 1);
      curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
    }
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, CollectHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(left.count()));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options_.connect_timeout.count()));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     std::max(1L, static_cast<long>(options_.stall_timeout.count() / 1000)));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (options_.cancel || request.cancel != nullptr) {
      // Asked about at least once a second, with or without bytes moving.
      curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &cancels);
      curl_easy_setopt(
          curl, CURLOPT_XFERINFOFUNCTION,
          +[](void* data, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
            const Cancels& flags = *static_cast<const Cancels*>(data);
            return flags.Set() ? 1 : 0;
          });
    }
    // Loopback never goes through a proxy, whatever the environment says; other hosts honour
    // the usual proxy variables.
    if (loopback_) curl_easy_setopt(curl, CURLOPT_PROXY, "");
    if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
      if (method == "PUT" || method == "POST") {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(body.data()));
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      }
    }
    CURLcode code = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    // A body with nothing in it is decided too (an empty object, a 204).
    if (code == CURLE_OK && transfer.body == Transfer::Body::kUndecided && transfer.failure.ok())
      transfer.Take({});
    if (!transfer.failure.ok()) {
      return transfer.failure.WithContext(method + " " + url);
    }
    // A range whose last byte arrived while the server went on: the rest was not read.
    if (code == CURLE_WRITE_ERROR && transfer.complete) code = CURLE_OK;
    reply.status = code == CURLE_OK ? transfer.status : 0;
    if (!transfer.etag.empty() && transfer.body == Transfer::Body::kContent) etag = transfer.etag;
    if (code == CURLE_OK && transfer.body == Transfer::Body::kContent) {
      // The object's bytes, whole (assembled over tries that resumed where the last stopped).
      if (request.range) reply.status = 206;
      reply.body = std::move(content);
      reply.delivered = transfer.delivered;
      reply.object_size = ObjectSizeOf(transfer, !transfer.complete);
      return reply;
    }
    const bool server_error = code == CURLE_OK && reply.status >= 500 && reply.status != 501;
    if (code == CURLE_OK &&
        (!server_error || reply.Header("x-weft-error") != "" || !request.retry_server_errors)) {
      // 416 answers a resumption the object no longer allows (retried from the start); to a first
      // try it is the answer (a range past the object's end).
      if (reply.status != 416 || !resume) {
        reply.body = std::move(transfer.message);
        reply.object_size = ObjectSizeOf(transfer, false);
        return reply;
      }
    }
    if (code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE ||
        code == CURLE_SSL_CERTPROBLEM || code == CURLE_UNSUPPORTED_PROTOCOL) {
      // Trying again cannot help: the server's certificate is not trusted, the CA file is bad.
      return Unavailable(method + " " + url + ": " + curl_easy_strerror(code) +
                         (options_.ca_file.empty() ? "" : " (CA file " + options_.ca_file + ")"));
    }
    if (code == CURLE_ABORTED_BY_CALLBACK && request.cancel != nullptr && request.cancel->load())
      return Unavailable(method + " " + url + ": cancelled by its caller");
    if (code == CURLE_ABORTED_BY_CALLBACK)
      return Unavailable(method + " " + url + ": cancelled (the client is closing)");
    if (code != CURLE_OK) {
      last_error = curl_easy_strerror(code);
    } else if (reply.status == 416) {
      last_error = "the server refused to resume at byte " +
                   std::to_string(transfer.window_first + transfer.delivered);
      etag.clear();  // from the start
    } else {
      HttpReply answer;
      answer.body = std::move(transfer.message);
      last_error = "HTTP " + std::to_string(reply.status) + ": " + Message(answer);
    }
    // A request that may have reached the server is repeated only when repeating it is harmless.
    const bool unsent = code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST ||
                        code == CURLE_COULDNT_RESOLVE_PROXY;
    if (!idempotent && !unsent) {
      return Unavailable(method + " " + url + ": " + last_error +
                         " (not repeated: the server may have acted on it)");
    }
    if (attempt >= options_.attempts || Clock::now() + backoff >= deadline) break;
    retries_.fetch_add(1);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
  const double waited =
      std::chrono::duration<double>(Clock::now() - (deadline - options_.deadline)).count();
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", waited);
  std::string progress = transfer.get && transfer.delivered > 0
                             ? ", " + std::to_string(transfer.delivered) + " bytes had arrived"
                             : "";
  return Unavailable(method + " " + url + ": " + last_error + " (gave up after " +
                     std::to_string(attempt) + (attempt == 1 ? " try" : " tries") + " in " +
                     seconds + " s" + progress + ")");
}

Status StatusOfReply(const HttpReply& reply, const std::string& what) {
  if (reply.status >= 200 && reply.status < 300) return Status::Ok();
  std::string text = what + ": HTTP " + std::to_string(reply.status) + ": " + Message(reply);
  // The server's verdict that what it received is not what the key names.
  if (reply.status >= 500 && !reply.Header("x-weft-error").empty()) return DataLoss(text);
  return StatusOfHttpCode(reply.status, std::move(text));
}

Status StatusOfHttpCode(long status, std::string text) {
  switch (status) {
    case 404:
      return NotFound(std::move(text));
    case 409:
      return Conflict(std::move(text));
    case 504:
      return Timeout(std::move(text));
    default:
      return status >= 500 ? Unavailable(std::move(text)) : InvalidArgument(std::move(text));
  }
}

}  // namespace weft
