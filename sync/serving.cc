#include "sync/serving.h"

#include <cstring>

namespace weft::sync {

bool IsServingFormat(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF8E4M3 ||
         dtype == DType::kF8E5M2;
}

std::optional<DType> ServingFormatByName(std::string_view name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kF16;
  if (name == "fp8-e4m3") return DType::kF8E4M3;
  if (name == "fp8-e5m2") return DType::kF8E5M2;
  return std::nullopt;
}

namespace {

void ConvertFloats(const ServeFormat& format, std::span<const float> values, uint64_t first,
                   std::span<uint8_t> out) {
  const size_t n = values.size();
  switch (format.dtype) {
    case DType::kBF16:
      return ConvertBf16(values, {reinterpret_cast<uint16_t*>(out.data()), n});
    case DType::kF16:
      return ConvertF16(values, {reinterpret_cast<uint16_t*>(out.data()), n});
    default: {
      const Fp8Format fp8 = format.dtype == DType::kF8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
      if (format.scaling == nullptr) return ConvertFp8(values, out, fp8, format.saturation);
      ForEachTileRun(*format.scaling, first, first + n, [&](uint64_t b, uint64_t e, uint64_t tile) {
        ConvertFp8(values.subspan(b - first, e - b), out.subspan(b - first, e - b), fp8,
                   format.saturation, format.scales[tile]);
      });
    }
  }
}

}  // namespace

void ConvertToServing(const ServeFormat& format, const MasterValues& values, uint64_t first,
                      std::span<uint8_t> out) {
  if (!values.is_f32() && format.dtype == DType::kBF16) {
    // BF16 to BF16 is the identity (NaN payloads included), as a cast to the same type is.
    std::memcpy(out.data(), values.bf16().data(), values.size() * 2);
    return;
  }
  const uint64_t width = Info(format.dtype).size;
  ForEachFloatBlock(values, [&](std::span<const float> block, uint64_t offset) {
    ConvertFloats(format, block, first + offset, out.subspan(offset * width, block.size() * width));
  });
}

ServedValues Serve(const MasterValues& values, std::span<const uint64_t> shape, DType dtype,
                   uint32_t fp8_block, Saturation saturation) {
  ServedValues served;
  served.bytes.resize(values.size() * Info(dtype).size);
  ServeFormat format{dtype, saturation, nullptr, {}};
  if (Info(dtype).size == 1) {
    served.scaling = ScalingForShape(shape, fp8_block);
    served.scales = ComputeScales(values, served.scaling,
                                  dtype == DType::kF8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2);
    format.scaling = &served.scaling;
    format.scales = served.scales;
  }
  ConvertToServing(format, values, 0, served.bytes);
  return served;
}

}  // namespace weft::sync
