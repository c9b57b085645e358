// The per-chunk layer of the delta codec: finding changed elements and coding them.
//
// A chunk is a fixed range of elements of one tensor. Its changes are a ChangeList: ascending
// offsets within the chunk and, for each, a non-zero residual:
//   kOrderedDiff: key(new) - key(old) mod 2^(8 * width), where key is the order-preserving
//                 integer view of the element (OrderKey below), so a one-ulp move is +-1;
//   kXor:         new ^ old.
// EncodeChanges turns a ChangeList into the "sparse" chunk payload of docs/formats.md (four bit
// streams: Rice-coded position gaps, signs, Rice-coded positions of the changes whose magnitude
// exceeds one, and Exp-Golomb-coded magnitudes of those), choosing each code's parameter per
// chunk to minimise its exact size. DecodeChanges reverses it and rejects anything malformed
// (overlong streams, offsets outside the chunk, counts that disagree) without writing to served
// memory. All functions are thread-safe on distinct outputs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sync/digest.h"
#include "sync/dtype.h"

namespace weft::sync {

// How residuals are formed for a dtype: float keys, integer identity, or XOR of bytes.
enum class KeyKind : uint8_t { kFloat, kInteger, kXor };

KeyKind KeyKindFor(DType dtype);

// The order-preserving key of a float's bit pattern (width = sizeof(T)) and its inverse: flip only
// the sign bit of a non-negative pattern, every bit of a negative one. A bijection on patterns.
template <typename T>
inline T OrderKey(T bits) {
  constexpr T kSign = static_cast<T>(T{1} << (8 * sizeof(T) - 1));
  T negative_mask = static_cast<T>(T{0} - static_cast<T>(bits >> (8 * sizeof(T) - 1)));
  return static_cast<T>(bits ^ static_cast<T>(negative_mask | kSign));
}
template <typename T>
inline T OrderKeyInverse(T key) {
  constexpr T kSign = static_cast<T>(T{1} << (8 * sizeof(T) - 1));
  return (key & kSign) ? static_cast<T>(key ^ kSign) : static_cast<T>(~key);
}

// The residual that takes `old_bits` to `new_bits`, and back.
template <typename T>
inline T Residual(KeyKind kind, T old_bits, T new_bits) {
  switch (kind) {
    case KeyKind::kFloat:
      return static_cast<T>(OrderKey(new_bits) - OrderKey(old_bits));
    case KeyKind::kInteger:
      return static_cast<T>(new_bits - old_bits);
    case KeyKind::kXor:
      return static_cast<T>(new_bits ^ old_bits);
  }
  return 0;
}
template <typename T>
inline T ApplyResidual(KeyKind kind, T old_bits, T residual) {
  switch (kind) {
    case KeyKind::kFloat:
      return OrderKeyInverse(static_cast<T>(OrderKey(old_bits) + residual));
    case KeyKind::kInteger:
      return static_cast<T>(old_bits + residual);
    case KeyKind::kXor:
      return static_cast<T>(old_bits ^ residual);
  }
  return old_bits;
}

// std::allocator that default-initialises: resize() of a vector of integers leaves the new
// elements uninitialised, so a kernel can size a list for the worst case and fill what it needs.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using U32Vector = std::vector<uint32_t, UninitializedAllocator<uint32_t>>;

struct ChangeList {
  U32Vector offsets;    // ascending, within the chunk
  U32Vector residuals;  // non-zero, in the low 8 * width bits

  size_t size() const { return offsets.size(); }
  bool empty() const { return offsets.empty(); }
  void clear() {
    offsets.clear();
    residuals.clear();
  }
};

// Appends to `changes` every element j in [0, count) where old and new differ, as offset
// `offset_base + j`, and adds to `digest_change` (if not null) the digest change of each, element
// j having tensor index `index_base + j`. `width` is the element size in bytes (1, 2 or 4).
// Uses AVX2 when available; ScanChangesRef is the scalar reference.
void ScanChanges(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
                 uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                 Digest* digest_change);
void ScanChangesRef(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
                    uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                    Digest* digest_change);

// The fused BF16 kernel: converts master[j] (FP32) to BF16 for j in [0, count), compares it
// with served element j, appends each change as ScanChanges does, adds its digest change, and
// writes the new value into `served`. Unchanged elements are not written. Uses AVX-512 when
// available; ScanFromMasterBf16Ref is the scalar reference.
void ScanFromMasterBf16(const float* master, uint8_t* served, uint32_t count, uint32_t offset_base,
                        uint64_t index_base, ChangeList* changes, Digest* digest_change);
void ScanFromMasterBf16Ref(const float* master, uint8_t* served, uint32_t count,
                           uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                           Digest* digest_change);
// Whether ScanFromMasterBf16 has a SIMD path here (otherwise callers convert and ScanChanges).
bool HasFusedBf16Kernel();

// Header fields of a sparse chunk (docs/formats.md, "Sparse payload").
struct SparseHeader {
  uint8_t k_gap = 0;  // Rice parameter of position gaps
  uint8_t k_big = 0;  // Rice parameter of gaps between changes with magnitude > 1
  uint8_t k_mag = 0;  // Exp-Golomb order of (magnitude - 2)
  uint32_t change_count = 0;
  uint32_t big_count = 0;
  uint32_t gap_bytes = 0;
  uint32_t sign_bytes = 0;
  uint32_t big_bytes = 0;
  uint32_t mag_bytes = 0;

  uint64_t payload_bytes() const {
    return uint64_t{gap_bytes} + sign_bytes + big_bytes + mag_bytes;
  }
};

// Codes `changes` (non-empty, offsets ascending, residuals non-zero) and appends the payload.
void EncodeChanges(const ChangeList& changes, uint8_t width, ValueCoding coding,
                   SparseHeader* header, std::vector<uint8_t>* payload);

// Decodes a sparse payload of a chunk holding `chunk_elements` elements into `changes` (cleared
// first). Checks the header against the payload before allocating, every offset against the
// chunk, every magnitude against the element width, and that each stream is consumed exactly.
Status DecodeChanges(const SparseHeader& header, std::span<const uint8_t> payload,
                     uint32_t chunk_elements, uint8_t width, ValueCoding coding,
                     ChangeList* changes);

// Limits on code parameters, checked by the decoder.
inline constexpr int kMaxGapParameter = 26;
inline constexpr int kMaxMagnitudeOrder = 30;

}  // namespace weft::sync
