// The delta codec's encoding and applying (delta_codec.h): plain, fused from master weights and
// for whole models; prepared, proven and committed.
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>

#include "common/parallel.h"
#include "sync/cpu.h"
#include "sync/delta_codec.h"
#include "sync/delta_internal.h"
#include "sync/digest_simd.h"
#include "sync/sparse_decode.h"

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start from an "undefined" register, which -Wmaybe-uninitialized
// and -Wuninitialized report at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

namespace weft::sync {

using detail::ChunkContext;
using detail::ChunkCount;
using detail::Load;
using detail::MakeChunk;
using detail::NewDelta;
using detail::Store;
using detail::WithUnitType;

namespace {

// Elements converted at a time in the fused path: small enough to stay in L1.
constexpr uint64_t kFusedBlock = 4096;

// ---- Applying ----------------------------------------------------------------------------------
//
// Prepare decodes a chunk's changes, loads the old value of each changed element, forms its new
// value and the digest change, and keeps (offset, new value) pairs; Commit only stores them. A
// sparse chunk is resolved while it is decoded: while a block of kApplyBlock changes is decoded
// (its elements prefetched), the block before it is resolved, eight changes at a time, so that the
// vector work of one overlaps the serial decoding of the other.

constexpr uint32_t kApplyBlock = detail::kSparseBlock;
constexpr uint32_t kApplyStep = detail::kSparseStep;

// values[i] = ApplyResidual(kind, old_values[i], values[i]) for i < count.
template <typename T>
void ApplyResiduals(KeyKind kind, const uint32_t* old_values, uint32_t* values, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    values[i] = ApplyResidual<T>(kind, static_cast<T>(old_values[i]), static_cast<T>(values[i]));
  }
}

// Resolves count <= kApplyBlock changes of the chunk whose first unit is `base` (tensor index
// `first`): replaces each residual by the new value and returns the digest change. Reads only.
template <typename T>
Digest ResolveBlock(KeyKind kind, const uint8_t* base, uint64_t first, const uint32_t* offsets,
                    uint32_t* values, uint32_t count) {
  uint32_t old_values[kApplyBlock];
  for (uint32_t i = 0; i < count; ++i) old_values[i] = Load<T>(base, offsets[i]);
  ApplyResiduals<T>(kind, old_values, values, count);
  return SumElementChanges(first, offsets, old_values, values, count);
}

#if defined(__x86_64__)
// Eight changes whose new values are written, with what their digest change still needs.
struct Resolved8 {
  __m512i key;  // position keys
  __m512i old_value;
  __m512i new_value;
};

// The eight-lane form of ResolveBlock, for changes [0, 8) of `offsets` and `values` where
// `lanes` is set: the magnitude in `values` is negated where `negative` is set and the new value
// replaces it. Inactive lanes count as unchanged zeros. The old values of a full group are
// gathered as 32-bit words when that stays inside the tensor (offsets below `gather_end`):
// loading them one by one would leave the vector load waiting for eight stores to retire. Returns
// what the digest change still needs (AddResolved8).
template <typename T>
WEFT_TARGET_AVX512 inline Resolved8 ResolveValues8(KeyKind kind, const uint8_t* base,
                                                   uint64_t first, uint32_t gather_end,
                                                   const uint32_t* offsets, uint32_t* values,
                                                   __mmask8 negative, __mmask8 lanes) {
  constexpr int kBits = 8 * sizeof(T);
  const __m512i mask = _mm512_set1_epi64(static_cast<long long>((uint64_t{1} << kBits) - 1));
  const __m512i sign = _mm512_set1_epi64(static_cast<long long>(uint64_t{1} << (kBits - 1)));
  const __m512i zero = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi64(1);
  __m512i old_value;
  if (lanes == 0xFF && offsets[kApplyStep - 1] < gather_end) {
    const __m256i index = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets));
    const __m256i words =
        _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), index, sizeof(T));
    old_value = _mm512_and_si512(_mm512_cvtepu32_epi64(words), mask);
  } else {
    alignas(32) uint32_t old_values[kApplyStep];
    for (uint32_t i = 0; i < kApplyStep; ++i)
      old_values[i] = (lanes >> i) & 1 ? Load<T>(base, offsets[i]) : 0;
    old_value =
        _mm512_cvtepu32_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(old_values)));
  }
  __m512i residual = _mm512_cvtepu32_epi64(
      _mm512_castsi512_si256(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(lanes), values)));
  residual = _mm512_and_si512(_mm512_mask_sub_epi64(residual, negative, zero, residual), mask);
  __m512i new_value;
  if (kind == KeyKind::kFloat) {
    // OrderKey: flip the sign bit of a non-negative pattern, every bit of a negative one.
    const __m512i is_negative = _mm512_srli_epi64(old_value, kBits - 1);
    const __m512i flip =
        _mm512_or_si512(_mm512_and_si512(_mm512_sub_epi64(zero, is_negative), mask), sign);
    const __m512i key =
        _mm512_and_si512(_mm512_add_epi64(_mm512_xor_si512(old_value, flip), residual), mask);
    // OrderKeyInverse: the key's top bit set means a non-negative pattern.
    const __m512i top = _mm512_srli_epi64(key, kBits - 1);
    const __m512i unflip =
        _mm512_or_si512(_mm512_and_si512(_mm512_sub_epi64(top, one), mask), sign);
    new_value = _mm512_xor_si512(key, unflip);
  } else if (kind == KeyKind::kInteger) {
    new_value = _mm512_and_si512(_mm512_add_epi64(old_value, residual), mask);
  } else {
    new_value = _mm512_xor_si512(old_value, residual);
  }
  _mm512_mask_cvtepi64_storeu_epi32(values, lanes, new_value);
  const __m512i index =
      _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first)),
                       _mm512_cvtepu32_epi64(_mm512_castsi512_si256(
                           _mm512_maskz_loadu_epi32(static_cast<__mmask16>(lanes), offsets))));
  return {digest_detail::PositionKeys8(index), old_value, new_value};
}

WEFT_TARGET_AVX512 inline void AddResolved8(const Resolved8& resolved,
                                            digest_detail::DigestLanes* sum) {
  digest_detail::AddElementChangesWithKeys8(resolved.key, resolved.old_value, resolved.new_value,
                                            sum);
}

// ResolveValues8 and the digest change, added to `sum`.
template <typename T>
WEFT_TARGET_AVX512 inline void Resolve8(KeyKind kind, const uint8_t* base, uint64_t first,
                                        uint32_t gather_end, const uint32_t* offsets,
                                        uint32_t* values, __mmask8 negative, __mmask8 lanes,
                                        digest_detail::DigestLanes* sum) {
  AddResolved8(ResolveValues8<T>(kind, base, first, gather_end, offsets, values, negative, lanes),
               sum);
}

// Resolves `count` changes, eight at a time, with the negative ones marked in `signs`.
template <typename T>
WEFT_TARGET_AVX512 inline void ResolveRun(KeyKind kind, const uint8_t* base, uint64_t first,
                                          uint32_t gather_end, const uint32_t* offsets,
                                          uint32_t* values, uint32_t count, uint64_t signs,
                                          digest_detail::DigestLanes* sum) {
  for (uint32_t i = 0; i < count; i += kApplyStep) {
    const uint32_t left = count - i;
    const __mmask8 lanes =
        left >= kApplyStep ? __mmask8{0xFF} : static_cast<__mmask8>((1u << left) - 1);
    Resolve8<T>(kind, base, first, gather_end, offsets + i, values + i,
                static_cast<__mmask8>(signs >> (i % 64)), lanes, sum);
  }
}
#endif

// Where a chunk's changes are resolved: its first unit in the served tensor, and that unit's
// index in the tensor.
struct ChunkBase {
  KeyKind kind;
  const uint8_t* base;  // the served tensor's bytes from the chunk's first unit
  uint64_t first;       // the chunk's first unit index
  uint32_t gather_end;  // offsets below which a 32-bit word read at a unit stays in the tensor
};

template <typename T>
ChunkBase MakeChunkBase(KeyKind kind, std::span<const uint8_t> served, uint64_t first) {
  // A 32-bit word read at a unit also reads the next 4 / sizeof(T) - 1 units.
  constexpr uint64_t kExtra = 4 / sizeof(T) - 1;
  const uint64_t units = served.size() / sizeof(T) - first;
  const uint64_t gather_end = units > kExtra ? units - kExtra : 0;
  return {kind, served.data() + first * sizeof(T), first,
          static_cast<uint32_t>(std::min<uint64_t>(gather_end, UINT32_MAX))};
}

// Replaces each residual of a decoded chunk by the new value of its element and returns the
// digest change; reads the served tensor only.
template <typename T>
Digest ResolveChangesScalar(const ChunkBase& chunk, ChangeList* changes) {
  const uint32_t n = static_cast<uint32_t>(changes->size());
  const uint32_t* offsets = changes->offsets.data();
  uint32_t* values = changes->residuals.data();
  Digest digest;
  for (uint32_t j = 0; j < std::min(n, kApplyBlock); ++j) {
    __builtin_prefetch(chunk.base + size_t{offsets[j]} * sizeof(T));
  }
  for (uint32_t begin = 0; begin < n; begin += kApplyBlock) {
    // Prefetch the next block while this one is resolved.
    for (uint32_t j = begin + kApplyBlock; j < std::min(n, begin + 2 * kApplyBlock); ++j) {
      __builtin_prefetch(chunk.base + size_t{offsets[j]} * sizeof(T));
    }
    digest += ResolveBlock<T>(chunk.kind, chunk.base, chunk.first, offsets + begin, values + begin,
                              std::min(kApplyBlock, n - begin));
  }
  return digest;
}

#if defined(__x86_64__)
template <typename T>
WEFT_TARGET_AVX512 Digest ResolveChangesAvx512(const ChunkBase& chunk, ChangeList* changes) {
  const uint32_t n = static_cast<uint32_t>(changes->size());
  const uint32_t* offsets = changes->offsets.data();
  uint32_t* values = changes->residuals.data();
  digest_detail::DigestLanes sum = digest_detail::ZeroLanes();
  for (uint32_t j = 0; j < std::min(n, kApplyBlock); ++j) {
    __builtin_prefetch(chunk.base + size_t{offsets[j]} * sizeof(T));
  }
  for (uint32_t begin = 0; begin < n; begin += kApplyBlock) {
    for (uint32_t j = begin + kApplyBlock; j < std::min(n, begin + 2 * kApplyBlock); ++j) {
      __builtin_prefetch(chunk.base + size_t{offsets[j]} * sizeof(T));
    }
    ResolveRun<T>(chunk.kind, chunk.base, chunk.first, chunk.gather_end, offsets + begin,
                  values + begin, std::min(kApplyBlock, n - begin), 0, &sum);
  }
  return digest_detail::ReduceLanes(sum);
}
#endif

template <typename T>
Digest ResolveNewValues(const ChunkBase& chunk, ChangeList* changes) {
#if defined(__x86_64__)
  if (Cpu().avx512) return ResolveChangesAvx512<T>(chunk, changes);
#endif
  return ResolveChangesScalar<T>(chunk, changes);
}

// The sink of detail::DecodeSparse that resolves changes as they are decoded. With kAvx512, the
// block before the one being decoded is resolved eight changes per Step, so that its vector work
// overlaps the serial decoding; otherwise each block is resolved once the next one has been
// decoded. Either way the elements a block reads were prefetched a block earlier.
template <typename T, bool kAvx512>
class ResolvingSink {
 public:
  ResolvingSink(const ChunkBase& chunk, ChangeList* changes) : chunk_(chunk), changes_(changes) {}

  void Begin(uint32_t n) {
    changes_->offsets.resize(n);
    changes_->residuals.resize(n);
    offsets_ = changes_->offsets.data();
    values_ = changes_->residuals.data();
  }
  uint32_t* offsets() { return offsets_; }
  uint32_t* magnitudes() { return values_; }
  void Put(uint32_t, uint32_t offset) {
    __builtin_prefetch(chunk_.base + size_t{offset} * sizeof(T));
  }
  void Step(uint32_t s) {
#if defined(__x86_64__)
    if constexpr (kAvx512) {
      if (pending_count_ == 0) return;
      // Each step starts a group and finishes the one before: two short chains of dependent
      // multiplications in flight rather than one long one.
      const uint32_t at = pending_first_ + s * kApplyStep;
      const Resolved8 next = ResolveValues8<T>(
          chunk_.kind, chunk_.base, chunk_.first, chunk_.gather_end, offsets_ + at, values_ + at,
          static_cast<__mmask8>(pending_signs_ >> (s * kApplyStep)), 0xFF);
      if (staged_) AddResolved8(staged_group_, &sum_);
      staged_group_ = next;
      staged_ = true;
      // Steps come only while a full block is decoded, and the block before it is full too.
      if (s + 1 == kApplyBlock / kApplyStep) pending_count_ = 0;
    }
#endif
  }
  void EndBlock(uint32_t first, uint32_t count, uint64_t signs) {
    ResolvePending();
    pending_first_ = first;
    pending_count_ = count;
    pending_signs_ = signs;
  }
  // The digest change, once every block has been put.
  Digest Finish() {
    ResolvePending();
#if defined(__x86_64__)
    if constexpr (kAvx512) {
      if (staged_) AddResolved8(staged_group_, &sum_);
      return digest_ + digest_detail::ReduceLanes(sum_);
    }
#endif
    return digest_;
  }

 private:
  void ResolvePending() {
    if (pending_count_ == 0) return;
#if defined(__x86_64__)
    if constexpr (kAvx512) {
      ResolveRun<T>(chunk_.kind, chunk_.base, chunk_.first, chunk_.gather_end,
                    offsets_ + pending_first_, values_ + pending_first_, pending_count_,
                    pending_signs_, &sum_);
      pending_count_ = 0;
      return;
    }
#endif
    detail::ApplySigns<T>(values_ + pending_first_, pending_count_, pending_signs_);
    digest_ += ResolveBlock<T>(chunk_.kind, chunk_.base, chunk_.first, offsets_ + pending_first_,
                               values_ + pending_first_, pending_count_);
    pending_count_ = 0;
  }

  ChunkBase chunk_;
  ChangeList* changes_;
  uint32_t* offsets_ = nullptr;
  uint32_t* values_ = nullptr;
  // The block decoded last, not yet resolved (or, with kAvx512, being resolved by Step).
  uint32_t pending_first_ = 0;
  uint32_t pending_count_ = 0;
  uint64_t pending_signs_ = 0;
  Digest digest_;
#if defined(__x86_64__)
  digest_detail::DigestLanes sum_{};
  Resolved8 staged_group_{};  // the last Step's group: values resolved, digest change not added
  bool staged_ = false;
#endif
};

// Decodes a sparse chunk of `units` units and resolves it in one pass (ResolvingSink).
template <typename T, bool kAvx512>
Status DecodeAndResolveWith(const SparseHeader& header, std::span<const uint8_t> payload,
                            uint32_t units, ValueCoding coding, const ChunkBase& chunk,
                            ChangeList* changes, Digest* digest_change) {
  ResolvingSink<T, kAvx512> sink(chunk, changes);
  WEFT_RETURN_IF_ERROR(detail::DecodeSparse<T>(header, payload, units, coding, sink));
  *digest_change = sink.Finish();
  return Status::Ok();
}

#if defined(__x86_64__)
// Flattened: everything they call is inlined into them and compiled for their instruction set
// (AVX-512 for the resolving, BMI2 for the bit reader's shifts).
template <typename T>
[[gnu::flatten]] WEFT_TARGET_AVX512 Status DecodeAndResolveAvx512(
    const SparseHeader& header, std::span<const uint8_t> payload, uint32_t units,
    ValueCoding coding, const ChunkBase& chunk, ChangeList* changes, Digest* digest_change) {
  return DecodeAndResolveWith<T, true>(header, payload, units, coding, chunk, changes,
                                       digest_change);
}

template <typename T>
[[gnu::flatten]] WEFT_TARGET_AVX2 Status DecodeAndResolveAvx2(
    const SparseHeader& header, std::span<const uint8_t> payload, uint32_t units,
    ValueCoding coding, const ChunkBase& chunk, ChangeList* changes, Digest* digest_change) {
  return DecodeAndResolveWith<T, false>(header, payload, units, coding, chunk, changes,
                                        digest_change);
}
#endif

template <typename T>
Status DecodeAndResolve(const SparseHeader& header, std::span<const uint8_t> payload,
                        uint32_t units, ValueCoding coding, const ChunkBase& chunk,
                        ChangeList* changes, Digest* digest_change) {
#if defined(__x86_64__)
  if (Cpu().avx512) {
    return DecodeAndResolveAvx512<T>(header, payload, units, coding, chunk, changes, digest_change);
  }
  if (Cpu().avx2) {
    return DecodeAndResolveAvx2<T>(header, payload, units, coding, chunk, changes, digest_change);
  }
#endif
  return DecodeAndResolveWith<T, false>(header, payload, units, coding, chunk, changes,
                                        digest_change);
}

// Stores the prepared new values. The lines are prefetched into L2 well ahead rather than into L1
// for writing: an L1 prefetch holds a fill buffer for the whole trip from L3, and there are few.
template <typename T>
void WriteNewValues(const ChangeList& changes, uint8_t* served, uint64_t first) {
  constexpr size_t kAhead = 64;  // changes between a prefetch and its store
  uint8_t* base = served + first * sizeof(T);
  const size_t n = changes.size();
  const uint32_t* offsets = changes.offsets.data();
  const uint32_t* values = changes.residuals.data();
  for (size_t j = 0; j < n; ++j) {
    __builtin_prefetch(base + size_t{offsets[std::min(j + kAhead, n - 1)]} * sizeof(T), 0, 2);
    Store<T>(base, offsets[j], static_cast<T>(values[j]));
  }
}

// Decodes and checks chunk c of `delta` against `served` (the whole tensor): leaves in `changes`
// what CommitChunk writes and in `digest_change` the chunk's digest change. Reads only.
Status PrepareChunk(const TensorDelta& delta, size_t c, std::span<const uint8_t> served,
                    ChangeList* changes, Digest* digest_change) {
  const TensorSpec& spec = delta.spec;
  const DeltaChunk& chunk = delta.chunks[c];
  const uint64_t first = uint64_t{c} << delta.chunk_log2;
  const uint32_t units = delta.UnitsInChunk(c);
  const uint8_t width = CodedWidth(spec.dtype);
  const KeyKind kind = KeyKindFor(spec.dtype);
  *digest_change = Digest{};
  Status status;
  switch (chunk.mode) {
    case ChunkMode::kUnchanged:
      changes->clear();
      break;
    case ChunkMode::kSparse:
      status = WithUnitType(width, [&]<typename T>() {
        return DecodeAndResolve<T>(chunk.sparse, chunk.payload, units, CodingFor(spec.dtype),
                                   MakeChunkBase<T>(kind, served, first), changes, digest_change);
      });
      break;
    case ChunkMode::kContext:
      status = DecodeContextChanges(chunk.context, chunk.payload, spec.dtype,
                                    served.data() + first * width, units, changes);
      if (status.ok()) {
        *digest_change = WithUnitType(width, [&]<typename T>() {
          return ResolveNewValues<T>(MakeChunkBase<T>(kind, served, first), changes);
        });
      }
      break;
    case ChunkMode::kRaw:
      if (chunk.payload.size() != size_t{units} * width) {
        return DataLoss(ChunkContext(spec, c) + ": raw chunk has the wrong length");
      }
      // The list holds offsets of differing units; values are written from the payload.
      changes->clear();
      ScanChanges(kind, width, served.data() + first * width, chunk.payload.data(), units, 0, first,
                  changes, digest_change);
      break;
  }
  if (!status.ok()) return status.WithContext(ChunkContext(spec, c));
  return Status::Ok();
}

void CommitChunk(const TensorDelta& delta, size_t c, const ChangeList& changes, uint8_t* served) {
  const DeltaChunk& chunk = delta.chunks[c];
  const uint8_t width = CodedWidth(delta.spec.dtype);
  const uint64_t first = uint64_t{c} << delta.chunk_log2;
  if (chunk.mode == ChunkMode::kSparse || chunk.mode == ChunkMode::kContext) {
    WithUnitType(width, [&]<typename T>() { WriteNewValues<T>(changes, served, first); });
  } else if (chunk.mode == ChunkMode::kRaw) {
    for (uint32_t offset : changes.offsets) {
      std::memcpy(served + (first + offset) * width, chunk.payload.data() + size_t{offset} * width,
                  width);
    }
  }
}

// About how long a chunk takes to prepare, in arbitrary units: the longest go first, so that the
// threads finish together.
uint64_t PrepareCost(const TensorDelta& delta, size_t c) {
  const DeltaChunk& chunk = delta.chunks[c];
  const uint64_t units = delta.UnitsInChunk(c);
  switch (chunk.mode) {
    case ChunkMode::kSparse:
      return 32 * uint64_t{chunk.sparse.change_count};
    case ChunkMode::kContext:
      return 32 * chunk.context.change_count() + 2 * units;
    case ChunkMode::kRaw:
      return units;
    case ChunkMode::kUnchanged:
      break;
  }
  return 0;
}

// One chunk of one tensor of a parallel loop over several tensors.
struct ChunkTask {
  uint32_t tensor;
  uint32_t chunk;
  uint64_t cost;
};

void SortByCost(std::vector<ChunkTask>* tasks) {
  std::stable_sort(tasks->begin(), tasks->end(),
                   [](const ChunkTask& a, const ChunkTask& b) { return a.cost > b.cost; });
}

// Prepares deltas[t] on served[t] into *prepared[t] for every t, the chunks of all tensors in one
// parallel loop. Returns the first error in tensor order, then chunk order.
Status PrepareTensors(std::span<const TensorDelta* const> deltas,
                      std::span<const ServedBytes> served,
                      std::span<PreparedTensorDelta* const> prepared, int threads) {
  const size_t tensors = deltas.size();
  std::vector<Status> tensor_status(tensors);
  std::vector<Digest> current(tensors);
  std::vector<size_t> chunk_start(tensors + 1, 0);
  for (size_t t = 0; t < tensors; ++t) {
    const TensorDelta& delta = *deltas[t];
    const TensorSpec& spec = delta.spec;
    PreparedTensorDelta& out = *prepared[t];
    out.delta = &delta;
    out.result_digest = Digest{};
    chunk_start[t + 1] = chunk_start[t];
    if (served[t].bytes.size() != spec.byte_count()) {
      tensor_status[t] =
          InvalidArgument("tensor '" + spec.name + "': served tensor has " +
                          std::to_string(served[t].bytes.size()) + " bytes, the delta is for " +
                          std::to_string(spec.byte_count()));
      continue;
    }
    if (delta.chunks.size() != ChunkCount(spec.unit_count(), delta.chunk_log2)) {
      tensor_status[t] = DataLoss("tensor '" + spec.name + "': wrong number of chunks");
      continue;
    }
    current[t] =
        served[t].digest ? *served[t].digest : TensorDigest(spec.dtype, served[t].bytes, threads);
    if (current[t] != delta.base_digest) {
      tensor_status[t] = Conflict(
          "tensor '" + spec.name + "': the delta applies to a tensor with digest " +
          delta.base_digest.ToHex() + ", but the served tensor has digest " + current[t].ToHex());
      continue;
    }
    out.changes.resize(delta.chunks.size());
    chunk_start[t + 1] += delta.chunks.size();
  }

  std::vector<ChunkTask> tasks;
  tasks.reserve(chunk_start[tensors]);
  for (size_t t = 0; t < tensors; ++t) {
    for (size_t c = 0; c < chunk_start[t + 1] - chunk_start[t]; ++c) {
      if (deltas[t]->chunks[c].mode == ChunkMode::kUnchanged) {
        prepared[t]->changes[c].clear();
        continue;
      }
      tasks.push_back(
          {static_cast<uint32_t>(t), static_cast<uint32_t>(c), PrepareCost(*deltas[t], c)});
    }
  }
  SortByCost(&tasks);
  std::vector<Status> chunk_status(chunk_start[tensors]);
  std::vector<Digest> chunk_digest(chunk_start[tensors]);
  ParallelFor(tasks.size(), threads, [&](size_t i) {
    const ChunkTask& task = tasks[i];
    const size_t slot = chunk_start[task.tensor] + task.chunk;
    chunk_status[slot] =
        PrepareChunk(*deltas[task.tensor], task.chunk, served[task.tensor].bytes,
                     &prepared[task.tensor]->changes[task.chunk], &chunk_digest[slot]);
  });

  for (size_t t = 0; t < tensors; ++t) {
    WEFT_RETURN_IF_ERROR(tensor_status[t]);
    const TensorDelta& delta = *deltas[t];
    Digest result = current[t];
    for (size_t slot = chunk_start[t]; slot < chunk_start[t + 1]; ++slot) {
      WEFT_RETURN_IF_ERROR(chunk_status[slot]);
      result += chunk_digest[slot];
    }
    if (result != delta.result_digest) {
      return DataLoss("tensor '" + delta.spec.name + "': applying the delta would give digest " +
                      result.ToHex() + ", not the published " + delta.result_digest.ToHex() +
                      "; nothing was written");
    }
    prepared[t]->result_digest = result;
  }
  return Status::Ok();
}

// Writes prepared[t] into served[t] for every t, the chunks of all tensors in one parallel loop.
void CommitTensors(std::span<const PreparedTensorDelta* const> prepared,
                   std::span<const std::span<uint8_t>> served, int threads) {
  std::vector<ChunkTask> tasks;
  for (size_t t = 0; t < prepared.size(); ++t) {
    const TensorDelta& delta = *prepared[t]->delta;
    for (size_t c = 0; c < delta.chunks.size(); ++c) {
      if (delta.chunks[c].mode == ChunkMode::kUnchanged) continue;
      tasks.push_back(
          {static_cast<uint32_t>(t), static_cast<uint32_t>(c), prepared[t]->changes[c].size()});
    }
  }
  SortByCost(&tasks);
  ParallelFor(tasks.size(), threads, [&](size_t i) {
    const ChunkTask& task = tasks[i];
    CommitChunk(*prepared[task.tensor]->delta, task.chunk,
                prepared[task.tensor]->changes[task.chunk], served[task.tensor].data());
  });
}

}  // namespace

Status CheckChunkLog2(int chunk_log2) {
  if (chunk_log2 < kMinChunkLog2 || chunk_log2 > kMaxChunkLog2) {
    return InvalidArgument("chunk size 2^" + std::to_string(chunk_log2) + " outside 2^" +
                           std::to_string(kMinChunkLog2) + "..2^" + std::to_string(kMaxChunkLog2));
  }
  return Status::Ok();
}

namespace detail {

DeltaChunk MakeChunk(const ChangeList& changes, std::span<const uint8_t> new_bytes, uint8_t width,
                     ValueCoding coding, const ContextSource* context) {
  DeltaChunk chunk;
  if (changes.empty()) return chunk;
  std::vector<uint8_t> payload;
  SparseHeader header;
  EncodeChanges(changes, width, coding, &header, &payload);
  chunk.mode = ChunkMode::kSparse;
  chunk.sparse = header;
  if (context != nullptr && SupportsContextMode(context->dtype)) {
    DeltaChunk coded;
    coded.mode = ChunkMode::kContext;
    std::vector<uint8_t> coded_payload;
    if (context->base != nullptr) {
      EncodeContextChanges(changes, context->dtype, context->base, context->count, &coded.context,
                           &coded_payload);
    } else {
      EncodeContextChangesFromResult(changes, context->dtype, context->result, context->count,
                                     &coded.context, &coded_payload);
    }
    if (coded_payload.size() + ChunkHeaderBytes(coded).size() <
        payload.size() + ChunkHeaderBytes(chunk).size()) {
      chunk = std::move(coded);
      payload = std::move(coded_payload);
    }
  }
  if (!new_bytes.empty() && payload.size() + ChunkHeaderBytes(chunk).size() >= new_bytes.size()) {
    DeltaChunk raw;
    raw.mode = ChunkMode::kRaw;
    raw.Own(std::vector<uint8_t>(new_bytes.begin(), new_bytes.end()));
    return raw;
  }
  chunk.Own(std::move(payload));
  return chunk;
}

DeltaChunk CopyChunk(const DeltaChunk& source) {
  DeltaChunk chunk;
  chunk.mode = source.mode;
  chunk.sparse = source.sparse;
  chunk.context = source.context;
  chunk.Own(std::vector<uint8_t>(source.payload.begin(), source.payload.end()));
  return chunk;
}

TensorDelta NewDelta(const TensorSpec& spec, int chunk_log2) {
  TensorDelta delta;
  delta.spec = spec;
  delta.chunk_log2 = chunk_log2;
  delta.chunks.resize(ChunkCount(spec.unit_count(), chunk_log2));
  return delta;
}

}  // namespace detail

uint32_t TensorDelta::UnitsInChunk(size_t c) const {
  uint64_t begin = uint64_t{c} << chunk_log2;
  return static_cast<uint32_t>(std::min(chunk_units(), spec.unit_count() - begin));
}

const TensorDelta* ModelDelta::Find(const std::string& name) const {
  for (const TensorDelta& tensor : tensors) {
    if (tensor.spec.name == name) return &tensor;
  }
  return nullptr;
}

ModelDelta ModelDelta::Copy() const {
  ModelDelta copy;
  copy.tensors.reserve(tensors.size());
  for (const TensorDelta& t : tensors) {
    TensorDelta& c = copy.tensors.emplace_back();
    c.spec = t.spec;
    c.chunk_log2 = t.chunk_log2;
    c.base_digest = t.base_digest;
    c.result_digest = t.result_digest;
    c.chunks.reserve(t.chunks.size());
    for (const DeltaChunk& chunk : t.chunks) c.chunks.push_back(detail::CopyChunk(chunk));
  }
  return copy;
}

Result<ModelDelta> EncodeModelDelta(const std::vector<TensorBytes>& old_tensors,
                                    const std::vector<TensorBytes>& new_tensors,
                                    const CodecOptions& options) {
  if (old_tensors.size() != new_tensors.size()) {
    return InvalidArgument("the old model has " + std::to_string(old_tensors.size()) +
                           " tensors, the new one " + std::to_string(new_tensors.size()));
  }
  std::map<std::string_view, const TensorBytes*> by_name;
  for (const TensorBytes& t : new_tensors) by_name[t.spec.name] = &t;
  ModelDelta delta;
  delta.tensors.reserve(old_tensors.size());
  for (const TensorBytes& old_tensor : old_tensors) {
    auto found = by_name.find(old_tensor.spec.name);
    if (found == by_name.end()) {
      return InvalidArgument("tensor '" + old_tensor.spec.name + "' is not in the new model");
    }
    const TensorBytes& new_tensor = *found->second;
    if (new_tensor.spec.dtype != old_tensor.spec.dtype ||
        new_tensor.spec.shape != old_tensor.spec.shape) {
      return InvalidArgument("tensor '" + old_tensor.spec.name +
                             "' has a different dtype or shape in the new model");
    }
    WEFT_ASSIGN_OR_RETURN(TensorDelta tensor_delta,
                          EncodeTensorDelta(old_tensor.spec, old_tensor.bytes, new_tensor.bytes,
                                            options, old_tensor.digest));
    delta.tensors.push_back(std::move(tensor_delta));
  }
  return delta;
}

Result<TensorDelta> EncodeTensorDelta(const TensorSpec& spec, std::span<const uint8_t> old_bytes,
                                      std::span<const uint8_t> new_bytes,
                                      const CodecOptions& options,
                                      std::optional<Digest> base_digest) {
  WEFT_RETURN_IF_ERROR(CheckChunkLog2(options.chunk_log2));
  if (old_bytes.size() != spec.byte_count() || new_bytes.size() != spec.byte_count()) {
    return InvalidArgument("tensor '" + spec.name + "': expected " +
                           std::to_string(spec.byte_count()) + " bytes, got " +
                           std::to_string(old_bytes.size()) + " (old) and " +
                           std::to_string(new_bytes.size()) + " (new)");
  }
  TensorDelta delta = NewDelta(spec, options.chunk_log2);
  const uint8_t width = CodedWidth(spec.dtype);
  const KeyKind kind = KeyKindFor(spec.dtype);
  const ValueCoding coding = CodingFor(spec.dtype);
  delta.base_digest =
      base_digest ? *base_digest : TensorDigest(spec.dtype, old_bytes, options.threads);
  std::vector<Digest> changes(delta.chunks.size());
  ParallelFor(delta.chunks.size(), options.threads, [&](size_t c) {
    uint64_t first = uint64_t{c} << delta.chunk_log2;
    uint32_t count = delta.UnitsInChunk(c);
    ChangeList list;
    ScanChanges(kind, width, old_bytes.data() + first * width, new_bytes.data() + first * width,
                count, 0, first, &list, &changes[c]);
    const detail::ContextSource context{spec.dtype, count, old_bytes.data() + first * width,
                                        nullptr};
    delta.chunks[c] =
        MakeChunk(list, new_bytes.subspan(first * width, size_t{count} * width), width, coding,
                  options.mode == DeltaMode::kContext ? &context : nullptr);
  });
  delta.result_digest = delta.base_digest;
  for (const Digest& d : changes) delta.result_digest += d;
  return delta;
}

Result<TensorDelta> EncodeFromMaster(const TensorSpec& spec, const MasterValues& master,
                                     const ServeFormat& format, std::span<uint8_t> served,
                                     Digest* served_digest, const CodecOptions& options,
                                     uint64_t* changed) {
  WEFT_RETURN_IF_ERROR(CheckChunkLog2(options.chunk_log2));
  if (spec.dtype != format.dtype) {
    return InvalidArgument("tensor '" + spec.name + "': spec dtype differs from the serve format");
  }
  const bool is_fp8 = Info(format.dtype).size == 1;
  if (!IsServingFormat(format.dtype)) {
    return InvalidArgument("tensor '" + spec.name +
                           "': the fused path serves BF16, F16 or FP8, not " +
                           std::string(Info(format.dtype).safetensors_name));
  }
  if (master.size() != spec.element_count() || served.size() != spec.byte_count()) {
    return InvalidArgument("tensor '" + spec.name +
                           "': master or served size does not match shape");
  }
  if (is_fp8 && format.scaling != nullptr &&
      (format.scales.size() != format.scaling->scale_count() ||
       format.scaling->rows * format.scaling->cols != master.size())) {
    return InvalidArgument("tensor '" + spec.name + "': FP8 scales do not match the tensor");
  }
  TensorDelta delta = NewDelta(spec, options.chunk_log2);
  const uint8_t width = Info(spec.dtype).size;

  std::vector<Digest> changes(delta.chunks.size());
  std::vector<uint64_t> counts(delta.chunks.size());
  ParallelFor(delta.chunks.size(), options.threads, [&](size_t c) {
    const uint64_t first = uint64_t{c} << delta.chunk_log2;
    const uint64_t end = first + delta.UnitsInChunk(c);
    ChangeList list;
    if (spec.dtype == DType::kBF16 && master.is_f32() && HasFusedBf16Kernel()) {
      ScanFromMasterBf16(master.f32().data() + first, served.data() + first * width,
                         static_cast<uint32_t>(end - first), 0, first, &list, &changes[c]);
    } else {
      // Convert a block at a time into L1, then diff it against the served tensor.
      alignas(64) std::array<uint8_t, kFusedBlock * 2> converted;
      for (uint64_t block = first; block < end; block += kFusedBlock) {
        const uint64_t n = std::min(kFusedBlock, end - block);
        ConvertToServing(format, master.subspan(block, n), block,
                         std::span<uint8_t>(converted.data(), n * width));
        size_t before = list.size();
        uint8_t* target = served.data() + block * width;
        ScanChanges(KeyKind::kFloat, width, target, converted.data(), static_cast<uint32_t>(n),
                    static_cast<uint32_t>(block - first), block, &list, &changes[c]);
        for (size_t j = before; j < list.size(); ++j) {
          uint64_t offset = list.offsets[j] - (block - first);
          std::memcpy(target + offset * width, converted.data() + offset * width, width);
        }
      }
    }
    counts[c] = list.size();
    // `served` holds the result now; the context coder undoes the changes to find the base.
    const detail::ContextSource context{spec.dtype, static_cast<uint32_t>(end - first), nullptr,
                                        served.data() + first * width};
    delta.chunks[c] = MakeChunk(list, served.subspan(first * width, (end - first) * width), width,
                                ValueCoding::kOrderedDiff,
                                options.mode == DeltaMode::kContext ? &context : nullptr);
  });
  if (changed != nullptr) {
    *changed = 0;
    for (uint64_t n : counts) *changed += n;
  }
  delta.base_digest = *served_digest;
  for (const Digest& d : changes) *served_digest += d;
  delta.result_digest = *served_digest;
  return delta;
}

Result<PreparedTensorDelta> PrepareTensorDelta(const TensorDelta& delta,
                                               std::span<const uint8_t> served,
                                               std::optional<Digest> served_digest, int threads) {
  PreparedTensorDelta prepared;
  const TensorDelta* deltas[] = {&delta};
  const ServedBytes bytes[] = {{served, served_digest}};
  PreparedTensorDelta* out[] = {&prepared};
  WEFT_RETURN_IF_ERROR(PrepareTensors(deltas, bytes, out, threads));
  return prepared;
}

void CommitTensorDelta(const PreparedTensorDelta& prepared, std::span<uint8_t> served,
                       int threads) {
  const PreparedTensorDelta* tensors[] = {&prepared};
  const std::span<uint8_t> bytes[] = {served};
  CommitTensors(tensors, bytes, threads);
}

Status ApplyTensorDelta(const TensorDelta& delta, std::span<uint8_t> served,
                        std::optional<Digest> served_digest, int threads,
                        Digest* served_digest_out) {
  WEFT_ASSIGN_OR_RETURN(PreparedTensorDelta prepared,
                        PrepareTensorDelta(delta, served, served_digest, threads));
  CommitTensorDelta(prepared, served, threads);
  if (served_digest_out != nullptr) *served_digest_out = prepared.result_digest;
  return Status::Ok();
}

Status PrepareModelDelta(const ModelDelta& delta, std::span<const ServedBytes> served, int threads,
                         PreparedModelDelta* prepared) {
  if (served.size() != delta.tensors.size()) {
    return InvalidArgument("a delta of " + std::to_string(delta.tensors.size()) +
                           " tensors prepared on " + std::to_string(served.size()));
  }
  prepared->tensors.resize(delta.tensors.size());
  std::vector<const TensorDelta*> deltas(delta.tensors.size());
  std::vector<PreparedTensorDelta*> out(delta.tensors.size());
  for (size_t t = 0; t < delta.tensors.size(); ++t) {
    deltas[t] = &delta.tensors[t];
    out[t] = &prepared->tensors[t];
  }
  return PrepareTensors(deltas, served, out, threads);
}

void CommitModelDelta(const PreparedModelDelta& prepared,
                      std::span<const std::span<uint8_t>> served, int threads) {
  std::vector<const PreparedTensorDelta*> tensors(prepared.tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) tensors[t] = &prepared.tensors[t];
  CommitTensors(tensors, served, threads);
}

}  // namespace weft::sync
