// The policy store on S3 next to the store server over HTTP, measured in the same run: publishing
// a run (a keyframe, then deltas), a verified pull from nothing, and raw downloads of the same
// blobs with libcurl (no verification, no decoding), per backend.
//
//   s3_bench S3_URI [--quick]
//
// S3_URI names a bucket and prefix (s3://BUCKET/PREFIX?endpoint=...), credentials in the
// environment; bench/s3_bench.sh starts a Ceph RADOS Gateway (its OSD on BlueStore, a file on
// disk, as the store server's directory is) and runs it. Both backends run on this machine over
// loopback: the store server in this process over a directory, the S3 service in its own. Each
// figure is the best of two rounds run alternately. Workload: about 200 MB of served BF16 (six 4096
// x 4096 projections) over FP32 masters updated by Adam (examples/synthetic_adam.h), versions 0..3;
// --quick: an 8 MB model.
#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "bench/bench_util.h"
#include "common/parallel.h"
#include "examples/synthetic_adam.h"
#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "policy_store/reader.h"
#include "policy_store/s3_store.h"
#include "policy_store/store_server.h"
#include "trainer_adapter/publisher.h"

namespace {

using namespace weft;
using namespace weft::policy_store;
using bench::Check;
using bench::Clock;
using bench::Seconds;

struct Figures {
  double keyframe = 0;  // Publisher::Start: version 0, a keyframe of the whole model
  double deltas = 0;    // versions 1..3, each a delta
  double pull = 1e9;    // verified pull of the latest version from nothing (fastest of 3)
  double raw = 1e9;     // libcurl downloads of the same blobs, 16 at once (fastest of 3)
  uint64_t pull_bytes = 0;
  uint64_t model_bytes = 0;

  // Keeps the better of each figure.
  void Best(const Figures& other) {
    keyframe = keyframe == 0 ? other.keyframe : std::min(keyframe, other.keyframe);
    deltas = deltas == 0 ? other.deltas : std::min(deltas, other.deltas);
    pull = std::min(pull, other.pull);
    raw = std::min(raw, other.raw);
    pull_bytes = other.pull_bytes;
    model_bytes = other.model_bytes;
  }
};

// One backend: publish the run, then pull it and download its blobs. `raw_url(key)` and
// `raw_setup(curl)` make a plain libcurl GET of an object.
Figures Measure(ObjectStore& store, const std::string& run,
                const std::vector<examples::SyntheticTensor>& shapes, int threads,
                const std::function<std::string(const std::string&)>& raw_url,
                const std::function<void(CURL*, curl_slist**)>& raw_setup) {
  Figures f;
  examples::AdamConfig config;
  config.learning_rate = 1e-6;
  examples::SyntheticAdam adam(shapes, config, 7, threads);
  auto master = [&] { return examples::MasterView(adam); };
  trainer_adapter::PublisherOptions options;
  options.codec.threads = threads;
  auto start = Clock::now();
  auto publisher = std::move(trainer_adapter::Publisher::Start(store, run, master(),
                                                               sync::ServingPlan{}, options))
                       .value();
  f.keyframe = Seconds(start);
  f.model_bytes = publisher->served().byte_count();
  const uint64_t latest = 3;
  for (uint64_t v = 1; v <= latest; ++v) {
    adam.Step(threads);
    start = Clock::now();
    Check(publisher->Publish(master()).status(), "publish");
    f.deltas += Seconds(start);
  }
  std::vector<BlobRef> blobs;
  for (int rep = 0; rep < 3; ++rep) {
    StoreReader reader(store, run, threads);
    sync::ServedModel model;
    start = Clock::now();
    Result<PullReport> report = reader.Pull(latest, std::nullopt, &model);
    Check(report.status(), "pull");
    f.pull = std::min(f.pull, Seconds(start));
    f.pull_bytes = report->bytes_downloaded;
    blobs = report->fetched;
  }
  for (int rep = 0; rep < 3; ++rep) {
    start = Clock::now();
    Check(bench::DownloadAll(blobs, raw_url, raw_setup), "raw download");
    f.raw = std::min(f.raw, Seconds(start));
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: s3_bench S3_URI [--quick]\n");
    return 2;
  }
  const bool quick = argc > 2 && std::string(argv[2]) == "--quick";
  const int threads = HardwareThreads();
  const std::vector<examples::SyntheticTensor> shapes =
      quick ? examples::ProjectionShapes(1024, 4) : examples::ProjectionShapes(4096, 6);

  // The store server over a directory, as `weft store serve` runs it.
  const std::string root =
      (std::filesystem::temp_directory_path() / ("weft-s3-bench-" + std::to_string(getpid())))
          .string();
  auto directory = std::move(DirectoryStore::Open(root)).value();
  StoreServerOptions server_options;
  server_options.threads = 8;
  server_options.writer_token = "bench-token";
  auto server = std::move(StoreServer::Start(*directory, server_options)).value();
  const std::string http_url = "http://127.0.0.1:" + std::to_string(server->port());
  HttpStore http(http_url, "bench-token");
  // S3, under a fresh prefix.
  Result<s3::Settings> settings = s3::ResolveSettings(argv[1], s3::ProcessEnvironment());
  Check(settings.status(), "S3 settings");
  const std::string fresh = "s3-bench-" + std::to_string(std::random_device{}());
  settings->prefix = settings->prefix.empty() ? fresh : settings->prefix + "/" + fresh;
  S3Store s3(*settings);
  const s3::Settings& s = s3.settings();
  const std::string credentials = s.credentials.access_key + ":" + s.credentials.secret_key;
  const std::string sigv4 = "aws:amz:" + s.region + ":s3";
  auto measure_http = [&](const std::string& run) {
    return Measure(
        http, run, shapes, threads,
        [&](const std::string& key) { return http_url + "/v1/objects/" + key; },
        [](CURL*, curl_slist**) {});
  };
  auto measure_s3 = [&](const std::string& run) {
    return Measure(
        s3, run, shapes, threads,
        [&](const std::string& key) {
          const std::string full = s.prefix.empty() ? key : s.prefix + "/" + key;
          return s.endpoint + "/" + s.bucket + "/" + full;
        },
        [&](CURL* curl, curl_slist** headers) {
          // libcurl's own signer: the empty payload's hash given, as S3 requires the header.
          *headers =
              curl_slist_append(*headers,
                                "x-amz-content-sha256: "
                                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
          curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
          curl_easy_setopt(curl, CURLOPT_USERPWD, credentials.c_str());
        });
  };
  // Alternating, twice: neither backend gains from running second (warm page cache, allocator).
  Figures h, s3f;
  for (int round = 0; round < 2; ++round) {
    const std::string run = "bench-" + std::to_string(round);
    h.Best(measure_http(run));
    s3f.Best(measure_s3(run));
  }

  std::printf(
      "s3_bench: %.0f MB served BF16, versions 0..3 (a pull from nothing fetches %.0f MB); S3 at "
      "%s, parts of %llu MiB, ranges of %llu MiB, %d in flight per object\n",
      h.model_bytes / 1e6, s3f.pull_bytes / 1e6, s.endpoint.c_str(),
      static_cast<unsigned long long>(s.part_size >> 20),
      static_cast<unsigned long long>(s.range_size >> 20), s.parallel);
  std::printf("  %-46s %14s %14s %9s\n", "", "HTTP store", "S3", "S3/HTTP");
  auto row = [](const char* what, double a, double b) {
    std::printf("  %-46s %12.3f s %12.3f s %8.2fx\n", what, a, b, b / a);
  };
  row("publish version 0 (keyframe of the whole model)", h.keyframe, s3f.keyframe);
  row("publish versions 1..3 (deltas), total", h.deltas, s3f.deltas);
  row("verified pull of version 3 from nothing", h.pull, s3f.pull);
  row("raw download of the same blobs (libcurl)", h.raw, s3f.raw);
  std::printf("  %-46s %12.0f MB/s %10.0f MB/s\n", "pull throughput", h.pull_bytes / 1e6 / h.pull,
              s3f.pull_bytes / 1e6 / s3f.pull);
  std::printf("  %-46s %12.2fx %12.2fx\n", "pull / raw download", h.pull / h.raw,
              s3f.pull / s3f.raw);

  // Leave nothing behind in the bucket.
  for (const char* prefix : {"blobs/", "runs/"}) {
    Result<std::vector<std::string>> keys = s3.List(prefix);
    if (keys.ok())
      for (const std::string& key : *keys) (void)s3.Delete(key);
  }
  server->Stop();
  std::filesystem::remove_all(root);
  return 0;
}
