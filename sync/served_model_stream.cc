#include "sync/served_model_stream.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "sync/digest.h"
#include "sync/safetensors.h"

namespace weft::sync {

Status ServedModelStream::Place(uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::Ok();
  if (offset > file_size_ || bytes.size() > file_size_ - offset) {
    return DataLoss("bytes [" + std::to_string(offset) + ", " +
                    std::to_string(offset + bytes.size()) + ") lie past the end of the " +
                    std::to_string(file_size_) + "-byte file");
  }
  {
    MutexLock lock(mutex_);
    if (!header_error_.ok()) return header_error_;
    placed_ += bytes.size();
    if (!parsed_) {
      waiting_[offset].assign(bytes.begin(), bytes.end());
      header_error_ = TryParseHeader();
      if (!header_error_.ok()) waiting_.clear();
      return header_error_;
    }
  }
  PlaceData(offset, bytes);
  return Status::Ok();
}

std::vector<std::span<uint8_t>> ServedModelStream::SpansLocked(uint64_t offset, uint64_t size,
                                                               size_t max) {
  if (!parsed_ || size == 0 || offset < data_start_ || offset > file_size_ ||
      size > file_size_ - offset) {
    return {};
  }
  std::vector<std::span<uint8_t>> spans;
  const uint64_t end = offset + size;
  uint64_t at = offset;
  for (size_t t = TensorAt(offset); at < end; ++t) {
    if (t >= tensors_.size() || spans.size() == max) return {};
    Building& building = tensors_[t];
    const uint64_t length = building.tensor.bytes.size();
    if (at < building.offset || at - building.offset > length) return {};  // not tensor data
    const uint64_t within = at - building.offset;
    if (within == length) continue;  // its end (or an empty tensor): the next one
    const uint64_t take = std::min(end - at, length - within);
    spans.push_back(std::span<uint8_t>(building.tensor.bytes).subspan(within, take));
    at += take;
  }
  return spans;
}

std::vector<std::span<uint8_t>> ServedModelStream::Windows(uint64_t offset, uint64_t size) {
  MutexLock lock(mutex_);
  return SpansLocked(offset, size, 64);
}

Status ServedModelStream::Placed(uint64_t offset, uint64_t size) {
  std::vector<std::span<uint8_t>> spans;
  {
    MutexLock lock(mutex_);
    if (!header_error_.ok()) return header_error_;
    spans = SpansLocked(offset, size, SIZE_MAX);
    if (spans.empty()) {
      return InvalidArgument("bytes [" + std::to_string(offset) + ", " +
                             std::to_string(offset + size) + ") were not windows of the file");
    }
    placed_ += size;
  }
  // Each span is in place already: hashed where it lies.
  uint64_t at = offset;
  for (std::span<uint8_t> span : spans) {
    PlaceData(at, span);
    at += span.size();
  }
  return Status::Ok();
}

size_t ServedModelStream::TensorAt(uint64_t offset) const {
  // The last tensor starting at or before `offset` (zero-byte tensors sort before others there).
  const size_t after = static_cast<size_t>(
      std::upper_bound(tensors_.begin(), tensors_.end(), offset,
                       [](uint64_t at, const Building& b) { return at < b.offset; }) -
      tensors_.begin());
  return after == 0 ? tensors_.size() : after - 1;
}

Status ServedModelStream::TryParseHeader() {
  // The first `want` bytes, when the waiting pieces hold them without a gap.
  auto gather = [&](uint64_t want) REQUIRES(mutex_) {
    std::vector<uint8_t> prefix;
    uint64_t next = 0;
    for (const auto& [offset, piece] : waiting_) {
      if (offset != next || prefix.size() >= want) break;
      const uint64_t take = std::min<uint64_t>(piece.size(), want - prefix.size());
      prefix.insert(prefix.end(), piece.begin(), piece.begin() + static_cast<long>(take));
      next = offset + piece.size();
    }
    return prefix;
  };
  const uint64_t length_bytes = std::min<uint64_t>(8, file_size_);
  const std::vector<uint8_t> start = gather(length_bytes);
  if (start.size() < length_bytes) return Status::Ok();
  if (file_size_ < 8) return SafetensorsFile::ParseHeader(start, file_size_).status();
  const uint64_t header_size = *SafetensorsFile::HeaderSize(start);
  if (header_size > file_size_) return SafetensorsFile::ParseHeader(start, file_size_).status();
  const std::vector<uint8_t> header = gather(header_size);
  if (header.size() < header_size) return Status::Ok();
  WEFT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::ParseHeader(header, file_size_));

  data_start_ = file.data_start();
  for (const SafetensorsTensor& t : file.tensors()) {
    Building building;
    building.tensor.spec = {t.name, t.dtype, t.shape};
    if (storage_) {
      Result<TensorStorage> storage = storage_(building.tensor.spec, t.data_bytes);
      if (!storage.ok()) return storage.status();
      if (storage->size() != t.data_bytes) {
        return Internal("tensor '" + t.name + "' was given " + std::to_string(storage->size()) +
                        " bytes of storage for its " + std::to_string(t.data_bytes));
      }
      building.tensor.bytes = std::move(storage).value();
    } else {
      building.tensor.bytes.resize(t.data_bytes);
    }
    building.unit = CodedWidth(t.dtype);
    building.tensor.digest = BaseDigest(t.data_bytes / building.unit, t.dtype);
    building.offset = data_start_ + t.data_offset;
    tensors_.push_back(std::move(building));
  }
  digests_.assign(tensors_.size(), Digest{});
  parsed_ = true;
  std::map<uint64_t, std::vector<uint8_t>> waiting = std::move(waiting_);
  waiting_.clear();
  for (const auto& [offset, piece] : waiting) PlaceDataLocked(offset, piece);
  return Status::Ok();
}

void ServedModelStream::PlaceData(uint64_t offset, std::span<const uint8_t> bytes) {
  std::vector<std::pair<size_t, Digest>> sums;
  std::vector<std::pair<size_t, uint64_t>> split;
  CopyAndHash(offset, bytes, &sums, &split);
  MutexLock lock(mutex_);
  for (const auto& [t, sum] : sums) digests_[t] += sum;
  split_.insert(split_.end(), split.begin(), split.end());
}

void ServedModelStream::PlaceDataLocked(uint64_t offset, std::span<const uint8_t> bytes) {
  std::vector<std::pair<size_t, Digest>> sums;
  CopyAndHash(offset, bytes, &sums, &split_);
  for (const auto& [t, sum] : sums) digests_[t] += sum;
}

void ServedModelStream::CopyAndHash(uint64_t offset, std::span<const uint8_t> bytes,
                                    std::vector<std::pair<size_t, Digest>>* sums,
                                    std::vector<std::pair<size_t, uint64_t>>* split) {
  const uint64_t begin = std::max(offset, data_start_);
  const uint64_t end = offset + bytes.size();
  if (begin >= end) return;
  size_t t = TensorAt(begin);
  if (t == tensors_.size()) t = 0;
  for (; t < tensors_.size() && tensors_[t].offset < end; ++t) {
    Building& building = tensors_[t];
    TensorStorage& data = building.tensor.bytes;
    const uint64_t from = std::max(begin, building.offset);
    const uint64_t to = std::min(end, building.offset + data.size());
    if (from >= to) continue;
    uint8_t* into = data.data() + (from - building.offset);
    const uint8_t* source = bytes.data() + (from - offset);
    if (into != source) std::memcpy(into, source, to - from);  // (a window is in place already)
    // The elements wholly inside this piece are hashed now; the ones it cuts, by Finish.
    const uint64_t unit = building.unit;
    const uint64_t low = from - building.offset, high = to - building.offset;
    const uint64_t first = (low + unit - 1) / unit, last = high / unit;
    if (first < last) {
      sums->emplace_back(t, ElementsDigest(std::span<const uint8_t>(data).subspan(
                                               first * unit, (last - first) * unit),
                                           building.unit, first));
    }
    if (low % unit != 0) split->emplace_back(t, low / unit);
    if (high % unit != 0) split->emplace_back(t, high / unit);
  }
}

void ServedModelStream::Restart() {
  MutexLock lock(mutex_);
  ResetLocked();
}

void ServedModelStream::ResetLocked() {
  parsed_ = false;
  header_error_ = Status::Ok();
  data_start_ = 0;
  waiting_.clear();
  tensors_.clear();
  digests_.clear();
  split_.clear();
  placed_ = 0;
}

Result<ServedModel> ServedModelStream::Finish() {
  MutexLock lock(mutex_);
  if (!header_error_.ok()) return header_error_;
  if (placed_ != file_size_ || !parsed_) {
    const uint64_t missing = file_size_ - std::min(placed_, file_size_);
    return DataLoss(std::to_string(missing) + " of the file's " + std::to_string(file_size_) +
                    " bytes have not arrived" + (parsed_ ? "" : ", nor has its whole header"));
  }
  std::sort(split_.begin(), split_.end());
  split_.erase(std::unique(split_.begin(), split_.end()), split_.end());
  for (const auto& [t, element] : split_) {
    const Building& building = tensors_[t];
    digests_[t] += ElementsDigest(std::span<const uint8_t>(building.tensor.bytes)
                                      .subspan(element * building.unit, building.unit),
                                  building.unit, element);
  }
  ServedModel model;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    tensors_[t].tensor.digest += digests_[t];
    model.tensors_.push_back(std::move(tensors_[t].tensor));
  }
  ResetLocked();
  return model;
}

}  // namespace weft::sync
