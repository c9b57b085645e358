// Squashing deltas without the weights (delta_codec.h; docs/formats.md, "Squashing").
#include <cstring>
#include <string>

#include "common/parallel.h"
#include "sync/delta_codec.h"
#include "sync/delta_internal.h"

namespace weft::sync {

using detail::ChunkContext;
using detail::ChunkCount;
using detail::CopyChunk;
using detail::FirstError;
using detail::Load;
using detail::MakeChunk;
using detail::NewDelta;
using detail::Store;
using detail::WithUnitType;

namespace {

// Applies each residual to the element it changes in `bytes` (the new bytes of a raw chunk).
template <typename T>
void ApplyResidualsToBytes(KeyKind kind, const ChangeList& changes, uint8_t* bytes) {
  for (size_t j = 0; j < changes.size(); ++j) {
    T value = Load<T>(bytes, changes.offsets[j]);
    Store<T>(bytes, changes.offsets[j],
             ApplyResidual<T>(kind, value, static_cast<T>(changes.residuals[j])));
  }
}

template <typename T>
uint32_t Compose(KeyKind kind, uint32_t first, uint32_t second) {
  if (kind == KeyKind::kXor) return static_cast<T>(first ^ second);
  return static_cast<T>(first + second);
}

// Dispatches fn.template operator()<T>() on the unit type of `width`.
}  // namespace

Result<TensorDelta> SquashTensorDeltas(const TensorDelta& first, const TensorDelta& second,
                                       int threads) {
  const TensorSpec& spec = first.spec;
  if (spec.name != second.spec.name || spec.dtype != second.spec.dtype ||
      spec.shape != second.spec.shape || first.chunk_log2 != second.chunk_log2) {
    return InvalidArgument("tensor '" + spec.name +
                           "': the deltas differ in name, dtype, shape or chunk size");
  }
  if (HasContextChunks(first) || HasContextChunks(second)) {
    return InvalidArgument("tensor '" + spec.name +
                           "': context-coded deltas can only be squashed with the base weights");
  }
  if (second.base_digest != first.result_digest) {
    return Conflict("tensor '" + spec.name + "': the second delta starts from digest " +
                    second.base_digest.ToHex() + ", but the first ends at " +
                    first.result_digest.ToHex());
  }
  if (first.chunks.size() != second.chunks.size() ||
      first.chunks.size() != ChunkCount(spec.unit_count(), first.chunk_log2)) {
    return DataLoss("tensor '" + spec.name + "': wrong number of chunks");
  }
  TensorDelta result = NewDelta(spec, first.chunk_log2);
  result.base_digest = first.base_digest;
  result.result_digest = second.result_digest;
  const uint8_t width = CodedWidth(spec.dtype);
  const KeyKind kind = KeyKindFor(spec.dtype);
  const ValueCoding coding = CodingFor(spec.dtype);
  std::vector<Status> statuses(result.chunks.size());
  ParallelFor(result.chunks.size(), threads, [&](size_t c) {
    const DeltaChunk& a = first.chunks[c];
    const DeltaChunk& b = second.chunks[c];
    const uint32_t units = first.UnitsInChunk(c);
    if (b.mode == ChunkMode::kRaw || a.mode == ChunkMode::kUnchanged) {
      result.chunks[c] = CopyChunk(b);
      return;
    }
    if (b.mode == ChunkMode::kUnchanged) {
      result.chunks[c] = CopyChunk(a);
      return;
    }
    ChangeList second_changes;
    Status status = DecodeChanges(b.sparse, b.payload, units, width, coding, &second_changes);
    if (!status.ok()) {
      statuses[c] = status.WithContext("second delta, " + ChunkContext(spec, c));
      return;
    }
    if (a.mode == ChunkMode::kRaw) {  // the new bytes are known: apply b to them
      if (a.payload.size() != size_t{units} * width) {
        statuses[c] =
            DataLoss("first delta, " + ChunkContext(spec, c) + ": raw chunk has the wrong length");
        return;
      }
      std::vector<uint8_t> bytes(a.payload.begin(), a.payload.end());
      WithUnitType(width, [&]<typename T>() {
        ApplyResidualsToBytes<T>(kind, second_changes, bytes.data());
      });
      result.chunks[c].mode = ChunkMode::kRaw;
      result.chunks[c].Own(std::move(bytes));
      return;
    }
    ChangeList first_changes;
    status = DecodeChanges(a.sparse, a.payload, units, width, coding, &first_changes);
    if (!status.ok()) {
      statuses[c] = status.WithContext("first delta, " + ChunkContext(spec, c));
      return;
    }
    ChangeList merged;
    merged.offsets.reserve(first_changes.size() + second_changes.size());
    merged.residuals.reserve(first_changes.size() + second_changes.size());
    size_t i = 0, j = 0;
    while (i < first_changes.size() || j < second_changes.size()) {
      uint32_t offset;
      uint32_t residual;
      if (j == second_changes.size() ||
          (i < first_changes.size() && first_changes.offsets[i] < second_changes.offsets[j])) {
        offset = first_changes.offsets[i];
        residual = first_changes.residuals[i++];
      } else if (i == first_changes.size() ||
                 second_changes.offsets[j] < first_changes.offsets[i]) {
        offset = second_changes.offsets[j];
        residual = second_changes.residuals[j++];
      } else {
        offset = first_changes.offsets[i];
        residual = WithUnitType(width, [&]<typename T>() {
          return Compose<T>(kind, first_changes.residuals[i], second_changes.residuals[j]);
        });
        ++i;
        ++j;
        if (residual == 0) continue;  // the two changes cancel
      }
      merged.offsets.push_back(offset);
      merged.residuals.push_back(residual);
    }
    result.chunks[c] = MakeChunk(merged, {}, width, coding);
  });
  WEFT_RETURN_IF_ERROR(FirstError(statuses));
  return result;
}

Result<ModelDelta> SquashModelDeltas(const ModelDelta& first, const ModelDelta& second,
                                     int threads) {
  if (first.tensors.size() != second.tensors.size()) {
    return InvalidArgument("the deltas cover different tensors (" +
                           std::to_string(first.tensors.size()) + " and " +
                           std::to_string(second.tensors.size()) + ")");
  }
  ModelDelta result;
  for (const TensorDelta& a : first.tensors) {
    const TensorDelta* b = second.Find(a.spec.name);
    if (b == nullptr) {
      return InvalidArgument("tensor '" + a.spec.name + "' is missing from the second delta");
    }
    WEFT_ASSIGN_OR_RETURN(TensorDelta squashed, SquashTensorDeltas(a, *b, threads));
    result.tensors.push_back(std::move(squashed));
  }
  return result;
}

Result<ModelDelta> SquashChain(std::span<const ModelDelta* const> chain, int threads,
                               size_t* failed) {
  if (chain.empty()) return InvalidArgument("an empty chain of deltas has nothing to squash");
  if (chain.size() == 1) return chain[0]->Copy();
  ModelDelta squashed;
  for (size_t i = 1; i < chain.size(); ++i) {
    Result<ModelDelta> next = SquashModelDeltas(i == 1 ? *chain[0] : squashed, *chain[i], threads);
    if (!next.ok()) {
      if (failed != nullptr) *failed = i;
      return next.status();
    }
    squashed = std::move(next).value();
  }
  return squashed;
}

}  // namespace weft::sync
