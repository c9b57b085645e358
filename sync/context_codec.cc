#include "sync/context_codec.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <string>

#include "sync/bit_stream.h"
#include "sync/codes.h"
#include "sync/cpu.h"
#include "sync/delta_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from an "undefined" register, which -Wmaybe-uninitialized
// and -Wuninitialized report at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace weft::sync {

using detail::BytesFor;

namespace {

// Elements classed at a time: one 64-bit mask per context covers a block.
constexpr uint32_t kBlock = 64;
// Contexts the encoder gives to changed elements: the binades from the largest changed exponent
// down; smaller elements share the lowest. Each present context costs the decoder a mask and a
// count per block, and on Adam steps more than ten of them save under 1% of the bytes.
constexpr int kContextWindow = 10;

// Where the exponent sits in an element's bit pattern.
struct ExponentField {
  int shift = 0;
  uint32_t mask = 0;
};

ExponentField FieldOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {23, 0xFF};
    case DType::kF16:
      return {10, 0x1F};
    case DType::kBF16:
      return {7, 0xFF};
    case DType::kF8E4M3:
      return {3, 0x0F};
    case DType::kF8E5M2:
      return {2, 0x1F};
    default:
      return {};
  }
}

inline uint8_t ContextOf(uint32_t bits, ExponentField field, uint8_t exponent_low) {
  const int exponent = static_cast<int>((bits >> field.shift) & field.mask);
  return static_cast<uint8_t>(std::clamp(exponent - exponent_low, 0, kContexts - 1));
}

template <typename T>
uint32_t BitsAt(const uint8_t* base, uint32_t index) {
  T value;
  std::memcpy(&value, base + size_t{index} * sizeof(T), sizeof(T));
  return value;
}

// The contexts of `n` <= 64 elements from `base`, one byte each.
template <typename T>
void BlockContextsScalar(const uint8_t* base, uint32_t n, ExponentField field, uint8_t low,
                         uint8_t* out) {
  for (uint32_t k = 0; k < n; ++k) out[k] = ContextOf(BitsAt<T>(base, k), field, low);
}

// One mask per context over a block's context bytes: bit k of masks[c] is set when element k has
// context c (only contexts in `wanted` are filled).
void BlockMasksScalar(const uint8_t* contexts, uint32_t n, uint16_t wanted, uint64_t* masks) {
  uint64_t all[kContexts] = {};
  for (uint32_t k = 0; k < n; ++k) all[contexts[k]] |= uint64_t{1} << k;
  for (int c = 0; c < kContexts; ++c) {
    if (wanted >> c & 1) masks[c] = all[c];
  }
}

#if defined(__x86_64__)

// The contexts of 64 elements from `base` as the bytes of a vector.
template <typename T>
WEFT_TARGET_AVX512 inline __m512i BlockContextsAvx512(const uint8_t* base, ExponentField field,
                                                      uint8_t low) {
  if constexpr (sizeof(T) == 1) {
    // A 16-bit shift brings the high byte's bits into the low byte's top, which the mask drops.
    const __m512i v = _mm512_loadu_si512(base);
    __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, field.shift),
                                 _mm512_set1_epi8(static_cast<char>(field.mask)));
    e = _mm512_subs_epu8(e, _mm512_set1_epi8(static_cast<char>(low)));
    return _mm512_min_epu8(e, _mm512_set1_epi8(kContexts - 1));
  } else if constexpr (sizeof(T) == 2) {
    const __m512i mask = _mm512_set1_epi16(static_cast<short>(field.mask));
    const __m512i lo = _mm512_set1_epi16(low);
    const __m512i top = _mm512_set1_epi16(kContexts - 1);
    __m512i halves[2];
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(base + 64 * h);
      __m512i e = _mm512_and_si512(_mm512_srli_epi16(v, field.shift), mask);
      halves[h] = _mm512_min_epu16(_mm512_subs_epu16(e, lo), top);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(halves[0])),
                              _mm512_cvtepi16_epi8(halves[1]), 1);
  } else {
    const __m512i mask = _mm512_set1_epi32(static_cast<int>(field.mask));
    const __m512i lo = _mm512_set1_epi32(low);
    const __m512i top = _mm512_set1_epi32(kContexts - 1);
    const __m512i zero = _mm512_setzero_si512();
    __m128i quarters[4];
    for (int q = 0; q < 4; ++q) {
      const __m512i v = _mm512_loadu_si512(base + 64 * q);
      __m512i e = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, field.shift), mask), lo);
      quarters[q] = _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(e, zero), top));
    }
    __m512i out = _mm512_castsi128_si512(quarters[0]);
    out = _mm512_inserti32x4(out, quarters[1], 1);
    out = _mm512_inserti32x4(out, quarters[2], 2);
    return _mm512_inserti32x4(out, quarters[3], 3);
  }
}

WEFT_TARGET_AVX512 inline uint64_t ContextMask(__m512i contexts, int c) {
  return _mm512_cmpeq_epi8_mask(contexts, _mm512_set1_epi8(static_cast<char>(c)));
}

#endif

// The index of the (rank)-th set bit of `mask` (rank < popcount(mask)), as a one-bit mask.
inline uint64_t SelectBit(uint64_t mask, uint64_t rank) {
  for (; rank > 0; --rank) mask &= mask - 1;
  return mask & (0 - mask);
}

// ---- Decoding ----------------------------------------------------------------------------------

// The state of the position decoder. Each present context's changes are known in advance as
// ranks among its members (decoded from its codes); the contexts with changes still to place are
// a compact list of slots, in any order, so that a block costs one mask and one count per live
// context. Per slot: its context, the members of it passed so far, and its next change's rank
// (`next` points into the ranks, `end` past the slot's last).
struct PositionState {
  int live = 0;
  uint8_t context[kContexts];
  uint32_t passed[kContexts];
  const uint32_t* next[kContexts];
  const uint32_t* end[kContexts];
  uint32_t* offsets = nullptr;
  uint32_t found = 0;

  // Drops slot i (its changes are all placed) by moving the last slot into it; callers visit
  // slots from the last down, so the moved one was already visited.
  void Drop(int i) {
    --live;
    context[i] = context[live];
    passed[i] = passed[live];
    next[i] = next[live];
    end[i] = end[live];
  }
};

// Places the changes of slot i in a block whose members of its context are `mask`, the first of
// them `skip` members in (skip < popcount(mask)): returns the one-bit masks of the changed
// elements, and counts the block's members as passed. Out of line: the loop that calls it stays
// small enough to keep its state in registers.
#if defined(__x86_64__)
WEFT_TARGET_AVX512 inline uint64_t SelectBitFast(uint64_t mask, uint64_t rank) {
  return _pdep_u64(uint64_t{1} << rank, mask);
}
#else
inline uint64_t SelectBitFast(uint64_t mask, uint64_t rank) { return SelectBit(mask, rank); }
#endif

template <bool kFast>
__attribute__((always_inline)) inline uint64_t PlaceChangesIn(PositionState& s, int i,
                                                              uint64_t mask, uint32_t skip) {
  const uint32_t in_block = static_cast<uint32_t>(std::popcount(mask));
  uint64_t changed = 0;
  while (true) {
    if constexpr (kFast) {
      changed |= SelectBitFast(mask, skip);
    } else {
      changed |= SelectBit(mask, skip);
    }
    if (++s.next[i] == s.end[i]) {
      s.Drop(i);
      return changed;
    }
    skip = *s.next[i] - s.passed[i];
    if (skip >= in_block) break;
  }
  s.passed[i] += in_block;
  return changed;
}

__attribute__((noinline)) uint64_t PlaceChanges(PositionState& s, int i, uint64_t mask,
                                                uint32_t skip) {
  return PlaceChangesIn<false>(s, i, mask, skip);
}
#if defined(__x86_64__)
WEFT_TARGET_AVX512 __attribute__((noinline)) uint64_t PlaceChangesFast(PositionState& s, int i,
                                                                       uint64_t mask,
                                                                       uint32_t skip) {
  return PlaceChangesIn<true>(s, i, mask, skip);
}
#endif

inline void AppendChanges(PositionState& s, uint64_t changed, uint32_t first) {
  while (changed != 0) {
    s.offsets[s.found++] = first + static_cast<uint32_t>(std::countr_zero(changed));
    changed &= changed - 1;
  }
}

template <typename T>
void DecodePositionsScalar(PositionState& s, const uint8_t* base, uint32_t count,
                           ExponentField field, uint8_t low) {
  alignas(64) uint8_t contexts[kBlock];
  uint64_t masks[kContexts];
  for (uint32_t first = 0; first < count && s.live != 0; first += kBlock) {
    const uint32_t n = std::min(kBlock, count - first);
    BlockContextsScalar<T>(base + size_t{first} * sizeof(T), n, field, low, contexts);
    BlockMasksScalar(contexts, n, 0xFFFF, masks);
    uint64_t changed = 0;
    for (int i = s.live - 1; i >= 0; --i) {
      const uint64_t mask = masks[s.context[i]];
      const uint32_t in_block = static_cast<uint32_t>(std::popcount(mask));
      const uint32_t skip = *s.next[i] - s.passed[i];
      if (skip >= in_block) {
        s.passed[i] += in_block;
        continue;
      }
      changed |= PlaceChanges(s, i, mask, skip);
    }
    AppendChanges(s, changed, first);
  }
}

#if defined(__x86_64__)
// `count` is a multiple of the block. A block costs its contexts (computed once, in registers),
// then a compare and a population count per live context; a change costs a bit deposit.
template <typename T>
WEFT_TARGET_AVX512 void DecodePositionsAvx512(PositionState& s, const uint8_t* base, uint32_t count,
                                              ExponentField field, uint8_t low) {
  for (uint32_t first = 0; first < count && s.live != 0; first += kBlock) {
    const __m512i contexts = BlockContextsAvx512<T>(base + size_t{first} * sizeof(T), field, low);
    uint64_t changed = 0;
    for (int i = s.live - 1; i >= 0; --i) {
      const uint64_t mask = ContextMask(contexts, s.context[i]);
      const uint32_t in_block = static_cast<uint32_t>(std::popcount(mask));
      const uint32_t skip = *s.next[i] - s.passed[i];
      if (__builtin_expect(skip >= in_block, 1)) {  // no change of this context here
        s.passed[i] += in_block;
        continue;
      }
      // One change of this context in the block, the next one beyond it: the common case, kept
      // inline; the rest (its last change, several in a block) out of line.
      const uint32_t* following = s.next[i] + 1;
      if (following != s.end[i] && *following - s.passed[i] >= in_block) {
        changed |= _pdep_u64(uint64_t{1} << skip, mask);
        s.next[i] = following;
        s.passed[i] += in_block;
        continue;
      }
      changed |= PlaceChangesFast(s, i, mask, skip);
    }
    if (changed != 0) AppendChanges(s, changed, first);
  }
}

template <typename T>
WEFT_TARGET_AVX512 void StoreBlockContextsAvx512(const uint8_t* base, ExponentField field,
                                                 uint8_t low, uint8_t* contexts) {
  _mm512_store_si512(contexts, BlockContextsAvx512<T>(base, field, low));
}

// masks[i] = the members of context[i] among the block's 64 context bytes, for i < count.
WEFT_TARGET_AVX512 void BlockMasksAvx512(const uint8_t* block, const uint8_t* context, int count,
                                         uint64_t* masks) {
  const __m512i contexts = _mm512_load_si512(block);
  for (int i = 0; i < count; ++i) masks[i] = ContextMask(contexts, context[i]);
}
#endif

// ---- Encoding ----------------------------------------------------------------------------------

// The base value of each change: read from the base, or undone from the result.
template <typename T>
uint32_t BaseBits(const uint8_t* base, const uint8_t* result, uint32_t offset, uint32_t residual) {
  if (base != nullptr) return BitsAt<T>(base, offset);
  return ApplyResidual<T>(KeyKind::kFloat, static_cast<T>(BitsAt<T>(result, offset)),
                          static_cast<T>(0 - residual));
}

// For each change, its rank among the chunk's elements of its context (the elements before it
// that share its context), given each change's context. Blocks after the last change are not
// visited.
template <typename T, bool kSimd>
__attribute__((always_inline)) inline void RanksOfImpl(const ChangeList& changes,
                                                       const uint8_t* base, const uint8_t* result,
                                                       const uint8_t* change_contexts,
                                                       uint32_t count, ExponentField field,
                                                       uint8_t low, uint16_t present,
                                                       uint32_t* ranks) {
  const uint8_t* values = base != nullptr ? base : result;
  // The present contexts as a compact list of slots.
  uint8_t context[kContexts], slot_of[kContexts] = {};
  int slots = 0;
  for (int c = 0; c < kContexts; ++c) {
    if ((present >> c & 1) == 0) continue;
    slot_of[c] = static_cast<uint8_t>(slots);
    context[slots++] = static_cast<uint8_t>(c);
  }
  uint32_t counters[kContexts] = {};
  alignas(64) uint8_t contexts[kBlock];
  uint64_t masks[kContexts];
  const size_t n = changes.size();
  const uint32_t end = std::min(count, (changes.offsets[n - 1] / kBlock + 1) * kBlock);
  size_t j = 0;
  for (uint32_t first = 0; first < end; first += kBlock) {
    const uint32_t width = std::min(kBlock, count - first);
    const uint8_t* block = values + size_t{first} * sizeof(T);
#if defined(__x86_64__)
    if (kSimd && width == kBlock) {
      StoreBlockContextsAvx512<T>(block, field, low, contexts);
    } else {
      BlockContextsScalar<T>(block, width, field, low, contexts);
    }
#else
    BlockContextsScalar<T>(block, width, field, low, contexts);
#endif
    const size_t block_begin = j;
    while (j < n && changes.offsets[j] < first + width) {
      contexts[changes.offsets[j] - first] = change_contexts[j];  // the base's, not the result's
      ++j;
    }
#if defined(__x86_64__)
    if (kSimd && width == kBlock) {
      BlockMasksAvx512(contexts, context, slots, masks);
    } else {
      uint64_t all[kContexts];
      BlockMasksScalar(contexts, width, present, all);
      for (int i = 0; i < slots; ++i) masks[i] = all[context[i]];
    }
#else
    uint64_t all[kContexts];
    BlockMasksScalar(contexts, width, present, all);
    for (int i = 0; i < slots; ++i) masks[i] = all[context[i]];
#endif
    for (size_t i = block_begin; i < j; ++i) {
      const uint32_t lane = changes.offsets[i] - first;
      const uint8_t slot = slot_of[change_contexts[i]];
      ranks[i] = counters[slot] +
                 static_cast<uint32_t>(std::popcount(masks[slot] & ((uint64_t{1} << lane) - 1)));
    }
    for (int i = 0; i < slots; ++i) counters[i] += static_cast<uint32_t>(std::popcount(masks[i]));
  }
}

template <typename T>
void RanksOfScalar(const ChangeList& changes, const uint8_t* base, const uint8_t* result,
                   const uint8_t* change_contexts, uint32_t count, ExponentField field, uint8_t low,
                   uint16_t present, uint32_t* ranks) {
  RanksOfImpl<T, false>(changes, base, result, change_contexts, count, field, low, present, ranks);
}

#if defined(__x86_64__)
template <typename T>
WEFT_TARGET_AVX512 void RanksOfAvx512(const ChangeList& changes, const uint8_t* base,
                                      const uint8_t* result, const uint8_t* change_contexts,
                                      uint32_t count, ExponentField field, uint8_t low,
                                      uint16_t present, uint32_t* ranks) {
  RanksOfImpl<T, true>(changes, base, result, change_contexts, count, field, low, present, ranks);
}
#endif

template <typename T>
void Encode(const ChangeList& changes, DType dtype, const uint8_t* base, const uint8_t* result,
            uint32_t count, ContextHeader* header, std::vector<uint8_t>* payload) {
  const ExponentField field = FieldOf(dtype);
  const size_t n = changes.size();
  assert(n > 0 && SupportsContextMode(dtype));
  // The window of contexts ends just above the largest changed exponent: larger elements, which
  // never change here, share the last context and cost nothing.
  std::vector<uint8_t> change_contexts(n);
  uint32_t top = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t bits = BaseBits<T>(base, result, changes.offsets[j], changes.residuals[j]);
    const uint32_t exponent = (bits >> field.shift) & field.mask;
    change_contexts[j] = static_cast<uint8_t>(exponent);
    top = std::max(top, exponent);
  }
  *header = ContextHeader{};
  header->exponent_low =
      static_cast<uint8_t>(top >= kContextWindow ? top - (kContextWindow - 1) : 0);
  for (size_t j = 0; j < n; ++j) {
    change_contexts[j] = static_cast<uint8_t>(
        std::clamp(change_contexts[j] - header->exponent_low, 0, kContexts - 1));
    ++header->counts[change_contexts[j]];
  }
  for (int c = 0; c < kContexts; ++c) {
    if (header->counts[c] > 0) header->present |= static_cast<uint16_t>(1u << c);
  }
  std::vector<uint32_t> ranks(n);
#if defined(__x86_64__)
  if (Cpu().avx512) {
    RanksOfAvx512<T>(changes, base, result, change_contexts.data(), count, field,
                     header->exponent_low, header->present, ranks.data());
  } else {
    RanksOfScalar<T>(changes, base, result, change_contexts.data(), count, field,
                     header->exponent_low, header->present, ranks.data());
  }
#else
  RanksOfScalar<T>(changes, base, result, change_contexts.data(), count, field,
                   header->exponent_low, header->present, ranks.data());
#endif

  // Gaps grouped by context, each context's in position order.
  uint32_t start[kContexts + 1] = {};
  for (int c = 0; c < kContexts; ++c) start[c + 1] = start[c] + header->counts[c];
  std::vector<uint32_t> gaps(n);
  uint32_t filled[kContexts] = {};
  int64_t previous[kContexts];
  std::fill(previous, previous + kContexts, -1);
  for (size_t j = 0; j < n; ++j) {
    const uint8_t c = change_contexts[j];
    gaps[start[c] + filled[c]++] = static_cast<uint32_t>(ranks[j] - previous[c] - 1);
    previous[c] = ranks[j];
  }
  uint64_t position_bits = 0;
  for (int c = 0; c < kContexts; ++c) {
    if (header->counts[c] == 0) continue;
    auto [k, bits] =
        detail::ChooseRice(std::span<const uint32_t>(gaps.data() + start[c], header->counts[c]));
    header->k_gap[c] = static_cast<uint8_t>(k);
    position_bits += bits;
  }
  header->gap_bytes = BytesFor(position_bits);
  const detail::ValueStreams values(changes.residuals, sizeof(T), ValueCoding::kOrderedDiff);
  const detail::ValueStreamHeader& declared = values.header();
  header->k_big = declared.k_big;
  header->k_mag = declared.k_mag;
  header->big_count = declared.big_count;
  header->sign_bytes = declared.sign_bytes;
  header->big_bytes = declared.big_bytes;
  header->mag_bytes = declared.mag_bytes;

  const size_t at = payload->size();
  payload->resize(at + header->payload_bytes() + kBitWriterSlack);
  uint8_t* out = payload->data() + at;
  {
    BitWriter writer(out);
    for (int c = 0; c < kContexts; ++c) {
      for (uint32_t i = start[c]; i < start[c + 1]; ++i) {
        detail::PutRice(writer, gaps[i], header->k_gap[c]);
      }
    }
    assert(writer.bytes() == header->gap_bytes);
  }
  values.Write(out + header->gap_bytes);
  payload->resize(at + header->payload_bytes());
}

// Runs fn.template operator()<T>() with T the unsigned type of `dtype`'s width.
template <typename Fn>
decltype(auto) WithFloatType(DType dtype, Fn&& fn) {
  return detail::WithUnitType(static_cast<uint8_t>(Info(dtype).size), std::forward<Fn>(fn));
}

}  // namespace

uint64_t ContextHeader::change_count() const {
  uint64_t n = 0;
  for (uint32_t c : counts) n += c;
  return n;
}

bool SupportsContextMode(DType dtype) { return FieldOf(dtype).mask != 0; }

void ComputeContexts(DType dtype, const uint8_t* base, uint32_t count, uint8_t exponent_low,
                     uint8_t* contexts) {
  const ExponentField field = FieldOf(dtype);
  WithFloatType(dtype, [&]<typename T>() {
    for (uint32_t k = 0; k < count; ++k) {
      contexts[k] = ContextOf(BitsAt<T>(base, k), field, exponent_low);
    }
  });
}

void EncodeContextChanges(const ChangeList& changes, DType dtype, const uint8_t* base,
                          uint32_t count, ContextHeader* header, std::vector<uint8_t>* payload) {
  WithFloatType(dtype, [&]<typename T>() {
    Encode<T>(changes, dtype, base, nullptr, count, header, payload);
  });
}

void EncodeContextChangesFromResult(const ChangeList& changes, DType dtype, const uint8_t* result,
                                    uint32_t count, ContextHeader* header,
                                    std::vector<uint8_t>* payload) {
  WithFloatType(dtype, [&]<typename T>() {
    Encode<T>(changes, dtype, nullptr, result, count, header, payload);
  });
}

Status DecodeContextChanges(const ContextHeader& header, std::span<const uint8_t> payload,
                            DType dtype, const uint8_t* base, uint32_t count, ChangeList* changes) {
  changes->clear();
  if (!SupportsContextMode(dtype)) {
    return DataLoss("context chunk in a " + std::string(Info(dtype).safetensors_name) + " tensor");
  }
  if (header.present == 0) return DataLoss("context chunk without changes");
  uint64_t n = 0, least_bits = 0;
  for (int c = 0; c < kContexts; ++c) {
    const std::string where = "context " + std::to_string(c);
    if ((header.present >> c & 1) == 0) {
      if (header.counts[c] != 0 || header.k_gap[c] != 0) {
        return DataLoss(where + " is absent but has changes");
      }
      continue;
    }
    if (header.k_gap[c] > detail::kMaxRiceParameter) {
      return DataLoss(where + ": code parameter out of range");
    }
    if (header.counts[c] == 0) return DataLoss(where + " is present without changes");
    n += header.counts[c];
    least_bits += uint64_t{header.counts[c]} * (header.k_gap[c] + 1u);
  }
  // Every code takes at least k + 1 bits: bound the counts by the stream before allocating.
  if (least_bits > uint64_t{header.gap_bytes} * 8) {
    return DataLoss("change counts exceed what the position stream of " +
                    std::to_string(header.gap_bytes) + " bytes can hold");
  }
  if (n > count) {
    return DataLoss("change count " + std::to_string(n) + " over the chunk's " +
                    std::to_string(count) + " elements");
  }
  const detail::ValueStreamHeader values{
      header.k_big,      header.k_mag,     static_cast<uint32_t>(n), header.big_count,
      header.sign_bytes, header.big_bytes, header.mag_bytes};
  WEFT_RETURN_IF_ERROR(detail::CheckValueStreams(values, ValueCoding::kOrderedDiff));
  if (header.payload_bytes() != payload.size()) return DataLoss("stream lengths do not add up");

  // Each context's changes as ranks among its members, context after context. A rank at or past
  // the chunk's end cannot be placed: refused here, the rest when the members run out. The ranks
  // are kept where the residuals go, which are decoded once the ranks are spent.
  changes->offsets.resize(n);
  changes->residuals.resize(n);
  U32Vector& ranks = changes->residuals;
  PositionState state;
  state.offsets = changes->offsets.data();
  {
    BitReader positions(payload.first(header.gap_bytes));
    uint32_t* rank = ranks.data();
    for (int c = 0; c < kContexts; ++c) {
      if ((header.present >> c & 1) == 0) continue;
      const int i = state.live++;
      state.context[i] = static_cast<uint8_t>(c);
      state.passed[i] = 0;
      state.next[i] = rank;
      uint64_t next = 0;
      for (uint32_t j = 0; j < header.counts[c]; ++j) {
        next += detail::GetRice(positions, header.k_gap[c]);
        if (next >= count) {
          return DataLoss("context " + std::to_string(c) + " has a change past the chunk's " +
                          std::to_string(count) + " elements");
        }
        *rank++ = static_cast<uint32_t>(next++);
      }
      state.end[i] = rank;
    }
    if (!positions.ConsumedExactly()) {
      return DataLoss("the position stream is truncated or has trailing bits");
    }
  }
  const ExponentField field = FieldOf(dtype);
  WithFloatType(dtype, [&]<typename T>() {
#if defined(__x86_64__)
    if (Cpu().avx512) {
      const uint32_t full = count - count % kBlock;
      DecodePositionsAvx512<T>(state, base, full, field, header.exponent_low);
      if (full < count && state.live != 0) {
        const uint32_t before = state.found;
        DecodePositionsScalar<T>(state, base + size_t{full} * sizeof(T), count - full, field,
                                 header.exponent_low);
        for (uint32_t j = before; j < state.found; ++j) state.offsets[j] += full;
      }
      return;
    }
#endif
    DecodePositionsScalar<T>(state, base, count, field, header.exponent_low);
  });
  if (state.live != 0) {
    return DataLoss("context " + std::to_string(state.context[0]) +
                    " has changes past its members in the chunk's " + std::to_string(count) +
                    " elements");
  }
  if (state.found != n) return DataLoss("positions disagree with the change count");
  return detail::DecodeValueStreams(values, payload.subspan(header.gap_bytes),
                                    static_cast<uint8_t>(Info(dtype).size),
                                    ValueCoding::kOrderedDiff, changes->residuals.data());
}

}  // namespace weft::sync
