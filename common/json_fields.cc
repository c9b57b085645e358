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

Result<nlohmann::json> ParseStrictObject(std::string_view text, const std::string& what,
                                         std::string_view opaque,
                                         std::optional<std::string_view>* opaque_text) {
  std::vector<json_text::TopMember> members;
  const std::string fault = json_text::Validate(text, 64, &members);
  if (!fault.empty()) return InvalidArgument(what + " is not valid JSON: " + fault);
  const size_t start = json_text::SkipSpace(text, text.starts_with("\xEF\xBB\xBF") ? 3 : 0);
  if (text[start] != '{') return InvalidArgument(what + " is not a JSON object");
  // The other members, as the text of an object of their own (small), parsed into the tree.
  opaque_text->reset();
  std::string rest = "{";
  for (const json_text::TopMember& member : members) {
    if (member.key == opaque) {
      *opaque_text = member.value;
      continue;
    }
    if (rest.size() > 1) rest += ',';
    rest += nlohmann::json(member.key).dump();
    rest += ':';
    rest += member.value;
  }
  rest += '}';
  nlohmann::json parsed = nlohmann::json::parse(rest, nullptr, false);
  if (parsed.is_discarded()) return InvalidArgument(what + " is not valid JSON");
  return parsed;
}

bool AllIntegers(const nlohmann::json& value) {
  if (value.is_number_float()) return false;
  if (value.is_structured()) {
    for (const nlohmann::json& item : value)
      if (!AllIntegers(item)) return false;
  }
  return true;
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
