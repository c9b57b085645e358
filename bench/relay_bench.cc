// Reading the policy store over HTTP: what a regional relay saves, and what verified pulls cost
// next to a plain download, measured in the same run.
//
// 1. Sixteen readers in one region pull the latest version from nothing (keyframe + deltas), all
//    at once: directly from the store server, then through a relay (pull-through cache) in their
//    region. Printed: the bytes the store server sent (what crosses the WAN) in each case.
// 2. One reader pulls the same version over loopback HTTP (fetch, SHA-256 of every blob, parse,
//    apply, digests) next to a raw HTTP download of the same blobs with libcurl (the bytes
//    counted, not kept): the cost of verification and decoding over moving the bytes. Fastest of
//    three runs each.
// 3. The same through a link shaped to 1 Gbit/s (policy_store/link_shaper.h), next to a download
//    of the same blobs into memory through the same link: where the link, not the reader, should
//    set the pace.
//
// Workload: about 200 MB of served BF16 (six 4096 x 4096 projections) over FP32 masters updated
// by Adam (examples/synthetic_adam.h), versions 0..3. --quick uses an 8 MB model.
#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "bench/bench_util.h"
#include "common/concurrent.h"
#include "common/parallel.h"
#include "examples/synthetic_adam.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/http_store.h"
#include "policy_store/link_shaper.h"
#include "policy_store/reader.h"
#include "policy_store/relay.h"
#include "policy_store/store_server.h"
#include "trainer_adapter/publisher.h"

namespace {

using namespace weft;
using namespace weft::policy_store;
using bench::Check;
using bench::Clock;
using bench::Seconds;

// Counts the bytes a backend hands to its server: what the server sends.
class CountingStore : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    Result<std::vector<uint8_t>> bytes = inner().Get(key);
    if (bytes.ok()) served.fetch_add(bytes->size());
    return bytes;
  }
  Result<ObjectRange> GetRange(const std::string& key, uint64_t first, uint64_t length) override {
    Result<ObjectRange> range = inner().GetRange(key, first, length);
    if (range.ok()) served.fetch_add(range->bytes.size());
    return range;
  }
  bool ReadsRanges() const override { return inner().ReadsRanges(); }
  std::atomic<uint64_t> served{0};
};

template <typename Server>
std::string Url(const Server& server) {
  return "http://127.0.0.1:" + std::to_string(server.port());
}

// `readers` concurrent pulls of `version` from nothing through `url` (over `shape`, one link per
// reader); returns the wall time.
double PullAll(const std::string& url, uint64_t version, int readers, int threads_each,
               const LinkShape& shape = {}) {
  const auto start = Clock::now();
  Check(ForEachConcurrently(readers, readers,
                            [&](size_t) -> Status {
                              HttpStoreOptions options;
                              if (shape.active())
                                options.shaper = std::make_shared<LinkShaper>(shape);
                              HttpStore store(url, "", options);
                              StoreReader reader(store, "bench", threads_each);
                              sync::ServedModel model;
                              return reader.Pull(version, std::nullopt, &model).status();
                            }),
        "pull");
  return Seconds(start);
}

// The blobs downloaded whole into memory, 16 at once, over one link shaped as `shape`, with
// weft's HTTP client and nothing checked: what a pull over that link could not beat.
double RawShapedDownload(const std::string& url, const std::vector<BlobRef>& blobs,
                         const LinkShape& shape) {
  HttpStoreOptions options;
  options.shaper = std::make_shared<LinkShaper>(shape);
  HttpStore store(url, "", options);
  const auto start = Clock::now();
  Check(ForEachConcurrently(
            blobs.size(), 16,
            [&](size_t i) -> Status { return store.Get(BlobKey(blobs[i].sha256)).status(); }),
        "raw shaped download");
  return Seconds(start);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int threads = HardwareThreads();
  const std::string root =
      (std::filesystem::temp_directory_path() / ("weft-relay-bench-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(root);
  auto directory = std::move(DirectoryStore::Open(root + "/store")).value();

  // The run: keyframe at 0, deltas 1..3.
  const std::vector<examples::SyntheticTensor> shapes =
      quick ? examples::ProjectionShapes(1024, 4) : examples::ProjectionShapes(4096, 6);
  examples::AdamConfig config;
  config.learning_rate = 1e-6;
  examples::SyntheticAdam adam(shapes, config, 7, threads);
  auto master = [&] { return examples::MasterView(adam); };
  trainer_adapter::PublisherOptions options;
  options.codec.threads = threads;
  auto publisher = std::move(trainer_adapter::Publisher::Start(*directory, "bench", master(),
                                                               sync::ServingPlan{}, options))
                       .value();
  const uint64_t latest = 3;
  for (uint64_t v = 1; v <= latest; ++v) {
    adam.Step(threads);
    Check(publisher->Publish(master()).status(), "publish");
  }
  // What a pull from nothing fetches (the planner's path), for the per-pull figure and the raw
  // download.
  sync::ServedModel probe;
  PullReport plan =
      std::move(StoreReader(*directory, "bench", threads).Pull(latest, std::nullopt, &probe))
          .value();
  const std::vector<BlobRef>& blobs = plan.fetched;
  const uint64_t pull_bytes = plan.bytes_downloaded;
  std::printf("relay_bench: %.0f MB served BF16; a pull from nothing fetches %.1f MB (%s)\n",
              publisher->served().byte_count() / 1e6, pull_bytes / 1e6, plan.path.c_str());

  CountingStore counted(*directory);
  StoreServerOptions server_options;
  server_options.threads = 8;
  auto origin = std::move(StoreServer::Start(counted, server_options)).value();

  // 1. Sixteen readers: direct, then through a relay.
  const int readers = 16;
  const int threads_each = std::max(1, threads / 4);
  const double direct_seconds = PullAll(Url(*origin), latest, readers, threads_each);
  const uint64_t direct_bytes = counted.served.exchange(0);
  RelayOptions relay_options;  // the region's relay, as `weft relay` runs it
  relay_options.upstream = Url(*origin);
  relay_options.cache_dir = root + "/relay-cache";
  relay_options.cache_bytes = uint64_t{4} << 30;
  relay_options.threads = 32;
  auto relay = std::move(Relay::Start(relay_options)).value();
  const double relay_seconds = PullAll(Url(*relay), latest, readers, threads_each);
  const uint64_t relay_bytes = counted.served.exchange(0);
  const CacheStats stats = relay->stats();
  std::printf("\n%d concurrent readers pulling version %llu from nothing (%.1f MB each)\n", readers,
              static_cast<unsigned long long>(latest), pull_bytes / 1e6);
  std::printf("  %-22s %16s %12s %10s\n", "", "upstream bytes", "vs one pull", "wall s");
  std::printf("  %-22s %16llu %11.2fx %10.2f\n", "direct",
              static_cast<unsigned long long>(direct_bytes),
              static_cast<double>(direct_bytes) / pull_bytes, direct_seconds);
  std::printf("  %-22s %16llu %11.2fx %10.2f\n", "through a relay",
              static_cast<unsigned long long>(relay_bytes),
              static_cast<double>(relay_bytes) / pull_bytes, relay_seconds);
  std::printf(
      "  relay: %llu upstream fetches (blobs and manifests), %llu blob reads waited on a fetch, "
      "%llu from its cache\n",
      static_cast<unsigned long long>(stats.upstream_fetches),
      static_cast<unsigned long long>(stats.misses), static_cast<unsigned long long>(stats.hits));
  std::printf("  upstream bytes saved by the relay: %.1fx\n",
              static_cast<double>(direct_bytes) / relay_bytes);
  relay->Stop();

  // 2. One verified pull next to a raw download of the same blobs, over loopback.
  double raw_best = 1e9, pull_best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = Clock::now();
    Check(bench::DownloadAll(
              blobs, [&](const std::string& key) { return Url(*origin) + "/v1/objects/" + key; }),
          "raw download");
    raw_best = std::min(raw_best, Seconds(start));
    pull_best = std::min(pull_best, PullAll(Url(*origin), latest, 1, threads));
  }
  std::printf(
      "\nOne pull of version %llu from nothing over loopback HTTP (%.1f MB), fastest of 3\n",
      static_cast<unsigned long long>(latest), pull_bytes / 1e6);
  std::printf("  %-44s %8.3f s %9.0f MB/s\n", "raw HTTP download of the same blobs (libcurl)",
              raw_best, pull_bytes / 1e6 / raw_best);
  std::printf("  %-44s %8.3f s %9.0f MB/s\n", "weft pull (fetch, SHA-256, parse, apply, digests)",
              pull_best, pull_bytes / 1e6 / pull_best);
  std::printf("  pull / raw download time: %.2fx\n", pull_best / raw_best);

  // 3. The same over a link shaped to 1 Gbit/s with 5 ms of latency per request.
  LinkShape gigabit;
  gigabit.bytes_per_second = 125'000'000;
  gigabit.latency = std::chrono::milliseconds(5);
  double shaped_raw_best = 1e9, shaped_pull_best = 1e9;
  for (int rep = 0; rep < 2; ++rep) {
    shaped_raw_best = std::min(shaped_raw_best, RawShapedDownload(Url(*origin), blobs, gigabit));
    shaped_pull_best =
        std::min(shaped_pull_best, PullAll(Url(*origin), latest, 1, threads, gigabit));
  }
  std::printf("\nThe same pull over a link shaped to %s, fastest of 2\n",
              gigabit.Describe().c_str());
  std::printf("  %-44s %8.3f s %9.0f MB/s\n", "raw download of the same blobs (weft's client)",
              shaped_raw_best, pull_bytes / 1e6 / shaped_raw_best);
  std::printf("  %-44s %8.3f s %9.0f MB/s\n", "weft pull (fetch, SHA-256, parse, apply, digests)",
              shaped_pull_best, pull_bytes / 1e6 / shaped_pull_best);
  std::printf("  pull / raw download time: %.2fx\n", shaped_pull_best / shaped_raw_best);
  origin->Stop();
  std::filesystem::remove_all(root);
  return 0;
}
