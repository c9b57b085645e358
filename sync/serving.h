// Serving formats: how master weights (FP32, or BF16: master_values.h) become the tensors an engine
// serves (docs/formats.md, section 2), written once for every path that converts: the served model
// (served_model.h), the fused encoder (delta_codec.h, EncodeFromMaster) and `weft cast`.
//
// BF16 and FP16 round to nearest even (convert.h); FP8 divides each element by its tile's scale
// (fp8_scaling.h) and converts with the configured saturation. Pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "sync/convert.h"
#include "sync/dtype.h"
#include "sync/fp8_scaling.h"
#include "sync/master_values.h"

namespace weft::sync {

// Whether `dtype` is a serving format: BF16, FP16, FP8 E4M3 or FP8 E5M2.
bool IsServingFormat(DType dtype);
// The serving formats by the names users give them: "bf16", "fp16", "fp8-e4m3", "fp8-e5m2".
inline constexpr const char* kServingFormatNames[] = {"bf16", "fp16", "fp8-e4m3", "fp8-e5m2"};
std::optional<DType> ServingFormatByName(std::string_view name);

struct ServeFormat {
  DType dtype = DType::kBF16;                           // a serving format
  Saturation saturation = Saturation::kSaturateFinite;  // FP8 only
  const BlockScaling* scaling = nullptr;                // FP8 only: the tiles of `scales`
  std::span<const float> scales;                        // FP8 only: the divisor of each tile
};

// Converts `values`, the elements of a tensor from index `first` on, into `out` (their served
// bytes, values.size() * the format's width). FP8 elements are divided by the scale of their tile
// (by 1 without `scaling`).
void ConvertToServing(const ServeFormat& format, const MasterValues& values, uint64_t first,
                      std::span<uint8_t> out);

// A whole tensor in a serving format: its bytes and, for FP8, its scale tiles and their values
// (served as the FP32 tensor ScaleTensorName(name) of shape scaling.scale_shape()).
struct ServedValues {
  std::vector<uint8_t> bytes;
  BlockScaling scaling;
  std::vector<float> scales;  // empty unless FP8
};
// Serves `values` (a tensor of `shape`) as `dtype`; FP8 gets one scale per `fp8_block` square
// tile, or one for the tensor when `fp8_block` is 0.
ServedValues Serve(const MasterValues& values, std::span<const uint64_t> shape, DType dtype,
                   uint32_t fp8_block, Saturation saturation);

}  // namespace weft::sync
