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
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "common/parallel.h"
#include "examples/synthetic_adam.h"
#include "policy_store/directory_store.h"
#include "policy_store/pins.h"
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
  s->full_bytes = publisher->last().keyframe->bytes;
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
  std::filesystem::remove_all(g_setup->root);
  benchmark::Shutdown();
  return 0;
}
