#include "common/json_fields.h"

#include "common/json_text.h"

namespace weft {

Result<nlohmann::json> ParseStrict(std::string_view text, const std::string& what,
                                   const nlohmann::json::parser_callback_t& callback) {
  const std::string fault = json_text::Validate(text);
  if (!fault.empty()) return InvalidArgument(what + " is not valid JSON: " + fault);
  nlohmann::json parsed = nlohmann::json::parse(text.begin(), text.end(), callback, false);
  // (Validate and the parser agree on what JSON is; this is for a disagreement nonetheless.)
  if (parsed.is_discarded()) return InvalidArgument(what + " is not valid JSON");
  return parsed;
}

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
