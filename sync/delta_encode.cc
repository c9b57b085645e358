// The delta codec's encoding and applying (delta_codec.h): plain, fused from master weights and
// for whole models; prepared, proven and committed.
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>

#include "common/parallel.h"
#include "sync/delta_codec.h"
#include "sync/delta_internal.h"

namespace weft::sync {

using detail::ChunkContext;
using detail::ChunkCount;
using detail::FirstError;
using detail::Load;
using detail::MakeChunk;
using detail::NewDelta;
using detail::Store;
using detail::WithUnitType;

namespace {

// Elements converted at a time in the fused path: small enough to stay in L1.
constexpr uint64_t kFusedBlock = 4096;

Status CheckChunkLog2(int chunk_log2) {
  if (chunk_log2 < kMinChunkLog2 || chunk_log2 > kMaxChunkLog2) {
    return InvalidArgument("chunk size 2^" + std::to_string(chunk_log2) + " outside 2^" +
                           std::to_string(kMinChunkLog2) + "..2^" + std::to_string(kMaxChunkLog2));
  }
  return Status::Ok();
}

// Replaces each residual of a decoded sparse chunk by the new value of its element and returns
// the digest change; reads `served` only.
template <typename T>
Digest ResolveNewValues(KeyKind kind, const uint8_t* served, uint64_t first, ChangeList* changes) {
  constexpr size_t kAhead = 16;  // changes between a prefetch and its use
  const size_t n = changes->size();
  const uint32_t* offsets = changes->offsets.data();
  uint32_t* values = changes->residuals.data();
  U32Vector old_values(n);
  for (size_t j = 0; j < n; ++j) {
    __builtin_prefetch(served + (first + offsets[std::min(j + kAhead, n - 1)]) * sizeof(T));
    const T old_value = Load<T>(served, first + offsets[j]);
    old_values[j] = old_value;
    values[j] = ApplyResidual<T>(kind, old_value, static_cast<T>(values[j]));
  }
  return SumElementChanges(first, offsets, old_values.data(), values, n);
}

template <typename T>
void WriteNewValues(const ChangeList& changes, uint8_t* served, uint64_t first) {
  constexpr size_t kAhead = 16;
  const size_t n = changes.size();
  for (size_t j = 0; j < n; ++j) {
    __builtin_prefetch(served + (first + changes.offsets[std::min(j + kAhead, n - 1)]) * sizeof(T),
                       1);
    Store<T>(served, first + changes.offsets[j], static_cast<T>(changes.residuals[j]));
  }
}

}  // namespace

namespace detail {

// A sparse chunk unless the raw new bytes are no larger; raw is only possible when the new bytes
// are known (`new_bytes` non-empty).
DeltaChunk MakeChunk(const ChangeList& changes, std::span<const uint8_t> new_bytes, uint8_t width,
                     ValueCoding coding) {
  DeltaChunk chunk;
  if (changes.empty()) return chunk;
  std::vector<uint8_t> payload;
  SparseHeader header;
  EncodeChanges(changes, width, coding, &header, &payload);
  chunk.mode = ChunkMode::kSparse;
  chunk.sparse = header;
  if (!new_bytes.empty() && payload.size() + ChunkHeaderBytes(chunk).size() >= new_bytes.size()) {
    chunk.mode = ChunkMode::kRaw;
    chunk.sparse = SparseHeader{};
    chunk.Own(std::vector<uint8_t>(new_bytes.begin(), new_bytes.end()));
    return chunk;
  }
  chunk.Own(std::move(payload));
  return chunk;
}

DeltaChunk CopyChunk(const DeltaChunk& source) {
  DeltaChunk chunk;
  chunk.mode = source.mode;
  chunk.sparse = source.sparse;
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

uint64_t TensorSpec::element_count() const {
  uint64_t count = 1;
  for (uint64_t d : shape) count *= d;
  return count;
}

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
    delta.chunks[c] =
        MakeChunk(list, new_bytes.subspan(first * width, size_t{count} * width), width, coding);
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
    delta.chunks[c] = MakeChunk(list, served.subspan(first * width, (end - first) * width), width,
                                ValueCoding::kOrderedDiff);
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
  const TensorSpec& spec = delta.spec;
  if (served.size() != spec.byte_count()) {
    return InvalidArgument("tensor '" + spec.name + "': served tensor has " +
                           std::to_string(served.size()) + " bytes, the delta is for " +
                           std::to_string(spec.byte_count()));
  }
  if (delta.chunks.size() != ChunkCount(spec.unit_count(), delta.chunk_log2)) {
    return DataLoss("tensor '" + spec.name + "': wrong number of chunks");
  }
  Digest current = served_digest ? *served_digest : TensorDigest(spec.dtype, served, threads);
  if (current != delta.base_digest) {
    return Conflict("tensor '" + spec.name + "': the delta applies to a tensor with digest " +
                    delta.base_digest.ToHex() + ", but the served tensor has digest " +
                    current.ToHex());
  }
  const uint8_t width = CodedWidth(spec.dtype);
  const KeyKind kind = KeyKindFor(spec.dtype);
  const ValueCoding coding = CodingFor(spec.dtype);

  PreparedTensorDelta prepared;
  prepared.delta = &delta;
  prepared.changes.resize(delta.chunks.size());
  std::vector<Digest> changes(delta.chunks.size());
  std::vector<Status> statuses(delta.chunks.size());
  ParallelFor(delta.chunks.size(), threads, [&](size_t c) {
    const DeltaChunk& chunk = delta.chunks[c];
    const uint64_t first = uint64_t{c} << delta.chunk_log2;
    const uint32_t units = delta.UnitsInChunk(c);
    ChangeList& list = prepared.changes[c];
    if (chunk.mode == ChunkMode::kSparse) {
      Status status = DecodeChanges(chunk.sparse, chunk.payload, units, width, coding, &list);
      if (!status.ok()) {
        statuses[c] = status.WithContext(ChunkContext(spec, c));
        return;
      }
      changes[c] = WithUnitType(width, [&]<typename T>() {
        return ResolveNewValues<T>(kind, served.data(), first, &list);
      });
    } else if (chunk.mode == ChunkMode::kRaw) {
      if (chunk.payload.size() != size_t{units} * width) {
        statuses[c] = DataLoss(ChunkContext(spec, c) + ": raw chunk has the wrong length");
        return;
      }
      // The list holds offsets of differing units; values are written from the payload.
      ScanChanges(kind, width, served.data() + first * width, chunk.payload.data(), units, 0, first,
                  &list, &changes[c]);
    }
  });
  WEFT_RETURN_IF_ERROR(FirstError(statuses));
  prepared.result_digest = current;
  for (const Digest& d : changes) prepared.result_digest += d;
  if (prepared.result_digest != delta.result_digest) {
    return DataLoss("tensor '" + spec.name + "': applying the delta would give digest " +
                    prepared.result_digest.ToHex() + ", not the published " +
                    delta.result_digest.ToHex() + "; nothing was written");
  }
  return prepared;
}

void CommitTensorDelta(const PreparedTensorDelta& prepared, std::span<uint8_t> served,
                       int threads) {
  const TensorDelta& delta = *prepared.delta;
  const uint8_t width = CodedWidth(delta.spec.dtype);
  ParallelFor(delta.chunks.size(), threads, [&](size_t c) {
    const DeltaChunk& chunk = delta.chunks[c];
    const ChangeList& list = prepared.changes[c];
    const uint64_t first = uint64_t{c} << delta.chunk_log2;
    if (chunk.mode == ChunkMode::kSparse) {
      WithUnitType(width, [&]<typename T>() { WriteNewValues<T>(list, served.data(), first); });
    } else if (chunk.mode == ChunkMode::kRaw) {
      for (uint32_t offset : list.offsets) {
        std::memcpy(served.data() + (first + offset) * width,
                    chunk.payload.data() + size_t{offset} * width, width);
      }
    }
  });
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

}  // namespace weft::sync
