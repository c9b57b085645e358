// Element types of served tensors, with their safetensors names and sizes.
//
// The numeric codes are part of the delta byte format (docs/formats.md, "Element types") and must
// never be renumbered. Element width decides how the delta codec sees a tensor: 1-, 2- and 4-byte
// numeric elements are coded as changes in an order-preserving integer view; 8-byte elements and
// packed or opaque formats (U8 holding int4 pairs, BOOL) are coded byte by byte with XOR.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::sync {

enum class DType : uint8_t {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF8E4M3 = 4,  // FP8 E4M3FN: no infinities, NaN = S.1111.111, max finite 448
  kF8E5M2 = 5,  // FP8 E5M2: IEEE-like, max finite 57344
  kF64 = 6,
  kI8 = 7,
  kU8 = 8,
  kI16 = 9,
  kU16 = 10,
  kI32 = 11,
  kU32 = 12,
  kI64 = 13,
  kU64 = 14,
  kBool = 15,
};

// How changed elements of a dtype are coded in a delta.
enum class ValueCoding : uint8_t {
  kOrderedDiff = 0,  // difference of order-preserving integer keys, modulo 2^(8 * width)
  kXor = 1,          // bytes XOR (packed and opaque formats, 8-byte elements)
};

struct DTypeInfo {
  DType dtype;
  std::string_view safetensors_name;  // "BF16", "F8_E4M3", ...
  uint8_t size;                       // bytes per element
  bool is_float;
  bool is_signed;  // two's-complement integer or sign-magnitude float
};

const DTypeInfo& Info(DType dtype);
std::optional<DType> DTypeFromCode(uint8_t code);
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);

// The value coding and the element width (in bytes) the delta codec uses for a dtype.
ValueCoding CodingFor(DType dtype);
uint8_t CodedWidth(DType dtype);

// A tensor's name, element type and shape: what the delta codec and the safetensors layout know
// of it apart from its bytes.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;

  uint64_t element_count() const;
  // Number of coded units (elements, or bytes for bytewise-coded dtypes).
  uint64_t unit_count() const { return element_count() * Info(dtype).size / CodedWidth(dtype); }
  uint64_t byte_count() const { return element_count() * Info(dtype).size; }
};

}  // namespace weft::sync
