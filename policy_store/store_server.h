// StoreServer: serves an ObjectStore over HTTP/1.1 (`weft store serve`), the API of
// docs/api.md ("Store API"). Anyone may read; writes need the writer token.
//
// Shape: the shared HttpServer (common/http_server.h): a session per connection on a strand, an
// io_context run on `threads` threads, a deadline on every read; handlers never throw (backend
// errors become JSON error responses). Every request is judged from its header before any of its
// body is read: the endpoint and key (keys with a segment starting with '.' are the store's own
// files and are refused), the method (405 with Allow), the writer token, a blob key's form, a
// PUT's `If-None-Match: *` (412 if the key exists) and the body's size. A PUT's body streams to
// the backend's ObjectWriter (for a directory store, a temporary file linked into place), never
// held in memory; a body for blobs/<sha256> is hashed on the way and refused (400, nothing stored)
// unless it matches its name. Objects under blobs/ and runs/*/versions/ are immutable and served
// as such (ETag, Cache-Control: immutable), so any HTTP cache in front is safe; GET supports a
// single byte Range. Start() returns once the port is bound; Stop() (or the destructor) joins the
// threads, closes the listening socket and every open connection. Thread-safe, except that Stop()
// must not race with itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "policy_store/object_store.h"

namespace weft::policy_store {

struct StoreServerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;                            // 0: any free port (see StoreServer::port)
  std::string writer_token;                     // empty: the server is read-only
  uint64_t max_body_bytes = uint64_t{4} << 30;  // of a PUT (other bodies: 64 KiB at most)
  int threads = 2;
  std::chrono::seconds read_timeout{30};
  uint32_t max_connections =
      0;  // as weft::http::ServerOptions says (0: the open-file limit less 64)
  // When set, GET /v1/stats answers with the JSON object it returns (a relay's cache counters).
  std::function<std::string()> stats;
  // GET /metrics: the server's own counters, named with this prefix, then what `metrics` returns
  // when set (a relay's cache counters), in the Prometheus text format.
  std::string metrics_prefix = "weft_store_server";
  std::function<std::string()> metrics;
};

class StoreServer {
 public:
  static Result<std::unique_ptr<StoreServer>> Start(ObjectStore& backend,
                                                    const StoreServerOptions& options);
  ~StoreServer();

  uint16_t port() const;
  void Stop();

  struct Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::policy_store
