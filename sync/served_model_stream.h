// ServedModelStream: a ServedModel assembled from a safetensors file (a keyframe) while its bytes
// are still arriving, in pieces, in any order, from several threads at once, as parallel ranged
// downloads deliver them.
//
// Each piece is copied once, straight into its tensor (or written there by the caller, Windows),
// and added to that tensor's state digest right after, while it is still in cache (the digest is a
// sum over positions, so pieces add up in any order). Pieces that arrive before the header has been
// read wait in memory until it has. An element split between two pieces is hashed once both have
// arrived. Nothing holds the file: the memory is the model's (new host memory, or storage the
// caller gives each tensor, StorageFor), plus pieces waiting for the header.
//
// The stream checks the header as SafetensorsFile::Parse does; it does not check that the bytes
// are the publisher's (the caller checks the file's content hash as the pieces pass through).
// Place is thread-safe for disjoint pieces; Restart and Finish are not concurrent with it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "sync/served_model.h"

namespace weft::sync {

class ServedModelStream {
 public:
  // Where a tensor's bytes go, once the header names it (called under the stream's lock, one
  // tensor at a time): storage of exactly the tensor's size, or an error that fails the stream.
  using StorageFor = std::function<Result<TensorStorage>(const TensorSpec& spec, uint64_t bytes)>;

  // Each tensor in new host memory, or where `storage` (when given) says.
  explicit ServedModelStream(uint64_t file_size, StorageFor storage = nullptr)
      : file_size_(file_size), storage_(std::move(storage)) {}

  // Bytes [offset, offset + bytes.size()) of the file. kDataLoss when the header is not valid or
  // the piece lies past the file's end; pieces must not overlap (each byte is placed once).
  Status Place(uint64_t offset, std::span<const uint8_t> bytes);
  // Where bytes [offset, offset + size) of the file belong, once the header has been read, when
  // they lie in the data section: the spans of the tensors they cover, in order (at most 64). A
  // piece written there straight from the network or a file (no copy) is then announced with
  // Placed, which counts and hashes it. Empty otherwise (the piece goes to Place). Thread-safe as
  // Place is.
  std::vector<std::span<uint8_t>> Windows(uint64_t offset, uint64_t size);
  Status Placed(uint64_t offset, uint64_t size);
  // Forgets every piece (the file is being fetched again).
  void Restart();
  // The model, once every byte has been placed (kDataLoss before, naming what is missing). The
  // stream is empty afterwards.
  Result<ServedModel> Finish();

  uint64_t file_size() const { return file_size_; }

 private:
  struct Building {
    ServedModel::Tensor tensor;
    uint64_t offset = 0;  // of its data in the file
    uint8_t unit = 1;     // the digest's unit (CodedWidth)
  };
  // Parses the header once the pieces from offset 0 hold it, then places the pieces that waited
  // for it.
  Status TryParseHeader() REQUIRES(mutex_);
  // The index of the last tensor whose data starts at or before `offset` (tensors_.size() when
  // none does), with mutex_ held or after the header is parsed.
  size_t TensorAt(uint64_t offset) const;
  // The spans of the tensors that bytes [offset, offset + size) of the file cover, in order; empty
  // when they are not all in the data section or need more than `max` spans.
  std::vector<std::span<uint8_t>> SpansLocked(uint64_t offset, uint64_t size, size_t max)
      REQUIRES(mutex_);
  // Forgets every piece (Restart, and Finish once the model is out).
  void ResetLocked() REQUIRES(mutex_);
  // Copies and hashes a piece of the data section (header parsed): PlaceData takes mutex_ to add
  // the sums, PlaceDataLocked is called with it held.
  void PlaceData(uint64_t offset, std::span<const uint8_t> bytes) EXCLUDES(mutex_);
  void PlaceDataLocked(uint64_t offset, std::span<const uint8_t> bytes) REQUIRES(mutex_);
  // Copies the piece into its tensors; the sums of the elements wholly inside it go to `sums`,
  // the elements it cuts to `split`.
  void CopyAndHash(uint64_t offset, std::span<const uint8_t> bytes,
                   std::vector<std::pair<size_t, Digest>>* sums,
                   std::vector<std::pair<size_t, uint64_t>>* split);

  const uint64_t file_size_;
  const StorageFor storage_;
  Mutex mutex_;
  bool parsed_ GUARDED_BY(mutex_) = false;
  Status header_error_ GUARDED_BY(mutex_);  // once the header failed to parse, every call says so
  // Pieces that arrived before the header.
  std::map<uint64_t, std::vector<uint8_t>> waiting_ GUARDED_BY(mutex_);
  // Laid out under mutex_ when the header is parsed (and cleared by ResetLocked); between the two
  // they do not change, and pieces are copied into disjoint bytes of the tensors without the lock.
  uint64_t data_start_ = 0;
  std::vector<Building> tensors_;                   // by data offset
  std::vector<Digest> digests_ GUARDED_BY(mutex_);  // each tensor's sum so far
  // Elements split between pieces (tensor, element), hashed by Finish.
  std::vector<std::pair<size_t, uint64_t>> split_ GUARDED_BY(mutex_);
  uint64_t placed_ GUARDED_BY(mutex_) = 0;  // bytes placed (the header's included)
};

}  // namespace weft::sync
