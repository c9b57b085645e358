// The embedded engine's own throughput, in one process: the baseline that bench/generate_bench.sh
// sets `weft generate`'s samples per second against (the orchestration's overhead). It serves a
// checkpoint (weft train --checkpoint) with the example policy's engine and generates `samples`
// completions of every prompt of a JSONL dataset, as a worker does (one Generate call per prompt,
// the arithmetic task's limits, the same sampling), on `threads` threads that each take the next
// prompt, and prints samples per second.
// Usage: engine_throughput CHECKPOINT DATASET SAMPLES THREADS D_MODEL LAYERS HEADS D_FF DIGITS
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "examples/arithmetic_task.h"
#include "examples/embedded_engine.h"
#include "sync/safetensors.h"
#include "trainer_adapter/dataset.h"

int main(int argc, char** argv) {
  using namespace weft;
  if (argc != 10) {
    std::fprintf(stderr,
                 "usage: engine_throughput CHECKPOINT DATASET SAMPLES THREADS D_MODEL LAYERS HEADS "
                 "D_FF DIGITS\n");
    return 2;
  }
  const int samples = std::atoi(argv[3]), threads = std::atoi(argv[4]);
  const examples::ArithmeticTask task(std::atoi(argv[9]));
  const examples::ArithmeticVerifier verifier(task);
  examples::TinyLmConfig config;
  config.d_model = std::atoi(argv[5]);
  config.layers = std::atoi(argv[6]);
  config.heads = std::atoi(argv[7]);
  config.d_ff = std::atoi(argv[8]);
  config.max_seq = verifier.limits().sequence_tokens();
  Result<sync::SafetensorsFile> file = sync::SafetensorsFile::Open(argv[1]);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  examples::EmbeddedEngine engine(config, 1);
  Status staged = engine.Stage(sync::ServedModel::FromSafetensors(*file, 1), 0);
  if (!staged.ok() || !engine.Commit().ok()) {
    std::fprintf(stderr, "cannot serve %s: %s\n", argv[1], staged.ToString().c_str());
    return 1;
  }
  Result<std::vector<trainer_adapter::DatasetPrompt>> dataset =
      trainer_adapter::ReadPromptDataset(argv[2]);
  if (!dataset.ok()) {
    std::fprintf(stderr, "%s\n", dataset.status().ToString().c_str());
    return 1;
  }
  rollout_worker::Sampling sampling;
  sampling.max_tokens = verifier.limits().max_completion_tokens;
  sampling.stop_token = verifier.limits().stop_token;
  std::atomic<size_t> next{0}, generated{0};
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < dataset->size(); i = next++) {
        Result<rollout_worker::Prompt> prompt = verifier.Encode((*dataset)[i].prompt);
        if (!prompt.ok()) continue;
        rollout_worker::Sampling own = sampling;
        own.seed = i * 0x9E3779B97F4A7C15ull;
        Result<std::vector<rollout_worker::Completion>> out =
            engine.Generate(std::vector<rollout_worker::Prompt>(samples, *prompt), own);
        if (out.ok()) generated += out->size();
      }
    });
  }
  for (std::thread& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("embedded engine, one process, %d threads: %zu samples in %.2f s, %.1f samples/s\n",
              threads, generated.load(), seconds, static_cast<double>(generated) / seconds);
  return 0;
}
