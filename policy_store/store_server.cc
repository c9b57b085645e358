#include "policy_store/store_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <condition_variable>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "common/concurrent.h"
#include "common/http_server.h"
#include "common/json_fields.h"
#include "common/mutex.h"
#include "policy_store/http_store.h"
#include "policy_store/long_poll.h"
#include "policy_store/manifest.h"

namespace weft::policy_store {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using Json = nlohmann::json;
using Request = weft::http::Request;
using RequestHeader = weft::http::RequestHeader;
using Response = weft::http::Response;

using weft::http::ErrorResponse;
using weft::http::JsonResponse;

// The body of a request other than an object's PUT: a compare-and-swap's JSON, or nothing.
constexpr uint64_t kSmallBodyBytes = 64 * 1024;
// An object other than a blob up to this size is read whole to answer (its ETag is its SHA-256);
// a larger one is hashed in a first pass over it, then streamed.
constexpr uint64_t kWholeObjectBytes = 1 << 20;

bool ImmutableKey(const std::string& key) {
  return key.rfind("blobs/", 0) == 0 ||
         (key.rfind("runs/", 0) == 0 && key.find("/versions/") != std::string::npos);
}

// Parses a single "bytes=a-b", "bytes=a-" or "bytes=-n" range against `size`.
std::optional<std::pair<uint64_t, uint64_t>> ParseRange(std::string_view header, uint64_t size) {
  if (header.rfind("bytes=", 0) != 0) return std::nullopt;
  std::string_view spec = header.substr(6);
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos || spec.find(',') != std::string_view::npos)
    return std::nullopt;
  auto number = [](std::string_view text, uint64_t* out) {
    if (text.empty() || text.size() > 19) return false;
    uint64_t value = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    *out = value;
    return true;
  };
  uint64_t first = 0, last = 0;
  if (dash == 0) {  // suffix
    uint64_t suffix;
    if (!number(spec.substr(1), &suffix) || suffix == 0 || size == 0) return std::nullopt;
    first = suffix >= size ? 0 : size - suffix;
    last = size - 1;
  } else {
    if (!number(spec.substr(0, dash), &first)) return std::nullopt;
    if (dash + 1 == spec.size()) {
      last = size == 0 ? 0 : size - 1;
    } else if (!number(spec.substr(dash + 1), &last)) {
      return std::nullopt;
    }
    if (first >= size || last < first) return std::nullopt;
    last = std::min(last, size - 1);
  }
  return std::make_pair(first, last);
}

// What the server counts for /metrics.
struct Counters {
  std::atomic<uint64_t> answers[6] = {};  // by status class: [1] 1xx ... [5] 5xx, [0] other
  std::atomic<uint64_t> bytes_sent{0};    // of object bodies
  std::atomic<uint64_t> streams{0};       // object bodies being sent
};

// What every request of a server shares. Held by the calls still under way (an answer from a
// backend that opens objects asynchronously may come after the server stopped).
struct Shared {
  Shared(ObjectStore& backend, StoreServerOptions options)
      : backend(backend), options(std::move(options)) {}
  ObjectStore& backend;
  StoreServerOptions options;
  Counters counters;
  // GETs of the objects that change that wait for a change (Prefer: wait=N).
  LongPolls polls{backend};
  // The HTTP server, once started (its connection counts are in /metrics).
  std::atomic<const weft::http::HttpServer*> server{nullptr};
  // Backend calls under way off the I/O threads: Stop() waits for them, since they use the
  // backend, which the server's owner destroys after it.
  Mutex mutex;
  std::condition_variable idle;
  int calls GUARDED_BY(mutex) = 0;

  void CallStarts() EXCLUDES(mutex) {
    MutexLock lock(mutex);
    ++calls;
  }
  void CallEnds() EXCLUDES(mutex) {
    MutexLock lock(mutex);
    if (--calls == 0) idle.notify_all();
  }
};
using SharedPtr = std::shared_ptr<Shared>;

// Runs a call that may block on the backend: at once for a local store (a directory), else on the
// blocking pool, so that the server's I/O threads never wait on a network.
void Blocking(const SharedPtr& shared, std::function<void()> call) {
  if (shared->backend.Local()) return call();
  shared->CallStarts();
  RunBlocking([shared, call = std::move(call)] {
    call();
    shared->CallEnds();
  });
}

enum class Endpoint { kLivez, kStats, kMetrics, kObject, kCas, kList };

// What a request's target names: an endpoint, and for objects, compare-and-swap and listings the
// key (a listing's prefix ends in '/').
struct Target {
  Endpoint endpoint;
  std::string key;
};

// The methods each endpoint takes, as its Allow header lists them.
std::string_view AllowedMethods(Endpoint endpoint) {
  switch (endpoint) {
    case Endpoint::kObject:
      return "GET, HEAD, PUT, DELETE";
    case Endpoint::kCas:
      return "POST";
    default:
      return "GET, HEAD";
  }
}

// A key as the API accepts it: the object-key rules, and no segment starting with '.', which name
// the store's own files (the lock of compare-and-swap, temporary files of writes in progress).
Status ValidateServedKey(const std::string& key) {
  WEFT_RETURN_IF_ERROR(ValidateKey(key));
  if (key.front() == '.' || key.find("/.") != std::string::npos) {
    return InvalidArgument("object key '" + key +
                           "' has a segment starting with '.': such keys are the store's own "
                           "files, not objects");
  }
  return Status::Ok();
}

// The endpoint and key a request names, or the answer that refuses it.
std::variant<Target, Response> ParseTarget(const Shared& shared, const RequestHeader& request) {
  const std::string target(request.target());
  if (target.find_first_of("?%#") != std::string::npos) {
    return ErrorResponse(request, http::status::bad_request,
                         "query strings and escapes are not supported");
  }
  if (target == "/livez") return Target{Endpoint::kLivez, ""};
  if (target == "/metrics") return Target{Endpoint::kMetrics, ""};
  if (target == "/v1/stats" && shared.options.stats) return Target{Endpoint::kStats, ""};
  const std::pair<std::string_view, Endpoint> keyed[] = {{"/v1/objects/", Endpoint::kObject},
                                                         {"/v1/cas/", Endpoint::kCas},
                                                         {"/v1/list/", Endpoint::kList}};
  for (const auto& [prefix, endpoint] : keyed) {
    if (target.rfind(prefix, 0) != 0) continue;
    std::string key = target.substr(prefix.size());
    if (endpoint == Endpoint::kList) {
      if (key.empty() || key.back() != '/') {
        return ErrorResponse(request, http::status::bad_request, "a listing's prefix ends in '/'");
      }
      key.pop_back();
    }
    Status valid = ValidateServedKey(key);
    if (!valid.ok()) return ErrorResponse(request, valid);
    if (endpoint == Endpoint::kList) key += '/';
    return Target{endpoint, std::move(key)};
  }
  return ErrorResponse(request, http::status::not_found, "no such endpoint: " + target);
}

// Writes need the writer token (compared in constant time).
std::optional<Response> CheckWriter(const Shared& shared, const RequestHeader& request) {
  if (shared.options.writer_token.empty())
    return ErrorResponse(request, http::status::forbidden, "this store server is read-only");
  if (!weft::http::BearerMatches(request, shared.options.writer_token)) {
    return ErrorResponse(request, http::status::unauthorized,
                         "writes need the writer token (Authorization: Bearer ...)");
  }
  return std::nullopt;
}

// Whether a PUT carries "If-None-Match: *" (store only if the key holds nothing yet).
bool MustCreate(const RequestHeader& request) {
  return request.count(http::field::if_none_match) > 0;
}

// Everything decided from the header, before any of the body is read: the endpoint and key, the
// method, the writer token, the form of a blob's key, a PUT's precondition, the body limit.
std::optional<Response> CheckHeader(const Shared& shared, const RequestHeader& request,
                                    uint64_t* body_limit) {
  std::variant<Target, Response> parsed = ParseTarget(shared, request);
  if (Response* refused = std::get_if<Response>(&parsed)) return std::move(*refused);
  const Target& target = std::get<Target>(parsed);
  const std::string_view allow = AllowedMethods(target.endpoint);
  if (!weft::http::MethodAllowed(allow, request.method())) {
    return weft::http::MethodNotAllowed(
        request, allow, std::string(request.target()) + " takes " + std::string(allow));
  }
  const http::verb method = request.method();
  const bool put = target.endpoint == Endpoint::kObject && method == http::verb::put;
  if (put || method == http::verb::delete_ || method == http::verb::post) {
    if (std::optional<Response> refused = CheckWriter(shared, request)) return refused;
  }
  // Immutable objects are written once (PUT) and never replaced; the few that change do so only
  // by compare-and-swap, never by a PUT that would make them look immutable.
  if (target.endpoint == Endpoint::kCas && !IsMutableKey(target.key)) {
    return ErrorResponse(request, http::status::conflict,
                         target.key +
                             " is immutable: only runs/<run>/latest and runs/<run>/pins/<holder> "
                             "change, by compare-and-swap");
  }
  if (put && IsMutableKey(target.key)) {
    return ErrorResponse(request, http::status::conflict,
                         target.key + " changes only by compare-and-swap (POST /v1/cas/" +
                             target.key + "), not by PUT");
  }
  if (!put) {
    *body_limit = std::min(*body_limit, kSmallBodyBytes);
    return std::nullopt;
  }
  if (target.key.rfind("blobs/", 0) == 0 && !IsSha256Hex(std::string_view(target.key).substr(6))) {
    return ErrorResponse(request, http::status::bad_request,
                         "a blob's key is blobs/ and the SHA-256 of its bytes in 64 lowercase "
                         "hex digits, not " +
                             target.key);
  }
  if (MustCreate(request)) {
    if (request[http::field::if_none_match] != "*") {
      return ErrorResponse(request, http::status::bad_request, "a PUT takes only If-None-Match: *");
    }
    // A remote backend is not asked from an I/O thread: its commit refuses an existing key (412).
    if (!shared.backend.Local()) return std::nullopt;
    Result<bool> exists = shared.backend.Exists(target.key);
    if (!exists.ok()) return ErrorResponse(request, exists.status());
    if (*exists) {
      return ErrorResponse(request, http::status::precondition_failed,
                           target.key + " already exists (If-None-Match: *)");
    }
  }
  return std::nullopt;
}

// An object's PUT: the body streams into a writer of the backend (a temporary file), hashed on
// the way when the key is a blob's, and is stored only once it has arrived whole and matched.
class PutSink : public weft::http::BodySink {
 public:
  PutSink(SharedPtr shared, std::string key)
      : shared_(std::move(shared)),
        key_(std::move(key)),
        writer_(shared_->backend.NewImmutableWriter(key_)),
        blob_(key_.rfind("blobs/", 0) == 0) {}
  PutSink(PutSink&& other) noexcept = default;

  Status Write(std::span<const uint8_t> piece) override {
    if (!writer_.ok()) return writer_.status();
    if (blob_) hash_.Update(piece);
    return (*writer_)->Write(piece);
  }

  void Finish(const RequestHeader& request, weft::http::Responder respond) override {
    if (shared_->backend.Local()) return respond(Store(request));
    // A remote backend's commit uploads: off the I/O thread, the writer moved along.
    auto self = std::make_shared<PutSink>(std::move(*this));
    Blocking(self->shared_,
             [self, request = RequestHeader(request), respond] { respond(self->Store(request)); });
  }

 private:
  Response Store(const RequestHeader& request) {
    if (!writer_.ok()) return ErrorResponse(request, writer_.status());
    if (blob_) {
      const std::string actual = hash_.HexDigest();
      const std::string expected = key_.substr(6);
      if (actual != expected) {
        return ErrorResponse(request, http::status::bad_request,
                             key_ + ": the bytes sent hash to " + actual + ", not to " + expected +
                                 " (SHA-256); nothing was stored");
      }
    }
    const bool must_create = MustCreate(request);
    Result<bool> created = (*writer_)->Commit();
    if (!created.ok()) return ErrorResponse(request, created.status());
    if (must_create && !*created) {
      return ErrorResponse(request, http::status::precondition_failed,
                           key_ + " already exists (If-None-Match: *)");
    }
    return JsonResponse(request, http::status::created, Json{{"key", key_}});
  }

  SharedPtr shared_;
  std::string key_;
  Result<std::unique_ptr<ObjectWriter>> writer_;
  bool blob_;  // its bytes must hash to its name
  Sha256 hash_;
};

// The requests whose body streams to disk: an object's PUT (CheckHeader has let it through).
std::unique_ptr<weft::http::BodySink> RouteBody(const SharedPtr& shared,
                                                const RequestHeader& request) {
  if (request.method() != http::verb::put) return nullptr;
  std::variant<Target, Response> parsed = ParseTarget(*shared, request);
  const Target* target = std::get_if<Target>(&parsed);
  if (target == nullptr || target->endpoint != Endpoint::kObject) return nullptr;
  return std::make_unique<PutSink>(shared, target->key);
}

// An object's bytes [first, first + length) from its reader, a piece at a time, for a streamed
// answer. What a pending read uses lives in State, which the read holds: the source may be
// destroyed (its connection closed) while a read is still under way.
class ReaderSource : public weft::http::BodySource {
 public:
  ReaderSource(SharedPtr shared, std::unique_ptr<ObjectReader> reader, uint64_t first,
               uint64_t length)
      : state_(
            std::make_shared<State>(std::move(shared), std::move(reader), first, first + length)) {
    ++state_->shared->counters.streams;
  }
  ~ReaderSource() override { --state_->shared->counters.streams; }

  void Read(size_t max, Done done) override {
    const std::shared_ptr<State> state = state_;
    const size_t want = static_cast<size_t>(std::min<uint64_t>(max, state->end - state->at));
    auto finish = std::make_shared<Done>(std::move(done));
    auto read = [state, want, finish] {
      state->buffer.resize(std::max(state->buffer.size(), want));
      Result<size_t> got =
          state->reader->ReadAt(state->at, std::span<uint8_t>(state->buffer).first(want));
      if (!got.ok()) return (*finish)(got.status());
      state->at += *got;
      state->shared->counters.bytes_sent += *got;
      (*finish)(std::span<const uint8_t>(state->buffer.data(), *got));
    };
    // A read on the pool is a backend call: Stop() waits for it.
    auto on_pool = [state](std::function<void()> read) {
      state->shared->CallStarts();
      RunBlocking([state, read = std::move(read)] {
        read();
        state->shared->CallEnds();
      });
    };
    if (state->reader->Remote()) return on_pool(std::move(read));
    // Bytes on disk are read on this thread; bytes still arriving, once they have, on the pool
    // (not on the thread of the transfer that announces them).
    auto calling = std::make_shared<std::atomic<bool>>(true);
    state->reader->WhenReady(state->at, want, [calling, read, finish, on_pool](Status ready) {
      if (!ready.ok()) return (*finish)(ready);  // the transfer failed: the answer is cut off
      if (calling->load()) return read();
      on_pool(read);
    });
    calling->store(false);
  }

 private:
  struct State {
    State(SharedPtr shared, std::unique_ptr<ObjectReader> reader, uint64_t at, uint64_t end)
        : shared(std::move(shared)), reader(std::move(reader)), at(at), end(end) {}
    SharedPtr shared;
    std::unique_ptr<ObjectReader> reader;
    uint64_t at;
    uint64_t end;
    std::vector<uint8_t> buffer;
  };
  std::shared_ptr<State> state_;
};
// The answer to a GET or HEAD of an object whose reader is open, its ETag known: the headers an
// immutable object gets, 304 on a matching If-None-Match, a single byte range (with If-Range),
// and the bytes streamed from the reader.
void AnswerRead(const SharedPtr& shared, const RequestHeader& request, const std::string& key,
                std::unique_ptr<ObjectReader> reader, const std::string& etag,
                const weft::http::Responder& respond) {
  const uint64_t size = reader->size();
  Response head(http::status::ok, request.version());
  head.set(http::field::content_type, "application/octet-stream");
  head.set(http::field::accept_ranges, "bytes");
  head.set(http::field::etag, etag);
  head.set(http::field::cache_control,
           ImmutableKey(key) ? "public, max-age=31536000, immutable" : "no-cache");
  if (request[http::field::if_none_match] == etag) {
    head.result(http::status::not_modified);
    return respond(std::move(head));
  }
  uint64_t first = 0, length = size;
  const bool ranged =
      request.count(http::field::range) > 0 &&
      (request.count(http::field::if_range) == 0 || request[http::field::if_range] == etag);
  if (ranged) {
    const auto range = ParseRange(std::string(request[http::field::range]), size);
    if (!range) {
      Response refused = ErrorResponse(request, http::status::range_not_satisfiable,
                                       "unsatisfiable or unsupported range");
      refused.set(http::field::content_range, "bytes */" + std::to_string(size));
      return respond(std::move(refused));
    }
    first = range->first;
    length = range->second - range->first + 1;
    head.result(http::status::partial_content);
    head.set(http::field::content_range, "bytes " + std::to_string(first) + "-" +
                                             std::to_string(range->second) + "/" +
                                             std::to_string(size));
  }
  respond.Stream(std::move(head), length,
                 std::make_unique<ReaderSource>(shared, std::move(reader), first, length));
}

// An object other than a blob: its ETag is the SHA-256 of its bytes. A small one is read whole
// (one version of it, even for a remote store), a larger one hashed in a pass before it is sent.
// May block on a remote reader: called off the I/O threads for those.
void AnswerHashed(const SharedPtr& shared, const RequestHeader& request, const std::string& key,
                  std::unique_ptr<ObjectReader> reader, const weft::http::Responder& respond) {
  std::vector<uint8_t> bytes(std::min<uint64_t>(reader->size(), kWholeObjectBytes));
  Sha256 hash;
  for (uint64_t at = 0; at < reader->size();) {
    const std::span<uint8_t> into = reader->size() <= kWholeObjectBytes
                                        ? std::span<uint8_t>(bytes).subspan(at)
                                        : std::span<uint8_t>(bytes).first(std::min<uint64_t>(
                                              bytes.size(), reader->size() - at));
    Result<size_t> got = reader->ReadAt(at, into);
    if (!got.ok()) return respond(ErrorResponse(request, got.status()));
    hash.Update(into.first(*got));
    at += *got;
  }
  const std::string etag = "\"" + hash.HexDigest() + "\"";
  if (reader->size() <= kWholeObjectBytes) reader = MemoryReader(std::move(bytes));
  AnswerRead(shared, request, key, std::move(reader), etag, respond);
}

// Why an object could not be opened. Bytes of a blob that do not hash to its name (a relay's
// upstream sent others) are a bad gateway, marked final (api.md): asking again cannot help.
Response OpenError(const RequestHeader& request, const std::string& key, const Status& status) {
  if (status.code() != StatusCode::kDataLoss || key.rfind("blobs/", 0) != 0)
    return ErrorResponse(request, status);
  Response refused = ErrorResponse(request, http::status::bad_gateway, status.message());
  refused.set(kFinalErrorHeader, "blob-hash-mismatch");
  refused.set(http::field::cache_control, "no-store");
  return refused;
}

// A GET or HEAD of an object: opened by the backend (at once from a directory, from a cache once
// its fetch has said the size, from a remote store off the I/O threads), then answered.
void ServeObject(const SharedPtr& shared, const RequestHeader& request, const std::string& key,
                 const weft::http::Responder& respond) {
  shared->CallStarts();
  shared->backend.OpenReadAsync(key, [shared, request = RequestHeader(request), key, respond](
                                         Result<std::unique_ptr<ObjectReader>> opened) mutable {
    if (!opened.ok()) {
      respond(OpenError(request, key, opened.status()));
    } else if (key.rfind("blobs/", 0) == 0) {
      // A blob's ETag is its name.
      AnswerRead(shared, request, key, std::move(opened).value(), "\"" + key.substr(6) + "\"",
                 respond);
    } else if ((*opened)->Remote() || (*opened)->size() > kWholeObjectBytes) {
      auto reader = std::make_shared<std::unique_ptr<ObjectReader>>(std::move(*opened));
      shared->CallStarts();
      RunBlocking([shared, request, key, reader, respond] {
        AnswerHashed(shared, request, key, std::move(*reader), respond);
        shared->CallEnds();
      });
    } else {
      AnswerHashed(shared, request, key, std::move(opened).value(), respond);
    }
    shared->CallEnds();
  });
}

Response CompareAndSwap(const Shared& shared, const Request& request, const std::string& key) {
  Result<Json> parsed = ParseStrict(
      {reinterpret_cast<const char*>(request.body().data()), request.body().size()}, "the body");
  if (!parsed.ok()) return ErrorResponse(request, parsed.status());
  Json body = std::move(parsed).value();
  if (!body.is_object() || !body.contains("desired") || !body["desired"].is_string() ||
      !body.contains("expected") || !(body["expected"].is_null() || body["expected"].is_string()) ||
      body.size() != 2) {
    return ErrorResponse(
        request, http::status::bad_request,
        "expected a JSON object {\"expected\": string or null, \"desired\": string}");
  }
  std::optional<std::string> expected;
  if (body["expected"].is_string()) expected = body["expected"].get<std::string>();
  Status status = shared.backend.CompareAndSwap(key, expected, body["desired"].get<std::string>());
  if (!status.ok()) return ErrorResponse(request, status);
  return JsonResponse(request, http::status::ok, Json{{"key", key}});
}

// GET /metrics: the server's counters in the Prometheus text format, and the backend's (a relay's
// cache) after them.
std::string MetricsText(const Shared& shared) {
  const std::string prefix = shared.options.metrics_prefix;
  std::string text = "# HELP " + prefix +
                     "_answers_total Requests answered, by status class.\n"
                     "# TYPE " +
                     prefix + "_answers_total counter\n";
  static const char* kClasses[] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
  for (int c = 1; c <= 5; ++c) {
    text += prefix + "_answers_total{class=\"" + kClasses[c] + "\"} " +
            std::to_string(shared.counters.answers[c].load()) + "\n";
  }
  text += "# HELP " + prefix + "_object_bytes_sent_total Bytes of object bodies sent.\n# TYPE " +
          prefix + "_object_bytes_sent_total counter\n" + prefix + "_object_bytes_sent_total " +
          std::to_string(shared.counters.bytes_sent.load()) + "\n";
  text += "# HELP " + prefix + "_object_streams Object bodies being sent now.\n# TYPE " + prefix +
          "_object_streams gauge\n" + prefix + "_object_streams " +
          std::to_string(shared.counters.streams.load()) + "\n";
  text += "# HELP " + prefix +
          "_long_polls Requests waiting for a change of an object (Prefer: wait).\n# TYPE " +
          prefix + "_long_polls gauge\n" + prefix + "_long_polls " +
          std::to_string(shared.polls.waiting()) + "\n";
  text += "# HELP " + prefix +
          "_watch_calls_total Reads and watches of the backend made for the long polls.\n# TYPE " +
          prefix + "_watch_calls_total counter\n" + prefix + "_watch_calls_total " +
          std::to_string(shared.polls.backend_calls()) + "\n";
  if (const weft::http::HttpServer* server = shared.server.load())
    text += weft::http::ConnectionMetrics(prefix, server->connection_stats());
  if (shared.options.metrics) text += shared.options.metrics();
  return text;
}

// Every request but an object's PUT, once CheckHeader has let it through and its body arrived:
// answered at once, or once the backend has answered (off the I/O thread where it may block).
void Handle(const SharedPtr& shared, const Request& request, const weft::http::Responder& respond) {
  std::variant<Target, Response> parsed = ParseTarget(*shared, request);
  if (Response* refused = std::get_if<Response>(&parsed)) return respond(std::move(*refused));
  const Target target = std::get<Target>(parsed);
  switch (target.endpoint) {
    case Endpoint::kLivez:
      return respond(JsonResponse(request, http::status::ok, Json{{"ok", true}}));
    case Endpoint::kStats:
      return respond(JsonResponse(request, http::status::ok,
                                  Json::parse(shared->options.stats(), nullptr, false)));
    case Endpoint::kMetrics: {
      Response response(http::status::ok, request.version());
      response.set(http::field::content_type, "text/plain; version=0.0.4");
      const std::string text = MetricsText(*shared);
      response.body().assign(text.begin(), text.end());
      response.prepare_payload();
      return respond(std::move(response));
    }
    case Endpoint::kList:
      return Blocking(shared, [shared, request = RequestHeader(request), target, respond] {
        Result<std::vector<std::string>> keys = shared->backend.List(target.key);
        if (!keys.ok()) return respond(ErrorResponse(request, keys.status()));
        respond(JsonResponse(request, http::status::ok, Json{{"keys", *keys}}));
      });
    case Endpoint::kCas:
      return Blocking(shared, [shared, request, target, respond] {
        respond(CompareAndSwap(*shared, request, target.key));
      });
    case Endpoint::kObject:
      if (request.method() == http::verb::delete_) {
        return Blocking(shared, [shared, request = RequestHeader(request), target, respond] {
          Status status = shared->backend.Delete(target.key);
          if (!status.ok()) return respond(ErrorResponse(request, status));
          respond(JsonResponse(request, http::status::ok, Json{{"key", target.key}}));
        });
      }
      if (request.method() == http::verb::get && IsMutableKey(target.key)) {
        // A long poll: answered when the object changes (docs/api.md, "Waiting for a change").
        Result<std::optional<std::chrono::seconds>> wait =
            PreferredWait(request, std::chrono::seconds(kMaxWaitSeconds));
        if (!wait.ok()) return respond(ErrorResponse(request, wait.status()));
        if (*wait && shared->polls.Add(request, target.key, **wait, respond)) return;
      }
      if (request.method() == http::verb::get || request.method() == http::verb::head)
        return ServeObject(shared, request, target.key, respond);
      break;  // a PUT streams to a PutSink
  }
  respond(ErrorResponse(request, http::status::internal_server_error,
                        "request not routed: " + std::string(request.target())));
}

// Counts every answer by its status class, for /metrics.
weft::http::Responder Counted(const SharedPtr& shared, weft::http::Responder respond) {
  auto count = [shared](const Response& response) {
    const unsigned code = static_cast<unsigned>(response.result_int());
    ++shared->counters.answers[code >= 100 && code < 600 ? code / 100 : 0];
  };
  return weft::http::Responder(
      [count, respond](Response response) {
        count(response);
        respond(std::move(response));
      },
      [count, respond](Response head, uint64_t length,
                       std::unique_ptr<weft::http::BodySource> body) {
        count(head);
        respond.Stream(std::move(head), length, std::move(body));
      });
}

}  // namespace

struct StoreServer::Impl {
  Impl(ObjectStore& backend, const StoreServerOptions& options)
      : shared(std::make_shared<Shared>(backend, options)) {}
  SharedPtr shared;
  std::unique_ptr<weft::http::HttpServer> server;
};

Result<std::unique_ptr<StoreServer>> StoreServer::Start(ObjectStore& backend,
                                                        const StoreServerOptions& options) {
  auto impl = std::make_unique<Impl>(backend, options);
  weft::http::ServerOptions server_options;
  server_options.address = options.address;
  server_options.port = options.port;
  server_options.max_body_bytes = options.max_body_bytes;
  server_options.threads = options.threads;
  server_options.read_timeout = options.read_timeout;
  server_options.max_connections = options.max_connections;
  const SharedPtr shared = impl->shared;
  WEFT_ASSIGN_OR_RETURN(
      impl->server,
      weft::http::HttpServer::Start(
          server_options,
          [shared](Request request, weft::http::Responder respond) {
            const weft::http::Responder counted = Counted(shared, std::move(respond));
            try {
              Handle(shared, request, counted);
            } catch (const std::exception& error) {
              counted(ErrorResponse(request, http::status::internal_server_error, error.what()));
            }
          },
          [shared](const RequestHeader& request, uint64_t* body_limit) {
            return CheckHeader(*shared, request, body_limit);
          },
          [shared](const RequestHeader& request) { return RouteBody(shared, request); }));
  shared->server = impl->server.get();
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { Stop(); }

uint16_t StoreServer::port() const { return impl_->server->port(); }

void StoreServer::Stop() {
  if (!impl_ || !impl_->server) return;
  impl_->server->Stop();
  impl_->shared->polls.Stop();
  // The backend calls under way end within their deadlines; the backend must outlive them.
  Shared& shared = *impl_->shared;
  MutexLock lock(shared.mutex);
  shared.idle.wait(lock.native(), [&]() REQUIRES(shared.mutex) { return shared.calls == 0; });
}

}  // namespace weft::policy_store
