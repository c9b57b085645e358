// Helpers shared by the policy store tests.
#pragma once

#include <string>

#include "tests/temp_path.h"

namespace weft::policy_store {

// A fresh, empty path under the temporary directory, unique to this process.
inline std::string TempRoot(const std::string& name) { return testing::TempPath(name); }

}  // namespace weft::policy_store
