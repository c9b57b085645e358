// Deltas and their context chunks (delta_codec.h): recoding between modes, and squashing chains
// on their base.
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "common/parallel.h"
#include "sync/delta_codec.h"
#include "sync/delta_internal.h"

namespace weft::sync {

using detail::ChunkContext;
using detail::ChunkCount;
using detail::FirstError;
using detail::MakeChunk;
using detail::WithUnitType;

namespace {

using TensorIndex = std::map<std::string_view, const TensorBytes*>;

TensorIndex IndexByName(const std::vector<TensorBytes>& tensors) {
  TensorIndex index;
  for (const TensorBytes& t : tensors) index[t.spec.name] = &t;
  return index;
}

// The bytes of `spec` in `tensors`, checked to be the state with digest `expected`; null when
// `tensors` does not hold it at all.
Result<const TensorBytes*> TensorAt(const TensorIndex& tensors, const TensorSpec& spec,
                                    const Digest& expected, std::string_view role, int threads) {
  auto found = tensors.find(spec.name);
  if (found == tensors.end()) return static_cast<const TensorBytes*>(nullptr);
  const TensorBytes& t = *found->second;
  if (t.spec.dtype != spec.dtype || t.spec.shape != spec.shape ||
      t.bytes.size() != spec.byte_count()) {
    return InvalidArgument("tensor '" + spec.name + "': the " + std::string(role) +
                           " has a different dtype or shape than the delta");
  }
  const Digest digest = t.digest ? *t.digest : TensorDigest(spec.dtype, t.bytes, threads);
  if (digest != expected) {
    return Conflict("tensor '" + spec.name + "': the " + std::string(role) + " has digest " +
                    digest.ToHex() + ", the delta's is " + expected.ToHex());
  }
  return &t;
}

// One chunk of one tensor, for loops over every chunk of a model.
struct ChunkRef {
  size_t tensor;
  size_t chunk;
};

std::vector<ChunkRef> AllChunks(const ModelDelta& delta) {
  std::vector<ChunkRef> chunks;
  for (size_t t = 0; t < delta.tensors.size(); ++t) {
    for (size_t c = 0; c < delta.tensors[t].chunks.size(); ++c) chunks.push_back({t, c});
  }
  return chunks;
}

// Decodes a sparse or context chunk; a context chunk reads its base from `base`.
Status DecodeChunk(const TensorDelta& tensor, size_t c, const uint8_t* base, ChangeList* list) {
  const DeltaChunk& chunk = tensor.chunks[c];
  const uint8_t width = CodedWidth(tensor.spec.dtype);
  const uint32_t units = tensor.UnitsInChunk(c);
  Status status = chunk.mode == ChunkMode::kSparse
                      ? DecodeChanges(chunk.sparse, chunk.payload, units, width,
                                      CodingFor(tensor.spec.dtype), list)
                      : DecodeContextChanges(chunk.context, chunk.payload, tensor.spec.dtype, base,
                                             units, list);
  return status.WithContext(ChunkContext(tensor.spec, c));
}

// Applies a decoded chunk to `values` (the chunk's units, starting at tensor unit `first`) and
// returns the digest change.
template <typename T>
Digest ApplyChanges(KeyKind kind, const ChangeList& list, uint64_t first, uint8_t* values) {
  const size_t n = list.size();
  U32Vector old_values(n), new_values(n);
  for (size_t j = 0; j < n; ++j) {
    const T old_value = detail::Load<T>(values, list.offsets[j]);
    const T new_value = ApplyResidual<T>(kind, old_value, static_cast<T>(list.residuals[j]));
    old_values[j] = old_value;
    new_values[j] = new_value;
    detail::Store<T>(values, list.offsets[j], new_value);
  }
  return SumElementChanges(first, list.offsets.data(), old_values.data(), new_values.data(), n);
}

}  // namespace

Result<ModelDelta> RecodeModelDelta(const ModelDelta& delta, DeltaMode mode,
                                    const std::vector<TensorBytes>& bases,
                                    const std::vector<TensorBytes>& results, int threads) {
  const TensorIndex base_index = IndexByName(bases);
  const TensorIndex result_index = IndexByName(results);
  ModelDelta recoded;
  recoded.tensors.resize(delta.tensors.size());
  std::vector<const TensorBytes*> base_of(delta.tensors.size()), result_of(delta.tensors.size());
  for (size_t t = 0; t < delta.tensors.size(); ++t) {
    const TensorDelta& tensor = delta.tensors[t];
    WEFT_ASSIGN_OR_RETURN(base_of[t],
                          TensorAt(base_index, tensor.spec, tensor.base_digest, "base", threads));
    WEFT_ASSIGN_OR_RETURN(
        result_of[t], TensorAt(result_index, tensor.spec, tensor.result_digest, "result", threads));
    const bool decodable = !HasContextChunks(tensor) || base_of[t] != nullptr;
    if (!decodable || (mode == DeltaMode::kContext && SupportsContextMode(tensor.spec.dtype) &&
                       base_of[t] == nullptr && result_of[t] == nullptr)) {
      return InvalidArgument("tensor '" + tensor.spec.name + "': recoding needs its " +
                             (decodable ? "base or result" : "base"));
    }
    TensorDelta& out = recoded.tensors[t];
    out.spec = tensor.spec;
    out.chunk_log2 = tensor.chunk_log2;
    out.base_digest = tensor.base_digest;
    out.result_digest = tensor.result_digest;
    out.chunks.resize(tensor.chunks.size());
  }
  const std::vector<ChunkRef> chunks = AllChunks(delta);
  std::vector<Status> statuses(chunks.size());
  ParallelFor(chunks.size(), threads, [&](size_t i) {
    const auto [t, c] = chunks[i];
    const TensorDelta& tensor = delta.tensors[t];
    const DeltaChunk& chunk = tensor.chunks[c];
    DeltaChunk& out = recoded.tensors[t].chunks[c];
    const bool context = mode == DeltaMode::kContext && SupportsContextMode(tensor.spec.dtype);
    const bool changes = chunk.mode == ChunkMode::kSparse || chunk.mode == ChunkMode::kContext;
    if (!changes || (chunk.mode == ChunkMode::kContext) == context) {
      out = detail::CopyChunk(chunk);
      return;
    }
    const uint8_t width = CodedWidth(tensor.spec.dtype);
    const size_t offset = (size_t{c} << tensor.chunk_log2) * width;
    const uint8_t* base = base_of[t] ? base_of[t]->bytes.data() + offset : nullptr;
    ChangeList list;
    Status status = DecodeChunk(tensor, c, base, &list);
    if (!status.ok()) {
      statuses[i] = status;
      return;
    }
    const detail::ContextSource source{
        tensor.spec.dtype, tensor.UnitsInChunk(c), base,
        result_of[t] ? result_of[t]->bytes.data() + offset : nullptr};
    out = MakeChunk(list, {}, width, CodingFor(tensor.spec.dtype), context ? &source : nullptr);
  });
  WEFT_RETURN_IF_ERROR(FirstError(statuses));
  return recoded;
}

Result<ModelDelta> SquashChainOnBase(std::span<const ModelDelta* const> chain,
                                     const std::vector<TensorBytes>& base, DeltaMode mode,
                                     int threads, size_t* failed) {
  if (chain.empty()) return InvalidArgument("an empty chain of deltas has nothing to squash");
  auto fail = [&](size_t i, Status status) {
    if (failed != nullptr) *failed = i;
    return status;
  };
  const ModelDelta& head = *chain[0];
  const TensorIndex base_index = IndexByName(base);
  // Each tensor's delta in every link, in the first delta's order, checked to continue.
  const size_t tensors = head.tensors.size();
  std::vector<std::vector<const TensorDelta*>> links(tensors);
  std::vector<const TensorBytes*> base_of(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    const TensorDelta& first = head.tensors[t];
    WEFT_ASSIGN_OR_RETURN(base_of[t],
                          TensorAt(base_index, first.spec, first.base_digest, "base", threads));
    if (base_of[t] == nullptr) {
      return InvalidArgument("tensor '" + first.spec.name + "' is not in the base");
    }
    for (size_t i = 0; i < chain.size(); ++i) {
      const TensorDelta* link = chain[i]->Find(first.spec.name);
      if (chain[i]->tensors.size() != tensors || link == nullptr) {
        return fail(i, InvalidArgument("the deltas cover different tensors ('" + first.spec.name +
                                       "' is missing from delta " + std::to_string(i) + ")"));
      }
      if (link->spec.dtype != first.spec.dtype || link->spec.shape != first.spec.shape ||
          link->chunk_log2 != first.chunk_log2 ||
          link->chunks.size() != ChunkCount(first.spec.unit_count(), first.chunk_log2)) {
        return fail(i, InvalidArgument("tensor '" + first.spec.name +
                                       "': the deltas differ in dtype, shape or chunking"));
      }
      if (i > 0 && link->base_digest != links[t].back()->result_digest) {
        return fail(
            i, Conflict("tensor '" + first.spec.name + "': delta " + std::to_string(i) +
                        " starts from digest " + link->base_digest.ToHex() +
                        ", but the one before ends at " + links[t].back()->result_digest.ToHex()));
      }
      links[t].push_back(link);
    }
  }

  ModelDelta squashed;
  squashed.tensors.resize(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    squashed.tensors[t] = detail::NewDelta(head.tensors[t].spec, head.tensors[t].chunk_log2);
    squashed.tensors[t].base_digest = head.tensors[t].base_digest;
    squashed.tensors[t].result_digest = links[t].back()->result_digest;
  }
  const std::vector<ChunkRef> chunks = AllChunks(head);
  // Digest changes per chunk and link, to prove every link's result digest.
  std::vector<std::vector<Digest>> changes(chunks.size(), std::vector<Digest>(chain.size()));
  std::vector<Status> statuses(chunks.size());
  std::vector<size_t> failed_link(chunks.size(), chain.size());
  ParallelFor(chunks.size(), threads, [&](size_t i) {
    const auto [t, c] = chunks[i];
    const TensorSpec& spec = head.tensors[t].spec;
    const uint8_t width = CodedWidth(spec.dtype);
    const KeyKind kind = KeyKindFor(spec.dtype);
    const uint64_t first = uint64_t{c} << head.tensors[t].chunk_log2;
    const uint32_t units = head.tensors[t].UnitsInChunk(c);
    const uint8_t* original = base_of[t]->bytes.data() + first * width;
    // The chunk as the chain goes, built from the base: one chunk's memory per thread.
    thread_local std::vector<uint8_t> values;
    values.assign(original, original + size_t{units} * width);
    ChangeList list;
    for (size_t k = 0; k < chain.size(); ++k) {
      const TensorDelta& link = *links[t][k];
      const DeltaChunk& chunk = link.chunks[c];
      if (chunk.mode == ChunkMode::kUnchanged) continue;
      if (chunk.mode == ChunkMode::kRaw) {
        if (chunk.payload.size() != size_t{units} * width) {
          statuses[i] = DataLoss(ChunkContext(spec, c) + ": raw chunk has the wrong length");
          failed_link[i] = k;
          return;
        }
        ScanChanges(kind, width, values.data(), chunk.payload.data(), units, 0, first, &list,
                    &changes[i][k]);
        std::memcpy(values.data(), chunk.payload.data(), chunk.payload.size());
        list.clear();
        continue;
      }
      Status status = DecodeChunk(link, c, values.data(), &list);
      if (!status.ok()) {
        statuses[i] = status;
        failed_link[i] = k;
        return;
      }
      changes[i][k] = WithUnitType(
          width, [&]<typename T>() { return ApplyChanges<T>(kind, list, first, values.data()); });
    }
    list.clear();
    ScanChanges(kind, width, original, values.data(), units, 0, first, &list, nullptr);
    const detail::ContextSource source{spec.dtype, units, original, nullptr};
    squashed.tensors[t].chunks[c] = MakeChunk(list, values, width, CodingFor(spec.dtype),
                                              mode == DeltaMode::kContext ? &source : nullptr);
  });
  size_t first_failure = chain.size();
  Status first_status = Status::Ok();
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!statuses[i].ok() && failed_link[i] < first_failure) {
      first_failure = failed_link[i];
      first_status = statuses[i];
    }
  }
  if (!first_status.ok()) return fail(first_failure, first_status);
  // Every link must land on its result digest: a link made for another base fails here.
  for (size_t k = 0; k < chain.size(); ++k) {
    std::vector<Digest> reached(tensors);
    for (size_t t = 0; t < tensors; ++t) reached[t] = links[t][k]->base_digest;
    for (size_t i = 0; i < chunks.size(); ++i) reached[chunks[i].tensor] += changes[i][k];
    for (size_t t = 0; t < tensors; ++t) {
      if (reached[t] != links[t][k]->result_digest) {
        return fail(k, DataLoss("tensor '" + head.tensors[t].spec.name + "': delta " +
                                std::to_string(k) + " gives digest " + reached[t].ToHex() +
                                ", not its result digest " + links[t][k]->result_digest.ToHex()));
      }
    }
  }
  return squashed;
}

}  // namespace weft::sync
