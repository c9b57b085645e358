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

// What one try of a request collects: the body (appended to what earlier tries received) and the
// headers a resumed GET needs.
struct Transfer {
  std::vector<uint8_t>* body = nullptr;
  const std::function<void(uint64_t)>* received = nullptr;
  std::atomic<uint64_t>* counter = nullptr;
  std::string etag;
  bool partial_content = false;  // the answer is 206
  std::map<std::string, std::string>* headers = nullptr;
};

size_t Collect(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  transfer->body->insert(transfer->body->end(), reinterpret_cast<uint8_t*>(data),
                         reinterpret_cast<uint8_t*>(data) + bytes);
  transfer->counter->fetch_add(bytes);
  if (transfer->received != nullptr && *transfer->received) (*transfer->received)(bytes);
  return bytes;
}

size_t CollectHeader(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  std::string line(data, size * count);
  std::string lower;
  for (char c : line)
    lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.rfind("http/", 0) == 0) {
    transfer->etag.clear();  // a new response (after a redirect or 100) starts over
    transfer->partial_content = lower.find(" 206") != std::string::npos;
    transfer->headers->clear();
    return size * count;
  }
  if (const size_t colon = lower.find(':'); colon != std::string::npos) {
    auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
    size_t begin = colon + 1, end = line.size();
    while (begin < end && blank(line[begin])) ++begin;
    while (end > begin && blank(line[end - 1])) --end;
    (*transfer->headers)[lower.substr(0, colon)] = line.substr(begin, end - begin);
  }
  if (lower.rfind("content-length:", 0) == 0) {
    // Room for the whole body up front: no reallocation while hundreds of MB arrive.
    const unsigned long long length = std::strtoull(line.c_str() + 15, nullptr, 10);
    if (length > 0 && length < (uint64_t{1} << 40))
      transfer->body->reserve(transfer->body->size() + length);
  } else if (lower.rfind("etag:", 0) == 0) {
    std::string value = line.substr(5);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.erase(value.begin());
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
      value.pop_back();
    transfer->etag = value;
  }
  return size * count;
}

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
  const uint64_t range_first = request.range ? request.range->first : 0;
  if (request.range && (method != "GET" || request.range->second == 0))
    return Internal(method + " " + url + ": a byte range is for a GET of at least one byte");
  const Clock::time_point deadline = Clock::now() + options_.deadline;
  std::string last_error;
  std::chrono::milliseconds backoff = options_.first_backoff;
  HttpReply reply;
  std::string etag;  // of the partial body held, for a resumed GET
  int attempt = 0;
  while (true) {
    ++attempt;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    CURL* curl = ThreadHandle();
    if (curl == nullptr) return Internal("cannot create an HTTP request");
    if (options_.before_request) options_.before_request();
    const bool resume = method == "GET" && !reply.body.empty() && !etag.empty();
    if (!resume) reply.body.clear();
    Transfer transfer{&reply.body, &options_.received, &bytes_received_, "", false, &reply.headers};
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
      range = std::to_string(range_first + reply.body.size()) + "-";
      if (request.range) range += std::to_string(range_first + request.range->second - 1);
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
    const size_t held = resume ? reply.body.size() : 0;
    CURLcode code = curl_easy_perform(curl);
    reply.status = 0;
    if (code == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
    curl_slist_free_all(headers);
    if (resume) {
      if (code == CURLE_OK && reply.status == 200) {
        // The server sent the whole object again (it changed, or ignores ranges): keep only that.
        reply.body.erase(reply.body.begin(), reply.body.begin() + static_cast<long>(held));
      } else if (!transfer.partial_content) {
        // No 206 began: nothing this try added belongs to the object (a final error answer
        // drops the partial body too: the object is gone or refused).
        reply.body.resize(code == CURLE_OK ? 0 : held);
      } else if (code == CURLE_OK) {
        reply.status = request.range ? 206 : 200;  // the rest arrived: assembled
      }
    }
    if (!transfer.etag.empty()) etag = transfer.etag;
    const bool server_error = code == CURLE_OK && reply.status >= 500 && reply.status != 501;
    // 416 answers a resumption the object no longer allows (retried from the start); to a first
    // try it is the answer (a range past the object's end).
    if (code == CURLE_OK && !server_error && (reply.status != 416 || !resume)) return reply;
    if (server_error && !request.retry_server_errors) return reply;
    if (code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE ||
        code == CURLE_SSL_CERTPROBLEM || code == CURLE_UNSUPPORTED_PROTOCOL) {
      // Trying again cannot help: the server's certificate is not trusted, the CA file is bad.
      return Unavailable(method + " " + url + ": " + curl_easy_strerror(code) +
                         (options_.ca_file.empty() ? "" : " (CA file " + options_.ca_file + ")"));
    }
    if (code != CURLE_OK) {
      last_error = curl_easy_strerror(code);
    } else if (reply.status == 416) {
      last_error = "the server refused to resume at byte " + std::to_string(reply.body.size());
      reply.body.clear();
    } else {
      last_error = "HTTP " + std::to_string(reply.status) + ": " + Message(reply);
      reply.body.clear();
    }
    if (method != "GET" || reply.body.empty()) {
      reply.body.clear();
      etag.clear();
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
  std::string progress = method == "GET" && !reply.body.empty()
                             ? ", " + std::to_string(reply.body.size()) + " bytes had arrived"
                             : "";
  return Unavailable(method + " " + url + ": " + last_error + " (gave up after " +
                     std::to_string(attempt) + (attempt == 1 ? " try" : " tries") + " in " +
                     seconds + " s" + progress + ")");
}

std::optional<uint64_t> RangedObjectSize(const HttpReply& reply) {
  if (reply.status == 200) return reply.body.size();
  const std::string range = reply.Header("content-range");
  const size_t slash = range.rfind('/');
  if (range.rfind("bytes ", 0) != 0 || slash == std::string::npos || slash + 1 == range.size())
    return std::nullopt;
  uint64_t total = 0;
  for (size_t i = slash + 1; i < range.size(); ++i) {
    if (range[i] < '0' || range[i] > '9' || total > (UINT64_MAX - 9) / 10) return std::nullopt;
    total = total * 10 + static_cast<uint64_t>(range[i] - '0');
  }
  return total;
}

Status StatusOfReply(const HttpReply& reply, const std::string& what) {
  if (reply.status >= 200 && reply.status < 300) return Status::Ok();
  return StatusOfHttpCode(reply.status,
                          what + ": HTTP " + std::to_string(reply.status) + ": " + Message(reply));
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
