#include "sync/delta_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "common/byte_io.h"
#include "common/parallel.h"

namespace weft::sync {
namespace {

constexpr uint8_t kMagic[8] = {'W', 'E', 'F', 'T', 'D', 'L', 'T', 'A'};
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
// Fuzz builds only: random mutations would almost never pass a checksum, hiding the decoders.
constexpr bool kSkipChecksums = true;
#else
constexpr bool kSkipChecksums = false;
#endif
constexpr uint32_t kMaxTensorHeaderBytes = 4096;
// Elements converted at a time in the fused path: small enough to stay in L1.
constexpr uint64_t kFusedBlock = 4096;

std::string ChunkContext(const TensorSpec& spec, size_t chunk) {
  return "tensor '" + spec.name + "' chunk " + std::to_string(chunk);
}

uint64_t Checksum(std::span<const uint8_t> header, std::span<const uint8_t> payload) {
  XXH64_hash_t seed = XXH3_64bits(header.data(), header.size());
  return XXH3_64bits_withSeed(payload.data(), payload.size(), seed);
}

// Bytes of a chunk header before its checksum.
std::vector<uint8_t> ChunkHeaderBytes(const DeltaChunk& chunk) {
  std::vector<uint8_t> bytes;
  ByteWriter out(&bytes);
  out.U8(static_cast<uint8_t>(chunk.mode));
  if (chunk.mode == ChunkMode::kSparse) {
    const SparseHeader& h = chunk.sparse;
    out.U8(h.k_gap);
    out.U8(h.k_big);
    out.U8(h.k_mag);
    out.Varint(h.change_count);
    out.Varint(h.big_count);
    out.Varint(h.gap_bytes);
    out.Varint(h.sign_bytes);
    out.Varint(h.big_bytes);
    out.Varint(h.mag_bytes);
  }
  return bytes;
}

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

Status CheckChunkLog2(int chunk_log2) {
  if (chunk_log2 < kMinChunkLog2 || chunk_log2 > kMaxChunkLog2) {
    return InvalidArgument("chunk size 2^" + std::to_string(chunk_log2) + " outside 2^" +
                           std::to_string(kMinChunkLog2) + "..2^" + std::to_string(kMaxChunkLog2));
  }
  return Status::Ok();
}

size_t ChunkCount(uint64_t units, int chunk_log2) {
  return static_cast<size_t>((units + (uint64_t{1} << chunk_log2) - 1) >> chunk_log2);
}

TensorDelta NewDelta(const TensorSpec& spec, int chunk_log2) {
  TensorDelta delta;
  delta.spec = spec;
  delta.chunk_log2 = chunk_log2;
  delta.chunks.resize(ChunkCount(spec.unit_count(), chunk_log2));
  return delta;
}

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

Status FirstError(const std::vector<Status>& statuses) {
  for (const Status& status : statuses) {
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

}  // namespace

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
    for (const DeltaChunk& chunk : t.chunks) c.chunks.push_back(CopyChunk(chunk));
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

Result<TensorDelta> EncodeFromMaster(const TensorSpec& spec, std::span<const float> master,
                                     const ServeFormat& format, std::span<uint8_t> served,
                                     Digest* served_digest, const CodecOptions& options) {
  WEFT_RETURN_IF_ERROR(CheckChunkLog2(options.chunk_log2));
  if (spec.dtype != format.dtype) {
    return InvalidArgument("tensor '" + spec.name + "': spec dtype differs from the serve format");
  }
  const bool is_fp8 = format.dtype == DType::kF8E4M3 || format.dtype == DType::kF8E5M2;
  if (format.dtype != DType::kBF16 && format.dtype != DType::kF16 && !is_fp8) {
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
  const Fp8Format fp8 = format.dtype == DType::kF8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  const BlockScaling unscaled{1, master.size(), 0};
  const float unit_scale = 1.0f;
  const BlockScaling& scaling = format.scaling != nullptr ? *format.scaling : unscaled;
  const std::span<const float> scales =
      format.scaling != nullptr ? format.scales : std::span<const float>(&unit_scale, 1);

  std::vector<Digest> changes(delta.chunks.size());
  ParallelFor(delta.chunks.size(), options.threads, [&](size_t c) {
    const uint64_t first = uint64_t{c} << delta.chunk_log2;
    const uint64_t end = first + delta.UnitsInChunk(c);
    ChangeList list;
    if (spec.dtype == DType::kBF16 && HasFusedBf16Kernel()) {
      ScanFromMasterBf16(master.data() + first, served.data() + first * width,
                         static_cast<uint32_t>(end - first), 0, first, &list, &changes[c]);
    } else {
      // Convert a block at a time into L1, then diff it against the served tensor.
      alignas(64) std::array<uint8_t, kFusedBlock * 2> converted;
      for (uint64_t block = first; block < end; block += kFusedBlock) {
        const uint64_t n = std::min(kFusedBlock, end - block);
        if (spec.dtype == DType::kBF16) {
          ConvertBf16(master.subspan(block, n),
                      std::span<uint16_t>(reinterpret_cast<uint16_t*>(converted.data()), n));
        } else if (spec.dtype == DType::kF16) {
          ConvertF16(master.subspan(block, n),
                     std::span<uint16_t>(reinterpret_cast<uint16_t*>(converted.data()), n));
        } else {
          ForEachTileRun(scaling, block, block + n, [&](uint64_t b, uint64_t e, uint64_t tile) {
            ConvertFp8(master.subspan(b, e - b),
                       std::span<uint8_t>(converted.data() + (b - block), e - b), fp8,
                       format.saturation, scales[tile]);
          });
        }
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
    delta.chunks[c] = MakeChunk(list, served.subspan(first * width, (end - first) * width), width,
                                ValueCoding::kOrderedDiff);
  });
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

Result<TensorDelta> SquashTensorDeltas(const TensorDelta& first, const TensorDelta& second,
                                       int threads) {
  const TensorSpec& spec = first.spec;
  if (spec.name != second.spec.name || spec.dtype != second.spec.dtype ||
      spec.shape != second.spec.shape || first.chunk_log2 != second.chunk_log2) {
    return InvalidArgument("tensor '" + spec.name +
                           "': the deltas differ in name, dtype, shape or chunk size");
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

namespace {

// Writes the byte format of docs/formats.md to `sink`, which either appends the bytes or only
// counts them: one description of the layout serves both.
template <typename Sink>
void WriteModelDelta(const ModelDelta& delta, Sink& sink) {
  std::vector<uint8_t> scratch;
  ByteWriter out(&scratch);
  out.Bytes(std::span<const uint8_t>(kMagic, 8));
  out.U16(kDeltaFormatVersion);
  out.U16(0);
  out.U32(static_cast<uint32_t>(delta.tensors.size()));
  sink(scratch);
  for (const TensorDelta& tensor : delta.tensors) {
    std::vector<uint8_t> header;
    ByteWriter h(&header);
    h.Varint(tensor.spec.name.size());
    h.Bytes(tensor.spec.name);
    h.U8(static_cast<uint8_t>(tensor.spec.dtype));
    h.U8(static_cast<uint8_t>(CodingFor(tensor.spec.dtype)));
    h.U8(static_cast<uint8_t>(tensor.spec.shape.size()));
    for (uint64_t d : tensor.spec.shape) h.Varint(d);
    h.U8(static_cast<uint8_t>(tensor.chunk_log2));
    h.U64(tensor.base_digest.lane0);
    h.U64(tensor.base_digest.lane1);
    h.U64(tensor.result_digest.lane0);
    h.U64(tensor.result_digest.lane1);
    scratch.clear();
    out.U32(static_cast<uint32_t>(header.size()));
    out.Bytes(header);
    out.U64(XXH3_64bits(header.data(), header.size()));
    sink(scratch);
    for (const DeltaChunk& chunk : tensor.chunks) {
      scratch = ChunkHeaderBytes(chunk);
      if (chunk.mode != ChunkMode::kUnchanged) {
        const uint64_t checksum = Checksum(scratch, chunk.payload);
        out.U64(checksum);
      }
      sink(scratch);
      if (chunk.mode != ChunkMode::kUnchanged) sink(chunk.payload);
    }
  }
}

}  // namespace

std::vector<uint8_t> SerializeModelDelta(const ModelDelta& delta) {
  std::vector<uint8_t> bytes;
  auto append = [&](std::span<const uint8_t> part) {
    bytes.insert(bytes.end(), part.begin(), part.end());
  };
  WriteModelDelta(delta, append);
  return bytes;
}

uint64_t SerializedSize(const ModelDelta& delta) {
  uint64_t size = 0;
  auto count = [&](std::span<const uint8_t> part) { size += part.size(); };
  WriteModelDelta(delta, count);
  return size;
}

namespace {

Status ParseTensor(ByteReader& in, size_t index, TensorDelta* tensor) {
  const std::string where = "tensor record " + std::to_string(index);
  uint32_t header_length;
  std::span<const uint8_t> header;
  uint64_t checksum;
  if (!in.U32(&header_length)) return DataLoss(where + ": truncated before its header");
  if (header_length > kMaxTensorHeaderBytes) {
    return DataLoss(where + ": header length " + std::to_string(header_length) + " over the limit");
  }
  if (!in.Bytes(header_length, &header) || !in.U64(&checksum)) {
    return DataLoss(where + ": truncated header");
  }
  if (XXH3_64bits(header.data(), header.size()) != checksum && !kSkipChecksums) {
    return DataLoss(where + ": header checksum mismatch");
  }
  ByteReader h(header);
  uint64_t name_length;
  std::span<const uint8_t> name;
  if (!h.Varint(&name_length) || name_length == 0 || name_length > kMaxTensorNameBytes ||
      !h.Bytes(name_length, &name)) {
    return DataLoss(where + ": bad tensor name");
  }
  tensor->spec.name.assign(name.begin(), name.end());
  const std::string named = "tensor '" + tensor->spec.name + "'";
  uint8_t dtype_code, coding, rank, chunk_log2;
  if (!h.U8(&dtype_code) || !h.U8(&coding) || !h.U8(&rank))
    return DataLoss(named + ": truncated header");
  std::optional<DType> dtype = DTypeFromCode(dtype_code);
  if (!dtype) return DataLoss(named + ": unknown dtype code " + std::to_string(dtype_code));
  tensor->spec.dtype = *dtype;
  if (coding != static_cast<uint8_t>(CodingFor(*dtype))) {
    return DataLoss(named + ": value coding " + std::to_string(coding) + " does not match dtype " +
                    std::string(Info(*dtype).safetensors_name));
  }
  if (rank > kMaxRank) return DataLoss(named + ": rank " + std::to_string(rank) + " over 8");
  tensor->spec.shape.resize(rank);
  // Element counts are bounded so that byte counts fit in 63 bits.
  unsigned __int128 elements = 1;
  for (uint64_t& d : tensor->spec.shape) {
    if (!h.Varint(&d)) return DataLoss(named + ": truncated shape");
    elements *= d;
    if (elements > (uint64_t{1} << 59)) return DataLoss(named + ": shape too large");
  }
  if (!h.U8(&chunk_log2) || chunk_log2 < kMinChunkLog2 || chunk_log2 > kMaxChunkLog2) {
    return DataLoss(named + ": bad chunk size");
  }
  tensor->chunk_log2 = chunk_log2;
  if (!h.U64(&tensor->base_digest.lane0) || !h.U64(&tensor->base_digest.lane1) ||
      !h.U64(&tensor->result_digest.lane0) || !h.U64(&tensor->result_digest.lane1) || !h.at_end()) {
    return DataLoss(named + ": header has the wrong length");
  }
  const uint8_t width = CodedWidth(*dtype);
  const size_t chunks = ChunkCount(tensor->spec.unit_count(), chunk_log2);
  // Each chunk takes at least one byte: a count beyond the remaining bytes is a lie.
  if (chunks > in.remaining()) return DataLoss(named + ": truncated chunks");
  tensor->chunks.resize(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    DeltaChunk& chunk = tensor->chunks[c];
    const std::string chunk_where = ChunkContext(tensor->spec, c);
    const size_t header_start = in.position();
    uint8_t mode;
    if (!in.U8(&mode)) return DataLoss(chunk_where + ": truncated");
    if (mode > static_cast<uint8_t>(ChunkMode::kRaw)) {
      return DataLoss(chunk_where + ": unknown chunk mode " + std::to_string(mode));
    }
    chunk.mode = static_cast<ChunkMode>(mode);
    if (chunk.mode == ChunkMode::kUnchanged) continue;
    uint64_t payload_length = 0;
    if (chunk.mode == ChunkMode::kSparse) {
      SparseHeader& s = chunk.sparse;
      uint64_t fields[6];
      if (!in.U8(&s.k_gap) || !in.U8(&s.k_big) || !in.U8(&s.k_mag)) {
        return DataLoss(chunk_where + ": truncated header");
      }
      for (uint64_t& field : fields) {
        if (!in.Varint(&field) || field > std::numeric_limits<uint32_t>::max()) {
          return DataLoss(chunk_where + ": bad header field");
        }
      }
      s.change_count = static_cast<uint32_t>(fields[0]);
      s.big_count = static_cast<uint32_t>(fields[1]);
      s.gap_bytes = static_cast<uint32_t>(fields[2]);
      s.sign_bytes = static_cast<uint32_t>(fields[3]);
      s.big_bytes = static_cast<uint32_t>(fields[4]);
      s.mag_bytes = static_cast<uint32_t>(fields[5]);
      payload_length = s.payload_bytes();
    } else {
      payload_length = uint64_t{tensor->UnitsInChunk(c)} * width;
    }
    const size_t header_end = in.position();
    uint64_t chunk_checksum;
    if (!in.U64(&chunk_checksum)) return DataLoss(chunk_where + ": truncated header");
    if (payload_length > in.remaining() || !in.Bytes(payload_length, &chunk.payload)) {
      return DataLoss(chunk_where + ": truncated payload (" + std::to_string(payload_length) +
                      " bytes declared, " + std::to_string(in.remaining()) + " left)");
    }
    std::span<const uint8_t> all = in.Whole();
    if (Checksum(all.subspan(header_start, header_end - header_start), chunk.payload) !=
            chunk_checksum &&
        !kSkipChecksums) {
      return DataLoss(chunk_where + ": checksum mismatch");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ModelDelta> ParseModelDelta(std::span<const uint8_t> bytes) {
  ByteReader in(bytes);
  std::span<const uint8_t> magic;
  uint16_t version, flags;
  uint32_t count;
  if (!in.Bytes(8, &magic) || std::memcmp(magic.data(), kMagic, 8) != 0) {
    return DataLoss("not a weft delta (bad magic)");
  }
  if (!in.U16(&version) || !in.U16(&flags) || !in.U32(&count))
    return DataLoss("truncated file header");
  if (version != kDeltaFormatVersion) {
    return DataLoss("delta format version " + std::to_string(version) +
                    " is not supported (this is " + std::to_string(kDeltaFormatVersion) + ")");
  }
  if (flags != 0) return DataLoss("unknown flags " + std::to_string(flags));
  // Every tensor record takes at least 13 bytes.
  if (count > in.remaining() / 13) {
    return DataLoss("truncated: the header declares " + std::to_string(count) +
                    " tensors but only " + std::to_string(in.remaining()) + " bytes follow");
  }
  ModelDelta delta;
  delta.tensors.resize(count);
  for (uint32_t t = 0; t < count; ++t) {
    WEFT_RETURN_IF_ERROR(ParseTensor(in, t, &delta.tensors[t]));
    for (uint32_t u = 0; u < t; ++u) {
      if (delta.tensors[u].spec.name == delta.tensors[t].spec.name) {
        return DataLoss("tensor '" + delta.tensors[t].spec.name + "' appears twice");
      }
    }
  }
  if (!in.at_end())
    return DataLoss(std::to_string(in.remaining()) + " trailing bytes after the last tensor");
  return delta;
}

DeltaStats ComputeStats(const ModelDelta& delta) {
  DeltaStats stats;
  uint64_t stream_bytes = 0;
  for (const TensorDelta& tensor : delta.tensors) {
    stats.units += tensor.spec.unit_count();
    for (size_t c = 0; c < tensor.chunks.size(); ++c) {
      const DeltaChunk& chunk = tensor.chunks[c];
      uint64_t units = tensor.UnitsInChunk(c);
      switch (chunk.mode) {
        case ChunkMode::kUnchanged:
          ++stats.unchanged_chunks;
          stats.sparse_units += units;
          break;
        case ChunkMode::kSparse:
          ++stats.sparse_chunks;
          stats.sparse_units += units;
          stats.changes += chunk.sparse.change_count;
          stats.big_changes += chunk.sparse.big_count;
          stats.gap_bytes += chunk.sparse.gap_bytes;
          stats.sign_bytes += chunk.sparse.sign_bytes;
          stats.big_bytes += chunk.sparse.big_bytes;
          stats.magnitude_bytes += chunk.sparse.mag_bytes;
          stream_bytes += chunk.payload.size();
          break;
        case ChunkMode::kRaw:
          ++stats.raw_chunks;
          stats.raw_units += units;
          stats.raw_bytes += chunk.payload.size();
          stream_bytes += chunk.payload.size();
          break;
      }
    }
  }
  stats.total_bytes = SerializedSize(delta);
  stats.header_bytes = stats.total_bytes - stream_bytes;
  return stats;
}

}  // namespace weft::sync
