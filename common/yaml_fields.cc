#include "common/yaml_fields.h"

#include <cmath>
#include <map>

#include "common/file_util.h"
#include "common/units.h"

namespace weft {
std::string LineOf(const YAML::Node& node) {
  if (!node) return "";  // a missing key's node: it has no place in the file (Mark() would throw)
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? "" : " (line " + std::to_string(mark.line + 1) + ")";
}

namespace {

// The scalar at node[key], or an error; nullopt when absent.
Result<std::optional<std::string>> Scalar(const YAML::Node& node, const std::string& where,
                                          const std::string& key) {
  const YAML::Node value = node[key];
  if (!value) return std::optional<std::string>();
  if (!value.IsScalar())
    return InvalidArgument(where + "." + key + " must be a single value" + LineOf(value));
  return std::optional<std::string>(value.Scalar());
}

// A key given twice in any map of the document, as an error naming its path and both lines
// (YAML says keys are unique; a parser that keeps the first would silently ignore the second).
Status CheckUniqueKeys(const YAML::Node& node, const std::string& where) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      WEFT_RETURN_IF_ERROR(CheckUniqueKeys(node[i], where + "[" + std::to_string(i) + "]"));
    }
  } else if (node.IsMap()) {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
      const std::string path = where.empty() ? key : where + "." + key;
      const auto [found, fresh] = seen.emplace(key, entry.first.Mark());
      if (!fresh) {
        return InvalidArgument(path + " is given twice (lines " +
                               std::to_string(found->second.line + 1) + " and " +
                               std::to_string(entry.first.Mark().line + 1) + "): keep one of them");
      }
      WEFT_RETURN_IF_ERROR(CheckUniqueKeys(entry.second, path));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<YAML::Node> LoadYamlFile(const std::string& path) {
  // Read within a bound first: a config is small, and a path such as /dev/zero must not be read
  // without end.
  Result<std::string> text = ReadTextFile(path, kMaxConfigBytes, "a config file");
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound)
      return NotFound("cannot read the config file " + path);
    return text.status();
  }
  try {
    YAML::Node root = YAML::Load(*text);
    WEFT_RETURN_IF_ERROR(CheckUniqueKeys(root, "").WithContext(path));
    return root;
  } catch (const YAML::Exception& error) {
    return InvalidArgument(path + ": line " + std::to_string(error.mark.line + 1) + ": " +
                           error.msg);
  }
}

Status CheckKeys(const YAML::Node& node, const std::string& where,
                 const std::set<std::string>& allowed) {
  if (!node.IsMap()) return InvalidArgument(where + " must be a map of settings" + LineOf(node));
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>("");
    if (!allowed.count(key)) {
      std::string known;
      for (const std::string& k : allowed) known += (known.empty() ? "" : ", ") + k;
      return InvalidArgument(where + "." + key + ": unknown key" + LineOf(entry.first) +
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
                           LineOf(node[key]));
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
                           LineOf(node[key]));
  }
  *out = number;
  return Status::Ok();
}

Status ReadBytes(const YAML::Node& node, const std::string& where, const std::string& key,
                 uint64_t* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (!value) return Status::Ok();
  Result<uint64_t> bytes = ParseByteSize(*value);
  if (!bytes.ok()) return bytes.status().WithContext(where + "." + key + LineOf(node[key]));
  *out = *bytes;
  return Status::Ok();
}

Status ReadDuration(const YAML::Node& node, const std::string& where, const std::string& key,
                    std::chrono::microseconds* out) {
  WEFT_ASSIGN_OR_RETURN(std::optional<std::string> value, Scalar(node, where, key));
  if (!value) return Status::Ok();
  Result<std::chrono::microseconds> duration = ParseDuration(*value);
  if (!duration.ok()) return duration.status().WithContext(where + "." + key + LineOf(node[key]));
  *out = *duration;
  return Status::Ok();
}

Status ReadInt(const YAML::Node& node, const std::string& where, const std::string& key, int* out,
               int low, int high) {
  uint64_t value = static_cast<uint64_t>(*out);
  WEFT_RETURN_IF_ERROR(ReadUnsigned(node, where, key, &value));
  if (value < static_cast<uint64_t>(low) || value > static_cast<uint64_t>(high)) {
    return InvalidArgument(where + "." + key + " must be " + std::to_string(low) + " to " +
                           std::to_string(high));
  }
  *out = static_cast<int>(value);
  return Status::Ok();
}

}  // namespace weft
