// publish_bench: the C++ publisher (trainer_adapter::Publisher) on master weights read from
// FP32 safetensors files, one file per version, timed per version; the baseline that
// bench/python_publish_bench.py measures the Python package against, on the same tensors in the
// same run. Each file is read into memory before its publish is timed.
//
//   publish_bench STORE_DIR RUN THREADS V0.safetensors V1.safetensors ...
//
// Prints one JSON object per version: {"version", "seconds", "bytes_written", "density"}.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/file_util.h"
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

int main(int argc, char** argv) {
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
