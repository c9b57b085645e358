// weft cast IN.safetensors --to bf16|fp16|fp8-e4m3|fp8-e5m2 [--block N] [--no-saturate] -o OUT
//
// Float tensors are converted to the serving format; other tensors are copied. FP8 tensors get a
// scale tensor "<name>_scale_inv" (per tensor, or per N x N block with --block). FP8 inputs that
// carry such a scale tensor are dequantised first.
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "cli/commands.h"
#include "common/parallel.h"
#include "sync/convert.h"
#include "sync/fp8_scaling.h"
#include "sync/safetensors.h"
#include "sync/serving.h"

namespace weft::cli {
namespace {

using namespace weft::sync;

struct CastOptions {
  std::string input;
  std::string output;
  std::string target;
  uint32_t block = 0;
  bool no_saturate = false;
};

bool EndsWith(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The block size of an existing scale tensor for `tensor`, or nullopt for a per-tensor scale.
Result<BlockScaling> ScalingOfExisting(const SafetensorsTensor& tensor,
                                       const SafetensorsTensor& scale) {
  BlockScaling per_tensor = ScalingForShape(tensor.shape, 0);
  if (scale.element_count() == 1) return per_tensor;
  if (scale.shape.size() != 2)
    return InvalidArgument("scale tensor '" + scale.name + "' is not 2-D");
  for (uint32_t block : {128u, 64u, 256u, 32u, 16u, 512u}) {
    BlockScaling candidate = ScalingForShape(tensor.shape, block);
    if (candidate.block_rows() == scale.shape[0] && candidate.block_cols() == scale.shape[1])
      return candidate;
  }
  return InvalidArgument("cannot infer the block size of scale tensor '" + scale.name + "'");
}

Result<std::vector<float>> ReadAsFloat(const SafetensorsFile& file,
                                       const SafetensorsTensor& tensor) {
  std::vector<float> values(tensor.element_count());
  ConvertToFloat(tensor.dtype, tensor.data, values);
  const bool fp8 = tensor.dtype == DType::kF8E4M3 || tensor.dtype == DType::kF8E5M2;
  const SafetensorsTensor* scale = file.Find(ScaleTensorName(tensor.name));
  if (fp8 && scale != nullptr) {
    WEFT_ASSIGN_OR_RETURN(BlockScaling scaling, ScalingOfExisting(tensor, *scale));
    std::vector<float> scales(scale->element_count());
    ConvertToFloat(scale->dtype, scale->data, scales);
    ForEachTileRun(scaling, 0, values.size(), [&](uint64_t b, uint64_t e, uint64_t tile) {
      for (uint64_t i = b; i < e; ++i) values[i] *= scales[tile];
    });
  }
  return values;
}

Status RunCast(const CastOptions& options) {
  const DType target = ServingFormatByName(options.target).value();  // checked by the flag
  const bool to_fp8 = Info(target).size == 1;
  if (options.block != 0 && !to_fp8) return InvalidArgument("--block applies to FP8 targets only");
  WEFT_ASSIGN_OR_RETURN(SafetensorsFile input, SafetensorsFile::Open(options.input));
  const Saturation saturation =
      options.no_saturate ? Saturation::kNoSaturate : Saturation::kSaturateFinite;

  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(2 * input.tensors().size());
  std::vector<TensorToWrite> outputs;
  size_t converted = 0;
  for (const SafetensorsTensor& tensor : input.tensors()) {
    const bool is_scale =
        EndsWith(tensor.name, kScaleSuffix) &&
        input.Find(tensor.name.substr(0, tensor.name.size() - kScaleSuffix.size())) != nullptr;
    if (is_scale) continue;  // recomputed for FP8 targets, folded into the values otherwise
    if (!Info(tensor.dtype).is_float) {
      outputs.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.data});
      continue;
    }
    Result<std::vector<float>> values = ReadAsFloat(input, tensor);
    if (!values.ok()) return values.status().WithContext(options.input);
    ServedValues served = Serve(*values, tensor.shape, target, options.block, saturation);
    if (to_fp8) {
      storage.emplace_back(served.scales.size() * sizeof(float));
      std::memcpy(storage.back().data(), served.scales.data(), storage.back().size());
      outputs.push_back({ScaleTensorName(tensor.name), DType::kF32, served.scaling.scale_shape(),
                         storage.back()});
    }
    storage.push_back(std::move(served.bytes));
    outputs.push_back({tensor.name, target, tensor.shape, storage.back()});
    ++converted;
  }
  WEFT_RETURN_IF_ERROR(WriteSafetensors(options.output, outputs, input.metadata()));
  std::string scales;
  if (to_fp8) {
    scales = options.block == 0 ? " with per-tensor scales"
                                : " with " + std::to_string(options.block) + "x" +
                                      std::to_string(options.block) + " block scales";
  }
  std::printf("cast %zu of %zu tensors to %s%s: %s\n", converted, input.tensors().size(),
              options.target.c_str(), scales.c_str(), options.output.c_str());
  return Status::Ok();
}

}  // namespace

void RegisterCast(CLI::App& app, Action* action) {
  auto options = std::make_shared<CastOptions>();
  CLI::App* cast = app.add_subcommand("cast", "Convert a safetensors file to a serving format");
  cast->add_option("input", options->input, "input .safetensors")
      ->required()
      ->check(CLI::ExistingFile);
  cast->add_option("--to", options->target, "target format")
      ->required()
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kServingFormatNames),
                                                     std::end(kServingFormatNames))));
  cast->add_option("--block", options->block,
                   "FP8: scale per N x N block (e.g. 128); default one scale per tensor")
      ->check(CLI::Range(1u, 1u << 16));
  cast->add_flag("--no-saturate", options->no_saturate,
                 "FP8: overflow to NaN/inf instead of the largest finite value");
  cast->add_option("-o,--output", options->output, "output .safetensors")->required();
  cast->callback([options, action] { *action = [options] { return RunCast(*options); }; });
}

}  // namespace weft::cli
