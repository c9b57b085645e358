// Where the suites find the source tree's files (configs/, tests/data/) and the build tree's
// programs.
#pragma once

#include <filesystem>
#include <string>

namespace weft::testing {

// Defined in tests/doctest_main.cc, the one test file compiled with the source tree's path, so
// that the suites' own objects are the same whichever directory the tree is in.
std::string SourceDir();
inline std::string TestDataDir() { return SourceDir() + "/tests/data"; }

// A program of the build tree, `relative` to the directory of the running suite's executable (as
// the WEFT_*_BINARY definitions in tests/CMakeLists.txt give it).
inline std::string BuildTreeProgram(const std::string& relative) {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path() / relative).lexically_normal().string();
}

}  // namespace weft::testing
