// Reading and writing safetensors files.
//
// Format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}}
// (offsets relative to the end of the header), then the data. The reader checks what the
// reference implementation checks, and reports the file and the offending tensor on failure:
// header length within the file and at most 100 MB, a JSON object with unique keys, known dtypes,
// non-negative shapes whose byte size equals the offset range, and offsets that tile the data
// section exactly, without gaps or overlaps.
//
// The writer produces the reference layout byte for byte: "__metadata__" first, tensors ordered
// by dtype (widest alignment first, in the reference's dtype order) then name, compact JSON, the
// header padded with spaces to a multiple of 8 bytes.
//
// A SafetensorsFile owns its mapping (or borrows bytes given to Parse, which must outlive it);
// tensor views point into it. Read-only use is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/status.h"
#include "sync/dtype.h"

namespace weft::sync {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> data;  // empty when only the header was parsed
  uint64_t data_offset = 0;       // from the start of the data section
  uint64_t data_bytes = 0;

  uint64_t element_count() const;
};

class SafetensorsFile {
 public:
  // Maps and parses `path`; errors name the path.
  static Result<SafetensorsFile> Open(const std::string& path);
  // Parses bytes the caller keeps alive.
  static Result<SafetensorsFile> Parse(std::span<const uint8_t> bytes);
  // The header of a file of `file_size` bytes, from its first bytes (at least HeaderSize of them),
  // for a file that is still arriving: every check but the data's, and the tensors' data spans
  // and bytes() are empty (data_offset and data_bytes say where each tensor will lie).
  static Result<SafetensorsFile> ParseHeader(std::span<const uint8_t> prefix, uint64_t file_size);
  // How many bytes from a file's start hold its header (the length prefix, the JSON and its
  // padding), read from its first 8 bytes; nullopt when `prefix` is shorter. A header length over
  // the limit gives a size just past it (ParseHeader then says what is wrong).
  static std::optional<uint64_t> HeaderSize(std::span<const uint8_t> prefix);

  // In data order (ascending offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole file, and the header block (length prefix, JSON and padding).
  std::span<const uint8_t> bytes() const { return bytes_; }
  size_t data_start() const { return data_start_; }

 private:
  static Result<SafetensorsFile> ParseHeaderOf(std::span<const uint8_t> bytes, uint64_t file_size,
                                               bool with_data);

  std::shared_ptr<MappedFile> mapping_;
  std::span<const uint8_t> bytes_;
  size_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> data;  // element_count * dtype size bytes
};

// The header block (length prefix, JSON, padding), the order the data must follow and where each
// tensor's data lies.
struct SafetensorsLayout {
  std::vector<uint8_t> header;
  std::vector<size_t> order;  // indices into the tensors, in data order
  // Per tensor (by index into the tensors): where its data starts in the file, and its length.
  std::vector<uint64_t> offsets, sizes;
  uint64_t file_bytes = 0;  // the header and all the data
};
Result<SafetensorsLayout> PlanSafetensors(const std::vector<TensorToWrite>& tensors,
                                          const std::map<std::string, std::string>& metadata);

// The same layout for tensors whose bytes are not at hand yet: the data of tensor order[k]
// follows that of order[k - 1], each as long as its shape and dtype say.
Result<SafetensorsLayout> PlanSafetensors(const std::vector<TensorSpec>& tensors,
                                          const std::map<std::string, std::string>& metadata);

// Writes atomically (temporary file, fsync, rename).
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace weft::sync
