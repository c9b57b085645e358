// Deltas and their context chunks (delta_codec.h): recoding between modes, and squashing chains
// on their base.
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include <xxhash.h>

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
// returns the digest change; with kWrite false, only the digest change (`values` unchanged).
// Works through the changes a block at a time, so that its memory does not grow with the chunk's.
template <typename T, bool kWrite = true>
Digest ApplyChanges(KeyKind kind, const ChangeList& list, uint64_t first, uint8_t* values) {
  constexpr size_t kBlock = 2048;
  uint32_t old_values[kBlock], new_values[kBlock];
  Digest change;
  for (size_t begin = 0; begin < list.size(); begin += kBlock) {
    const size_t n = std::min(kBlock, list.size() - begin);
    const uint32_t* offsets = list.offsets.data() + begin;
    const uint32_t* residuals = list.residuals.data() + begin;
    for (size_t j = 0; j < n; ++j) {
      const T old_value = detail::Load<T>(values, offsets[j]);
      const T new_value = ApplyResidual<T>(kind, old_value, static_cast<T>(residuals[j]));
      old_values[j] = old_value;
      new_values[j] = new_value;
      if constexpr (kWrite) detail::Store<T>(values, offsets[j], new_value);
    }
    change += SumElementChanges(first, offsets, old_values, new_values, n);
  }
  return change;
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

namespace {

// A chain of deltas lined up per tensor of its first delta: links[t][k] is delta k's delta of
// tensor t, base_of[t] the bytes it starts from (checked by digest).
struct LinkedChain {
  std::vector<std::vector<const TensorDelta*>> links;
  std::vector<const TensorBytes*> base_of;
};

// Checks that every delta of `chain` covers the first's tensors with the same dtypes, shapes and
// chunking, that each starts where the one before ends, and that `base` holds the first's bases.
// On a delta that does not fit, `*failed` (when given) is its index.
Result<LinkedChain> LinkChain(std::span<const ModelDelta* const> chain,
                              const std::vector<TensorBytes>& base, int threads, size_t* failed) {
  if (chain.empty()) return InvalidArgument("an empty chain of deltas");
  auto fail = [&](size_t i, Status status) {
    if (failed != nullptr) *failed = i;
    return status;
  };
  const ModelDelta& head = *chain[0];
  const TensorIndex base_index = IndexByName(base);
  const size_t tensors = head.tensors.size();
  LinkedChain linked;
  linked.links.resize(tensors);
  linked.base_of.resize(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    const TensorDelta& first = head.tensors[t];
    Result<const TensorBytes*> base_of =
        TensorAt(base_index, first.spec, first.base_digest, "base", threads);
    if (!base_of.ok()) return fail(0, base_of.status());
    if (*base_of == nullptr) {
      return fail(0, InvalidArgument("tensor '" + first.spec.name + "' is not in the base"));
    }
    linked.base_of[t] = *base_of;
    std::vector<const TensorDelta*>& links = linked.links[t];
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
      if (i > 0 && link->base_digest != links.back()->result_digest) {
        return fail(
            i, Conflict("tensor '" + first.spec.name + "': delta " + std::to_string(i) +
                        " starts from digest " + link->base_digest.ToHex() +
                        ", but the one before ends at " + links.back()->result_digest.ToHex()));
      }
      links.push_back(link);
    }
  }
  return linked;
}

// What a thread needs to walk chunks: the chunk's units as a chain goes (a copy), and one link's
// decoded changes. Each loop over chunks gives each of its threads one, freed when the loop ends,
// so that the memory is not held for the life of the pool's threads.
struct WalkScratch {
  std::vector<uint8_t> values;
  ChangeList list;
};

// The most changes one link decodes in chunk c (a raw chunk's scan finds at most its units).
uint64_t MostChanges(const std::vector<const TensorDelta*>& links, size_t c) {
  uint64_t most = 0;
  for (const TensorDelta* link : links) {
    const DeltaChunk& chunk = link->chunks[c];
    const uint64_t units = link->UnitsInChunk(c);
    const uint64_t n = chunk.mode == ChunkMode::kSparse    ? chunk.sparse.change_count
                       : chunk.mode == ChunkMode::kContext ? chunk.context.change_count()
                       : chunk.mode == ChunkMode::kRaw     ? units
                                                           : 0;
    most = std::max(most, std::min(n, units));
  }
  return most;
}

// Runs fn(i, scratch) for every i in [0, count) on up to `threads` threads, each thread with a
// WalkScratch of its own whose change list has room for `changes` from the start: grown chunk by
// chunk, it would leave the allocator holes the size of the lists it outgrew.
void ForEachChunk(size_t count, int threads, uint64_t changes,
                  const std::function<void(size_t, WalkScratch&)>& fn) {
  std::atomic<size_t> next{0};
  const size_t workers = std::min<size_t>(count, static_cast<size_t>(std::max(threads, 1)));
  ParallelFor(workers, threads, [&](size_t) {
    WalkScratch scratch;
    // The scan kernels size a list a few entries past what they fill.
    scratch.list.offsets.reserve(changes + 16);
    scratch.list.residuals.reserve(changes + 16);
    for (size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i, scratch);
  });
}

// Walks chunk c of a tensor through every link of its chain, changing `values` (the chunk's
// units) in place. With `changes` (one per link), records what each link changes in the digest;
// without, only writes. With `write` false (a chain of one link, `changes` given), records the
// digest change and leaves `values` as they are. On a malformed chunk returns its error and sets
// `*failed_link`.
Status WalkChunk(const std::vector<const TensorDelta*>& links, size_t c, uint8_t* values,
                 Digest* changes, size_t* failed_link, ChangeList& list, bool write = true) {
  assert(write || (links.size() == 1 && changes != nullptr));
  const TensorDelta& head = *links.front();
  const TensorSpec& spec = head.spec;
  const uint8_t width = CodedWidth(spec.dtype);
  const KeyKind kind = KeyKindFor(spec.dtype);
  const uint64_t first = uint64_t{c} << head.chunk_log2;
  const uint32_t units = head.UnitsInChunk(c);
  for (size_t k = 0; k < links.size(); ++k) {
    const TensorDelta& link = *links[k];
    const DeltaChunk& chunk = link.chunks[c];
    if (chunk.mode == ChunkMode::kUnchanged) continue;
    if (chunk.mode == ChunkMode::kRaw) {
      if (chunk.payload.size() != size_t{units} * width) {
        *failed_link = k;
        return DataLoss(ChunkContext(spec, c) + ": raw chunk has the wrong length");
      }
      if (changes != nullptr) {
        list.clear();
        ScanChanges(kind, width, values, chunk.payload.data(), units, 0, first, &list, &changes[k]);
      }
      if (write) std::memcpy(values, chunk.payload.data(), chunk.payload.size());
      continue;
    }
    list.clear();
    Status status = DecodeChunk(link, c, values, &list);
    if (!status.ok()) {
      *failed_link = k;
      return status;
    }
    const Digest change = WithUnitType(width, [&]<typename T>() {
      return write ? ApplyChanges<T>(kind, list, first, values)
                   : ApplyChanges<T, false>(kind, list, first, values);
    });
    if (changes != nullptr) changes[k] = change;
  }
  list.clear();
  return Status::Ok();
}

// Whether any link changes chunk c.
bool ChunkTouched(const std::vector<const TensorDelta*>& links, size_t c) {
  for (const TensorDelta* link : links) {
    if (link->chunks[c].mode != ChunkMode::kUnchanged) return true;
  }
  return false;
}

// The error of the earliest link that failed in any chunk (the link the chain broke at), or Ok.
Status EarliestFailure(const std::vector<Status>& statuses, const std::vector<size_t>& failed_link,
                       size_t links, size_t* failed) {
  size_t first_failure = links;
  Status first_status = Status::Ok();
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (!statuses[i].ok() && failed_link[i] < first_failure) {
      first_failure = failed_link[i];
      first_status = statuses[i];
    }
  }
  if (!first_status.ok() && failed != nullptr) *failed = first_failure;
  return first_status;
}

// Proves that every link lands on its result digest, from the digest changes walked per chunk
// (`changes[i][k]`: chunk `chunks[i]`, link k): a link made for another base fails here.
Status ProveLinks(const LinkedChain& linked, const std::vector<ChunkRef>& chunks,
                  const std::vector<std::vector<Digest>>& changes, size_t* failed) {
  const size_t tensors = linked.links.size();
  const size_t links = tensors == 0 ? 0 : linked.links[0].size();
  for (size_t k = 0; k < links; ++k) {
    std::vector<Digest> reached(tensors);
    for (size_t t = 0; t < tensors; ++t) reached[t] = linked.links[t][k]->base_digest;
    for (size_t i = 0; i < chunks.size(); ++i) reached[chunks[i].tensor] += changes[i][k];
    for (size_t t = 0; t < tensors; ++t) {
      const TensorDelta& link = *linked.links[t][k];
      if (reached[t] != link.result_digest) {
        if (failed != nullptr) *failed = k;
        return DataLoss("tensor '" + link.spec.name + "': delta " + std::to_string(k) +
                        " gives digest " + reached[t].ToHex() + ", not its result digest " +
                        link.result_digest.ToHex());
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ModelDelta> SquashChainOnBase(std::span<const ModelDelta* const> chain,
                                     const std::vector<TensorBytes>& base, DeltaMode mode,
                                     int threads, size_t* failed) {
  if (chain.empty()) return InvalidArgument("an empty chain of deltas has nothing to squash");
  WEFT_ASSIGN_OR_RETURN(LinkedChain linked, LinkChain(chain, base, threads, failed));
  const ModelDelta& head = *chain[0];
  const size_t tensors = head.tensors.size();
  ModelDelta squashed;
  squashed.tensors.resize(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    squashed.tensors[t] = detail::NewDelta(head.tensors[t].spec, head.tensors[t].chunk_log2);
    squashed.tensors[t].base_digest = head.tensors[t].base_digest;
    squashed.tensors[t].result_digest = linked.links[t].back()->result_digest;
  }
  const std::vector<ChunkRef> chunks = AllChunks(head);
  // Digest changes per chunk and link, to prove every link's result digest.
  std::vector<std::vector<Digest>> changes(chunks.size(), std::vector<Digest>(chain.size()));
  std::vector<Status> statuses(chunks.size());
  std::vector<size_t> failed_link(chunks.size(), chain.size());
  uint64_t most = 0;
  for (const auto [t, c] : chunks) most = std::max(most, MostChanges(linked.links[t], c));
  ForEachChunk(chunks.size(), threads, most, [&](size_t i, WalkScratch& scratch) {
    const auto [t, c] = chunks[i];
    const TensorSpec& spec = head.tensors[t].spec;
    const uint8_t width = CodedWidth(spec.dtype);
    const uint64_t first = uint64_t{c} << head.tensors[t].chunk_log2;
    const uint32_t units = head.tensors[t].UnitsInChunk(c);
    const uint8_t* original = linked.base_of[t]->bytes.data() + first * width;
    // The chunk as the chain goes, built from the base: one chunk's memory per thread.
    std::vector<uint8_t>& values = scratch.values;
    values.assign(original, original + size_t{units} * width);
    statuses[i] = WalkChunk(linked.links[t], c, values.data(), changes[i].data(), &failed_link[i],
                            scratch.list);
    if (!statuses[i].ok()) return;
    ChangeList list;
    ScanChanges(KeyKindFor(spec.dtype), width, original, values.data(), units, 0, first, &list,
                nullptr);
    const detail::ContextSource source{spec.dtype, units, original, nullptr};
    squashed.tensors[t].chunks[c] = MakeChunk(list, values, width, CodingFor(spec.dtype),
                                              mode == DeltaMode::kContext ? &source : nullptr);
  });
  WEFT_RETURN_IF_ERROR(EarliestFailure(statuses, failed_link, chain.size(), failed));
  WEFT_RETURN_IF_ERROR(ProveLinks(linked, chunks, changes, failed));
  return squashed;
}

Status ApplyChain(std::span<const ModelDelta* const> chain, const std::vector<TensorBytes>& served,
                  std::span<const std::span<uint8_t>> writable, int threads, size_t* failed,
                  const ApplyChainOptions& options) {
  if (writable.size() != served.size()) {
    return InvalidArgument("ApplyChain needs a writable span for every served tensor");
  }
  for (size_t i = 0; i < served.size(); ++i) {
    if (writable[i].data() != served[i].bytes.data() ||
        writable[i].size() != served[i].bytes.size()) {
      return InvalidArgument("tensor '" + served[i].spec.name +
                             "': its writable span is not its served bytes");
    }
  }
  WEFT_ASSIGN_OR_RETURN(LinkedChain linked, LinkChain(chain, served, threads, failed));
  const ModelDelta& head = *chain[0];
  const size_t links = chain.size();
  // Only the chunks some delta changes are walked: twice, first on a copy to prove every link's
  // digest, then in place.
  std::vector<ChunkRef> chunks;
  uint64_t most = 0;
  for (const ChunkRef& chunk : AllChunks(head)) {
    if (!ChunkTouched(linked.links[chunk.tensor], chunk.chunk)) continue;
    chunks.push_back(chunk);
    most = std::max(most, MostChanges(linked.links[chunk.tensor], chunk.chunk));
  }
  auto payload = [&](size_t i, size_t k) -> std::span<const uint8_t> {
    return linked.links[chunks[i].tensor][k]->chunks[chunks[i].chunk].payload;
  };
  // Windows of chunks, [first, end): one for all of them, unless the payloads' memory is let go
  // window by window.
  const bool releasing = static_cast<bool>(options.release);
  std::vector<std::pair<size_t, size_t>> windows;
  for (size_t begin = 0, i = 0; i < chunks.size();) {
    uint64_t bytes = 0;
    while (i < chunks.size() && (!releasing || bytes < options.window_bytes)) {
      for (size_t k = 0; k < links; ++k) bytes += payload(i, k).size();
      ++i;
    }
    windows.emplace_back(begin, i);
    begin = i;
  }
  auto release_window = [&](const std::pair<size_t, size_t>& window) {
    if (!releasing) return;
    for (size_t k = 0; k < links; ++k) {
      const uint8_t* low = nullptr;
      const uint8_t* high = nullptr;
      for (size_t i = window.first; i < window.second; ++i) {
        const std::span<const uint8_t> bytes = payload(i, k);
        if (bytes.empty()) continue;
        if (low == nullptr || bytes.data() < low) low = bytes.data();
        if (high == nullptr || bytes.data() + bytes.size() > high)
          high = bytes.data() + bytes.size();
      }
      if (low != nullptr) options.release(k, {low, static_cast<size_t>(high - low)});
    }
  };
  // What the first walk read of each payload (releasing only: the second reads it again).
  std::vector<uint64_t> sums(releasing ? chunks.size() * links : 0);
  std::vector<std::vector<Digest>> changes(chunks.size(), std::vector<Digest>(links));
  std::vector<Status> statuses(chunks.size());
  std::vector<size_t> failed_link(chunks.size(), links);
  auto chunk_bytes = [&](const ChunkRef& chunk) {
    const TensorDelta& tensor = head.tensors[chunk.tensor];
    const uint8_t width = CodedWidth(tensor.spec.dtype);
    const size_t begin = (size_t{chunk.chunk} << tensor.chunk_log2) * width;
    const size_t index = static_cast<size_t>(linked.base_of[chunk.tensor] - served.data());
    return writable[index].subspan(begin, size_t{tensor.UnitsInChunk(chunk.chunk)} * width);
  };
  // A chain of one delta is walked on the served bytes without writing them; a longer one on a
  // copy of the chunk, as each link decodes against what the links before it wrote.
  const bool copy = links > 1;
  for (const auto& window : windows) {
    ForEachChunk(window.second - window.first, threads, most, [&](size_t j, WalkScratch& scratch) {
      const size_t i = window.first + j;
      if (releasing) {
        for (size_t k = 0; k < links; ++k) {
          const std::span<const uint8_t> bytes = payload(i, k);
          sums[i * links + k] = XXH3_64bits(bytes.data(), bytes.size());
        }
      }
      const std::span<uint8_t> original = chunk_bytes(chunks[i]);
      uint8_t* values = original.data();
      if (copy) {
        scratch.values.assign(original.begin(), original.end());
        values = scratch.values.data();
      }
      statuses[i] = WalkChunk(linked.links[chunks[i].tensor], chunks[i].chunk, values,
                              changes[i].data(), &failed_link[i], scratch.list, copy);
    });
    release_window(window);
  }
  WEFT_RETURN_IF_ERROR(EarliestFailure(statuses, failed_link, links, failed));
  WEFT_RETURN_IF_ERROR(ProveLinks(linked, chunks, changes, failed));
  // Proven: the same walk, now on the served bytes. It decodes what already decoded, so it
  // cannot fail, unless bytes read again are not what the first walk read.
  for (size_t w = 0; w < windows.size(); ++w) {
    const auto& window = windows[w];
    if (releasing) {
      std::atomic<size_t> changed{SIZE_MAX};
      ParallelFor(window.second - window.first, threads, [&](size_t j) {
        const size_t i = window.first + j;
        for (size_t k = 0; k < links; ++k) {
          const std::span<const uint8_t> bytes = payload(i, k);
          if (XXH3_64bits(bytes.data(), bytes.size()) != sums[i * links + k]) changed.store(k);
        }
      });
      if (changed.load() != SIZE_MAX) {
        if (failed != nullptr) *failed = changed.load();
        if (options.partly_written != nullptr) *options.partly_written = w > 0;
        return DataLoss("delta " + std::to_string(changed.load()) +
                        " changed between the two walks of the chain (its bytes were read again "
                        "from where they are kept)" +
                        (w > 0 ? "; part of the chain was written" : ""));
      }
    }
    ForEachChunk(window.second - window.first, threads, most, [&](size_t j, WalkScratch& scratch) {
      const size_t i = window.first + j;
      size_t unused = 0;
      [[maybe_unused]] const Status status =
          WalkChunk(linked.links[chunks[i].tensor], chunks[i].chunk, chunk_bytes(chunks[i]).data(),
                    nullptr, &unused, scratch.list);
      assert(status.ok());
    });
    release_window(window);
  }
  return Status::Ok();
}

}  // namespace weft::sync
