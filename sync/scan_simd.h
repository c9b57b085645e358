// Internal: the SIMD scan kernels behind sync/chunk_codec.h (ScanChanges, ScanFromMasterBf16), and
// the scalar scan they share with the references. Use chunk_codec.h instead.
//
// On x86-64 the kernels are compiled per function for the levels of sync/cpu.h and are only called
// when the CPU has them (ScanAvx2: Cpu().avx2; ScanFromMasterBf16Avx512: Cpu().avx512); elsewhere
// they are the scalar references.
#pragma once

#include <cstdint>
#include <cstring>

#include "sync/chunk_codec.h"
#include "sync/digest.h"

namespace weft::sync::detail {

template <typename T>
inline void Record(KeyKind kind, T old_value, T new_value, uint32_t offset, uint64_t index,
                   ChangeList* changes, Digest* digest_change) {
  changes->offsets.push_back(offset);
  changes->residuals.push_back(static_cast<uint32_t>(Residual<T>(kind, old_value, new_value)));
  if (digest_change != nullptr) *digest_change += ElementChange(index, old_value, new_value);
}

template <typename T>
void ScanScalar(KeyKind kind, const uint8_t* old_bytes, const uint8_t* new_bytes, uint32_t begin,
                uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                Digest* digest_change) {
  for (uint32_t j = begin; j < count; ++j) {
    T a, b;
    std::memcpy(&a, old_bytes + size_t{j} * sizeof(T), sizeof(T));
    std::memcpy(&b, new_bytes + size_t{j} * sizeof(T), sizeof(T));
    if (a != b) Record<T>(kind, a, b, offset_base + j, index_base + j, changes, digest_change);
  }
}

// ScanChanges on AVX2 (64 bytes a step, the changes of each window finished while in L1).
void ScanAvx2(KeyKind kind, uint8_t width, const uint8_t* old_bytes, const uint8_t* new_bytes,
              uint32_t count, uint32_t offset_base, uint64_t index_base, ChangeList* changes,
              Digest* digest_change);
// ScanFromMasterBf16 on AVX-512 (32 elements a step).
void ScanFromMasterBf16Avx512(const float* master, uint8_t* served, uint32_t count,
                              uint32_t offset_base, uint64_t index_base, ChangeList* changes,
                              Digest* digest_change);

}  // namespace weft::sync::detail
