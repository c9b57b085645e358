#include "common/yaml_fields.h"

#include <cmath>

#include "common/units.h"

namespace weft {
namespace {

std::string At(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? "" : " (line " + std::to_string(mark.line + 1) + ")";
}

// The scalar at node[key], or an error; nullopt when absent.
Result<std::optional<std::string>> Scalar(const YAML::Node& node, const std::string& where,
                                          const std::string& key) {
  const YAML::Node value = node[key];
  if (!value) return std::optional<std::string>();
  if (!value.IsScalar())
    return InvalidArgument(where + "." + key + " must be a single value" + At(value));
  return std::optional<std::string>(value.Scalar());
}

}  // namespace

Result<YAML::Node> LoadYamlFile(const std::string& path) {
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return NotFound("cannot read the config file " + path);
  } catch (const YAML::Exception& error) {
    return InvalidArgument(path + ": line " + std::to_string(error.mark.line + 1) + ": " +
                           error.msg);
  }
}

Status CheckKeys(const YAML::Node& node, const std::string& where,
                 const std::set<std::string>& allowed) {
  if (!node.IsMap()) return InvalidArgument(where + " must be a map of settings" + At(node));
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>("");
    if (!allowed.count(key)) {
      std::string known;
      for (const std::string& k : allowed) known += (known.empty() ? "" : ", ") + k;
      return InvalidArgument(where + "." + key + ": unknown key" + At(entry.first) +
                             "; known: " + known);
    }
  }
  return Status::Ok();
}

Status ReadString(const YAML::Node& node, const std::string& where, const std::string& key,
                  std::string* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (value) *out = *value;
  return Status::Ok();
}

Status ReadUnsigned(const YAML::Node& node, const std::string& where, const std::string& key,
                    uint64_t* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (!value) return Status::Ok();
  char* end = nullptr;
  const unsigned long long number = std::strtoull(value->c_str(), &end, 10);
  if (value->empty() || (*value)[0] == '-' || *end != '\0') {
    return InvalidArgument(where + "." + key + ": '" + *value + "' is not a non-negative integer" +
                           At(node[key]));
  }
  *out = number;
  return Status::Ok();
}

Status ReadDouble(const YAML::Node& node, const std::string& where, const std::string& key,
                  double* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (!value) return Status::Ok();
  char* end = nullptr;
  const double number = std::strtod(value->c_str(), &end);
  if (value->empty() || *end != '\0' || !std::isfinite(number)) {
    return InvalidArgument(where + "." + key + ": '" + *value + "' is not a number" +
                           At(node[key]));
  }
  *out = number;
  return Status::Ok();
}

Status ReadBytes(const YAML::Node& node, const std::string& where, const std::string& key,
                 uint64_t* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (!value) return Status::Ok();
  Result<uint64_t> bytes = ParseByteSize(*value);
  if (!bytes.ok()) return bytes.status().WithContext(where + "." + key + At(node[key]));
  *out = *bytes;
  return Status::Ok();
}

Status ReadDuration(const YAML::Node& node, const std::string& where, const std::string& key,
                    std::chrono::microseconds* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (!value) return Status::Ok();
  Result<std::chrono::microseconds> duration = ParseDuration(*value);
  if (!duration.ok()) return duration.status().WithContext(where + "." + key + At(node[key]));
  *out = *duration;
  return Status::Ok();
}

}  // namespace weft
