// Relay: a regional pull-through cache of a store server (`weft relay`; docs/api.md, "Relay").
//
// A read-only store server in front of a CachingStore (caching_store.h) in front of the upstream
// store server, reached over an optionally shaped link (link_shaper.h): blobs are fetched once per
// region however many readers ask at once, streamed to the cache's disk and to every reader that
// waits for them as they arrive, checked against their hash, and kept within a byte bound;
// manifests are kept in memory; `latest` and listings pass through. Its I/O threads never wait
// on the upstream (the cache answers them by callback), so a slow or hung upstream delays only
// the requests for the objects it holds back; hits, other misses, /livez and /metrics answer at
// once. Bytes that arrive with the wrong hash are answered 502 (api.md), never cached. Its only
// state on disk is the cache's directory, reached through an Env (RelayOptions::env).
// GET /v1/stats serves the cache's counters, GET /metrics the same in the Prometheus text format.
// Start() returns once the port is bound; Stop() (or the destructor) closes it, cancels the
// upstream requests under way and waits for them to end. Thread-safe, except that Stop() must not
// race with itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/env.h"
#include "policy_store/caching_store.h"
#include "policy_store/link_shaper.h"
#include "policy_store/object_store.h"
#include "policy_store/store_server.h"

namespace weft::policy_store {

struct RelayOptions {
  std::string upstream;  // a store server's (or another relay's) http(s):// URL, or an s3:// store
  std::string cache_dir;
  uint64_t cache_bytes = uint64_t{10} << 30;
  LinkShape link;  // the emulated link to the upstream (inactive: the link as it is)
  std::chrono::milliseconds deadline{120000};  // per upstream request, retries included
  std::string address = "127.0.0.1";
  uint16_t port = 0;             // 0: any free port
  int threads = 4;               // I/O threads; they never wait on the upstream
  uint32_t max_connections = 0;  // 0: the open-file limit less 64 (weft::http::ServerOptions)
  // How long a blob whose upstream bytes failed their hash is refused before it is fetched again.
  std::chrono::milliseconds mismatch_hold{std::chrono::seconds(30)};
  // The cache's files and the hold's clock (CacheOptions::env; null: Env::Default()).
  Env* env = nullptr;
};

class Relay {
 public:
  static Result<std::unique_ptr<Relay>> Start(const RelayOptions& options);
  ~Relay();

  uint16_t port() const { return server_->port(); }
  CacheStats stats() const { return cache_->stats(); }
  // "relay of URL (cache DIR, at most N bytes; upstream link shaped to ...)".
  std::string Describe() const;
  void Stop();

 private:
  explicit Relay(RelayOptions options) : options_(std::move(options)) {}

  RelayOptions options_;
  // Set by Stop(): the upstream's requests under way end at once rather than at their deadline.
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<ObjectStore> upstream_;
  std::unique_ptr<CachingStore> cache_;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace weft::policy_store
