// Internal: what the parts of the delta codec share (delta_encode.cc, delta_squash.cc,
// delta_format.cc). Use delta_codec.h instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "sync/delta_codec.h"

namespace weft::sync::detail {

// "tensor 'NAME' chunk C", for errors.
inline std::string ChunkContext(const TensorSpec& spec, size_t chunk) {
  return "tensor '" + spec.name + "' chunk " + std::to_string(chunk);
}

// Bytes of a chunk header before its checksum (docs/formats.md, "Chunk").
std::vector<uint8_t> ChunkHeaderBytes(const DeltaChunk& chunk);

// Where a context coder finds a chunk's base values: `base` itself, or `result` (the chunk after
// the changes) from which it undoes them. `count` is the chunk's element count.
struct ContextSource {
  DType dtype;
  uint32_t count = 0;
  const uint8_t* base = nullptr;
  const uint8_t* result = nullptr;
};

// A sparse chunk (or, given a context source, the smaller of sparse and context-coded) unless the
// raw new bytes are no larger; raw is only possible when the new bytes are known (`new_bytes`
// non-empty).
DeltaChunk MakeChunk(const ChangeList& changes, std::span<const uint8_t> new_bytes, uint8_t width,
                     ValueCoding coding, const ContextSource* context = nullptr);
// A chunk that owns a copy of `source`'s payload.
DeltaChunk CopyChunk(const DeltaChunk& source);

// Element `index` of a tensor's bytes, read and written unaligned.
template <typename T>
T Load(const uint8_t* base, uint64_t index) {
  T value;
  std::memcpy(&value, base + index * sizeof(T), sizeof(T));
  return value;
}
template <typename T>
void Store(uint8_t* base, uint64_t index, T value) {
  std::memcpy(base + index * sizeof(T), &value, sizeof(T));
}

// Chunks of 2^chunk_log2 units that cover `units`.
inline size_t ChunkCount(uint64_t units, int chunk_log2) {
  return static_cast<size_t>((units + (uint64_t{1} << chunk_log2) - 1) >> chunk_log2);
}

// A delta of `spec` with every chunk unchanged.
TensorDelta NewDelta(const TensorSpec& spec, int chunk_log2);

// Dispatches fn.template operator()<T>() on the unit type of `width` (1, 2 or 4 bytes).
template <typename Fn>
decltype(auto) WithUnitType(uint8_t width, Fn&& fn) {
  switch (width) {
    case 1:
      return fn.template operator()<uint8_t>();
    case 2:
      return fn.template operator()<uint16_t>();
    default:
      return fn.template operator()<uint32_t>();
  }
}

// The first error of per-chunk results, or Ok.
inline Status FirstError(const std::vector<Status>& statuses) {
  for (const Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

}  // namespace weft::sync::detail
