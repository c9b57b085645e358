// weft delta encode OLD NEW -o D | apply OLD D -o NEW | squash D1 D2 [...] -o D | inspect D
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/parallel.h"
#include "sync/delta_codec.h"
#include "sync/safetensors.h"

namespace weft::cli {
namespace {

using namespace weft::sync;

struct DeltaOptions {
  std::vector<std::string> inputs;
  std::string output;
  int threads = 0;
  int chunk_log2 = kDefaultChunkLog2;
  bool json = false;
  bool per_tensor = false;
  std::string mode = "plain";
  std::string base;  // squash: the safetensors file the first delta applies to
};

// The --mode option's value; CLI11 has checked that it names a mode.
DeltaMode ModeOf(const DeltaOptions& options) {
  return ParseDeltaMode(options.mode).value_or(DeltaMode::kPlain);
}

int Threads(const DeltaOptions& options) { return ThreadsOrAll(options.threads); }

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

Status WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  return WriteFileAtomic(path, [&](int fd) { return WriteAll(fd, bytes, path); });
}

// A parsed delta file and the mapping it points into.
struct LoadedDelta {
  MappedFile file;
  ModelDelta delta;
};

Result<LoadedDelta> LoadDelta(const std::string& path) {
  LoadedDelta loaded;
  WEFT_ASSIGN_OR_RETURN(loaded.file, MappedFile::Open(path));
  Result<ModelDelta> parsed = ParseModelDelta(loaded.file.bytes());
  if (!parsed.ok()) return parsed.status().WithContext(path);
  loaded.delta = std::move(parsed).value();
  return loaded;
}

TensorSpec SpecOf(const SafetensorsTensor& tensor) {
  return TensorSpec{tensor.name, tensor.dtype, tensor.shape};
}

Status RunEncode(const DeltaOptions& options) {
  const std::string& old_path = options.inputs[0];
  const std::string& new_path = options.inputs[1];
  WEFT_ASSIGN_OR_RETURN(SafetensorsFile old_file, SafetensorsFile::Open(old_path));
  WEFT_ASSIGN_OR_RETURN(SafetensorsFile new_file, SafetensorsFile::Open(new_path));
  auto start = std::chrono::steady_clock::now();
  auto views = [](const SafetensorsFile& file) {
    std::vector<TensorBytes> tensors;
    for (const SafetensorsTensor& t : file.tensors()) tensors.push_back({SpecOf(t), t.data, {}});
    return tensors;
  };
  Result<ModelDelta> encoded =
      EncodeModelDelta(views(old_file), views(new_file),
                       CodecOptions{options.chunk_log2, Threads(options), ModeOf(options)});
  if (!encoded.ok()) {
    return encoded.status().WithContext(old_path + " -> " + new_path);
  }
  const ModelDelta& delta = *encoded;
  uint64_t bytes_in = 0;
  for (const SafetensorsTensor& t : old_file.tensors()) bytes_in += t.data.size();
  std::vector<uint8_t> bytes = SerializeModelDelta(delta);
  double seconds = Seconds(start);
  WEFT_RETURN_IF_ERROR(WriteBytes(options.output, bytes));
  DeltaStats stats = ComputeStats(delta);
  std::printf(
      "%s: %zu tensors, %llu of %llu elements changed (%.3f%%), %llu bytes (%.2f%% of the "
      "%llu-byte tensors), encoded in %.3f s\n",
      options.output.c_str(), delta.tensors.size(), static_cast<unsigned long long>(stats.changes),
      static_cast<unsigned long long>(stats.units),
      stats.sparse_units ? 100.0 * stats.changes / stats.sparse_units : 0.0,
      static_cast<unsigned long long>(bytes.size()),
      bytes_in ? 100.0 * bytes.size() / bytes_in : 0.0, static_cast<unsigned long long>(bytes_in),
      seconds);
  return Status::Ok();
}

Status RunApply(const DeltaOptions& options) {
  const std::string& old_path = options.inputs[0];
  const std::string& delta_path = options.inputs[1];
  WEFT_ASSIGN_OR_RETURN(SafetensorsFile old_file, SafetensorsFile::Open(old_path));
  WEFT_ASSIGN_OR_RETURN(LoadedDelta loaded, LoadDelta(delta_path));
  // The result keeps OLD's layout (header, order, metadata); only tensor bytes change. Everything
  // is applied to a private copy, and the output is written only if every tensor succeeded.
  std::vector<uint8_t> result(old_file.bytes().begin(), old_file.bytes().end());
  auto start = std::chrono::steady_clock::now();
  for (const TensorDelta& tensor_delta : loaded.delta.tensors) {
    const SafetensorsTensor* tensor = old_file.Find(tensor_delta.spec.name);
    if (tensor == nullptr) {
      return InvalidArgument(delta_path + " changes tensor '" + tensor_delta.spec.name +
                             "', which " + old_path + " does not have");
    }
    if (tensor->dtype != tensor_delta.spec.dtype || tensor->shape != tensor_delta.spec.shape) {
      return InvalidArgument("tensor '" + tensor->name + "' has a different dtype or shape in " +
                             old_path + " and " + delta_path);
    }
    std::span<uint8_t> served(result.data() + old_file.data_start() + tensor->data_offset,
                              tensor->data.size());
    Status status = ApplyTensorDelta(tensor_delta, served, std::nullopt, Threads(options));
    if (status.code() == StatusCode::kConflict) {
      return status.WithContext(old_path + " is not the version " + delta_path + " was made from");
    }
    if (!status.ok()) return status.WithContext(delta_path);
  }
  double seconds = Seconds(start);
  WEFT_RETURN_IF_ERROR(WriteBytes(options.output, result));
  std::printf("%s: applied %zu tensor deltas to %s, every result digest verified, in %.3f s\n",
              options.output.c_str(), loaded.delta.tensors.size(), old_path.c_str(), seconds);
  return Status::Ok();
}

Status RunSquash(const DeltaOptions& options) {
  std::vector<LoadedDelta> loaded;  // parsed deltas point into their mappings
  for (const std::string& input : options.inputs) {
    WEFT_ASSIGN_OR_RETURN(LoadedDelta next, LoadDelta(input));
    loaded.push_back(std::move(next));
  }
  std::vector<const ModelDelta*> chain;
  bool context = false;
  for (const LoadedDelta& d : loaded) {
    chain.push_back(&d.delta);
    context = context || HasContextChunks(d.delta);
  }
  size_t failed = 0;
  auto squash = [&]() -> Result<ModelDelta> {
    if (!options.base.empty()) {
      // On the base: any modes in, the chosen mode out.
      WEFT_ASSIGN_OR_RETURN(SafetensorsFile base_file, SafetensorsFile::Open(options.base));
      std::vector<TensorBytes> base;
      for (const SafetensorsTensor& t : base_file.tensors()) {
        base.push_back({SpecOf(t), t.data, {}});
      }
      Result<ModelDelta> squashed =
          SquashChainOnBase(chain, base, ModeOf(options), Threads(options), &failed);
      if (!squashed.ok()) {
        return squashed.status().WithContext("squashing " + options.inputs[failed] + " on " +
                                             options.base);
      }
      return squashed;
    }
    if (context) {
      return InvalidArgument(
          "the deltas have context chunks, which squash only with the weights the first one "
          "applies to: pass them with --base");
    }
    if (ModeOf(options) != DeltaMode::kPlain) {
      return InvalidArgument(
          "--mode context needs the weights the first delta applies to (--base)");
    }
    Result<ModelDelta> squashed = SquashChain(chain, Threads(options), &failed);
    if (!squashed.ok()) {
      return squashed.status().WithContext("squashing " + options.inputs[failed] + " onto " +
                                           options.inputs[failed - 1]);
    }
    return squashed;
  };
  WEFT_ASSIGN_OR_RETURN(ModelDelta squashed, squash());
  std::vector<uint8_t> bytes = SerializeModelDelta(squashed);
  WEFT_RETURN_IF_ERROR(WriteBytes(options.output, bytes));
  std::printf("%s: %zu deltas squashed into one of %zu bytes\n", options.output.c_str(),
              options.inputs.size(), bytes.size());
  return Status::Ok();
}

std::string Percent(uint64_t part, uint64_t whole) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f%%", whole ? 100.0 * part / whole : 0.0);
  return text;
}

Status RunInspect(const DeltaOptions& options) {
  const std::string& path = options.inputs[0];
  WEFT_ASSIGN_OR_RETURN(LoadedDelta loaded, LoadDelta(path));
  DeltaStats s = ComputeStats(loaded.delta);
  const double density = s.sparse_units ? static_cast<double>(s.changes) / s.sparse_units : 0.0;
  const uint64_t coded = s.gap_bytes + s.sign_bytes + s.big_bytes + s.magnitude_bytes;
  const double bits_per_change = s.changes ? 8.0 * coded / s.changes : 0.0;
  const double entropy_floor =
      (density > 0 && density < 1)
          ? (-density * std::log2(density) - (1 - density) * std::log2(1 - density)) / density
          : 0.0;
  if (options.json) {
    nlohmann::json out = {{"file", path},
                          {"format_version", loaded.delta.format_version},
                          {"tensors", loaded.delta.tensors.size()},
                          {"units", s.units},
                          {"changed_units", s.changes},
                          {"changed_by_more_than_one", s.big_changes},
                          {"density", density},
                          {"chunks",
                           {{"unchanged", s.unchanged_chunks},
                            {"sparse", s.sparse_chunks},
                            {"context", s.context_chunks},
                            {"raw", s.raw_chunks}}},
                          {"bytes",
                           {{"total", s.total_bytes},
                            {"headers", s.header_bytes},
                            {"positions", s.gap_bytes},
                            {"signs", s.sign_bytes},
                            {"large_change_positions", s.big_bytes},
                            {"magnitudes", s.magnitude_bytes},
                            {"raw", s.raw_bytes}}},
                          {"bits_per_changed_element", bits_per_change},
                          {"position_entropy_floor_bits", entropy_floor}};
    std::printf("%s\n", out.dump(2).c_str());
    return Status::Ok();
  }
  std::printf("%s: weft delta, format version %u (%s), %zu tensors\n", path.c_str(),
              loaded.delta.format_version, s.context_chunks > 0 ? "context-coded chunks" : "plain",
              loaded.delta.tensors.size());
  std::printf("  elements          %llu (%llu in raw chunks)\n",
              static_cast<unsigned long long>(s.units),
              static_cast<unsigned long long>(s.raw_units));
  std::printf(
      "  changed           %llu in sparse and context chunks, density %.4f%%, %s of them by more "
      "than one "
      "step\n",
      static_cast<unsigned long long>(s.changes), 100 * density,
      Percent(s.big_changes, s.changes).c_str());
  std::printf("  chunks            %llu unchanged, %llu sparse, %llu context, %llu raw\n",
              static_cast<unsigned long long>(s.unchanged_chunks),
              static_cast<unsigned long long>(s.sparse_chunks),
              static_cast<unsigned long long>(s.context_chunks),
              static_cast<unsigned long long>(s.raw_chunks));
  std::printf("  bytes             %llu total\n", static_cast<unsigned long long>(s.total_bytes));
  const std::pair<const char*, uint64_t> sections[] = {{"headers+checksums", s.header_bytes},
                                                       {"positions", s.gap_bytes},
                                                       {"signs", s.sign_bytes},
                                                       {"large-change pos.", s.big_bytes},
                                                       {"magnitudes", s.magnitude_bytes},
                                                       {"raw chunks", s.raw_bytes}};
  for (const auto& [name, bytes] : sections) {
    std::printf("    %-18s %12llu  %7s\n", name, static_cast<unsigned long long>(bytes),
                Percent(bytes, s.total_bytes).c_str());
  }
  if (s.changes > 0) {
    std::printf(
        "  bits per change   %.3f (coded sections); positions alone %.3f vs iid floor H(p)/p = "
        "%.3f\n",
        bits_per_change, 8.0 * s.gap_bytes / s.changes, entropy_floor);
  }
  if (options.per_tensor) {
    std::printf("  %-40s %-8s %14s %12s %10s\n", "tensor", "dtype", "elements", "changed",
                "chunks");
    for (const TensorDelta& t : loaded.delta.tensors) {
      uint64_t changed = 0;
      size_t raw = 0;
      for (const DeltaChunk& c : t.chunks) {
        changed += c.mode == ChunkMode::kSparse    ? c.sparse.change_count
                   : c.mode == ChunkMode::kContext ? c.context.change_count()
                                                   : 0;
        raw += c.mode == ChunkMode::kRaw;
      }
      std::printf("  %-40s %-8s %14llu %12llu %6zu%s\n", t.spec.name.c_str(),
                  std::string(Info(t.spec.dtype).safetensors_name).c_str(),
                  static_cast<unsigned long long>(t.spec.element_count()),
                  static_cast<unsigned long long>(changed), t.chunks.size(),
                  raw ? (" (" + std::to_string(raw) + " raw)").c_str() : "");
    }
  }
  return Status::Ok();
}

void AddThreads(CLI::App* command, DeltaOptions* options) {
  command->add_option("--threads", options->threads, "worker threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
}

void AddMode(CLI::App* command, DeltaOptions* options) {
  command
      ->add_option("--mode", options->mode,
                   "plain, or context: code each float chunk's positions by the exponent of its "
                   "base values where that is smaller (docs/formats.md)")
      ->check(CLI::IsMember({"plain", "context"}));
}

}  // namespace

void RegisterDelta(CLI::App& app, Action* action) {
  CLI::App* delta =
      app.add_subcommand("delta", "Encode, apply, squash and inspect served-weight deltas");
  delta->require_subcommand(1);

  auto encode_options = std::make_shared<DeltaOptions>();
  encode_options->inputs.resize(2);
  CLI::App* encode =
      delta->add_subcommand("encode", "Delta from OLD.safetensors to NEW.safetensors");
  encode->add_option("old", encode_options->inputs[0], "base version")
      ->required()
      ->check(CLI::ExistingFile);
  encode->add_option("new", encode_options->inputs[1], "new version")
      ->required()
      ->check(CLI::ExistingFile);
  encode->add_option("-o,--output", encode_options->output, "delta file to write")->required();
  encode
      ->add_option("--chunk-log2", encode_options->chunk_log2,
                   "elements per chunk, as a power of two")
      ->check(CLI::Range(kMinChunkLog2, kMaxChunkLog2));
  AddThreads(encode, encode_options.get());
  AddMode(encode, encode_options.get());
  encode->callback([encode_options, action] {
    *action = [encode_options] { return RunEncode(*encode_options); };
  });

  auto apply_options = std::make_shared<DeltaOptions>();
  apply_options->inputs.resize(2);
  CLI::App* apply =
      delta->add_subcommand("apply", "Apply a delta to OLD.safetensors, verifying digests");
  apply->add_option("old", apply_options->inputs[0], "base version")
      ->required()
      ->check(CLI::ExistingFile);
  apply->add_option("delta", apply_options->inputs[1], "delta file")
      ->required()
      ->check(CLI::ExistingFile);
  apply->add_option("-o,--output", apply_options->output, "safetensors file to write")->required();
  AddThreads(apply, apply_options.get());
  apply->callback(
      [apply_options, action] { *action = [apply_options] { return RunApply(*apply_options); }; });

  auto squash_options = std::make_shared<DeltaOptions>();
  CLI::App* squash = delta->add_subcommand(
      "squash", "Squash consecutive deltas D1 (A->B), D2 (B->C), ... into one");
  squash->add_option("deltas", squash_options->inputs, "delta files, oldest first")
      ->required()
      ->expected(2, 1 << 20)
      ->check(CLI::ExistingFile);
  squash->add_option("-o,--output", squash_options->output, "delta file to write")->required();
  squash
      ->add_option("--base", squash_options->base,
                   "safetensors file D1 applies to: needed to squash context-coded deltas, or to "
                   "write the result with --mode context")
      ->check(CLI::ExistingFile);
  AddThreads(squash, squash_options.get());
  AddMode(squash, squash_options.get());
  squash->callback([squash_options, action] {
    *action = [squash_options] { return RunSquash(*squash_options); };
  });

  auto inspect_options = std::make_shared<DeltaOptions>();
  inspect_options->inputs.resize(1);
  CLI::App* inspect =
      delta->add_subcommand("inspect", "Density, bytes per section and bits per changed element");
  inspect->add_option("delta", inspect_options->inputs[0], "delta file")
      ->required()
      ->check(CLI::ExistingFile);
  inspect->add_flag("--json", inspect_options->json, "print JSON");
  inspect->add_flag("--tensors", inspect_options->per_tensor, "one line per tensor");
  inspect->callback([inspect_options, action] {
    *action = [inspect_options] { return RunInspect(*inspect_options); };
  });
}

}  // namespace weft::cli
