// A fresh path under the temporary directory, unique to this process, removed if it exists.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace weft::testing {

inline std::string TempPath(const std::string& name) {
  auto path =
      std::filesystem::temp_directory_path() / ("weft_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(path);
  return path.string();
}

}  // namespace weft::testing
