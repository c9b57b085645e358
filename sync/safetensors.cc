#include "sync/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <set>

namespace weft::sync {
namespace {

using Json = nlohmann::json;

// The reference implementation's dtype order (its enum declaration order); the writer sorts by it,
// descending, so wider types come first and every tensor stays aligned.
int ReferenceRank(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 2;
    case DType::kF8E5M2:
      return 3;
    case DType::kF8E4M3:
      return 4;
    case DType::kI16:
      return 5;
    case DType::kU16:
      return 6;
    case DType::kF16:
      return 7;
    case DType::kBF16:
      return 8;
    case DType::kI32:
      return 9;
    case DType::kU32:
      return 10;
    case DType::kF32:
      return 11;
    case DType::kF64:
      return 12;
    case DType::kI64:
      return 13;
    case DType::kU64:
      return 14;
  }
  return 0;
}

// Multiplies out a shape, failing on overflow past 2^62.
bool CheckedProduct(const std::vector<uint64_t>& shape, uint64_t factor, uint64_t* out) {
  unsigned __int128 product = factor;
  for (uint64_t d : shape) {
    product *= d;
    if (product > (uint64_t{1} << 62)) return false;
  }
  *out = static_cast<uint64_t>(product);
  return true;
}

}  // namespace

uint64_t SafetensorsTensor::element_count() const {
  uint64_t count = 1;
  for (uint64_t d : shape) count *= d;
  return count;
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  auto mapping = std::make_shared<MappedFile>(std::move(mapped));
  Result<SafetensorsFile> parsed = Parse(mapping->bytes());
  if (!parsed.ok()) return parsed.status().WithContext(path);
  parsed->mapping_ = std::move(mapping);
  return parsed;
}

Result<SafetensorsFile> SafetensorsFile::Parse(std::span<const uint8_t> bytes) {
  return ParseHeaderOf(bytes, bytes.size(), true);
}

Result<SafetensorsFile> SafetensorsFile::ParseHeader(std::span<const uint8_t> prefix,
                                                     uint64_t file_size) {
  return ParseHeaderOf(prefix, file_size, false);
}

std::optional<uint64_t> SafetensorsFile::HeaderSize(std::span<const uint8_t> prefix) {
  if (prefix.size() < 8) return std::nullopt;
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= uint64_t{prefix[i]} << (8 * i);
  return 8 + std::min(header_length, kMaxSafetensorsHeaderBytes + 1);
}

Result<SafetensorsFile> SafetensorsFile::ParseHeaderOf(std::span<const uint8_t> bytes,
                                                       uint64_t file_size, bool with_data) {
  if (file_size < 8 || bytes.size() < 8)
    return DataLoss("file of " + std::to_string(file_size) +
                    " bytes is too short for a safetensors header");
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= uint64_t{bytes[i]} << (8 * i);
  if (header_length > kMaxSafetensorsHeaderBytes) {
    return DataLoss("header length " + std::to_string(header_length) + " exceeds the 100 MB limit");
  }
  if (header_length > file_size - 8) {
    return DataLoss("header length " + std::to_string(header_length) + " exceeds the file size " +
                    std::to_string(file_size));
  }
  if (header_length > bytes.size() - 8) {
    return Internal("the first " + std::to_string(bytes.size()) +
                    " bytes do not hold the whole safetensors header");
  }
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  if (header_length == 0 || text[0] != '{') return DataLoss("header is not a JSON object");

  // Reject duplicate top-level keys while parsing: the JSON library would keep the last one.
  std::set<std::string> keys;
  std::string duplicate;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key) {
      if (!keys.insert(parsed.get<std::string>()).second) duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, text + header_length, callback);
  } catch (const Json::exception& error) {
    return DataLoss(std::string("header is not valid JSON: ") + error.what());
  }
  if (!duplicate.empty()) return DataLoss("tensor '" + duplicate + "' appears twice in the header");
  if (!header.is_object()) return DataLoss("header is not a JSON object");

  SafetensorsFile file;
  if (with_data) file.bytes_ = bytes;
  file.data_start_ = 8 + static_cast<size_t>(header_length);
  const uint64_t data_size = file_size - file.data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLoss("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          return DataLoss("__metadata__ value '" + m.key() + "' is not a string");
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || entry.size() != 3) {
      return DataLoss(where + ": expected exactly dtype, shape and data_offsets");
    }
    const Json& dtype_name = entry["dtype"];
    if (!dtype_name.is_string()) return DataLoss(where + ": dtype is not a string");
    std::optional<DType> dtype = DTypeFromSafetensorsName(dtype_name.get<std::string>());
    if (!dtype)
      return DataLoss(where + ": unsupported dtype '" + dtype_name.get<std::string>() + "'");
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.dtype = *dtype;
    const Json& shape = entry["shape"];
    if (!shape.is_array()) return DataLoss(where + ": shape is not an array");
    for (const Json& d : shape) {
      if (!d.is_number_unsigned())
        return DataLoss(where + ": shape has a non-integer or negative dimension");
      tensor.shape.push_back(d.get<uint64_t>());
    }
    const Json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return DataLoss(where + ": data_offsets is not a pair of non-negative integers");
    }
    uint64_t begin = offsets[0].get<uint64_t>();
    uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return DataLoss(where + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + "] outside the data section of " +
                      std::to_string(data_size) + " bytes");
    }
    uint64_t expected = 0;
    if (!CheckedProduct(tensor.shape, Info(*dtype).size, &expected)) {
      return DataLoss(where + ": shape is too large");
    }
    if (expected != end - begin) {
      return DataLoss(where + ": shape and dtype need " + std::to_string(expected) +
                      " bytes, data_offsets give " + std::to_string(end - begin));
    }
    tensor.data_offset = begin;
    tensor.data_bytes = end - begin;
    if (with_data) tensor.data = bytes.subspan(file.data_start_ + begin, end - begin);
    file.tensors_.push_back(std::move(tensor));
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.data_offset != b.data_offset ? a.data_offset < b.data_offset
                                                    : a.data_bytes < b.data_bytes;
            });
  uint64_t expected_offset = 0;
  for (const SafetensorsTensor& tensor : file.tensors_) {
    if (tensor.data_offset != expected_offset) {
      return DataLoss("tensor '" + tensor.name + "': data starts at " +
                      std::to_string(tensor.data_offset) + ", expected " +
                      std::to_string(expected_offset) + " (gap or overlap)");
    }
    expected_offset += tensor.data_bytes;
  }
  if (expected_offset != data_size) {
    return DataLoss("tensors cover " + std::to_string(expected_offset) + " of " +
                    std::to_string(data_size) + " data bytes");
  }
  return file;
}

const SafetensorsTensor* SafetensorsFile::Find(const std::string& name) const {
  for (const SafetensorsTensor& tensor : tensors_) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

Result<SafetensorsLayout> PlanSafetensors(const std::vector<TensorToWrite>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> places;
  places.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    uint64_t bytes;
    if (!CheckedProduct(t.shape, Info(t.dtype).size, &bytes) || bytes != t.data.size()) {
      return InvalidArgument("tensor '" + t.name + "': data size does not match shape and dtype");
    }
    places.push_back({t.name, t.dtype, t.shape});
  }
  return PlanSafetensors(places, metadata);
}

Result<SafetensorsLayout> PlanSafetensors(const std::vector<TensorSpec>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout;
  std::set<std::string> names;
  std::vector<uint64_t>& sizes = layout.sizes;
  sizes.resize(tensors.size());
  layout.offsets.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__")
      return InvalidArgument("invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) return InvalidArgument("tensor '" + t.name + "' given twice");
    if (!CheckedProduct(t.shape, Info(t.dtype).size, &sizes[i]))
      return InvalidArgument("tensor '" + t.name + "': its size overflows");
    layout.order.push_back(i);
  }
  std::sort(layout.order.begin(), layout.order.end(), [&](size_t a, size_t b) {
    int ra = ReferenceRank(tensors[a].dtype), rb = ReferenceRank(tensors[b].dtype);
    return ra != rb ? ra > rb : tensors[a].name < tensors[b].name;
  });
  // Compact JSON written by hand to control key order exactly.
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":" + Json(metadata).dump();
    first = false;
  }
  uint64_t offset = 0;
  for (size_t i : layout.order) {
    const TensorSpec& t = tensors[i];
    layout.offsets[i] = offset;  // (in the data: the header's length is added below)
    if (!first) json += ",";
    first = false;
    json += Json(t.name).dump() + ":{\"dtype\":\"" + std::string(Info(t.dtype).safetensors_name) +
            "\",\"shape\":" + Json(t.shape).dump() + ",\"data_offsets\":[" +
            std::to_string(offset) + "," + std::to_string(offset + sizes[i]) + "]}";
    offset += sizes[i];
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) layout.header.push_back(static_cast<uint8_t>(length >> (8 * i)));
  layout.header.insert(layout.header.end(), json.begin(), json.end());
  for (uint64_t& start : layout.offsets) start += layout.header.size();
  layout.file_bytes = layout.header.size() + offset;
  return layout;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  Result<SafetensorsLayout> layout = PlanSafetensors(tensors, metadata);
  if (!layout.ok()) return layout.status().WithContext(path);
  return WriteFileAtomic(path, [&](int fd) -> Status {
    WEFT_RETURN_IF_ERROR(WriteAll(fd, layout->header, path));
    for (size_t i : layout->order) WEFT_RETURN_IF_ERROR(WriteAll(fd, tensors[i].data, path));
    return Status::Ok();
  });
}

}  // namespace weft::sync
