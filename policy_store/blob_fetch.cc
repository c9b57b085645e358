#include "policy_store/blob_fetch.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "common/concurrent.h"
#include "common/logging.h"

namespace weft::policy_store {
namespace {

constexpr int kFetches = 3;
// A blob the store refuses as damaged (kDataLoss: a relay's upstream sent other bytes) is asked
// for once more, then reported.
constexpr int kSourceFetches = 2;
// The first part of a blob whose sink wants it before the others (a keyframe: its header): small,
// so that the other parts wait for one short request only.
constexpr uint64_t kFirstPartBytes = uint64_t{1} << 20;

struct Part {
  size_t blob = 0;  // index into the blobs of this round
  uint64_t offset = 0;
  uint64_t size = 0;
};

// One blob's state in a round: its hash so far and the parts that arrived ahead of it.
struct BlobState {
  explicit BlobState(const BlobFetch& fetch) : fetch(fetch) {}
  const BlobFetch& fetch;
  Sha256 hash;
  uint64_t hashed = 0;  // bytes hashed, from the start
  // A part that arrived, waiting to be hashed: the size it should have, its bytes (in `buffer`, or
  // in the sink's windows, `views`) and the buffered bytes it counts against the memory bound.
  struct Arrived {
    uint64_t size = 0;
    std::vector<uint8_t> buffer;
    std::vector<std::span<const uint8_t>> views;
    uint64_t counted = 0;
    bool in_file = false;  // in the sink's file, read back to be hashed
  };
  std::map<uint64_t, Arrived> arrived;  // by offset
  bool hashing = false;                 // a thread is hashing its parts
  bool damaged = false;                 // a part had the wrong size
  Status source_error;                  // the store said its bytes are not the blob (kDataLoss)
  bool first_done = false;              // its first part has been placed (StartFirst)
  Status sink_error;                    // the first error of its sink
};

// Where a part of a blob that a sink keeps in a file goes: straight to its place in the file as the
// bytes arrive.
class FileTarget : public BodyTarget {
 public:
  FileTarget(int fd, uint64_t offset, uint64_t size) : fd_(fd), offset_(offset), size_(size) {}
  Status Write(std::span<const uint8_t> bytes) override {
    if (bytes.size() > size_ - written_) return DataLoss("more bytes arrived than the part holds");
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t wrote = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                                     static_cast<off_t>(offset_ + written_ + done));
      if (wrote < 0) {
        if (errno == EINTR) continue;
        return Unavailable(std::string("cannot write a spill file: ") + std::strerror(errno));
      }
      done += static_cast<size_t>(wrote);
    }
    written_ += bytes.size();
    return Status::Ok();
  }
  Status Rewind() override {
    written_ = 0;
    return Status::Ok();
  }
  uint64_t written() const { return written_; }

 private:
  int fd_;
  uint64_t offset_;
  uint64_t size_;
  uint64_t written_ = 0;
};

// Adds bytes [offset, offset + size) of a file to a hash, read back a megabyte at a time.
Status HashFromFile(int fd, uint64_t offset, uint64_t size, Sha256& hash) {
  std::vector<uint8_t> buffer(std::min<uint64_t>(size, 1 << 20));
  for (uint64_t done = 0; done < size;) {
    const ssize_t got = ::pread(fd, buffer.data(), std::min<uint64_t>(buffer.size(), size - done),
                                static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return DataLoss("a spill file is shorter than what was written to it");
    hash.Update(std::span<const uint8_t>(buffer).first(static_cast<size_t>(got)));
    done += static_cast<size_t>(got);
  }
  return Status::Ok();
}

// A blob of a round that must be fetched again: its index, and the store's own verdict on it
// when the store refused it as damaged (ok when the fetcher found the damage).
struct Damaged {
  size_t blob = 0;
  Status source_error;
};

// One pass over `blobs`; the ones that arrived damaged (size or hash), or that the store refused
// as damaged, are added to `damaged`.
Status FetchRound(ObjectStore& store, const std::vector<const BlobFetch*>& blobs,
                  const FetchOptions& options, std::vector<Damaged>* damaged) {
  const uint64_t part_bytes =
      store.ReadsRanges() ? std::max<uint64_t>(options.part_bytes, 1) : UINT64_MAX;
  std::vector<Part> parts;
  std::vector<std::unique_ptr<BlobState>> states;
  for (size_t b = 0; b < blobs.size(); ++b) {
    states.push_back(std::make_unique<BlobState>(*blobs[b]));
    const uint64_t size = blobs[b]->blob.bytes;
    const bool start_first = store.ReadsRanges() && blobs[b]->sink->StartFirst();
    uint64_t offset = 0;
    do {
      const uint64_t length =
          std::min(offset == 0 && start_first ? std::min(part_bytes, kFirstPartBytes) : part_bytes,
                   size - offset);
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
        BlobSink& sink = *state.fetch.sink;
        const std::string key = BlobKey(state.fetch.blob.sha256);
        if (part.offset > 0 && sink.StartFirst()) {
          std::unique_lock<std::mutex> lock(mutex);
          room.wait(lock, [&] { return stopped || state.first_done; });
          if (stopped) return Status::Ok();
        }
        const std::vector<std::span<uint8_t>> windows = part.size > 0
                                                            ? sink.Windows(part.offset, part.size)
                                                            : std::vector<std::span<uint8_t>>();
        uint64_t window_bytes = 0;
        for (std::span<uint8_t> window : windows) window_bytes += window.size();
        const bool in_place = part.size > 0 && window_bytes == part.size;
        const uint64_t counted = in_place || sink.file() >= 0 ? 0 : part.size;
        {
          std::unique_lock<std::mutex> lock(mutex);
          room.wait(lock, [&] {
            return stopped || held + counted <= options.max_buffered_bytes ||
                   state.hashed == part.offset;
          });
          if (stopped) return Status::Ok();  // the failure is reported by its own part
          held += counted;
        }
        // The store's verdict that its bytes are not the blob's (a relay whose upstream sent
        // others) fails the blob, not the round: it is fetched again, then reported.
        bool refused = false;
        auto fail = [&](const Status& status) {
          std::lock_guard<std::mutex> lock(mutex);
          if (status.code() == StatusCode::kDataLoss) {
            if (state.source_error.ok()) state.source_error = status;
            refused = true;
            return Status::Ok();
          }
          stopped = true;
          room.notify_all();
          return status.WithContext(state.fetch.what);
        };
        BlobState::Arrived arrived{part.size, {}, {}, counted};
        bool whole = false;
        Status placed = Status::Ok();
        bool skip_part = false;
        {
          std::lock_guard<std::mutex> lock(mutex);
          skip_part = !state.source_error.ok();  // refused already: fetched again anyway
        }
        if (skip_part) {
          // Nothing read: counted as arrived so that the round ends.
        } else if (sink.file() >= 0) {
          FileTarget target(sink.file(), part.offset, part.size);
          // (An empty blob is asked for one byte: the answer says it exists and holds none.)
          Result<uint64_t> got =
              store.ReadTo(key, part.offset, std::max<uint64_t>(part.size, 1), target);
          if (got.ok()) {
            whole = *got == state.fetch.blob.bytes && target.written() == part.size;
            arrived.in_file = true;
          } else {
            WEFT_RETURN_IF_ERROR(fail(got.status()));
          }
        } else if (in_place) {
          whole = true;
          uint64_t at = part.offset;
          for (std::span<uint8_t> window : windows) {
            if (window.empty()) continue;
            Result<RangeRead> got = store.GetRangeInto(key, at, window);
            if (!got.ok()) {
              WEFT_RETURN_IF_ERROR(fail(got.status()));
              whole = false;
              break;
            }
            arrived.views.push_back(window.first(std::min<uint64_t>(got->read, window.size())));
            at += got->read;
            if (got->object_size != state.fetch.blob.bytes || got->read != window.size()) {
              whole = false;
              break;
            }
          }
          if (whole) placed = sink.Placed(part.offset, part.size);
        } else {
          // (An empty blob is asked for one byte: the answer says it exists and holds none.)
          Result<ObjectRange> got =
              store.GetRange(key, part.offset, std::max<uint64_t>(part.size, 1));
          if (got.ok()) {
            whole = got->object_size == state.fetch.blob.bytes && got->bytes.size() == part.size;
            arrived.buffer = std::move(got->bytes);
            if (whole) placed = sink.Place(part.offset, arrived.buffer);
          } else {
            WEFT_RETURN_IF_ERROR(fail(got.status()));
          }
        }
        // Hashed in order: this thread hashes every part that can be hashed next, unless another
        // thread is doing so for this blob (it will take this part too).
        std::unique_lock<std::mutex> lock(mutex);
        if (!placed.ok() && state.sink_error.ok()) state.sink_error = std::move(placed);
        if (!whole || refused || skip_part) state.damaged = true;
        if (part.offset == 0) {
          state.first_done = true;
          room.notify_all();
        }
        state.arrived[part.offset] = std::move(arrived);
        if (state.hashing) return Status::Ok();
        state.hashing = true;
        while (!state.arrived.empty() && state.arrived.begin()->first == state.hashed) {
          auto next = state.arrived.extract(state.arrived.begin());
          const bool skip = state.damaged;  // it will be fetched again anyway
          lock.unlock();
          const BlobState::Arrived& done = next.mapped();
          if (!skip && done.in_file) {
            const Status read = HashFromFile(sink.file(), state.hashed, done.size, state.hash);
            if (!read.ok()) {
              lock.lock();
              state.damaged = true;
              lock.unlock();
            }
          } else if (!skip) {
            state.hash.Update(done.buffer);
            for (std::span<const uint8_t> view : done.views) state.hash.Update(view);
          }
          lock.lock();
          state.hashed += done.size;
          held -= done.counted;
          room.notify_all();
        }
        state.hashing = false;
        return Status::Ok();
      });
  if (!fetched.ok()) return fetched;

  for (size_t b = 0; b < blobs.size(); ++b) {
    BlobState& state = *states[b];
    const bool good = !state.damaged && state.hashed == state.fetch.blob.bytes &&
                      state.hash.HexDigest() == state.fetch.blob.sha256;
    if (!good) {
      damaged->push_back({b, state.source_error});
    } else if (!state.sink_error.ok()) {
      return state.sink_error.WithContext(state.fetch.what);
    }
  }
  return Status::Ok();
}

}  // namespace

FetchOptions FetchOptionsFor(const ObjectStore& store) {
  const BlobReads reads = store.blob_reads();
  FetchOptions options;
  options.part_bytes = reads.part_bytes;
  options.concurrency = reads.parallel;
  return options;
}

Status BytesSink::Place(uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::Ok();
  if (offset > bytes_.size() || bytes.size() > bytes_.size() - offset)
    return DataLoss("bytes past the blob's end");
  std::memcpy(bytes_.data() + offset, bytes.data(), bytes.size());
  return Status::Ok();
}

std::vector<std::span<uint8_t>> BytesSink::Windows(uint64_t offset, uint64_t size) {
  if (offset > bytes_.size() || size > bytes_.size() - offset) return {};
  return {std::span<uint8_t>(bytes_).subspan(offset, size)};
}

Status FetchBlobs(ObjectStore& store, std::span<const BlobFetch> blobs,
                  const FetchOptions& options) {
  std::vector<const BlobFetch*> round;
  for (const BlobFetch& fetch : blobs) round.push_back(&fetch);
  for (int attempt = 1; !round.empty(); ++attempt) {
    std::vector<Damaged> damaged;
    WEFT_RETURN_IF_ERROR(FetchRound(store, round, options, &damaged));
    std::vector<const BlobFetch*> again;
    for (const Damaged& bad : damaged) {
      const BlobFetch& fetch = *round[bad.blob];
      if (!bad.source_error.ok()) {
        // The store itself says its bytes are not the blob's: asked once more, then reported.
        WEFT_LOG(kWarning) << fetch.what << ": blob " << fetch.blob.sha256 << " refused by "
                           << store.Describe() << " (fetch " << attempt << " of " << kSourceFetches
                           << "): " << bad.source_error.message();
        if (attempt >= kSourceFetches) {
          return DataLoss(fetch.what + ": blob " + fetch.blob.sha256 + " from " + store.Describe() +
                          " is not what its name says on " + std::to_string(attempt) +
                          " fetches: " + bad.source_error.message());
        }
      } else {
        // Corrupted in transit, or at rest: fetch it again; a copy corrupted at rest stays so.
        WEFT_LOG(kWarning) << fetch.what << ": blob " << fetch.blob.sha256 << " from "
                           << store.Describe() << " does not match its size and hash (fetch "
                           << attempt << " of " << kFetches << ")";
        if (attempt >= kFetches) {
          return DataLoss(fetch.what + ": blob " + fetch.blob.sha256 +
                          " is corrupted (its content does not match its hash on " +
                          std::to_string(attempt) + " fetches)");
        }
      }
      fetch.sink->Restart();
      again.push_back(&fetch);
    }
    round = std::move(again);
  }
  return Status::Ok();
}

}  // namespace weft::policy_store
