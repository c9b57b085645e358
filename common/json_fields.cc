#include "common/json_fields.h"

namespace weft {

Status CheckFields(const nlohmann::json& object, const std::string& where,
                   const std::set<std::string>& required, const std::set<std::string>& optional) {
  if (!object.is_object()) return InvalidArgument(where + " is not an object");
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (!required.count(it.key()) && !optional.count(it.key())) {
      return InvalidArgument(where + " has an unknown field '" + it.key() + "'");
    }
  }
  for (const std::string& field : required) {
    if (!object.contains(field)) return InvalidArgument(where + " lacks the field '" + field + "'");
  }
  return Status::Ok();
}

Result<uint64_t> GetUnsigned(const nlohmann::json& object, const std::string& field,
                             const std::string& where) {
  const nlohmann::json& value = object.at(field);
  if (!value.is_number_unsigned())
    return InvalidArgument(where + "." + field + " is not a non-negative integer");
  return value.get<uint64_t>();
}

Result<std::string> GetString(const nlohmann::json& object, const std::string& field,
                              const std::string& where) {
  const nlohmann::json& value = object.at(field);
  if (!value.is_string()) return InvalidArgument(where + "." + field + " is not a string");
  return value.get<std::string>();
}

}  // namespace weft
