// The context-modelled chunk coding (chunk mode 3 of docs/formats.md, "Context payload").
//
// Whether an element of a float tensor changes between two served versions depends strongly on
// its magnitude: an optimiser step moves most weights by about the same amount, while the spacing
// of representable values doubles with each binade, so small weights cross rounding thresholds
// far more often than large ones. The receiver holds the base, so both sides can class every
// element by the exponent of its base value ("its context") and code the positions of each
// context's changes as gaps within that context's own elements, with a Rice parameter per context.
// Signs, large-change positions and magnitudes are coded as in a sparse chunk (chunk_codec.h).
//
// Decoding a context chunk needs the base values of the whole chunk; encoding one needs the base
// or, equivalently, the result plus the change list (the base is the result with each change
// undone). A squash of context-coded deltas therefore needs the base too: SquashChainOnBase.
// All functions are thread-safe on distinct outputs.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "sync/chunk_codec.h"
#include "sync/dtype.h"

namespace weft::sync {

inline constexpr int kContexts = 16;

// Header fields of a context chunk. Contexts without changes are absent from `present` and have
// no parameter, count or stream.
struct ContextHeader {
  uint8_t exponent_low = 0;  // context = clamp(exponent - exponent_low, 0, kContexts - 1)
  uint8_t k_big = 0;         // as in SparseHeader
  uint8_t k_mag = 0;
  uint16_t present = 0;  // bit c: context c has at least one change
  std::array<uint8_t, kContexts> k_gap{};
  std::array<uint32_t, kContexts> counts{};
  uint32_t gap_bytes = 0;  // the position stream: every present context's codes, in order
  uint32_t big_count = 0;
  uint32_t sign_bytes = 0;
  uint32_t big_bytes = 0;
  uint32_t mag_bytes = 0;

  uint64_t change_count() const;
  uint64_t payload_bytes() const {
    return uint64_t{gap_bytes} + sign_bytes + uint64_t{big_bytes} + mag_bytes;
  }
};

// Whether chunks of `dtype` may be context-coded: the float types coded by ordered difference
// (F32, F16, BF16, FP8 E4M3 and E5M2).
bool SupportsContextMode(DType dtype);

// The context of each of `count` elements of `dtype` at `base` (for tests and tools).
void ComputeContexts(DType dtype, const uint8_t* base, uint32_t count, uint8_t exponent_low,
                     uint8_t* contexts);

// Codes `changes` (non-empty, offsets ascending within the chunk, residuals non-zero) of a chunk
// of `count` elements whose base values are `base`, and appends the payload.
void EncodeContextChanges(const ChangeList& changes, DType dtype, const uint8_t* base,
                          uint32_t count, ContextHeader* header, std::vector<uint8_t>* payload);

// The same, when only the result is at hand: the base of each changed element is recovered by
// undoing its residual.
void EncodeContextChangesFromResult(const ChangeList& changes, DType dtype, const uint8_t* result,
                                    uint32_t count, ContextHeader* header,
                                    std::vector<uint8_t>* payload);

// Decodes a context chunk of `count` elements whose base values are `base` into `changes`
// (cleared first). Checks the header against the payload before allocating, every position
// against the base's elements of its context, every magnitude against the element width, and
// that each stream is consumed exactly.
Status DecodeContextChanges(const ContextHeader& header, std::span<const uint8_t> payload,
                            DType dtype, const uint8_t* base, uint32_t count, ChangeList* changes);

}  // namespace weft::sync
