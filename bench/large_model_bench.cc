// The data path at a frontier model's scale: a synthetic BF16 model of a chosen served size
// (--gib, 4 by default) published by several ranks as a keyframe in parts plus --versions deltas,
// then pulled from nothing and caught up (lag 10 and lag 100, unpinned, as a returning rollout
// worker does) through
//   (a) `weft store serve`,
//   (b) a `weft relay` in front of it, read by 8 readers at once,
//   (c) S3 (with --s3 URI; bench/large_model_bench.sh starts a Ceph RADOS Gateway for it),
// every server and reader a process of its own. Printed per process: peak resident memory (the
// target: at most 256 MiB for the store server and the relay whatever the object size, at most
// 1.2x the model for a reader), throughput and CPU seconds per GB, next to a raw read of the same
// files and raw loopback downloads of the same blobs measured in the same run (the target: a
// verified pull at least 0.8x a raw download's throughput), the upstream bytes of 8 readers
// through a relay next to one pull's (the target: 1.00x), and what range_size and parallel
// (docs/store.md) change.
//
// The versions are generated tensor by tensor, with no FP32 master anywhere: each step moves
// --density of a tensor's elements (2% by default) by one unit in the last place (one in eight by
// two), four in five of them among the 5% of elements that move most, as small weights under an
// optimiser do. Takes tens of minutes at 4 GiB on two cores, most of it publishing; the work
// directory (--dir, default under /tmp) needs about 3x the model's size on disk.
//
//   large_model_bench [--gib N] [--versions N] [--density P] [--ranks N] [--dir DIR] [--keep]
//                     [--s3 s3://BUCKET/PREFIX?endpoint=...] [--skip-knobs]
#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/concurrent.h"
#include "common/file_util.h"
#include "common/parallel.h"
#include "policy_store/blob_fetch.h"
#include "policy_store/directory_store.h"
#include "policy_store/planner.h"
#include "policy_store/publish.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
#include "sync/delta_codec.h"
#include "sync/served_model.h"

namespace {

using namespace weft;
using namespace weft::policy_store;
using bench::Check;
using bench::Clock;
using bench::Seconds;

constexpr const char* kRun = "bench";

// ---------------------------------------------------------------------------------------------
// The synthetic model and its steps.

// Projections of 4096 x 4096 BF16 (32 MiB each) and a norm of 4096 after every eight, up to
// `bytes` in all.
std::vector<sync::TensorSpec> Layout(uint64_t bytes) {
  std::vector<sync::TensorSpec> specs;
  uint64_t total = 0;
  for (int layer = 0; total < bytes; ++layer) {
    for (int p = 0; p < 8 && total < bytes; ++p) {
      specs.push_back({"layer" + std::to_string(layer) + ".proj" + std::to_string(p),
                       sync::DType::kBF16,
                       {4096, 4096}});
      total += specs.back().byte_count();
    }
    specs.push_back({"layer" + std::to_string(layer) + ".norm", sync::DType::kBF16, {4096}});
    total += specs.back().byte_count();
  }
  return specs;
}

// BF16 values N(0, 0.02), seeded by the tensor's index.
std::vector<uint8_t> InitialTensor(const sync::TensorSpec& spec, size_t index) {
  std::vector<uint8_t> bytes(spec.byte_count());
  std::mt19937_64 rng(1000 + index);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (size_t i = 0; i < bytes.size(); i += 2) {
    const float value = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint16_t bf16 = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    std::memcpy(&bytes[i], &bf16, 2);
  }
  return bytes;
}

// One optimiser step of a BF16 tensor, in place: `density` of its elements move by one unit in
// the last place (one in eight by two), up or down, four in five of them among every 20th
// element (the small weights, which cross rounding thresholds most often).
void Step(std::span<uint8_t> bytes, size_t index, uint64_t version, double density) {
  const uint64_t elements = bytes.size() / 2;
  std::mt19937_64 rng(index * 1000003 + version);
  const uint64_t changes = static_cast<uint64_t>(static_cast<double>(elements) * density);
  for (uint64_t n = 0; n < changes; ++n) {
    const uint64_t draw = rng();
    const bool hot = (draw >> 56) % 5 != 0;
    const uint64_t at = hot ? (draw >> 8) % (elements / 20) * 20 : (draw >> 8) % elements;
    uint16_t bits;
    std::memcpy(&bits, &bytes[at * 2], 2);
    // The order-preserving key of the pattern, moved and mapped back.
    const bool negative = bits & 0x8000;
    uint16_t key = negative ? static_cast<uint16_t>(~bits) : static_cast<uint16_t>(bits | 0x8000);
    const int step = (draw >> 40) % 8 == 0 ? 2 : 1;
    key = static_cast<uint16_t>((draw >> 44) & 1 ? key + step : key - step);
    bits = key & 0x8000 ? static_cast<uint16_t>(key & 0x7fff) : static_cast<uint16_t>(~key);
    std::memcpy(&bytes[at * 2], &bits, 2);
  }
}

// Publishes version 0 (a keyframe in one part per rank) and `versions` more, each rank holding
// its tensors (every `ranks`-th) and committing through rank 0, as a sharded trainer does.
void Publish(ObjectStore& store, uint64_t model_bytes, uint64_t versions, double density,
             int ranks) {
  const int threads = HardwareThreads();
  const std::vector<sync::TensorSpec> layout = Layout(model_bytes);
  std::vector<sync::ServedModel> shards;
  std::vector<std::vector<size_t>> owned(ranks);
  for (size_t t = 0; t < layout.size(); ++t) owned[t % ranks].push_back(t);
  for (int r = 0; r < ranks; ++r) {
    std::vector<sync::TensorSpec> specs;
    std::vector<std::vector<uint8_t>> bytes;
    for (size_t t : owned[r]) {
      specs.push_back(layout[t]);
      bytes.push_back(InitialTensor(layout[t], t));
    }
    shards.push_back(sync::ServedModel::FromTensors(std::move(specs), std::move(bytes), threads));
  }
  KeyframePolicy policy;
  policy.interval = 1 << 20;  // the one keyframe at version 0: readers catch up through deltas
  policy.delta_budget = 1e9;
  std::vector<RecentDeltas> recent(ranks);
  RecentDeltas committed;
  std::optional<Manifest> previous;
  const auto start = Clock::now();
  for (uint64_t v = 0; v <= versions; ++v) {
    for (int r = 0; r < ranks; ++r) {
      std::optional<sync::ModelDelta> delta;
      if (v > 0) {
        delta.emplace();
        for (size_t i = 0; i < owned[r].size(); ++i) {
          const sync::ServedModel::Tensor& tensor = shards[r].tensors()[i];
          std::vector<uint8_t> next = tensor.bytes.ToVector();
          Step(next, owned[r][i], v, density);
          sync::CodecOptions codec;
          codec.threads = threads;
          delta->tensors.push_back(std::move(sync::EncodeTensorDelta(tensor.spec, tensor.bytes,
                                                                     next, codec, tensor.digest))
                                       .value());
        }
        Check(shards[r].Apply(*delta, threads), "apply a step");
      }
      Check(PublishShard(store, kRun, previous ? &*previous : nullptr, r, ranks, shards[r],
                         delta ? &*delta : nullptr, policy, &recent[r])
                .status(),
            "publish a shard");
    }
    Result<Manifest> manifest = CommitShards(store, kRun, previous ? &*previous : nullptr, ranks,
                                             policy, threads, std::chrono::seconds(60), &committed);
    Check(manifest.status(), "commit");
    previous = std::move(manifest).value();
    if (v % 10 == 0) {
      std::printf("  version %" PRIu64 " published (%.0f s)\n", v, Seconds(start));
      std::fflush(stdout);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Measurements in processes of their own.

// A field of /proc/PID/status ("self" for this process), in bytes.
uint64_t StatusBytes(const std::string& pid, const std::string& field) {
  std::ifstream status("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// What a child reports: one line "peak before model bytes wall cpu".
struct ChildReport {
  uint64_t peak = 0, before = 0, model = 0, bytes = 0;
  double wall = 0, cpu = 0;
  double Ratio() const { return model == 0 ? 0 : double(peak - before) / double(model); }
  double MBps() const { return wall == 0 ? 0 : bytes / 1e6 / wall; }
  double CpuPerGB() const { return bytes == 0 ? 0 : cpu / (bytes / 1e9); }
};

void Print(const ChildReport& r) {
  std::printf("%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.6f %.6f\n", r.peak, r.before,
              r.model, r.bytes, r.wall, r.cpu);
}

// Child: a verified pull of `to` from `from` (none: "-"), the store's own range_size and parallel
// unless given. The peak is reset once version `from` is held.
int ChildPull(const std::string& uri, uint64_t to, const std::string& from_text) {
  Result<std::unique_ptr<ObjectStore>> store = OpenStore(uri);
  Check(store.status(), "open the store");
  const int threads = HardwareThreads();
  ChildReport report;
  report.before = StatusBytes("self", "VmRSS");
  StoreReader reader(**store, kRun, threads);
  reader.DropCopyForKeyframe(true);
  sync::ServedModel model;
  std::optional<uint64_t> from;
  if (from_text != "-") {
    from = std::stoull(from_text);
    Check(reader.Pull(*from, std::nullopt, &model).status(), "pull the version caught up from");
    std::ofstream("/proc/self/clear_refs") << "5";
  }
  const double cpu = CpuSeconds();
  const auto start = Clock::now();
  Result<PullReport> pulled = reader.Pull(to, from, &model);
  Check(pulled.status(), "pull");
  report.wall = Seconds(start);
  report.cpu = CpuSeconds() - cpu;
  report.peak = StatusBytes("self", "VmHWM");
  report.model = model.byte_count();
  report.bytes = pulled->bytes_downloaded;
  Print(report);
  return 0;
}

// A blob's bytes hashed and dropped: what a reader that checks blobs but builds no model holds.
class DropSink : public BlobSink {
 public:
  Status Place(uint64_t, std::span<const uint8_t>) override { return Status::Ok(); }
  void Restart() override {}
};

// Child: every blob of the path to `to` from nothing fetched and checked against its hash (no
// model built): one of the 8 readers through a relay.
int ChildVerify(const std::string& uri, uint64_t to) {
  Result<std::unique_ptr<ObjectStore>> store = OpenStore(uri);
  Check(store.status(), "open the store");
  ChildReport report;
  report.before = StatusBytes("self", "VmRSS");
  Result<Manifest> goal = ReadManifest(**store, kRun, to);
  Check(goal.status(), "read the manifest");
  Result<PullPlan> plan = PlanPath(**store, kRun, *goal, std::nullopt, true);
  Check(plan.status(), "plan");
  std::vector<BlobRef> blobs = plan->keyframe.keyframe;
  for (const PullPlan::Step& step : plan->steps) blobs.push_back(step.blob);
  std::vector<DropSink> sinks(blobs.size());
  std::vector<BlobFetch> fetches;
  for (size_t i = 0; i < blobs.size(); ++i) {
    fetches.push_back({blobs[i], "blob", &sinks[i]});
    report.bytes += blobs[i].bytes;
  }
  const double cpu = CpuSeconds();
  const auto start = Clock::now();
  FetchOptions options = FetchOptionsFor(**store);
  options.max_buffered_bytes = uint64_t{64} << 20;
  Check(FetchBlobs(**store, fetches, options), "fetch");
  report.wall = Seconds(start);
  report.cpu = CpuSeconds() - cpu;
  report.peak = StatusBytes("self", "VmHWM");
  Print(report);
  return 0;
}

// The blobs of a pull from nothing of `to`: "SHA256 BYTES" lines in a file, for the raw children.
std::vector<BlobRef> ReadBlobList(const std::string& path) {
  std::vector<BlobRef> blobs;
  std::ifstream in(path);
  BlobRef blob;
  while (in >> blob.sha256 >> blob.bytes) blobs.push_back(blob);
  return blobs;
}

// Child: the blobs read from their files in the store's directory, 8 MiB at a time, 16 at once.
int ChildRawRead(const std::string& dir, const std::string& list) {
  const std::vector<BlobRef> blobs = ReadBlobList(list);
  ChildReport report;
  struct Part {
    std::string path;
    uint64_t offset, size;
  };
  std::vector<Part> parts;
  for (const BlobRef& blob : blobs) {
    for (uint64_t at = 0; at < blob.bytes; at += 8 << 20)
      parts.push_back(
          {dir + "/" + BlobKey(blob.sha256), at, std::min<uint64_t>(8 << 20, blob.bytes - at)});
    report.bytes += blob.bytes;
  }
  const double cpu = CpuSeconds();
  const auto start = Clock::now();
  std::atomic<size_t> next{0};
  Check(ForEachConcurrently(16, 16,
                            [&](size_t) -> Status {
                              std::vector<uint8_t> buffer(8 << 20);
                              for (size_t i = next++; i < parts.size(); i = next++) {
                                Result<FileRead> read = ReadFileRangeInto(
                                    parts[i].path, parts[i].offset,
                                    std::span<uint8_t>(buffer).first(parts[i].size));
                                WEFT_RETURN_IF_ERROR(read.status());
                              }
                              return Status::Ok();
                            }),
        "raw read");
  report.wall = Seconds(start);
  report.cpu = CpuSeconds() - cpu;
  report.peak = StatusBytes("self", "VmHWM");
  Print(report);
  return 0;
}

// Child: the blobs downloaded from a store server (plain libcurl GETs, the bytes counted and
// dropped), 16 requests at once: whole blobs, or ranges of `part` bytes (as a reader asks).
int ChildRawDownload(const std::string& url, const std::string& list, uint64_t part) {
  const std::vector<BlobRef> blobs = ReadBlobList(list);
  ChildReport report;
  struct Range {
    std::string key;
    uint64_t offset, size;
  };
  std::vector<Range> ranges;
  for (const BlobRef& blob : blobs) {
    const uint64_t step = part == 0 ? std::max<uint64_t>(blob.bytes, 1) : part;
    for (uint64_t at = 0; at < std::max<uint64_t>(blob.bytes, 1); at += step)
      ranges.push_back({BlobKey(blob.sha256), at, std::min(step, blob.bytes - at)});
    report.bytes += blob.bytes;
  }
  const double cpu = CpuSeconds();
  const auto start = Clock::now();
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> received{0};
  Check(ForEachConcurrently(
            16, 16,
            [&](size_t) -> Status {
              CURL* curl = curl_easy_init();
              uint64_t got = 0;
              curl_easy_setopt(curl, CURLOPT_PROXY, "");
              curl_easy_setopt(
                  curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t count, void* user) {
                    *static_cast<uint64_t*>(user) += size * count;
                    return size * count;
                  });
              curl_easy_setopt(curl, CURLOPT_WRITEDATA, &got);
              Status status = Status::Ok();
              for (size_t i = next++; i < ranges.size() && status.ok(); i = next++) {
                const std::string where = url + "/v1/objects/" + ranges[i].key;
                const std::string range = std::to_string(ranges[i].offset) + "-" +
                                          std::to_string(ranges[i].offset + ranges[i].size - 1);
                curl_easy_setopt(curl, CURLOPT_URL, where.c_str());
                curl_easy_setopt(curl, CURLOPT_RANGE, part == 0 ? nullptr : range.c_str());
                got = 0;
                const CURLcode code = curl_easy_perform(curl);
                if (code != CURLE_OK || got != ranges[i].size)
                  status = Unavailable("raw download of " + where + " failed");
                received += got;
              }
              curl_easy_cleanup(curl);
              return status;
            }),
        "raw download");
  report.wall = Seconds(start);
  report.cpu = CpuSeconds() - cpu;
  report.peak = StatusBytes("self", "VmHWM");
  Print(report);
  return 0;
}

// Counts the bytes of a read and drops them.
class CountTarget : public BodyTarget {
 public:
  Status Write(std::span<const uint8_t> bytes) override {
    count += bytes.size();
    return Status::Ok();
  }
  Status Rewind() override {
    count = 0;
    return Status::Ok();
  }
  uint64_t count = 0;
};

// Child: the blobs read through weft's own client for the store (S3's signed requests, say), in
// ranges of the store's range_size, as many at once as its parallel: the bytes counted and
// dropped, nothing checked.
int ChildRawStore(const std::string& uri, const std::string& list) {
  Result<std::unique_ptr<ObjectStore>> store = OpenStore(uri);
  Check(store.status(), "open the store");
  const BlobReads reads = (*store)->blob_reads();
  const std::vector<BlobRef> blobs = ReadBlobList(list);
  ChildReport report;
  struct Range {
    std::string key;
    uint64_t offset, size;
  };
  std::vector<Range> ranges;
  for (const BlobRef& blob : blobs) {
    for (uint64_t at = 0; at < blob.bytes; at += reads.part_bytes)
      ranges.push_back({BlobKey(blob.sha256), at, std::min(reads.part_bytes, blob.bytes - at)});
    report.bytes += blob.bytes;
  }
  const double cpu = CpuSeconds();
  const auto start = Clock::now();
  std::atomic<size_t> next{0};
  Check(ForEachConcurrently(reads.parallel, reads.parallel,
                            [&](size_t) -> Status {
                              for (size_t i = next++; i < ranges.size(); i = next++) {
                                CountTarget target;
                                WEFT_RETURN_IF_ERROR((*store)
                                                         ->ReadTo(ranges[i].key, ranges[i].offset,
                                                                  ranges[i].size, target)
                                                         .status());
                                if (target.count != ranges[i].size)
                                  return DataLoss("a short range of " + ranges[i].key);
                              }
                              return Status::Ok();
                            }),
        "raw download through the store's client");
  report.wall = Seconds(start);
  report.cpu = CpuSeconds() - cpu;
  report.peak = StatusBytes("self", "VmHWM");
  Print(report);
  return 0;
}

// Runs this program as a child with `args` and reads its report.
ChildReport RunChild(const std::vector<std::string>& args) {
  std::string command = bench::SelfPath() + " --child";
  for (const std::string& arg : args) command += " '" + arg + "'";
  FILE* child = popen(command.c_str(), "r");
  ChildReport r;
  unsigned long long peak = 0, before = 0, model = 0, bytes = 0;
  if (child == nullptr || std::fscanf(child, "%llu %llu %llu %llu %lf %lf", &peak, &before, &model,
                                      &bytes, &r.wall, &r.cpu) != 6) {
    std::fprintf(stderr, "large_model_bench: the child '%s' failed\n", command.c_str());
    std::exit(1);
  }
  if (pclose(child) != 0) {
    std::fprintf(stderr, "large_model_bench: the child '%s' failed\n", command.c_str());
    std::exit(1);
  }
  r.peak = peak, r.before = before, r.model = model, r.bytes = bytes;
  return r;
}

// A weft server process (`weft store serve`, `weft relay`), its URL read from its first line.
struct Server {
  pid_t pid = -1;
  std::string url;

  static Server Start(const std::vector<std::string>& args) {
    int out[2];
    if (pipe(out) != 0) std::abort();
    Server server;
    server.pid = fork();
    if (server.pid == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      std::string binary = WEFT_BINARY;
      argv.push_back(binary.data());
      std::vector<std::string> copies = args;
      for (std::string& arg : copies) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    // "serving WHAT on http://ADDRESS:PORT (...)": WHAT may hold URLs too (a relay's upstream).
    const size_t on = line.rfind(" on http://");
    const size_t at = on == std::string::npos ? on : on + 4;
    if (at == std::string::npos) {
      std::fprintf(stderr, "large_model_bench: weft did not start: '%s'\n", line.c_str());
      std::exit(1);
    }
    server.url = line.substr(at, line.find(' ', at) - at);
    return server;
  }
  uint64_t Peak() const { return StatusBytes(std::to_string(pid), "VmHWM"); }
  void Stop() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }
};

// A relay's counter from GET /v1/stats.
uint64_t RelayCounter(const std::string& url, const std::string& name) {
  HttpClient client(url);
  Result<HttpReply> reply = client.Request("GET", "/v1/stats", {}, {});
  Check(reply.status(), "relay stats");
  const std::string text(reply->body.begin(), reply->body.end());
  const size_t at = text.find("\"" + name + "\":");
  return at == std::string::npos ? 0 : std::stoull(text.substr(at + name.size() + 3));
}

struct Row {
  std::string what;
  ChildReport r;
  std::string note;
};

void PrintRows(const std::string& title, const std::vector<Row>& rows) {
  std::printf("\n%s\n", title.c_str());
  std::printf("  %-52s %8s %8s %9s %9s %8s\n", "", "s", "MB/s", "CPU s/GB", "peak MiB", "x model");
  for (const Row& row : rows) {
    std::printf("  %-52s %8.2f %8.0f %9.2f %9.0f %8s %s\n", row.what.c_str(), row.r.wall,
                row.r.MBps(), row.r.CpuPerGB(), (row.r.peak - row.r.before) / 1048576.0,
                row.r.model ? (std::to_string(row.r.Ratio()).substr(0, 5) + "x").c_str() : "",
                row.note.c_str());
  }
  std::fflush(stdout);
}

// (a) through a store server and (b) through a relay in front of it.
void MeasureHttp(const std::string& store_dir, const std::string& dir, const std::string& list,
                 uint64_t latest, uint64_t pull_bytes, uint64_t model_bytes, bool knobs) {
  const std::string from_nothing = "-";
  const std::string lag10 = std::to_string(latest - 10), lag100 = std::to_string(latest - 100);
  Server serve = Server::Start({"store", "serve", "--store", store_dir, "--listen", "127.0.0.1:0"});
  std::vector<Row> a;
  std::vector<std::string> pull = {"pull", serve.url, std::to_string(latest)};
  a.push_back({"raw read of the blob files (8 MiB reads, 16 at once)",
               RunChild({"raw-read", store_dir, list}), ""});
  a.push_back({"raw download, whole blobs, 16 at once (libcurl)",
               RunChild({"raw-download", serve.url, list, "0"}), ""});
  const ChildReport raw = RunChild({"raw-download", serve.url, list, std::to_string(8 << 20)});
  a.push_back({"raw download, 8 MiB ranges, 16 at once (libcurl)", raw, ""});
  const ChildReport fresh = RunChild({"pull", serve.url, std::to_string(latest), from_nothing});
  char note[128];
  std::snprintf(note, sizeof(note), "%.2fx the ranged raw download", fresh.MBps() / raw.MBps());
  a.push_back({"verified pull from nothing", fresh, note});
  // The keyframe alone (version 0): moving and checking the bytes, without applying deltas.
  const ChildReport keyframe = RunChild({"pull", serve.url, "0", from_nothing});
  std::snprintf(note, sizeof(note), "%.2fx the ranged raw download", keyframe.MBps() / raw.MBps());
  a.push_back({"verified pull of the keyframe alone (version 0)", keyframe, note});
  a.push_back({"catch-up, lag 10, unpinned",
               RunChild({"pull", serve.url, std::to_string(latest), lag10}), ""});
  a.push_back({"catch-up, lag 100, unpinned",
               RunChild({"pull", serve.url, std::to_string(latest), lag100}), ""});
  if (knobs) {
    for (const char* options : {"?range_size=1MiB&parallel=16", "?range_size=32MiB&parallel=16",
                                "?range_size=8MiB&parallel=4", "?range_size=8MiB&parallel=64"}) {
      a.push_back({std::string("verified pull from nothing, ") + (options + 1),
                   RunChild({"pull", serve.url + options, std::to_string(latest), from_nothing}),
                   ""});
    }
  }
  const uint64_t serve_peak = serve.Peak();
  PrintRows("(a) through weft store serve (loopback)", a);
  std::printf("  store server peak resident memory: %.0f MiB (target: at most 256 MiB)\n",
              serve_peak / 1048576.0);

  // (b) A relay in front of it, 8 readers at once.
  Server relay =
      Server::Start({"relay", "--upstream", serve.url, "--cache", dir + "/relay", "--max-bytes",
                     std::to_string(model_bytes * 3), "--listen", "127.0.0.1:0"});
  std::vector<ChildReport> readers(8);
  const auto start = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&, i] {
        readers[i] = RunChild({"verify", relay.url, std::to_string(latest)});
      });
    for (std::thread& t : threads) t.join();
  }
  const double relay_wall = Seconds(start);
  const uint64_t upstream = RelayCounter(relay.url, "upstream_bytes");
  uint64_t reader_peak = 0;
  for (const ChildReport& r : readers) reader_peak = std::max(reader_peak, r.peak - r.before);
  std::vector<Row> b;
  const ChildReport warm = RunChild({"pull", relay.url, std::to_string(latest), from_nothing});
  b.push_back({"verified pull from nothing, from the warm relay", warm, ""});
  const uint64_t relay_peak = relay.Peak();
  PrintRows("(b) through a relay in front of the store server", b);
  std::printf(
      "  8 readers at once, each checking every blob from nothing: %.1f s, %.0f MB/s in "
      "all, each reader's peak %.0f MiB\n",
      relay_wall, 8 * pull_bytes / 1e6 / relay_wall, reader_peak / 1048576.0);
  std::printf("  upstream bytes for the 8 readers: %" PRIu64 ", %.3fx one pull (target 1.00x)\n",
              upstream, static_cast<double>(upstream) / pull_bytes);
  std::printf("  relay peak resident memory: %.0f MiB (target: at most 256 MiB)\n",
              relay_peak / 1048576.0);
  std::printf("  store server peak resident memory, all of (a) and (b): %.0f MiB\n",
              serve.Peak() / 1048576.0);
  relay.Stop();
  serve.Stop();
}

int Main(int argc, char** argv) {
  double gib = 4, density = 0.02;
  uint64_t versions = 100;
  int ranks = 4;
  std::string dir, s3;
  bool keep = false, knobs = true, http = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "large_model_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (arg == "--gib") {
      gib = std::stod(value());
    } else if (arg == "--versions") {
      versions = std::stoull(value());
    } else if (arg == "--density") {
      density = std::stod(value());
    } else if (arg == "--ranks") {
      ranks = std::stoi(value());
    } else if (arg == "--dir") {
      dir = value();
    } else if (arg == "--s3") {
      s3 = value();
    } else if (arg == "--keep") {
      keep = true;
    } else if (arg == "--skip-knobs") {
      knobs = false;
    } else if (arg == "--s3-only") {
      http = false;
    } else {
      std::fprintf(stderr, "large_model_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (versions < 100) {
    std::fprintf(stderr, "large_model_bench: --versions must be at least 100 (lag 100)\n");
    return 2;
  }
  if (dir.empty())
    dir = (std::filesystem::temp_directory_path() / ("weft-large-" + std::to_string(getpid())))
              .string();
  const std::string store_dir = dir + "/store";
  std::filesystem::create_directories(dir + "/spill");
  setenv("TMPDIR", (dir + "/spill").c_str(), 1);  // the readers' spill files
  const uint64_t model_bytes = static_cast<uint64_t>(gib * (uint64_t{1} << 30));
  auto store = std::move(DirectoryStore::Open(store_dir)).value();
  if (!ReadLatest(*store, kRun).ok()) {
    std::printf("large_model_bench: publishing %.1f GiB of BF16 from %d ranks, %" PRIu64
                " versions at density %.3f, in %s\n",
                gib, ranks, versions, density, store_dir.c_str());
    const auto start = Clock::now();
    Publish(*store, model_bytes, versions, density, ranks);
    std::printf("  published in %.0f s\n", Seconds(start));
  }
  const uint64_t latest = std::move(ReadLatest(*store, kRun)).value();
  // The blobs of a pull from nothing of the latest version, for the raw baselines.
  sync::ServedModel none;
  Result<Manifest> goal = ReadManifest(*store, kRun, latest);
  Check(goal.status(), "manifest");
  Result<PullPlan> plan = PlanPath(*store, kRun, *goal, std::nullopt, true);
  Check(plan.status(), "plan");
  const std::string list = dir + "/blobs.txt";
  uint64_t pull_bytes = 0;
  {
    std::ofstream out(list);
    for (const BlobRef& blob : plan->keyframe.keyframe)
      out << blob.sha256 << " " << blob.bytes << "\n";
    for (const PullPlan::Step& step : plan->steps)
      out << step.blob.sha256 << " " << step.blob.bytes << "\n";
    for (const BlobRef& blob : plan->keyframe.keyframe) pull_bytes += blob.bytes;
    for (const PullPlan::Step& step : plan->steps) pull_bytes += step.blob.bytes;
  }
  std::printf("\nversion %" PRIu64 " from nothing: %s, %.2f GB\n", latest, plan->Describe().c_str(),
              pull_bytes / 1e9);
  const std::string from_nothing = "-";
  const std::string lag10 = std::to_string(latest - 10), lag100 = std::to_string(latest - 100);

  if (http) MeasureHttp(store_dir, dir, list, latest, pull_bytes, model_bytes, knobs);

  // (c) S3.
  if (!s3.empty()) {
    Result<std::unique_ptr<ObjectStore>> bucket = OpenStore(s3);
    Check(bucket.status(), "open the S3 store");
    // What the pulls below read: the run's objects, and the blobs of their paths.
    std::printf("\ncopying what the pulls read to %s...\n", s3.c_str());
    const auto copy_start = Clock::now();
    std::set<std::string> keys;
    Result<std::vector<std::string>> run_keys = store->List("runs/");
    Check(run_keys.status(), "list");
    keys.insert(run_keys->begin(), run_keys->end());
    // (The catch-ups pull the version they start from first, from nothing.)
    const std::pair<uint64_t, std::optional<uint64_t>> pulls[] = {{latest, std::nullopt},
                                                                  {latest, latest - 10},
                                                                  {latest, latest - 100},
                                                                  {latest - 10, std::nullopt},
                                                                  {latest - 100, std::nullopt}};
    for (const auto& [to, from] : pulls) {
      Result<Manifest> target = ReadManifest(*store, kRun, to);
      Check(target.status(), "manifest");
      Result<PullPlan> path = PlanPath(*store, kRun, *target, from, true);
      Check(path.status(), "plan");
      if (path->from_keyframe) {
        for (const BlobRef& blob : path->keyframe.keyframe) keys.insert(BlobKey(blob.sha256));
      }
      for (const PullPlan::Step& step : path->steps) keys.insert(BlobKey(step.blob.sha256));
    }
    uint64_t copied = 0;
    for (const std::string& key : keys) {
      Result<MappedFile> file = MappedFile::Open(store_dir + "/" + key);
      Check(file.status(), "map an object");
      Check((*bucket)->PutImmutable(key, file->bytes()), "copy an object to S3");
      copied += file->bytes().size();
    }
    std::printf("  %.2f GB copied in %.0f s\n", copied / 1e9, Seconds(copy_start));
    std::vector<Row> c;
    const ChildReport raw_s3 = RunChild({"raw-store", s3, list});
    c.push_back({"raw download of the same blobs (weft's S3 client)", raw_s3, ""});
    const ChildReport s3_fresh = RunChild({"pull", s3, std::to_string(latest), from_nothing});
    char s3_note[128];
    std::snprintf(s3_note, sizeof(s3_note), "%.2fx the raw download",
                  s3_fresh.MBps() / raw_s3.MBps());
    c.push_back({"verified pull from nothing", s3_fresh, s3_note});
    c.push_back({"checked download of the same blobs (no model)",
                 RunChild({"verify", s3, std::to_string(latest)}), ""});
    c.push_back(
        {"catch-up, lag 10, unpinned", RunChild({"pull", s3, std::to_string(latest), lag10}), ""});
    c.push_back({"catch-up, lag 100, unpinned",
                 RunChild({"pull", s3, std::to_string(latest), lag100}), ""});
    PrintRows("(c) from S3", c);
  }
  std::printf(
      "\nTargets: servers at most 256 MiB whatever the object size; a reader at most 1.2x the "
      "model; a verified pull at least 0.8x a raw loopback download; 1.00x upstream bytes for 8 "
      "readers through a relay.\n");
  if (!keep) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--child") {
    const std::string mode = argc >= 3 ? argv[2] : "";
    if (mode == "pull" && argc == 6) return ChildPull(argv[3], std::stoull(argv[4]), argv[5]);
    if (mode == "verify" && argc == 5) return ChildVerify(argv[3], std::stoull(argv[4]));
    if (mode == "raw-read" && argc == 5) return ChildRawRead(argv[3], argv[4]);
    if (mode == "raw-store" && argc == 5) return ChildRawStore(argv[3], argv[4]);
    if (mode == "raw-download" && argc == 6)
      return ChildRawDownload(argv[3], argv[4], std::stoull(argv[5]));
    std::fprintf(stderr, "large_model_bench: bad child arguments\n");
    return 2;
  }
  return Main(argc, argv);
}
