// The delta codec: lossless, chunked, adaptive deltas between two versions of served tensors.
//
// Byte format: docs/formats.md, "Delta files" (format versions 1 and 2). A ModelDelta is a list of
// TensorDeltas; each carries the tensor's name, dtype and shape, the state digests of the base it
// applies to and of the result it produces, and one chunk per `chunk_elements` coded units. A
// chunk is unchanged, sparse (the changed positions and values, entropy-coded: chunk_codec.h),
// context-coded (the same, with positions coded per class of base value: context_codec.h; format
// version 2), or raw (the new bytes, when that is smaller). Every chunk and tensor header carries
// a checksum.
//
// Guarantees:
//  - Lossless: applying Encode(old, new) to old gives new bit for bit, for every dtype and every
//    bit pattern (NaN payloads, infinities, signed zeros, subnormals).
//  - Safe: ApplyTensorDelta decodes and checks every chunk, and proves that the result's digest
//    equals the delta's result digest, before it writes a single byte of served memory. A
//    truncated, corrupted or hostile delta is rejected with kDataLoss (malformed) or kConflict
//    (valid, but made for a different base); the served tensor is then unchanged.
//  - Composable: SquashTensorDeltas(d1, d2) equals a delta from d1's base to d2's result, computed
//    without the base weights when neither holds context chunks (SquashChainOnBase otherwise).
//  - Large: element counts and indices are 64-bit; tensors over 2^32 elements work.
//  - Parallel: encode, apply and squash split the work by chunk over `threads` threads.
//
// Ownership: a TensorDelta's chunk payloads either own their bytes (after encoding or squashing)
// or point into the buffer passed to ParseModelDelta, which must outlive the parsed delta.
// TensorDeltas are movable, not copyable. Functions are thread-safe on distinct arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "sync/chunk_codec.h"
#include "sync/context_codec.h"
#include "sync/convert.h"
#include "sync/digest.h"
#include "sync/dtype.h"
#include "sync/fp8_scaling.h"
#include "sync/serving.h"

namespace weft::sync {

// Version 2 adds context chunks; a delta without them is written as version 1, which readers of
// either version read.
inline constexpr uint16_t kDeltaFormatVersion = 2;
inline constexpr uint16_t kPlainDeltaFormatVersion = 1;
inline constexpr int kMinChunkLog2 = 10;
inline constexpr int kMaxChunkLog2 = 26;
// Ok when 2^chunk_log2 is a chunk size the format allows, else kInvalidArgument saying so.
Status CheckChunkLog2(int chunk_log2);
inline constexpr int kDefaultChunkLog2 = 20;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr int kMaxRank = 8;

enum class ChunkMode : uint8_t { kUnchanged = 0, kSparse = 1, kRaw = 2, kContext = 3 };

// How an encoder codes changed chunks: sparse only, or each chunk of a float tensor as the smaller
// of sparse and context-coded (smaller deltas, more encoding and decoding work).
enum class DeltaMode : uint8_t { kPlain, kContext };
std::string_view DeltaModeName(DeltaMode mode);
std::optional<DeltaMode> ParseDeltaMode(std::string_view name);

struct DeltaChunk {
  ChunkMode mode = ChunkMode::kUnchanged;
  SparseHeader sparse;               // kSparse only
  ContextHeader context;             // kContext only
  std::span<const uint8_t> payload;  // sparse streams, or the chunk's new bytes (kRaw)
  std::vector<uint8_t> owned;        // backing store of `payload` when the chunk owns it

  DeltaChunk() = default;
  DeltaChunk(DeltaChunk&&) = default;
  DeltaChunk& operator=(DeltaChunk&&) = default;
  DeltaChunk(const DeltaChunk&) = delete;
  DeltaChunk& operator=(const DeltaChunk&) = delete;

  void Own(std::vector<uint8_t> bytes) {
    owned = std::move(bytes);
    payload = owned;
  }
};

struct TensorDelta {
  TensorSpec spec;
  int chunk_log2 = kDefaultChunkLog2;
  Digest base_digest;
  Digest result_digest;
  std::vector<DeltaChunk> chunks;

  uint64_t chunk_units() const { return uint64_t{1} << chunk_log2; }
  // Units in chunk c (the last chunk may be short).
  uint32_t UnitsInChunk(size_t c) const;
};

struct ModelDelta {
  std::vector<TensorDelta> tensors;
  uint16_t format_version = 0;  // of the file it was parsed from; 0 when built in memory

  const TensorDelta* Find(const std::string& name) const;
  // A copy that owns every payload (a parsed delta's point into its buffer).
  ModelDelta Copy() const;
};

struct CodecOptions {
  int chunk_log2 = kDefaultChunkLog2;
  int threads = 1;
  DeltaMode mode = DeltaMode::kPlain;
};

// Delta from `old_bytes` to `new_bytes` (both spec.byte_count() long). `base_digest` is the digest
// of old_bytes if the caller already knows it (a publisher tracks it); otherwise it is computed.
Result<TensorDelta> EncodeTensorDelta(const TensorSpec& spec, std::span<const uint8_t> old_bytes,
                                      std::span<const uint8_t> new_bytes,
                                      const CodecOptions& options,
                                      std::optional<Digest> base_digest = std::nullopt);

// One tensor of a model as a model delta is encoded from: its spec, its served bytes and, when the
// caller knows it, their digest.
struct TensorBytes {
  TensorSpec spec;
  std::span<const uint8_t> bytes;
  std::optional<Digest> digest;
};

// The delta from one model to another: both must hold the same tensors (names, dtypes and shapes,
// in any order). The delta lists the tensors in `old_tensors`' order. kInvalidArgument names the
// first tensor that is missing or differs.
Result<ModelDelta> EncodeModelDelta(const std::vector<TensorBytes>& old_tensors,
                                    const std::vector<TensorBytes>& new_tensors,
                                    const CodecOptions& options);

// The fused path: converts `master` to the serving format, diffs it against `served` (the
// previously served tensor, updated in place to the new one), and encodes the delta, in one
// streaming pass. `served_digest` must be the digest of `served` on entry; it is the new digest
// on return. Elements that do not change are not written; `*changed` (when given) counts those
// that do. `master` is FP32 or BF16 (master_values.h).
Result<TensorDelta> EncodeFromMaster(const TensorSpec& spec, const MasterValues& master,
                                     const ServeFormat& format, std::span<uint8_t> served,
                                     Digest* served_digest, const CodecOptions& options,
                                     uint64_t* changed = nullptr);

// Applies `delta` to `served` in place. `served_digest` is the digest of `served` if known (it is
// computed otherwise); it must equal the delta's base digest. On success `served` holds the
// result and `*served_digest_out` (if not null) its digest, equal to delta.result_digest. On any
// error `served` is unchanged. Equivalent to PrepareTensorDelta followed by CommitTensorDelta.
Status ApplyTensorDelta(const TensorDelta& delta, std::span<uint8_t> served,
                        std::optional<Digest> served_digest, int threads,
                        Digest* served_digest_out = nullptr);

// A delta decoded, checked and proven (by digest) against a served tensor, ready to be written.
// It refers to the TensorDelta it was prepared from, which must outlive it.
struct PreparedTensorDelta {
  const TensorDelta* delta = nullptr;
  std::vector<ChangeList> changes;  // per chunk: offsets and new values (sparse), offsets (raw)
  Digest result_digest;
};

// The first half of ApplyTensorDelta: reads `served`, writes nothing. Fails with kConflict when
// `served` is not the delta's base, kDataLoss when the delta is malformed or would not produce its
// result digest. Staging the next version this way while the current one is being served leaves
// only CommitTensorDelta for the pause.
Result<PreparedTensorDelta> PrepareTensorDelta(const TensorDelta& delta,
                                               std::span<const uint8_t> served,
                                               std::optional<Digest> served_digest, int threads);
// The second half: writes the prepared changes. `served` must be the tensor it was prepared on,
// unchanged since.
void CommitTensorDelta(const PreparedTensorDelta& prepared, std::span<uint8_t> served, int threads);

// The served bytes a tensor delta is prepared on and, when known, their digest.
struct ServedBytes {
  std::span<const uint8_t> bytes;
  std::optional<Digest> digest;
};

// Every tensor of a model delta prepared (PrepareModelDelta), ready to be written. Preparing into
// the same object again reuses its buffers: a replica that keeps one allocates nothing, and takes
// no page faults, once it has applied a version as large as the current one.
struct PreparedModelDelta {
  std::vector<PreparedTensorDelta> tensors;  // in the delta's order
};

// PrepareTensorDelta for every tensor of a model delta at once: delta.tensors[t] on served[t].
// The chunks of all tensors are decoded in one parallel loop, so a model of many small tensors
// (one chunk each) uses every thread too. Reads `served` only. Returns the error PrepareTensorDelta
// gives for the first tensor, in the delta's order, that fails; `prepared` then holds nothing
// usable. `prepared` must not outlive `delta`.
Status PrepareModelDelta(const ModelDelta& delta, std::span<const ServedBytes> served, int threads,
                         PreparedModelDelta* prepared);
// Writes what PrepareModelDelta proved: served[t] must be the bytes tensor t was prepared on,
// unchanged since.
void CommitModelDelta(const PreparedModelDelta& prepared,
                      std::span<const std::span<uint8_t>> served, int threads);

// d1: A -> B and d2: B -> C for the same tensor gives A -> C, without A, B or C.
Result<TensorDelta> SquashTensorDeltas(const TensorDelta& first, const TensorDelta& second,
                                       int threads);
// Squashes tensor by tensor; both deltas must cover the same tensors.
Result<ModelDelta> SquashModelDeltas(const ModelDelta& first, const ModelDelta& second,
                                     int threads);
// A chain of deltas, each starting where the one before ends, as one delta from the first's base to
// the last's result (a chain of one is copied). On error `*failed`, when given, is the index of the
// delta that did not squash onto the ones before it.
Result<ModelDelta> SquashChain(std::span<const ModelDelta* const> chain, int threads,
                               size_t* failed = nullptr);

// Whether any chunk of `delta` is context-coded (and so cannot be squashed without its base).
bool HasContextChunks(const TensorDelta& delta);
bool HasContextChunks(const ModelDelta& delta);

// `delta` with its chunks coded in `mode`: sparse chunks of float tensors become context chunks
// where that is smaller (kContext), context chunks become sparse (kPlain). `bases` or `results`
// (by tensor name; one may be empty) give the tensors the delta starts from or ends at: the
// contexts are read from the base, or from the result with each change undone. The digests and
// the changes are unchanged.
Result<ModelDelta> RecodeModelDelta(const ModelDelta& delta, DeltaMode mode,
                                    const std::vector<TensorBytes>& bases,
                                    const std::vector<TensorBytes>& results, int threads);

// A chain of deltas in any modes squashed into one delta in `mode` from `base` (the tensors the
// first delta applies to, checked by digest) to the last one's result. Works chunk by chunk on a
// copy of one chunk at a time: memory beyond the deltas is a chunk per thread plus the result.
// Every delta's base and result digests are checked on the way; nothing is written to `base`.
Result<ModelDelta> SquashChainOnBase(std::span<const ModelDelta* const> chain,
                                     const std::vector<TensorBytes>& base, DeltaMode mode,
                                     int threads, size_t* failed = nullptr);

// A chain of deltas in any modes applied in place to `served` (the tensors the first delta applies
// to, in any order, checked by digest; tensors the deltas do not name are left alone), writing
// through `writable` (writable[i] is served[i].bytes). In bounded memory: every chunk some delta
// changes is first walked through the whole chain on a copy of that chunk (a chain of one delta:
// on the served bytes, unwritten), which proves every delta's result digest, and only then walked
// again on the served bytes. Memory beyond the deltas is, per thread, one chunk's decoded changes
// and (chains of several) a chunk copy, freed on return, plus a digest per changed chunk and
// delta; decoding is done twice.
// On any error nothing is written; `*failed`, when given, is the index of the delta at fault.
// On success each tensor's digest is the last delta's result digest.
//
// With `options.release`, the deltas' payloads may live in memory that can be let go and read
// again (the pages of a mapped file): the chunks are walked in windows of about
// `options.window_bytes` of payload over the whole chain, and after each window `release(k,
// bytes)` is called for each delta k with the extent of that window's payloads in it, so that the
// memory held is a window's, not the deltas'. The second walk then checks each payload against
// what the first read (XXH3) before it writes its window; should one differ, it stops with
// kDataLoss, and `*options.partly_written` (when given) says whether earlier windows were
// written (the copy is then damaged and must be dropped).
struct ApplyChainOptions {
  std::function<void(size_t delta, std::span<const uint8_t> bytes)> release;
  uint64_t window_bytes = uint64_t{32} << 20;
  bool* partly_written = nullptr;
};
Status ApplyChain(std::span<const ModelDelta* const> chain, const std::vector<TensorBytes>& served,
                  std::span<const std::span<uint8_t>> writable, int threads,
                  size_t* failed = nullptr, const ApplyChainOptions& options = {});

// Serialises to the byte format of docs/formats.md.
std::vector<uint8_t> SerializeModelDelta(const ModelDelta& delta);
// The size SerializeModelDelta would produce, without copying any payload.
uint64_t SerializedSize(const ModelDelta& delta);
// Parses and checks structure and every checksum. Sparse payloads are decoded (and checked in
// full) by ApplyTensorDelta and SquashTensorDeltas, context payloads by ApplyTensorDelta and
// SquashChainOnBase. The result points into `bytes`.
Result<ModelDelta> ParseModelDelta(std::span<const uint8_t> bytes);
// The same, calling `parsed(n)` after each tensor with the bytes of `bytes` read so far (a caller
// parsing a mapped file may let the pages before that go; they are read again when applied).
Result<ModelDelta> ParseModelDelta(std::span<const uint8_t> bytes,
                                   const std::function<void(uint64_t)>& parsed);

// Statistics for `weft delta inspect` and the benchmarks.
struct DeltaStats {
  uint64_t units = 0;           // coded units over all tensors
  uint16_t format_version = 0;  // as written (1 without context chunks, else 2)
  uint64_t unchanged_chunks = 0;
  uint64_t sparse_chunks = 0;
  uint64_t context_chunks = 0;
  uint64_t raw_chunks = 0;
  uint64_t sparse_units = 0;  // units in sparse or unchanged chunks
  uint64_t raw_units = 0;
  uint64_t changes = 0;       // changed units in sparse and context chunks
  uint64_t big_changes = 0;   // of which magnitude > 1
  uint64_t header_bytes = 0;  // file header, tensor headers, chunk headers and checksums
  uint64_t gap_bytes = 0;     // positions, in either mode
  uint64_t sign_bytes = 0;
  uint64_t big_bytes = 0;
  uint64_t magnitude_bytes = 0;
  uint64_t raw_bytes = 0;
  uint64_t total_bytes = 0;  // serialised size
};
DeltaStats ComputeStats(const ModelDelta& delta);

}  // namespace weft::sync
