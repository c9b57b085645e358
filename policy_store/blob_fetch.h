// FetchBlobs: blobs fetched in parts, several requests at once, and checked as they arrive.
//
// Each blob is cut into parts of `part_bytes`; parts of every blob are requested in order, up to
// `concurrency` at a time (ObjectStore::GetRange; a store that reads whole objects gets one part
// per blob). Where a sink can say where a part belongs (BlobSink::Windows), the part is read
// straight there (ObjectStore::GetRangeInto: with no buffer at all from a directory or a cache's
// checked file); otherwise it arrives in a buffer and goes to its blob's sink on the thread that
// fetched it (the sinks copy it into place, in parallel); into a sink that is a file, it streams
// straight to the file. It is then hashed into the blob's
// SHA-256 in order, by whichever fetching thread completes the run of parts that can be hashed
// next. So a blob's hash is known as soon as its last part has arrived, and each byte is read at
// most twice after it lands (placed and hashed), both while it is fresh.
//
// At most `max_buffered_bytes` of buffered parts are held (in flight, or arrived and waiting for
// an earlier part to be hashed), except the part each blob needs next, which always goes ahead;
// parts read into their sink's window hold no buffer. A transfer
// cut off mid-part resumes where it stopped (the HTTP and S3 stores resume ranges). A blob whose
// size or SHA-256 does not match its reference is fetched again from its start (its sink is
// restarted), up to three fetches, then kDataLoss naming it. A blob the store itself refuses as
// damaged (kDataLoss: a relay whose upstream sent bytes that are not the blob's) is asked for once
// more, then reported as kDataLoss naming the blob, the store and what it said. What the sinks were
// given is theirs to discard on error: FetchBlobs never says a blob is good before its hash
// matched.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "policy_store/manifest.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

// Where a blob's bytes go. Place is called from several threads at once, for disjoint parts, in
// any order; an error from it fails the fetch (after the blob's hash has been checked: a sink's
// complaint about a blob whose hash is wrong only means it arrived damaged, and the blob is
// fetched again).
class BlobSink {
 public:
  virtual ~BlobSink() = default;
  virtual Status Place(uint64_t offset, std::span<const uint8_t> bytes) = 0;
  // Forgets what was placed: the blob is fetched again from its start.
  virtual void Restart() = 0;
  // Where bytes [offset, offset + size) belong in the sink's memory, when it can say: spans that
  // together hold `size` bytes, in order (a keyframe's part may cover the ends of two tensors).
  // The part is read straight there and announced with Placed instead of Place. Empty: the part
  // arrives in a buffer and is handed to Place. Called from several threads at once.
  virtual std::vector<std::span<uint8_t>> Windows(uint64_t offset, uint64_t size) { return {}; }
  virtual Status Placed(uint64_t offset, uint64_t size) { return Status::Ok(); }
  // Whether the blob's first part must have been placed before its other parts are requested (a
  // sink that has windows only once it has read the blob's header). That first part is then at
  // most 1 MiB, so the others wait for one short request.
  virtual bool StartFirst() const { return false; }
  // A descriptor when the sink is a file (a spilled delta): each part is then streamed into it as
  // it arrives (ObjectStore::ReadTo, no buffer), and read back from it to be hashed. -1 otherwise.
  virtual int file() const { return -1; }
};

// A blob's bytes in a spill file (a delta too large to hold in memory beside the model).
class FileSink : public BlobSink {
 public:
  explicit FileSink(SpillFile file) : file_(std::move(file)) {}
  Status Place(uint64_t offset, std::span<const uint8_t> bytes) override {
    return file_.WriteAt(offset, bytes);
  }
  void Restart() override {}
  int file() const override { return file_.fd(); }
  const SpillFile& spill() const { return file_; }

 private:
  SpillFile file_;
};

// A blob's bytes in memory, in one buffer of the blob's size.
class BytesSink : public BlobSink {
 public:
  explicit BytesSink(uint64_t size) : bytes_(size) {}
  Status Place(uint64_t offset, std::span<const uint8_t> bytes) override;
  void Restart() override {}
  std::vector<std::span<uint8_t>> Windows(uint64_t offset, uint64_t size) override;
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

struct FetchOptions {
  uint64_t part_bytes = uint64_t{8} << 20;
  int concurrency = 16;
  uint64_t max_buffered_bytes = uint64_t{256} << 20;
};
// The fetch options a store's URI asks for (ObjectStore::blob_reads).
FetchOptions FetchOptionsFor(const ObjectStore& store);

struct BlobFetch {
  BlobRef blob;
  std::string what;  // names the blob in messages, e.g. "keyframe of version 7"
  BlobSink* sink = nullptr;
};

// Fetches every blob into its sink and checks each against its reference; returns at the first
// error (the lowest failing part's, so the same failure is reported whatever the timing).
Status FetchBlobs(ObjectStore& store, std::span<const BlobFetch> blobs,
                  const FetchOptions& options = {});

}  // namespace weft::policy_store
