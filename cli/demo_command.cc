// weft demo: the sync core on a synthetic RL fine-tuning run, on one machine.
//
// A publisher holds FP32 master weights (N(0, 0.02)) updated by Adam on noisy gradients, serves
// them in BF16, FP16 or block-scaled FP8, and after every step writes the delta of the served
// tensors to a file (the fused cast + diff + encode path). A replica, standing in for a rollout
// worker, reads each file, applies it and proves by digest that it serves the publisher's bytes.
// A second replica that missed every update catches up from one squashed delta. The summary
// compares the bytes shipped with full checkpoints.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/parallel.h"
#include "common/units.h"
#include "examples/synthetic_adam.h"
#include "sync/served_model.h"

namespace weft::cli {
namespace {

using namespace weft::sync;

struct DemoOptions {
  int steps = 10;
  int warmup = 10;
  double learning_rate = 3e-6;
  std::string format = "bf16";
  uint32_t block = 128;
  int threads = 0;
  std::string out_dir;
  int layers = 2;
  uint64_t seed = 1;
};

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A small decoder-style parameter set: embeddings and `layers` blocks of attention and MLP.
std::vector<examples::SyntheticTensor> ModelShapes(int layers) {
  std::vector<examples::SyntheticTensor> shapes = {{"embed_tokens.weight", {8192, 1024}}};
  for (int l = 0; l < layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"})
      shapes.push_back({p + "attn." + name + ".weight", {1024, 1024}});
    shapes.push_back({p + "mlp.gate_proj.weight", {2816, 1024}});
    shapes.push_back({p + "mlp.up_proj.weight", {2816, 1024}});
    shapes.push_back({p + "mlp.down_proj.weight", {1024, 2816}});
    shapes.push_back({p + "input_norm.weight", {1024}});
  }
  return shapes;
}

bool SameBytes(const ServedModel& a, const ServedModel& b) {
  for (size_t t = 0; t < a.tensors().size(); ++t) {
    if (a.tensors()[t].bytes != b.tensors()[t].bytes ||
        a.tensors()[t].digest != b.tensors()[t].digest)
      return false;
  }
  return true;
}

Status RunDemo(const DemoOptions& options) {
  const int threads = ThreadsOrAll(options.threads);
  ServingPlan plan{ServingFormatByName(options.format).value(), options.block,
                   Saturation::kSaturateFinite};  // the name is checked by the flag
  std::string out_dir =
      options.out_dir.empty()
          ? (std::filesystem::temp_directory_path() / ("weft-demo-" + std::to_string(::getpid())))
                .string()
          : options.out_dir;
  std::filesystem::create_directories(out_dir);

  std::printf("weft demo: served-weight sync on a synthetic RL fine-tuning run\n");
  std::printf("  (the sync core alone; weft run configs/local.yaml runs the whole system)\n");
  examples::AdamConfig config;
  config.learning_rate = options.learning_rate;
  examples::SyntheticAdam adam(ModelShapes(options.layers), config, options.seed, threads);
  std::printf(
      "  model: %zu tensors, %.1f M parameters, FP32 master ~ N(0, 0.02); Adam lr %.1e; served as "
      "%s%s\n",
      adam.tensor_count(), adam.parameter_count() / 1e6, options.learning_rate,
      options.format.c_str(),
      Info(plan.dtype).size == 1 ? (" with " + std::to_string(options.block) + "x" +
                                    std::to_string(options.block) + " block scales")
                                       .c_str()
                                 : "");
  std::printf("  warming up the optimiser state for %d steps (not published)...\n", options.warmup);
  for (int i = 0; i < options.warmup; ++i) adam.Step(threads);

  WEFT_ASSIGN_OR_RETURN(ServedModel publisher,
                        ServedModel::FromMaster(examples::MasterView(adam), plan, threads));
  ServedModel replica = publisher;    // loaded version 0 as a full checkpoint
  ServedModel straggler = publisher;  // stays at version 0 until the end
  const uint64_t checkpoint_bytes = publisher.byte_count();
  std::printf("  version 0: %s served (a full checkpoint); deltas go to %s\n\n",
              FormatBytes(checkpoint_bytes).c_str(), out_dir.c_str());
  std::printf("  %-4s %9s %11s %10s %12s %10s %10s  %s\n", "ver", "density", "delta", "vs full",
              "bits/change", "encode", "apply", "replica");

  const CodecOptions codec{kDefaultChunkLog2, threads};
  uint64_t total_delta_bytes = 0, total_changes = 0, total_units = 0;
  double total_encode = 0, total_apply = 0;
  std::vector<std::string> files;
  for (int v = 1; v <= options.steps; ++v) {
    adam.Step(threads);
    auto start = std::chrono::steady_clock::now();
    WEFT_ASSIGN_OR_RETURN(ModelDelta delta, publisher.Update(examples::MasterView(adam), codec));
    std::vector<uint8_t> bytes = SerializeModelDelta(delta);
    double encode_seconds = Since(start);
    std::string path = out_dir + "/v" + std::to_string(v) + ".delta";
    WEFT_RETURN_IF_ERROR(WriteFileAtomic(path, [&](int fd) { return WriteAll(fd, bytes, path); }));
    files.push_back(path);

    // The replica reads the file as a worker would and proves it serves the publisher's bytes.
    start = std::chrono::steady_clock::now();
    WEFT_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
    Result<ModelDelta> parsed = ParseModelDelta(file.bytes());
    if (!parsed.ok()) return parsed.status().WithContext(path);
    WEFT_RETURN_IF_ERROR(replica.Apply(*parsed, threads).WithContext(path));
    double apply_seconds = Since(start);
    bool digests_match = true;
    for (size_t t = 0; t < publisher.tensors().size(); ++t) {
      digests_match &= publisher.tensors()[t].digest == replica.tensors()[t].digest;
    }
    if (!digests_match)
      return DataLoss("version " + std::to_string(v) +
                      ": replica digest differs from the publisher's");

    DeltaStats stats = ComputeStats(delta);
    total_delta_bytes += bytes.size();
    total_changes += stats.changes;
    total_units += stats.sparse_units;
    total_encode += encode_seconds;
    total_apply += apply_seconds;
    double density =
        stats.sparse_units ? static_cast<double>(stats.changes) / stats.sparse_units : 0;
    std::printf("  v%-3d %8.3f%% %11s %9.2f%% %12.2f %8.0f ms %8.0f ms  digest ok\n", v,
                100 * density, FormatBytes(bytes.size()).c_str(),
                100.0 * bytes.size() / checkpoint_bytes,
                stats.changes ? 8.0 * bytes.size() / stats.changes : 0.0, 1e3 * encode_seconds,
                1e3 * apply_seconds);
    std::fflush(stdout);
  }

  // A worker that missed every update downloads one squashed delta instead of the chain.
  auto start = std::chrono::steady_clock::now();
  std::vector<MappedFile> mapped;
  std::vector<ModelDelta> chain;
  for (const std::string& path : files) {
    WEFT_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
    Result<ModelDelta> parsed = ParseModelDelta(file.bytes());
    if (!parsed.ok()) return parsed.status().WithContext(path);
    mapped.push_back(std::move(file));
    chain.push_back(std::move(parsed).value());
  }
  std::vector<const ModelDelta*> links;
  for (const ModelDelta& d : chain) links.push_back(&d);
  WEFT_ASSIGN_OR_RETURN(ModelDelta squashed, SquashChain(links, threads));
  uint64_t squashed_bytes = SerializeModelDelta(squashed).size();
  WEFT_RETURN_IF_ERROR(straggler.Apply(squashed, threads));
  double squash_seconds = Since(start);

  if (!SameBytes(publisher, replica) || !SameBytes(publisher, straggler)) {
    return DataLoss("a replica's bytes differ from the publisher's");
  }
  for (const auto& tensor : publisher.tensors()) {
    if (TensorDigest(tensor.spec.dtype, tensor.bytes, threads) != tensor.digest) {
      return Internal("tensor '" + tensor.spec.name +
                      "': incremental digest differs from a full recomputation");
    }
  }
  const double full_bytes = static_cast<double>(checkpoint_bytes) * options.steps;
  std::printf("\nsummary\n");
  std::printf("  versions published        %d\n", options.steps);
  std::printf("  mean density              %.3f%% of served elements changed per version\n",
              total_units ? 100.0 * total_changes / total_units : 0.0);
  std::printf("  bytes sent per replica    %s in deltas vs %s as full checkpoints (%.2f%%)\n",
              FormatBytes(total_delta_bytes).c_str(), FormatBytes(full_bytes).c_str(),
              100.0 * total_delta_bytes / full_bytes);
  std::printf("  bits per changed element  %.2f (u32 index + raw value would be %d)\n",
              total_changes ? 8.0 * total_delta_bytes / total_changes : 0.0,
              32 + 8 * Info(plan.dtype).size);
  std::printf("  time per version          encode %.0f ms, apply %.0f ms (%d threads)\n",
              1e3 * total_encode / options.steps, 1e3 * total_apply / options.steps, threads);
  std::printf(
      "  catch-up from version 0   one squashed delta of %s (the chain is %s), applied in %.0f "
      "ms\n",
      FormatBytes(squashed_bytes).c_str(), FormatBytes(total_delta_bytes).c_str(),
      1e3 * squash_seconds);
  std::printf(
      "  verified                  every version by digest; final bytes identical on both "
      "replicas;\n"
      "                            incremental digests equal full recomputations\n");
  return Status::Ok();
}

}  // namespace

void RegisterDemo(CLI::App& app, Action* action) {
  auto options = std::make_shared<DemoOptions>();
  CLI::App* demo =
      app.add_subcommand("demo", "Run the sync core on a synthetic RL fine-tuning run");
  demo->add_option("--steps", options->steps, "versions to publish")->check(CLI::Range(1, 10000));
  demo->add_option("--warmup", options->warmup, "optimiser steps before version 0")
      ->check(CLI::Range(0, 10000));
  demo->add_option("--lr", options->learning_rate, "Adam learning rate")
      ->check(CLI::PositiveNumber);
  demo->add_option("--format", options->format, "serving format")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kServingFormatNames),
                                                     std::end(kServingFormatNames))));
  demo->add_option("--block", options->block, "FP8 scale block size (0: per tensor)")
      ->check(CLI::Range(0u, 1u << 16));
  demo->add_option("--layers", options->layers, "transformer blocks in the synthetic model")
      ->check(CLI::Range(1, 64));
  demo->add_option("--threads", options->threads, "threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  demo->add_option("--out", options->out_dir,
                   "directory for the delta files (default: a temporary directory)");
  demo->add_option("--seed", options->seed, "random seed");
  demo->callback([options, action] { *action = [options] { return RunDemo(*options); }; });
}

}  // namespace weft::cli
