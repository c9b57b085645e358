// New versions pushed against polled: how soon readers hear of a version, and what idle readers
// cost the store, measured in the same run.
//
// A store server over a directory, a relay in front of it over a link shaped to a WAN's latency,
// and --readers readers on the relay, each a thread running the rollout worker's loop for new
// versions (StoreReader::WatchLatest):
//   - poll (the baseline): read `latest` every 100 ms (a plain GET, passed through by the relay);
//   - push: a long poll of up to 10 s on `latest` (Prefer: wait), answered when it changes.
// For each mode: --idle seconds without a version (requests per second that reach the relay from
// the readers, and the store server from the relay), then --versions versions published by
// compare-and-swap every --every seconds (from each publication to each reader hearing of it: the
// median and the 99th percentile over readers and versions, and the median over versions of the
// last reader's).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/http_client.h"
#include "policy_store/directory_store.h"
#include "policy_store/http_store.h"
#include "policy_store/reader.h"
#include "policy_store/relay.h"
#include "policy_store/run_objects.h"
#include "policy_store/store_server.h"

namespace {

using namespace weft;
using namespace weft::policy_store;
using bench::Check;
using bench::Clock;
using bench::Seconds;

struct Settings {
  int readers = 100;
  double idle = 10;
  int versions = 20;
  double every = 0.5;
  int latency_ms = 40;
};

// Answers a server has given so far (every status class), from its /metrics.
uint64_t Answers(const std::string& url, const std::string& prefix) {
  HttpClient client(url);
  Result<HttpReply> reply = client.Request("GET", "/metrics", {}, {});
  Check(reply.status(), "reading /metrics");
  const std::string text(reply->body.begin(), reply->body.end());
  uint64_t total = 0;
  const std::string name = prefix + "_answers_total{";
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const size_t value = text.find("} ", at);
    total += std::stoull(text.substr(value + 2));
  }
  return total;
}

double Percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(fraction * values.size()));
  return values[index];
}

struct Figures {
  double relay_per_s = 0, store_per_s = 0;  // idle
  double median = 0, p99 = 0, last_median = 0, worst = 0;
};

Figures Measure(bool push, const Settings& settings, DirectoryStore& origin,
                const std::string& store_url, const std::string& relay_url, uint64_t first) {
  const std::string key = LatestKey("bench");
  const int versions = settings.versions;
  // heard[v][r]: seconds from the start until reader r heard of version first + 1 + v.
  std::vector<std::vector<double>> heard(versions, std::vector<double>(settings.readers, -1));
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  const Clock::time_point zero = Clock::now();
  std::vector<std::thread> readers;
  for (int r = 0; r < settings.readers; ++r) {
    readers.emplace_back([&, r] {
      HttpStoreOptions options;
      options.deadline = std::chrono::milliseconds(60000);
      HttpStore store(relay_url, "", options);
      StoreReader reader(store, "bench", 1);
      bool counted = false;
      while (!stop.load()) {
        // Poll: a plain read (Latest); push: a long poll (WatchLatest).
        Result<StoreReader::LatestWatch> latest = StoreReader::LatestWatch{};
        if (push) {
          latest = reader.WatchLatest(std::chrono::milliseconds(10000), &stop);
        } else if (Result<uint64_t> read = reader.Latest(); read.ok()) {
          latest = StoreReader::LatestWatch{*read, false};
        } else {
          latest = read.status();
        }
        if (latest.ok() && latest->version) {
          if (!counted) {
            counted = true;
            ++started;
          }
          const uint64_t v = *latest->version;
          if (v > first && v <= first + static_cast<uint64_t>(versions) &&
              heard[v - first - 1][r] < 0)
            heard[v - first - 1][r] = Seconds(zero);
        }
        if (!push || !latest.ok() || !latest->waited)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  while (started.load() < settings.readers)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  Figures figures;
  const uint64_t relay_before = Answers(relay_url, "weft_relay");
  const uint64_t store_before = Answers(store_url, "weft_store_server");
  const Clock::time_point idle_start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(settings.idle));
  const double idle = Seconds(idle_start);
  // (Each count includes the /metrics read that took it.)
  figures.relay_per_s =
      static_cast<double>(Answers(relay_url, "weft_relay") - relay_before - 1) / idle;
  figures.store_per_s =
      static_cast<double>(Answers(store_url, "weft_store_server") - store_before - 1) / idle;

  std::vector<double> published(versions);
  for (int v = 0; v < versions; ++v) {
    const uint64_t version = first + 1 + static_cast<uint64_t>(v);
    published[v] = Seconds(zero);
    Check(origin.CompareAndSwap(key, VersionText(version - 1), VersionText(version)), "publishing");
    std::this_thread::sleep_for(std::chrono::duration<double>(settings.every));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  for (std::thread& reader : readers) reader.join();

  std::vector<double> each, last;
  for (int v = 0; v < versions; ++v) {
    double latest = 0;
    for (int r = 0; r < settings.readers; ++r) {
      // A reader that missed a version (it heard of the next one first) counts at the next's.
      double at = heard[v][r];
      for (int w = v + 1; at < 0 && w < versions; ++w) at = heard[w][r];
      if (at < 0) at = Seconds(zero);
      each.push_back(at - published[v]);
      latest = std::max(latest, at - published[v]);
    }
    last.push_back(latest);
  }
  figures.median = Percentile(each, 0.5);
  figures.p99 = Percentile(each, 0.99);
  figures.last_median = Percentile(last, 0.5);
  figures.worst = Percentile(last, 1.0);
  return figures;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "watch_bench: %s needs a value\n", flag.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--readers") {
      settings.readers = std::stoi(value());
    } else if (flag == "--idle") {
      settings.idle = std::stod(value());
    } else if (flag == "--versions") {
      settings.versions = std::stoi(value());
    } else if (flag == "--every") {
      settings.every = std::stod(value());
    } else if (flag == "--latency-ms") {
      settings.latency_ms = std::stoi(value());
    } else if (flag == "--quick") {
      settings = Settings{20, 2, 5, 0.3, 40};
    } else {
      std::fprintf(stderr,
                   "usage: watch_bench [--readers N] [--idle SECONDS] [--versions N] "
                   "[--every SECONDS] [--latency-ms MS] [--quick]\n");
      return 2;
    }
  }
  const std::string root =
      (std::filesystem::temp_directory_path() / ("watch_bench." + std::to_string(getpid())))
          .string();
  auto origin = DirectoryStore::Open(root + "/store");
  Check(origin.status(), "opening the store");
  Check((*origin)->CompareAndSwap(LatestKey("bench"), std::nullopt, VersionText(0)), "version 0");
  StoreServerOptions server_options;
  server_options.threads = 2;
  auto server = StoreServer::Start(**origin, server_options);
  Check(server.status(), "starting the store server");
  const std::string store_url = "http://127.0.0.1:" + std::to_string((*server)->port());
  RelayOptions relay_options;
  relay_options.upstream = store_url;
  relay_options.cache_dir = root + "/relay";
  relay_options.link.latency = std::chrono::milliseconds(settings.latency_ms);
  auto relay = Relay::Start(relay_options);
  Check(relay.status(), "starting the relay");
  const std::string relay_url = "http://127.0.0.1:" + std::to_string((*relay)->port());

  std::printf(
      "%d readers on a relay %d ms from the store; %.0f s idle, then %d versions %.2f s "
      "apart\n",
      settings.readers, settings.latency_ms, settings.idle, settings.versions, settings.every);
  const Figures poll = Measure(false, settings, **origin, store_url, relay_url, 0);
  const Figures push = Measure(true, settings, **origin, store_url, relay_url,
                               static_cast<uint64_t>(settings.versions));
  std::printf("%-34s %12s %12s %8s\n", "", "poll 100 ms", "push", "ratio");
  auto row = [](const char* what, double a, double b, const char* unit) {
    if (b > 0) {
      std::printf("%-34s %9.3f %-2s %9.3f %-2s %7.1fx\n", what, a, unit, b, unit, a / b);
    } else {
      std::printf("%-34s %9.3f %-2s %9.3f %-2s %8s\n", what, a, unit, b, unit, "-");
    }
  };
  row("idle requests/s at the relay", poll.relay_per_s, push.relay_per_s, "");
  row("idle requests/s at the store", poll.store_per_s, push.store_per_s, "");
  row("publication to heard, median", poll.median, push.median, "s");
  row("publication to heard, p99", poll.p99, push.p99, "s");
  row("to the last reader, median", poll.last_median, push.last_median, "s");
  row("to the last reader, worst", poll.worst, push.worst, "s");
  (*relay)->Stop();
  (*server)->Stop();
  std::filesystem::remove_all(root);
  return 0;
}
