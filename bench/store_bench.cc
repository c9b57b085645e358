// Catch-up cost of the policy store: bytes a reader downloads to reach the latest version from
// lag 1, 10 and 100, next to the single squashed delta over the same range (the ideal for plain
// object storage) and a full copy, measured in the same run. The readers pin the versions they
// hold, as workers do, so the publisher writes catch-up deltas from them; the same pulls without
// those (skip deltas only) are printed too.
//
// Workload: about 200 MB of served BF16 (six 4096 x 4096 projections) over FP32 master weights
// updated by Adam at lr 1e-6 (examples/synthetic_adam.h), 110 published versions in a directory
// store with skip deltas and no keyframe after version 0. Pull times are Google Benchmark figures
// (fastest of three repetitions). Takes a few minutes; --quick uses a 16 MB model.
//
// Then the peak memory of a catch-up over 100 versions, next to the model's size: each pull runs
// in a process of its own (this program, started again), which loads the version it starts from,
// resets its peak resident size and pulls; printed are the resident size before the model, with
// it, and at the peak. The same pulls the way readers applied paths before (the path squashed
// into one delta, decoded whole, then written) are the baseline. Last, a reader whose version's
// manifest is gone restarts from the keyframe, dropping its copy first or keeping it meanwhile.
//
// Last, a version with a keyframe published by 4 ranks that each hold a part of the model
// (PublishShard on 4 threads, then rank 0's CommitShards) next to one rank publishing the whole
// model (PublishVersion), with the bytes rank 0's commit reads, by kind.
#include <benchmark/benchmark.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "bench/bench_util.h"
#include "common/parallel.h"
#include "examples/synthetic_adam.h"
#include "policy_store/directory_store.h"
#include "policy_store/forwarding_store.h"
#include "policy_store/manifest.h"
#include "policy_store/pins.h"
#include "policy_store/planner.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
#include "trainer_adapter/publisher.h"

namespace {

using namespace weft;

struct Setup {
  std::string root;
  std::unique_ptr<policy_store::DirectoryStore> store;
  std::vector<sync::ServedModel> versions;  // only those the benchmarks start from, by version
  std::map<uint64_t, sync::ServedModel> held;
  sync::ServedModel last;  // the latest version's
  uint64_t latest = 0;
  uint64_t full_bytes = 0;
};

Setup* g_setup = nullptr;
constexpr uint64_t kLags[] = {1, 10, 100};

struct SizeRow {
  uint64_t lag, planned, squashed, chain;
  std::string path;
  uint64_t unpinned = 0;  // the same reader without a catch-up delta (skip deltas only)
  std::string unpinned_path;
};
std::vector<SizeRow> g_sizes;

void Prepare(bool quick) {
  const int threads = HardwareThreads();
  auto* s = new Setup;
  g_setup = s;
  s->root =
      (std::filesystem::temp_directory_path() / ("weft-store-bench-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(s->root);
  s->store = std::move(policy_store::DirectoryStore::Open(s->root)).value();
  const std::vector<examples::SyntheticTensor> shapes =
      quick ? examples::ProjectionShapes(1024, 4) : examples::ProjectionShapes(4096, 6);
  examples::AdamConfig config;
  config.learning_rate = 1e-6;
  examples::SyntheticAdam adam(shapes, config, 7, threads);
  for (int i = 0; i < 10; ++i) adam.Step(threads);
  trainer_adapter::PublisherOptions options;
  options.keyframes.interval = 1 << 30;
  options.keyframes.delta_budget = 1e9;
  options.codec = sync::CodecOptions{sync::kDefaultChunkLog2, threads};
  auto publisher =
      std::move(trainer_adapter::Publisher::Start(*s->store, "bench", examples::MasterView(adam),
                                                  sync::ServingPlan{}, options))
          .value();
  const uint64_t total = 110;
  std::fprintf(stderr, "store_bench: publishing %llu versions of %.0f MB served...\n",
               static_cast<unsigned long long>(total), publisher->served().byte_count() / 1e6);
  s->full_bytes = publisher->last().keyframe_bytes();
  for (uint64_t v = 1; v <= total; ++v) {
    adam.Step(threads);
    if (!publisher->Publish(examples::MasterView(adam)).ok()) std::abort();
    for (uint64_t lag : kLags) {
      if (v != total - lag) continue;
      // A reader holding v: it pins v, so the publisher writes catch-up deltas from v.
      s->held.emplace(v, publisher->served());
      if (!policy_store::SetPin(*s->store, "bench", "reader-lag" + std::to_string(lag), v).ok())
        std::abort();
    }
  }
  s->latest = total;
  s->last = publisher->served();
  // Sizes: the planner's download, the single squashed delta, the plain chain.
  policy_store::StoreReader reader(*s->store, "bench", threads);
  for (uint64_t lag : kLags) {
    SizeRow row{lag, 0, 0, 0, "", 0, ""};
    sync::ServedModel model = s->held.at(total - lag);
    auto report = reader.Pull(total, total - lag, &model);
    if (!report.ok()) std::abort();
    row.planned = report->bytes_downloaded;
    row.path = report->path;
    std::vector<policy_store::LoadedDelta> plain;
    for (uint64_t v = total - lag + 1; v <= total; ++v) {
      auto manifest = reader.GetManifest(v);
      row.chain += manifest->delta->bytes;
      plain.push_back(
          std::move(policy_store::FetchDelta(*s->store, *manifest->delta, "delta")).value());
    }
    std::vector<const sync::ModelDelta*> chain;
    for (const policy_store::LoadedDelta& d : plain) chain.push_back(&d.delta);
    row.squashed = sync::SerializedSize(std::move(sync::SquashChain(chain, threads)).value());
    g_sizes.push_back(row);
  }
  // The same readers had they not pinned their versions: skip deltas only.
  for (SizeRow& row : g_sizes) {
    const std::string record = policy_store::CatchupKey("bench", total, total - row.lag);
    auto kept = s->store->Get(record);
    if (kept.ok() && !s->store->Delete(record).ok()) std::abort();
    sync::ServedModel model = s->held.at(total - row.lag);
    auto report = reader.Pull(total, total - row.lag, &model);
    if (!report.ok()) std::abort();
    row.unpinned = report->bytes_downloaded;
    row.unpinned_path = report->path;
    if (kept.ok() && !s->store->PutImmutable(record, *kept).ok()) std::abort();
  }
}

// A field of /proc/self/status, in bytes (VmRSS: resident now; VmHWM: the peak since the last
// reset).
uint64_t StatusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// How readers applied a path before it was applied in place: the deltas squashed into one (on the
// base when they hold context chunks), decoded whole and written.
Status PullSquashed(policy_store::ObjectStore& store, uint64_t from, uint64_t to,
                    sync::ServedModel* model, int threads) {
  WEFT_ASSIGN_OR_RETURN(policy_store::Manifest goal,
                        policy_store::ReadManifest(store, "bench", to));
  WEFT_ASSIGN_OR_RETURN(policy_store::PullPlan plan,
                        policy_store::PlanPath(store, "bench", goal, from, false));
  std::vector<policy_store::LoadedDelta> deltas;
  std::vector<const sync::ModelDelta*> chain;
  for (const policy_store::PullPlan::Step& step : plan.steps) {
    WEFT_ASSIGN_OR_RETURN(deltas.emplace_back(),
                          policy_store::FetchDelta(store, step.blob, "delta"));
  }
  for (const policy_store::LoadedDelta& d : deltas) chain.push_back(&d.delta);
  if (chain.size() == 1) return model->Apply(*chain[0], threads);
  bool context = false;
  for (const sync::ModelDelta* d : chain) context = context || sync::HasContextChunks(*d);
  WEFT_ASSIGN_OR_RETURN(sync::ModelDelta squashed,
                        context ? sync::SquashChainOnBase(chain, model->AsTensorBytes(),
                                                          sync::DeltaMode::kPlain, threads)
                                : sync::SquashChain(chain, threads));
  return model->Apply(squashed, threads);
}

// The directory store, reading ranges into place as the directory does, that answers the next
// read of `hidden` (a version's manifest) as if retention had removed it.
class HidingStore : public policy_store::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    if (!hidden.empty() && key == hidden) {
      hidden.clear();
      return NotFound(key + " is gone");
    }
    return inner().Get(key);
  }
  Result<policy_store::ObjectRange> GetRange(const std::string& key, uint64_t first,
                                             uint64_t length) override {
    return inner().GetRange(key, first, length);
  }
  Result<policy_store::RangeRead> GetRangeInto(const std::string& key, uint64_t first,
                                               std::span<uint8_t> out) override {
    return inner().GetRangeInto(key, first, out);
  }
  bool ReadsRanges() const override { return inner().ReadsRanges(); }
  std::string hidden;
};

// The child process of a memory measurement: loads version `from` (none: "-"), resets the peak,
// pulls `to` and prints "before holding peak model_bytes". `how`: "reader" (the reader's path),
// "squashed" (the path the way readers applied it before), "restart-keep" or "restart-drop"
// (version `from`'s manifest gone when the reader looks for it, so the pull restarts from the
// keyframe, building the new copy beside the one held, or dropping that one first).
int MeasureCatchup(const std::string& root, const std::string& from_text, uint64_t to,
                   const std::string& how) {
  const int threads = HardwareThreads();
  auto directory = std::move(policy_store::DirectoryStore::Open(root)).value();
  HidingStore store(*directory);
  std::optional<uint64_t> from;
  if (from_text != "-") from = std::stoull(from_text);
  malloc_trim(0);
  const uint64_t before = StatusBytes("VmRSS");
  policy_store::StoreReader reader(store, "bench", threads);
  sync::ServedModel model;
  if (from && !reader.Pull(*from, std::nullopt, &model).ok()) return 1;
  malloc_trim(0);
  const uint64_t holding = StatusBytes("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";
  if (how.rfind("restart-", 0) == 0) {
    store.hidden = policy_store::ManifestKey("bench", *from);
    reader.DropCopyForKeyframe(how == "restart-drop");
  }
  const Status pulled = how == "squashed" ? PullSquashed(store, *from, to, &model, threads)
                                          : reader.Pull(to, from, &model).status();
  if (!pulled.ok()) {
    std::fprintf(stderr, "store_bench: %s\n", pulled.ToString().c_str());
    return 1;
  }
  std::printf("%llu %llu %llu %llu\n", static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(holding),
              static_cast<unsigned long long>(StatusBytes("VmHWM")),
              static_cast<unsigned long long>(model.byte_count()));
  return 0;
}

struct MemoryRow {
  std::string what;
  uint64_t before = 0, holding = 0, peak = 0, model = 0;
};
std::vector<MemoryRow> g_memory;

// Runs MeasureCatchup in a new process of this program.
void MeasureInChild(const std::string& what, std::optional<uint64_t> from, const std::string& how) {
  const std::string command = weft::bench::SelfPath() + " --measure-catchup " + g_setup->root +
                              " " + (from ? std::to_string(*from) : "-") + " " +
                              std::to_string(g_setup->latest) + " " + how;
  FILE* child = popen(command.c_str(), "r");
  MemoryRow row{what};
  unsigned long long before = 0, holding = 0, peak = 0, model = 0;
  if (child == nullptr ||
      std::fscanf(child, "%llu %llu %llu %llu", &before, &holding, &peak, &model) != 4) {
    std::fprintf(stderr, "store_bench: the measurement of '%s' failed\n", what.c_str());
    std::abort();
  }
  pclose(child);
  g_memory.push_back({what, before, holding, peak, model});
}

void MeasureMemory() {
  const uint64_t from = g_setup->latest - 100;
  const std::string record = policy_store::CatchupKey("bench", g_setup->latest, from);
  MeasureInChild("lag 100, pinned (1 catch-up delta), in place", from, "reader");
  MeasureInChild("lag 100, pinned, squashed and decoded whole", from, "squashed");
  // Without the catch-up delta: the skip deltas.
  auto kept = g_setup->store->Get(record);
  if (!kept.ok() || !g_setup->store->Delete(record).ok()) std::abort();
  MeasureInChild("lag 100, unpinned (skip deltas), in place", from, "reader");
  MeasureInChild("lag 100, unpinned, squashed and decoded whole", from, "squashed");
  if (!g_setup->store->PutImmutable(record, *kept).ok()) std::abort();
  MeasureInChild("from nothing (keyframe + deltas)", std::nullopt, "reader");
  // A reader whose version was collected: the pull restarts from the keyframe.
  MeasureInChild("restart from a keyframe, copy dropped first", from, "restart-drop");
  MeasureInChild("restart from a keyframe, copy kept meanwhile", from, "restart-keep");
}

// Counts the bytes read through it: blobs in `keyframes`, other blobs, and everything else.
class ReadCounter : public policy_store::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<uint8_t>> Get(const std::string& key) override {
    Result<std::vector<uint8_t>> bytes = inner().Get(key);
    if (bytes.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool blob = key.rfind("blobs/", 0) == 0;
      (blob ? (keyframes.count(key) ? keyframe_bytes : delta_bytes) : other_bytes) += bytes->size();
    }
    return bytes;
  }
  std::set<std::string> keyframes;
  uint64_t keyframe_bytes = 0, delta_bytes = 0, other_bytes = 0;

 private:
  std::mutex mutex_;
};

struct ShardedRow {
  double whole_seconds = 0, sharded_seconds = 0, commit_seconds = 0;
  uint64_t keyframe_bytes = 0, parts = 0, read_keyframes = 0, read_deltas = 0, read_other = 0;
};
ShardedRow g_sharded;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void MeasureShardedPublish() {
  const int threads = HardwareThreads();
  constexpr uint64_t kWorld = 4;
  const sync::ServedModel& before = g_setup->held.at(g_setup->latest - 1);
  const sync::ServedModel& after = g_setup->last;
  policy_store::KeyframePolicy policy;
  policy.interval = 1;  // version 1 has a keyframe, as does version 0
  const sync::CodecOptions codec{sync::kDefaultChunkLog2, threads};
  // One rank with the whole model.
  policy_store::DirectoryStore& store = *g_setup->store;
  const policy_store::Manifest whole0 =
      std::move(
          policy_store::PublishVersion(store, "whole", nullptr, before, nullptr, policy, threads))
          .value();
  const sync::ModelDelta whole_delta =
      std::move(sync::EncodeModelDelta(before.AsTensorBytes(), after.AsTensorBytes(), codec))
          .value();
  auto start = std::chrono::steady_clock::now();
  const policy_store::Manifest whole1 =
      std::move(policy_store::PublishVersion(store, "whole", &whole0, after, &whole_delta, policy,
                                             threads))
          .value();
  g_sharded.whole_seconds = SecondsSince(start);
  g_sharded.keyframe_bytes = whole1.keyframe_bytes();
  // Four ranks, each with every fourth tensor.
  auto split = [&](const sync::ServedModel& model) {
    std::vector<sync::ServedModel> parts;
    for (uint64_t r = 0; r < kWorld; ++r) {
      std::vector<sync::TensorSpec> specs;
      std::vector<std::vector<uint8_t>> bytes;
      for (size_t t = r; t < model.tensors().size(); t += kWorld) {
        specs.push_back(model.tensors()[t].spec);
        bytes.push_back(model.tensors()[t].bytes.ToVector());
      }
      parts.push_back(sync::ServedModel::FromTensors(specs, bytes, threads));
    }
    return parts;
  };
  const std::vector<sync::ServedModel> parts0 = split(before), parts1 = split(after);
  std::vector<sync::ModelDelta> deltas;
  for (uint64_t r = 0; r < kWorld; ++r) {
    deltas.push_back(std::move(sync::EncodeModelDelta(parts0[r].AsTensorBytes(),
                                                      parts1[r].AsTensorBytes(), codec))
                         .value());
    if (!policy_store::PublishShard(store, "sharded", nullptr, r, kWorld, parts0[r], nullptr,
                                    policy)
             .ok())
      std::abort();
  }
  const policy_store::Manifest sharded0 =
      std::move(policy_store::CommitShards(store, "sharded", nullptr, kWorld, policy, threads,
                                           std::chrono::seconds(60)))
          .value();
  ReadCounter counter(store);
  start = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (uint64_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      if (!policy_store::PublishShard(store, "sharded", &sharded0, r, kWorld, parts1[r], &deltas[r],
                                      policy)
               .ok())
        std::abort();
    });
  }
  for (std::thread& rank : ranks) rank.join();
  // Rank 0 commits once every part is in (it would wait for them anyway).
  for (uint64_t r = 0; r < kWorld; ++r) {
    const auto part =
        policy_store::ReadPart(store, policy_store::ShardKey("sharded", 1, r, kWorld));
    if (part.ok()) counter.keyframes.insert(policy_store::BlobKey(part->keyframe.front().sha256));
  }
  const auto commit_start = std::chrono::steady_clock::now();
  const policy_store::Manifest sharded1 =
      std::move(policy_store::CommitShards(counter, "sharded", &sharded0, kWorld, policy, threads,
                                           std::chrono::seconds(60)))
          .value();
  g_sharded.commit_seconds = SecondsSince(commit_start);
  g_sharded.sharded_seconds = SecondsSince(start);
  g_sharded.parts = sharded1.keyframe.size();
  g_sharded.read_keyframes = counter.keyframe_bytes;
  g_sharded.read_deltas = counter.delta_bytes;
  g_sharded.read_other = counter.other_bytes;
}

void Register() {
  for (uint64_t lag : kLags) {
    benchmark::RegisterBenchmark(
        ("pull/lag:" + std::to_string(lag)).c_str(),
        [lag](benchmark::State& state) {
          policy_store::StoreReader reader(*g_setup->store, "bench", HardwareThreads());
          for (auto _ : state) {
            sync::ServedModel model = g_setup->held.at(g_setup->latest - lag);
            auto report = reader.Pull(g_setup->latest, g_setup->latest - lag, &model);
            if (!report.ok()) state.SkipWithError(report.status().ToString().c_str());
          }
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.5)
        ->Repetitions(3)
        ->ComputeStatistics(
            "min",
            [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); })
        ->DisplayAggregatesOnly(true);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--measure-catchup")
    return MeasureCatchup(argv[2], argv[3], std::stoull(argv[4]), argv[5]);
  bool quick = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick")
      quick = true;
    else
      args.push_back(argv[i]);
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  Prepare(quick);
  Register();
  benchmark::RunSpecifiedBenchmarks();
  MeasureMemory();
  MeasureShardedPublish();
  std::printf("\nCatch-up to version %llu, bytes downloaded (full copy: %llu bytes)\n",
              static_cast<unsigned long long>(g_setup->latest),
              static_cast<unsigned long long>(g_setup->full_bytes));
  std::printf("%5s %14s %14s %10s %14s %10s %10s  %s\n", "lag", "downloaded", "squashed",
              "vs squash", "plain chain", "vs chain", "vs full", "path");
  for (const SizeRow& row : g_sizes) {
    std::printf(
        "%5llu %14llu %14llu %9.2fx %14llu %9.2fx %9.2f%%  %s\n",
        static_cast<unsigned long long>(row.lag), static_cast<unsigned long long>(row.planned),
        static_cast<unsigned long long>(row.squashed),
        static_cast<double>(row.planned) / row.squashed, static_cast<unsigned long long>(row.chain),
        static_cast<double>(row.planned) / row.chain, 100.0 * row.planned / g_setup->full_bytes,
        row.path.c_str());
  }
  std::printf("\nThe same readers without pins (no catch-up delta; skip deltas only)\n");
  std::printf("%5s %14s %10s  %s\n", "lag", "downloaded", "vs squash", "path");
  for (const SizeRow& row : g_sizes) {
    std::printf("%5llu %14llu %9.2fx  %s\n", static_cast<unsigned long long>(row.lag),
                static_cast<unsigned long long>(row.unpinned),
                static_cast<double>(row.unpinned) / row.squashed, row.unpinned_path.c_str());
  }
  uint64_t catchup_bytes = 0;
  size_t catchups = 0;
  const std::vector<std::string> records =
      g_setup->store->List(policy_store::CatchupPrefix("bench", g_setup->latest)).value();
  for (const std::string& key : records) {
    auto text = g_setup->store->Get(key);
    auto record = policy_store::Catchup::FromJson(
        {reinterpret_cast<const char*>(text->data()), text->size()});
    catchup_bytes += record->blob.bytes;
    ++catchups;
  }
  std::printf(
      "Cost of the catch-up deltas: one per pinned reader 2 or more versions behind, %zu for "
      "version %llu, "
      "%llu bytes (%.1fx its plain delta)\n",
      catchups, static_cast<unsigned long long>(g_setup->latest),
      static_cast<unsigned long long>(catchup_bytes),
      static_cast<double>(catchup_bytes) / g_sizes.front().planned);
  std::printf("Target: at most about 1.3x the single squashed delta.\n");
  std::printf(
      "\nPeak memory of a catch-up to version %llu (resident bytes, in a process of its own)\n",
      static_cast<unsigned long long>(g_setup->latest));
  std::printf("%-48s %12s %12s %12s %12s %14s\n", "pull", "model", "process", "with model", "peak",
              "peak / model");
  for (const MemoryRow& row : g_memory) {
    // The process's own memory (code, libraries, heap) before it held a model is not the pull's.
    std::printf(
        "%-48s %12llu %12llu %12llu %12llu %13.3fx\n", row.what.c_str(),
        static_cast<unsigned long long>(row.model), static_cast<unsigned long long>(row.before),
        static_cast<unsigned long long>(row.holding), static_cast<unsigned long long>(row.peak),
        static_cast<double>(row.peak - row.before) / static_cast<double>(row.model));
  }
  std::printf("Target: a peak of at most 1.2x the model (beyond the process's own memory).\n");
  std::printf(
      "\nA version with a keyframe (%llu bytes) and a delta, published by one rank and by %llu "
      "ranks\n",
      static_cast<unsigned long long>(g_sharded.keyframe_bytes),
      static_cast<unsigned long long>(g_sharded.parts));
  std::printf("  one rank, the whole model (PublishVersion)        %8.3f s\n",
              g_sharded.whole_seconds);
  std::printf(
      "  %llu ranks on threads, then rank 0 commits          %8.3f s (the commit: %.3f s)\n",
      static_cast<unsigned long long>(g_sharded.parts), g_sharded.sharded_seconds,
      g_sharded.commit_seconds);
  std::printf(
      "  bytes rank 0 read to commit: %llu of the ranks' keyframes, %llu of their deltas (merged "
      "into the version's), %llu of manifests\n",
      static_cast<unsigned long long>(g_sharded.read_keyframes),
      static_cast<unsigned long long>(g_sharded.read_deltas),
      static_cast<unsigned long long>(g_sharded.read_other));
  std::printf(
      "Target: none of the other ranks' weights (a commit that merged the keyframes read "
      "all %llu bytes of them).\n",
      static_cast<unsigned long long>(g_sharded.keyframe_bytes));
  std::filesystem::remove_all(g_setup->root);
  benchmark::Shutdown();
  return 0;
}
