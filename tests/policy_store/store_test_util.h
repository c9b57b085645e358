// Helpers shared by the policy store tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace weft::policy_store {

// A fresh, empty path under the temporary directory, unique to this process.
inline std::string TempRoot(const std::string& name) {
  auto path = std::filesystem::temp_directory_path() / ("weft_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(path);
  return path.string();
}

}  // namespace weft::policy_store
