// The rollout worker's copy of the weights for a serving engine (SGLang, vLLM), at scale: a
// synthetic BF16 model (--mib, 1024 by default) published as a keyframe and --versions deltas, then
// pulled from nothing and version by version into a served checkpoint directory two ways, each in
// a process of its own:
//   host       the copy in host memory, written into the directory at each version (the tensors
//              that changed rewritten in place): HostWeightSink over the HTTP engine;
//   directory  the copy is the directory's file: the keyframe arrives straight into a new file,
//              mapped, and each delta is applied to it in place (DirectoryWeightSink's path:
//              policy_store::KeyframePlacement, ServedCheckpoint::NewFile, a Write that writes
//              nothing).
// Printed per way, next to the model's size: the peak of the process's anonymous (not file-backed)
// resident memory, sampled every 2 ms (the target for `directory`: at most a quarter of the
// model, where `host` holds all of it), the time to the first version and per later version, and
// the bytes the directory's writes took per later version (for `directory` the changed elements'
// pages are written by the kernel from the mapping, not counted here).
//
//   sink_bench [--mib N] [--versions N] [--threads N] [--dir DIR]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "policy_store/directory_store.h"
#include "policy_store/reader.h"
#include "rollout_worker/served_checkpoint.h"
#include "rollout_worker/weight_sink.h"
#include "trainer_adapter/publisher.h"

namespace {

using namespace weft;
using bench::Check;
using bench::Clock;
using bench::PeakSampler;
using bench::Seconds;

struct Options {
  uint64_t mib = 1024;
  int versions = 3;
  int threads = 2;
  std::string dir = "/tmp/weft-sink-bench";
};

// Tensors of 4096 x 4096, as many as the size asks (at least one).
std::vector<std::vector<uint64_t>> Shapes(uint64_t mib) {
  const uint64_t tensors = std::max<uint64_t>(1, mib * (1 << 20) / (4096ull * 4096 * 2));
  return std::vector<std::vector<uint64_t>>(tensors, {4096, 4096});
}

// Publishes version 0 and `versions` more into the store in `dir`: each step moves 2% of the
// elements by about a BF16 unit, as small weights under an optimiser move.
void Publish(const Options& o) {
  std::filesystem::remove_all(o.dir);
  policy_store::OpenOptions create;
  create.create = true;
  auto store = policy_store::OpenStore(o.dir + "/store", create);
  Check(store.status(), "opening the store");
  const auto shapes = Shapes(o.mib);
  std::vector<std::vector<float>> values(shapes.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto& v : values) {
    v.resize(4096ull * 4096);
    for (float& x : v) x = normal(rng);
  }
  auto masters = [&] {
    std::vector<sync::MasterTensor> m;
    for (size_t t = 0; t < values.size(); ++t)
      m.push_back({"layers." + std::to_string(t) + ".weight", shapes[t], values[t]});
    return m;
  };
  trainer_adapter::PublisherOptions options;
  options.codec.threads = o.threads;
  auto publisher =
      trainer_adapter::Publisher::Start(**store, "r", masters(), sync::ServingPlan{}, options);
  Check(publisher.status(), "publishing version 0");
  for (int v = 1; v <= o.versions; ++v) {
    std::uniform_int_distribution<uint64_t> pick(0, 4096ull * 4096 - 1);
    for (auto& tensor : values) {
      for (uint64_t k = 0; k < tensor.size() / 50; ++k) {
        float& x = tensor[pick(rng)];
        x += x * ((rng() & 1) ? 0.01f : -0.01f);
      }
    }
    Check((*publisher)->Publish(masters()).status(), "publishing a version");
  }
}

// One way, in this process: prints "first SECONDS later SECONDS written BYTES peak BYTES".
int RunChild(const Options& o, const std::string& way) {
  PeakSampler sampler;
  auto store = policy_store::OpenStore(o.dir + "/store", {});
  Check(store.status(), "opening the store");
  policy_store::StoreReader reader(**store, "r", o.threads);
  const std::string served = o.dir + "/served-" + way;
  std::filesystem::remove_all(served);
  rollout_worker::ServedCheckpoint checkpoint(served);
  rollout_worker::FilePlacement placement(
      [&](const std::vector<sync::TensorSpec>& specs) { return checkpoint.NewFile(specs); });
  const bool directory = way == "directory";
  if (directory) reader.PlaceKeyframes(&placement);
  sync::ServedModel copy;
  std::optional<policy_store::Manifest> held;
  double first = 0, later = 0;
  uint64_t written = 0;
  for (int v = 0; v <= o.versions; ++v) {
    const Clock::time_point start = Clock::now();
    if (directory && held) checkpoint.WillChangeInPlace();
    auto pulled = reader.Pull(static_cast<uint64_t>(v),
                              held ? std::optional<uint64_t>(held->version) : std::nullopt, &copy,
                              held ? &*held : nullptr);
    Check(pulled.status(), "pulling");
    placement.Done();
    Check(checkpoint.Write(copy, ""), "writing the served checkpoint");
    held = pulled->manifest;
    (v == 0 ? first : later) += Seconds(start);
    if (v > 0) written += checkpoint.last_bytes_written();
  }
  const uint64_t peak = sampler.peak();
  // The directory holds the last version, whichever way it came (read back into memory: after
  // the peak was taken).
  auto file = sync::SafetensorsFile::Open(served + "/" + rollout_worker::kServedWeightsFile);
  Check(file.status(), "reading the served checkpoint back");
  Check(policy_store::CheckAgainstManifest(sync::ServedModel::FromSafetensors(*file, o.threads),
                                           *held, nullptr, true, o.threads),
        "checking the served checkpoint");
  std::printf("first %.3f later %.3f written %" PRIu64 " peak %" PRIu64 "\n", first,
              later / std::max(1, o.versions), written / std::max(1, o.versions), peak);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string child;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "sink_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--mib") {
      o.mib = std::stoull(next());
    } else if (arg == "--versions") {
      o.versions = std::stoi(next());
    } else if (arg == "--threads") {
      o.threads = std::stoi(next());
    } else if (arg == "--dir") {
      o.dir = next();
    } else if (arg == "--child") {
      child = next();
    } else {
      std::fprintf(stderr,
                   "usage: sink_bench [--mib N] [--versions N] [--threads N] [--dir DIR]\n");
      return 2;
    }
  }
  if (!child.empty()) return RunChild(o, child);

  const uint64_t model = Shapes(o.mib).size() * 4096ull * 4096 * 2;
  std::printf("sink_bench: a BF16 model of %.0f MiB, a keyframe and %d deltas, %d threads\n",
              model / 1048576.0, o.versions, o.threads);
  const Clock::time_point start = Clock::now();
  Publish(o);
  std::printf("published in %.1f s\n", Seconds(start));
  std::printf("%-10s %12s %8s %10s %12s %14s\n", "way", "peak anon", "x model", "first (s)",
              "later (s)", "written/ver");
  for (const std::string way : {"host", "directory"}) {
    const std::string command =
        bench::SelfPath() + " --child " + way + " --mib " + std::to_string(o.mib) + " --versions " +
        std::to_string(o.versions) + " --threads " + std::to_string(o.threads) + " --dir " + o.dir;
    FILE* out = ::popen(command.c_str(), "r");
    char line[512] = {0};
    const bool read = out != nullptr && std::fgets(line, sizeof(line), out) != nullptr;
    const int rc = out != nullptr ? ::pclose(out) : -1;
    double first = 0, later = 0;
    uint64_t written = 0, peak = 0;
    if (!read || rc != 0 ||
        std::sscanf(line, "first %lf later %lf written %" SCNu64 " peak %" SCNu64, &first, &later,
                    &written, &peak) != 4) {
      std::fprintf(stderr, "sink_bench: the %s run failed\n", way.c_str());
      return 1;
    }
    std::printf("%-10s %8.0f MiB %8.2f %10.2f %12.2f %10.1f MiB\n", way.c_str(), peak / 1048576.0,
                static_cast<double>(peak) / static_cast<double>(model), first, later,
                written / 1048576.0);
  }
  std::filesystem::remove_all(o.dir);
  return 0;
}
