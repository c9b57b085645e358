// publish_bench: the C++ publisher (trainer_adapter::Publisher) on master weights read from
// FP32 safetensors files, one file per version, timed per version; the baseline that
// bench/python_publish_bench.py measures the Python package against, on the same tensors in the
// same run. Each file is read into memory before its publish is timed.
//
//   publish_bench STORE_DIR RUN THREADS V0.safetensors V1.safetensors ...
//
// Prints one JSON object per version: {"version", "seconds", "bytes_written", "density"}.
//
//   publish_bench --memory GIB [--threads N] [--dir DIR] [--step EPS]
//
// The memory a publish takes: FP32 masters for GIB GiB of BF16 served tensors (4096 x 4096 each)
// are started as version 0 into a directory store, then moved by a relative step of up to EPS
// (default 1e-3: about a tenth of the served elements change) and published as version 1. Printed:
// the peak of the process's anonymous memory during each, above what it held before (the
// masters, and for the publish the publisher's served copy), next to the same step taken the
// publisher's former way in the same run (a second served copy updated while the first is kept
// for a retry), and against the goal of the served model plus the delta plus 10%.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/file_util.h"
#include "common/parallel.h"
#include "policy_store/object_store.h"
#include "sync/safetensors.h"
#include "trainer_adapter/publisher.h"

namespace {

using namespace weft;

int Fail(const Status& status) {
  std::fprintf(stderr, "publish_bench: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

// The --memory mode (above).
int MemoryMode(int argc, char** argv) {
  double gib = 0;
  int threads = 2;
  double step = 1e-3;
  std::string dir = "/tmp/weft-publish-memory";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Fail(InvalidArgument(flag + " needs a value"));
    const std::string value = argv[++i];
    if (flag == "--memory") {
      gib = std::stod(value);
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--dir") {
      dir = value;
    } else if (flag == "--step") {
      step = std::stod(value);
    } else {
      return Fail(InvalidArgument("unknown flag " + flag));
    }
  }
  constexpr uint64_t kSide = 4096;
  const uint64_t count = std::max<uint64_t>(
      1, static_cast<uint64_t>(gib * static_cast<double>(uint64_t{1} << 30)) / (kSide * kSide * 2));
  std::vector<std::vector<float>> buffers(count, std::vector<float>(kSide * kSide));
  std::vector<sync::MasterTensor> master;
  // Weights of a trained layer's scale, different in every tensor and element.
  ParallelFor(count, threads, [&](size_t t) {
    uint64_t state = 0x9e3779b97f4a7c15ull * (t + 1);
    for (float& w : buffers[t]) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      w = static_cast<float>(static_cast<int64_t>(state >> 11) - (int64_t{1} << 52)) * 0x1p-52f *
          0.05f;
    }
  });
  for (size_t t = 0; t < count; ++t)
    master.push_back({"layer" + std::to_string(t) + ".weight", {kSide, kSide}, buffers[t]});
  std::filesystem::remove_all(dir);
  policy_store::OpenOptions open;
  open.create = true;
  Result<std::unique_ptr<policy_store::ObjectStore>> store = policy_store::OpenStore(dir, open);
  if (!store.ok()) return Fail(store.status());
  trainer_adapter::PublisherOptions options;
  options.codec.threads = threads;
  options.recent_delta_bytes = 0;  // the delta in flight only, not the recent ones
  const double served_bytes = static_cast<double>(count * kSide * kSide * 2);
  const double gb = 1e9;

  uint64_t before = bench::AnonymousResident();
  std::unique_ptr<trainer_adapter::Publisher> publisher;
  uint64_t start_peak = 0;
  {
    bench::PeakSampler sampler;
    Result<std::unique_ptr<trainer_adapter::Publisher>> made =
        trainer_adapter::Publisher::Start(**store, "memory", master, sync::ServingPlan{}, options);
    if (!made.ok()) return Fail(made.status());
    publisher = std::move(*made);
    start_peak = sampler.peak() - before;
  }
  const double start_seconds = publisher->last_stats().seconds;

  // The step, in place in the masters.
  ParallelFor(count, threads, [&](size_t t) {
    uint64_t state = 0xd1b54a32d192ed03ull * (t + 7);
    for (float& w : buffers[t]) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u =
          static_cast<float>(static_cast<int64_t>(state >> 11) - (int64_t{1} << 52)) * 0x1p-52f;
      w += w * static_cast<float>(step) * u;
    }
  });

  // The former way, in the same run: a second served copy updated, the first kept for a retry.
  before = bench::AnonymousResident();
  uint64_t former_peak = 0;
  double former_delta = 0;
  {
    bench::PeakSampler sampler;
    sync::ServedModel next = publisher->served();
    Result<sync::ModelDelta> delta = next.Update(master, options.codec);
    if (!delta.ok()) return Fail(delta.status());
    former_delta = static_cast<double>(sync::SerializeModelDelta(*delta).size());
    former_peak = sampler.peak() - before;
  }
  before = bench::AnonymousResident();
  uint64_t publish_peak = 0;
  {
    bench::PeakSampler sampler;
    Status published = publisher->Publish(master).status();
    if (!published.ok()) return Fail(published);
    publish_peak = sampler.peak() - before;
  }
  const trainer_adapter::PublishStats& stats = publisher->last_stats();
  const double delta = static_cast<double>(stats.bytes_written);
  const double goal = (served_bytes + delta) * 1.1;
  std::printf("served %.2f GB of BF16 (%llu tensors of 4096 x 4096) from %.2f GB of FP32 masters\n",
              served_bytes / gb, static_cast<unsigned long long>(count), 2 * served_bytes / gb);
  std::printf(
      "start (version 0, keyframe streamed from the copy): %.1f s, peak %.2f GB above the "
      "masters (%.2fx the served model)\n",
      start_seconds, static_cast<double>(start_peak) / gb,
      static_cast<double>(start_peak) / served_bytes);
  std::printf("step: density %.2f%%, delta %.3f GB (the former way's serialised delta %.3f GB)\n",
              100 * stats.density(), delta / gb, former_delta / gb);
  std::printf("%-44s %12s %14s\n", "memory of a publish", "GB", "x (served+delta)");
  auto row = [&](const char* what, double bytes) {
    std::printf("%-44s %12.2f %14.2f\n", what, bytes / gb, bytes / (served_bytes + delta));
  };
  row("former way: held copy + copy and update", served_bytes + static_cast<double>(former_peak));
  row("publish now: held copy + publish peak", served_bytes + static_cast<double>(publish_peak));
  row("goal: (served + delta) + 10%", goal);
  std::printf("publish %.2f s\n", stats.seconds);
  std::filesystem::remove_all(dir);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--memory") return MemoryMode(argc, argv);
  if (argc < 5) {
    std::fprintf(stderr, "usage: publish_bench STORE_DIR RUN THREADS V0.safetensors [V1 ...]\n");
    return 2;
  }
  policy_store::OpenOptions open;
  open.create = true;
  Result<std::unique_ptr<policy_store::ObjectStore>> store = policy_store::OpenStore(argv[1], open);
  if (!store.ok()) return Fail(store.status());
  trainer_adapter::PublisherOptions options;
  options.codec.threads = std::stoi(argv[3]);
  // The masters live in one buffer per tensor, overwritten in place by every version's values,
  // as a trainer's weights are.
  std::vector<std::vector<float>> buffers;
  std::vector<sync::MasterTensor> master;
  std::unique_ptr<trainer_adapter::Publisher> publisher;
  for (int i = 4; i < argc; ++i) {
    Result<std::vector<uint8_t>> bytes = ReadFile(argv[i]);
    if (!bytes.ok()) return Fail(bytes.status());
    Result<sync::SafetensorsFile> file = sync::SafetensorsFile::Parse(*bytes);
    if (!file.ok()) return Fail(file.status());
    if (master.empty()) {
      buffers.resize(file->tensors().size());
      for (size_t t = 0; t < file->tensors().size(); ++t) {
        const sync::SafetensorsTensor& tensor = file->tensors()[t];
        buffers[t].resize(tensor.data.size() / sizeof(float));
        master.push_back({tensor.name, tensor.shape, buffers[t]});
      }
    }
    for (size_t t = 0; t < buffers.size(); ++t) {
      const sync::SafetensorsTensor& tensor = file->tensors()[t];
      if (tensor.dtype != sync::DType::kF32 || tensor.data.size() != buffers[t].size() * 4)
        return Fail(InvalidArgument(std::string(argv[i]) + ": tensors differ from the first file"));
      std::memcpy(buffers[t].data(), tensor.data.data(), tensor.data.size());
    }
    const auto started = std::chrono::steady_clock::now();
    if (!publisher) {
      Result<std::unique_ptr<trainer_adapter::Publisher>> made =
          trainer_adapter::Publisher::Start(**store, argv[2], master, sync::ServingPlan{}, options);
      if (!made.ok()) return Fail(made.status());
      publisher = std::move(*made);
    } else {
      Status published = publisher->Publish(master).status();
      if (!published.ok()) return Fail(published);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const trainer_adapter::PublishStats& stats = publisher->last_stats();
    std::printf(
        "{\"version\": %llu, \"seconds\": %.6f, \"bytes_written\": %llu, \"density\": %.6f}\n",
        static_cast<unsigned long long>(stats.version), seconds,
        static_cast<unsigned long long>(stats.bytes_written), stats.density());
    std::fflush(stdout);
  }
  return 0;
}
