// Strict reading of JSON objects from outside (manifests, API request bodies): unknown or missing
// fields and wrong types are errors that name the field, as "where.field".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/status.h"

namespace weft {

// `object` must be an object with every `required` field and no field outside required/optional.
Status CheckFields(const nlohmann::json& object, const std::string& where,
                   const std::set<std::string>& required,
                   const std::set<std::string>& optional = {});
Result<uint64_t> GetUnsigned(const nlohmann::json& object, const std::string& field,
                             const std::string& where);
Result<std::string> GetString(const nlohmann::json& object, const std::string& field,
                              const std::string& where);

}  // namespace weft
