// The delta file format (delta_codec.h; docs/formats.md, "Delta files"): writing, sizing,
// parsing with every length and checksum checked, and statistics.
#include <xxhash.h>

#include <cstring>
#include <limits>
#include <string>

#include "common/byte_io.h"
#include "sync/delta_codec.h"
#include "sync/delta_internal.h"

namespace weft::sync {

using detail::ChunkContext;
using detail::ChunkCount;
using detail::ChunkHeaderBytes;

namespace {

constexpr uint8_t kMagic[8] = {'W', 'E', 'F', 'T', 'D', 'L', 'T', 'A'};
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
// Fuzz builds only: random mutations would almost never pass a checksum, hiding the decoders.
constexpr bool kSkipChecksums = true;
#else
constexpr bool kSkipChecksums = false;
#endif
constexpr uint32_t kMaxTensorHeaderBytes = 4096;
uint64_t Checksum(std::span<const uint8_t> header, std::span<const uint8_t> payload) {
  XXH64_hash_t seed = XXH3_64bits(header.data(), header.size());
  return XXH3_64bits_withSeed(payload.data(), payload.size(), seed);
}

// Bytes of a chunk header before its checksum.
}  // namespace

namespace detail {

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
  } else if (chunk.mode == ChunkMode::kContext) {
    const ContextHeader& h = chunk.context;
    out.U8(h.exponent_low);
    out.U8(h.k_big);
    out.U8(h.k_mag);
    out.U16(h.present);
    for (int c = 0; c < kContexts; ++c) {
      if ((h.present >> c & 1) == 0) continue;
      out.U8(h.k_gap[c]);
      out.Varint(h.counts[c]);
    }
    out.Varint(h.gap_bytes);
    out.Varint(h.big_count);
    out.Varint(h.sign_bytes);
    out.Varint(h.big_bytes);
    out.Varint(h.mag_bytes);
  }
  return bytes;
}

}  // namespace detail

namespace {

// Writes the byte format of docs/formats.md to `sink`, which either appends the bytes or only
// counts them: one description of the layout serves both.
template <typename Sink>
void WriteModelDelta(const ModelDelta& delta, Sink& sink) {
  std::vector<uint8_t> scratch;
  ByteWriter out(&scratch);
  out.Bytes(std::span<const uint8_t>(kMagic, 8));
  out.U16(HasContextChunks(delta) ? kDeltaFormatVersion : kPlainDeltaFormatVersion);
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

// Reads the fields of a context chunk's header after its mode byte.
Status ParseContextHeader(ByteReader& in, const std::string& where, ContextHeader* h) {
  if (!in.U8(&h->exponent_low) || !in.U8(&h->k_big) || !in.U8(&h->k_mag) || !in.U16(&h->present)) {
    return DataLoss(where + ": truncated header");
  }
  if (h->present == 0) return DataLoss(where + ": context chunk without changes");
  auto read = [&](uint32_t* field) {
    uint64_t value;
    if (!in.Varint(&value) || value > std::numeric_limits<uint32_t>::max()) return false;
    *field = static_cast<uint32_t>(value);
    return true;
  };
  for (int c = 0; c < kContexts; ++c) {
    if ((h->present >> c & 1) == 0) continue;
    if (!in.U8(&h->k_gap[c]) || !read(&h->counts[c])) {
      return DataLoss(where + ": bad header field of context " + std::to_string(c));
    }
  }
  if (!read(&h->gap_bytes) || !read(&h->big_count) || !read(&h->sign_bytes) ||
      !read(&h->big_bytes) || !read(&h->mag_bytes)) {
    return DataLoss(where + ": bad header field");
  }
  return Status::Ok();
}

Status ParseTensor(ByteReader& in, size_t index, uint16_t version, TensorDelta* tensor) {
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
    const uint8_t last_mode = static_cast<uint8_t>(
        version >= kDeltaFormatVersion ? ChunkMode::kContext : ChunkMode::kRaw);
    if (mode > last_mode) {
      return DataLoss(chunk_where + ": unknown chunk mode " + std::to_string(mode) +
                      " in a version " + std::to_string(version) + " delta");
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
    } else if (chunk.mode == ChunkMode::kContext) {
      if (!SupportsContextMode(tensor->spec.dtype)) {
        return DataLoss(chunk_where + ": context chunk in a " +
                        std::string(Info(tensor->spec.dtype).safetensors_name) + " tensor");
      }
      WEFT_RETURN_IF_ERROR(ParseContextHeader(in, chunk_where, &chunk.context));
      payload_length = chunk.context.payload_bytes();
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

bool HasContextChunks(const TensorDelta& delta) {
  for (const DeltaChunk& chunk : delta.chunks) {
    if (chunk.mode == ChunkMode::kContext) return true;
  }
  return false;
}

bool HasContextChunks(const ModelDelta& delta) {
  for (const TensorDelta& tensor : delta.tensors) {
    if (HasContextChunks(tensor)) return true;
  }
  return false;
}

std::string_view DeltaModeName(DeltaMode mode) {
  return mode == DeltaMode::kContext ? "context" : "plain";
}

std::optional<DeltaMode> ParseDeltaMode(std::string_view name) {
  if (name == "plain") return DeltaMode::kPlain;
  if (name == "context") return DeltaMode::kContext;
  return std::nullopt;
}

Result<ModelDelta> ParseModelDelta(std::span<const uint8_t> bytes) {
  return ParseModelDelta(bytes, nullptr);
}

Result<ModelDelta> ParseModelDelta(std::span<const uint8_t> bytes,
                                   const std::function<void(uint64_t)>& parsed) {
  ByteReader in(bytes);
  std::span<const uint8_t> magic;
  uint16_t version, flags;
  uint32_t count;
  if (!in.Bytes(8, &magic) || std::memcmp(magic.data(), kMagic, 8) != 0) {
    return DataLoss("not a weft delta (bad magic)");
  }
  if (!in.U16(&version) || !in.U16(&flags) || !in.U32(&count))
    return DataLoss("truncated file header");
  if (version < kPlainDeltaFormatVersion || version > kDeltaFormatVersion) {
    return DataLoss("delta format version " + std::to_string(version) +
                    " is not supported (this reads versions " +
                    std::to_string(kPlainDeltaFormatVersion) + " to " +
                    std::to_string(kDeltaFormatVersion) + ")");
  }
  if (flags != 0) return DataLoss("unknown flags " + std::to_string(flags));
  // Every tensor record takes at least 13 bytes.
  if (count > in.remaining() / 13) {
    return DataLoss("truncated: the header declares " + std::to_string(count) +
                    " tensors but only " + std::to_string(in.remaining()) + " bytes follow");
  }
  ModelDelta delta;
  delta.format_version = version;
  delta.tensors.resize(count);
  for (uint32_t t = 0; t < count; ++t) {
    WEFT_RETURN_IF_ERROR(ParseTensor(in, t, version, &delta.tensors[t]));
    if (parsed) parsed(bytes.size() - in.remaining());
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
  stats.format_version = HasContextChunks(delta) ? kDeltaFormatVersion : kPlainDeltaFormatVersion;
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
        case ChunkMode::kContext: {
          // The same streams in both modes but the positions.
          const bool sparse = chunk.mode == ChunkMode::kSparse;
          ++(sparse ? stats.sparse_chunks : stats.context_chunks);
          stats.sparse_units += units;
          stats.changes += sparse ? chunk.sparse.change_count : chunk.context.change_count();
          stats.big_changes += sparse ? chunk.sparse.big_count : chunk.context.big_count;
          stats.gap_bytes += sparse ? chunk.sparse.gap_bytes : chunk.context.gap_bytes;
          stats.sign_bytes += sparse ? chunk.sparse.sign_bytes : chunk.context.sign_bytes;
          stats.big_bytes += sparse ? chunk.sparse.big_bytes : chunk.context.big_bytes;
          stats.magnitude_bytes += sparse ? chunk.sparse.mag_bytes : chunk.context.mag_bytes;
          stream_bytes += chunk.payload.size();
          break;
        }
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
