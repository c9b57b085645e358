#include "sync/dtype.h"

#include <array>

namespace weft::sync {
namespace {

constexpr std::array<DTypeInfo, 15> kInfos = {{
    {DType::kF32, "F32", 4, true, true},
    {DType::kF16, "F16", 2, true, true},
    {DType::kBF16, "BF16", 2, true, true},
    {DType::kF8E4M3, "F8_E4M3", 1, true, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true, true},
    {DType::kF64, "F64", 8, true, true},
    {DType::kI8, "I8", 1, false, true},
    {DType::kU8, "U8", 1, false, false},
    {DType::kI16, "I16", 2, false, true},
    {DType::kU16, "U16", 2, false, false},
    {DType::kI32, "I32", 4, false, true},
    {DType::kU32, "U32", 4, false, false},
    {DType::kI64, "I64", 8, false, true},
    {DType::kU64, "U64", 8, false, false},
    {DType::kBool, "BOOL", 1, false, false},
}};

}  // namespace

const DTypeInfo& Info(DType dtype) { return kInfos[static_cast<size_t>(dtype) - 1]; }

std::optional<DType> DTypeFromCode(uint8_t code) {
  if (code < 1 || code > kInfos.size()) return std::nullopt;
  return static_cast<DType>(code);
}

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const auto& info : kInfos) {
    if (info.safetensors_name == name) return info.dtype;
  }
  return std::nullopt;
}

ValueCoding CodingFor(DType dtype) {
  const DTypeInfo& info = Info(dtype);
  // U8 and BOOL often hold packed sub-byte formats (int4 pairs, bit masks) whose byte order is not
  // numeric order; 8-byte elements are rare in served weights and are coded bytewise.
  if (dtype == DType::kU8 || dtype == DType::kBool || info.size == 8) return ValueCoding::kXor;
  return ValueCoding::kOrderedDiff;
}

uint8_t CodedWidth(DType dtype) {
  return CodingFor(dtype) == ValueCoding::kXor ? 1 : Info(dtype).size;
}

uint64_t TensorSpec::element_count() const {
  uint64_t count = 1;
  for (uint64_t d : shape) count *= d;
  return count;
}

}  // namespace weft::sync
