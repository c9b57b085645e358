// Strict reading of JSON objects from outside (manifests, API request bodies): unknown or missing
// fields and wrong types are errors that name the field, as "where.field".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/status.h"

namespace weft {

// `text` parsed as JSON from outside, once json_text::Validate found it well-formed (no repeated
// keys, nesting at most 64 deep, well-formed UTF-8); kInvalidArgument naming `what` and the byte
// offset of the fault otherwise. `callback` is the parser's (it can leave members out of the tree).
Result<nlohmann::json> ParseStrict(std::string_view text, const std::string& what,
                                   const nlohmann::json::parser_callback_t& callback = nullptr);

// The same for a JSON object whose member `opaque` (a large payload) is checked but kept out of
// the tree: `*opaque_text` receives its value's text (nullopt when there is none), and only the
// other members are parsed. One pass over the text checks it and finds the members.
Result<nlohmann::json> ParseStrictObject(std::string_view text, const std::string& what,
                                         std::string_view opaque,
                                         std::optional<std::string_view>* opaque_text);

// Whether every number in `value` is an integer (none parsed with a fraction or an exponent):
// reading a fraction as an integer type is undefined, so documents of integers check this first.
bool AllIntegers(const nlohmann::json& value);

// `object` must be an object with every `required` field and no field outside required/optional.
Status CheckFields(const nlohmann::json& object, const std::string& where,
                   const std::set<std::string>& required,
                   const std::set<std::string>& optional = {});
Result<uint64_t> GetUnsigned(const nlohmann::json& object, const std::string& field,
                             const std::string& where);
Result<std::string> GetString(const nlohmann::json& object, const std::string& field,
                              const std::string& where);

}  // namespace weft
