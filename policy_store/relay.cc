#include "policy_store/relay.h"

#include "common/units.h"

namespace weft::policy_store {

Result<std::unique_ptr<Relay>> Relay::Start(const RelayOptions& options) {
  if (options.upstream.rfind("http://", 0) != 0 && options.upstream.rfind("https://", 0) != 0 &&
      options.upstream.rfind("s3://", 0) != 0) {
    return InvalidArgument(
        "the upstream must be an http(s):// store server or an s3:// store, not '" +
        options.upstream + "'");
  }
  std::unique_ptr<Relay> relay(new Relay(options));
  OpenOptions link;
  link.shape_bytes_per_second = options.link.bytes_per_second;
  link.shape_latency = options.link.latency;
  link.deadline = options.deadline;
  link.cancel = relay->cancel_;
  WEFT_ASSIGN_OR_RETURN(relay->upstream_, OpenStore(options.upstream, link));
  WEFT_ASSIGN_OR_RETURN(
      relay->cache_,
      CachingStore::Open(*relay->upstream_,
                         CacheOptions{options.cache_dir, options.cache_bytes, uint64_t{64} << 20,
                                      options.mismatch_hold, options.env}));
  StoreServerOptions server;
  server.address = options.address;
  server.port = options.port;
  server.threads = options.threads;
  server.max_connections = options.max_connections;
  CachingStore* cache = relay->cache_.get();
  server.stats = [cache] { return cache->StatsJson(); };
  server.metrics_prefix = "weft_relay";
  server.metrics = [cache] { return cache->MetricsText("weft_relay"); };
  WEFT_ASSIGN_OR_RETURN(relay->server_, StoreServer::Start(*relay->cache_, server));
  return relay;
}

Relay::~Relay() { Stop(); }

void Relay::Stop() {
  cancel_->store(true);
  if (server_) server_->Stop();
}

std::string Relay::Describe() const {
  std::string text = "relay of " + options_.upstream + " (cache " + options_.cache_dir +
                     ", at most " + FormatBytes(options_.cache_bytes);
  if (options_.link.active()) text += "; upstream link shaped to " + options_.link.Describe();
  return text + ")";
}

}  // namespace weft::policy_store
