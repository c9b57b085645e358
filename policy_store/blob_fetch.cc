#include "policy_store/blob_fetch.h"

#include <openssl/evp.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "common/concurrent.h"
#include "common/hex.h"
#include "common/logging.h"

namespace weft::policy_store {
namespace {

constexpr int kFetches = 3;

struct Part {
  size_t blob = 0;  // index into the blobs of this round
  uint64_t offset = 0;
  uint64_t size = 0;
};

// One blob's state in a round: its hash so far and the parts that arrived ahead of it.
struct BlobState {
  explicit BlobState(const BlobFetch& fetch) : fetch(fetch) {
    EVP_DigestInit_ex(hash.get(), EVP_sha256(), nullptr);
  }
  const BlobFetch& fetch;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> hash{EVP_MD_CTX_new(), EVP_MD_CTX_free};
  uint64_t hashed = 0;  // bytes hashed, from the start
  // Parts waiting to be hashed, by offset: the size each should have, and what arrived.
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint8_t>>> arrived;
  bool hashing = false;  // a thread is hashing its parts
  bool damaged = false;  // a part had the wrong size
  Status sink_error;     // the first error of its sink
};

// One pass over `blobs`; the ones that arrived damaged (size or hash) are added to `damaged`.
Status FetchRound(ObjectStore& store, const std::vector<const BlobFetch*>& blobs,
                  const FetchOptions& options, std::vector<size_t>* damaged) {
  const uint64_t part_bytes =
      store.ReadsRanges() ? std::max<uint64_t>(options.part_bytes, 1) : UINT64_MAX;
  std::vector<Part> parts;
  std::vector<std::unique_ptr<BlobState>> states;
  for (size_t b = 0; b < blobs.size(); ++b) {
    states.push_back(std::make_unique<BlobState>(*blobs[b]));
    const uint64_t size = blobs[b]->blob.bytes;
    uint64_t offset = 0;
    do {
      const uint64_t length = std::min(part_bytes, size - offset);
      parts.push_back({b, offset, length});
      offset += length;
    } while (offset < size);
  }
  std::mutex mutex;
  std::condition_variable room;
  uint64_t held = 0;  // bytes of parts in flight or waiting to be hashed
  bool stopped = false;

  const Status fetched =
      ForEachConcurrently(parts.size(), std::max(1, options.concurrency), [&](size_t i) -> Status {
        const Part& part = parts[i];
        BlobState& state = *states[part.blob];
        {
          std::unique_lock<std::mutex> lock(mutex);
          room.wait(lock, [&] {
            return stopped || held + part.size <= options.max_buffered_bytes ||
                   state.hashed == part.offset;
          });
          if (stopped) return Status::Ok();  // the failure is reported by its own part
          held += part.size;
        }
        // (An empty blob is asked for one byte: the answer says it exists and holds none.)
        Result<ObjectRange> got = store.GetRange(BlobKey(state.fetch.blob.sha256), part.offset,
                                                 std::max<uint64_t>(part.size, 1));
        if (!got.ok()) {
          std::lock_guard<std::mutex> lock(mutex);
          stopped = true;
          room.notify_all();
          return got.status().WithContext(state.fetch.what);
        }
        ObjectRange range = std::move(got).value();
        const bool whole =
            range.object_size == state.fetch.blob.bytes && range.bytes.size() == part.size;
        if (whole) {
          Status placed = state.fetch.sink->Place(part.offset, range.bytes);
          if (!placed.ok()) {
            std::lock_guard<std::mutex> lock(mutex);
            if (state.sink_error.ok()) state.sink_error = std::move(placed);
          }
        }
        // Hashed in order: this thread hashes every part that can be hashed next, unless another
        // thread is doing so for this blob (it will take this part too).
        std::unique_lock<std::mutex> lock(mutex);
        if (!whole) state.damaged = true;
        state.arrived[part.offset] = {part.size, std::move(range.bytes)};
        if (state.hashing) return Status::Ok();
        state.hashing = true;
        while (!state.arrived.empty() && state.arrived.begin()->first == state.hashed) {
          auto next = state.arrived.extract(state.arrived.begin());
          const bool skip = state.damaged;  // it will be fetched again anyway
          lock.unlock();
          const std::vector<uint8_t>& bytes = next.mapped().second;
          if (!skip) EVP_DigestUpdate(state.hash.get(), bytes.data(), bytes.size());
          lock.lock();
          state.hashed += next.mapped().first;
          held -= next.mapped().first;
          room.notify_all();
        }
        state.hashing = false;
        return Status::Ok();
      });
  if (!fetched.ok()) return fetched;

  for (size_t b = 0; b < blobs.size(); ++b) {
    BlobState& state = *states[b];
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(state.hash.get(), digest, &length);
    const bool good = !state.damaged && state.hashed == state.fetch.blob.bytes &&
                      HexEncode({digest, length}) == state.fetch.blob.sha256;
    if (!good) {
      damaged->push_back(b);
    } else if (!state.sink_error.ok()) {
      return state.sink_error.WithContext(state.fetch.what);
    }
  }
  return Status::Ok();
}

}  // namespace

Status BytesSink::Place(uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::Ok();
  if (offset > bytes_.size() || bytes.size() > bytes_.size() - offset)
    return DataLoss("bytes past the blob's end");
  std::memcpy(bytes_.data() + offset, bytes.data(), bytes.size());
  return Status::Ok();
}

Status FetchBlobs(ObjectStore& store, std::span<const BlobFetch> blobs,
                  const FetchOptions& options) {
  std::vector<const BlobFetch*> round;
  for (const BlobFetch& fetch : blobs) round.push_back(&fetch);
  for (int attempt = 1; !round.empty(); ++attempt) {
    std::vector<size_t> damaged;
    WEFT_RETURN_IF_ERROR(FetchRound(store, round, options, &damaged));
    std::vector<const BlobFetch*> again;
    for (size_t b : damaged) {
      const BlobFetch& fetch = *round[b];
      // Corrupted in transit, or at rest: fetch it again; a copy corrupted at rest stays so.
      WEFT_LOG(kWarning) << fetch.what << ": blob " << fetch.blob.sha256 << " from "
                         << store.Describe() << " does not match its size and hash (fetch "
                         << attempt << " of " << kFetches << ")";
      if (attempt == kFetches) {
        return DataLoss(fetch.what + ": blob " + fetch.blob.sha256 +
                        " is corrupted (its content does not match its hash on " +
                        std::to_string(kFetches) + " fetches)");
      }
      fetch.sink->Restart();
      again.push_back(&fetch);
    }
    round = std::move(again);
  }
  return Status::Ok();
}

}  // namespace weft::policy_store
