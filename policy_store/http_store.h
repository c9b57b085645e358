// HttpStore: an ObjectStore reached over HTTP, from a `weft store serve` server or any server that
// speaks the Store API of docs/api.md (reads also work through plain HTTP caches and relays).
//
// Requests go through common/http_client (deadlines, retries with backoff, resumed GETs, kept-alive
// connections); an optional LinkShaper emulates a WAN link. Only connection failures, stalled
// transfers and 5xx answers are retried; a 4xx answer is final. Answers map to Status codes: 404
// kNotFound, 409 kConflict, other 4xx kInvalidArgument with the server's message. Writes send the
// writer token (Authorization: Bearer). Thread-safe (one libcurl handle per request).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/http_client.h"
#include "policy_store/link_shaper.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

// The client's retry and deadline settings, and the link shaping (its hooks are set from `shaper`).
struct HttpStoreOptions : HttpClientOptions {
  std::shared_ptr<LinkShaper> shaper;  // null: the link as it is
  BlobReads reads;                     // how readers fetch its blobs (the URI's options)
};

// A successful answer (200, 206 or 416) to a GET of `length` bytes from `first` as the range it
// holds: kDataLoss, naming `what`, when it does not fit the request (a missing or malformed
// Content-Range, a body of the wrong size). Shared by the HTTP and S3 stores.
Result<ObjectRange> RangeOfReply(HttpReply reply, uint64_t first, uint64_t length,
                                 const std::string& what);
// The same for an answer whose bytes went to a BodyTarget: the whole object's size.
Result<uint64_t> DeliveredRange(const HttpReply& reply, uint64_t first, uint64_t length,
                                const std::string& what);

// The longest wait a store server grants a long poll on an object that changes (Prefer: wait=N).
inline constexpr int64_t kMaxWaitSeconds = 30;

// The ETag a store server gives an object other than a blob (docs/api.md): the SHA-256 of its
// bytes in hex, in quotes.
std::string ObjectEtag(std::string_view bytes);

class HttpStore : public ObjectStore {
 public:
  // `base_url` like "http://127.0.0.1:8080" (no trailing slash).
  HttpStore(std::string base_url, std::string writer_token, HttpStoreOptions options = {});

  Result<std::vector<uint8_t>> Get(const std::string& key) override;
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override;
  // Straight into `out` as the bytes arrive, without a buffer.
  Result<RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                 std::span<uint8_t> out) override;
  // One streamed GET (a ranged one unless the whole object is asked for), resumed where it stops.
  Result<uint64_t> ReadTo(const std::string& key, uint64_t first, uint64_t length,
                          BodyTarget& target) override;
  bool ReadsRanges() const override { return true; }
  BlobReads blob_reads() const override { return reads_; }
  Result<bool> Exists(const std::string& key) override;
  // A long poll (Prefer: wait=N with the ETag of `known`): it waits where the server supports it
  // (a store server or relay), and says it did not where the answer came at once (another server,
  // a plain HTTP cache). Waits are whole seconds, at most kMaxWaitSeconds and 5 s less than the
  // client's stall timeout.
  Result<ObjectWatch> WaitForChange(const std::string& key, const std::optional<std::string>& known,
                                    std::chrono::milliseconds wait,
                                    const std::atomic<bool>* cancel = nullptr) override;
  Result<std::vector<std::string>> List(const std::string& prefix) override;
  Status PutImmutable(const std::string& key, std::span<const uint8_t> bytes) override;
  Status CompareAndSwap(const std::string& key, std::optional<std::string> expected,
                        const std::string& desired) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override { return client_.base_url(); }

  // Body bytes received by every request so far (what a shaped link carried).
  uint64_t bytes_received() const { return client_.bytes_received(); }
  // Tries that failed and were retried, and GETs resumed from a byte offset.
  uint64_t retries() const { return client_.retries(); }
  uint64_t resumed() const { return client_.resumed(); }

  using Reply = HttpReply;
  // One operation with retries; `method` is GET, HEAD, PUT, POST or DELETE.
  Result<Reply> Request(const std::string& method, const std::string& path,
                        std::span<const uint8_t> body, bool authorize);

 private:
  HttpClient client_;
  std::string writer_token_;
  BlobReads reads_;
};

}  // namespace weft::policy_store
