// What the fuzz targets share outside HTTP: their seeds, written by the targets themselves so that
// they always match the current formats (a target started with `--write-seeds=DIR` writes its
// seeds into DIR, one file each, and exits; libFuzzer ignores arguments that start with "--"), and
// a directory for the files a target works with.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace weft::fuzz {

// The DIR of a `--write-seeds=DIR` argument, or "" when there is none.
inline std::string SeedDirectoryArgument(int argc, char** argv) {
  constexpr std::string_view kFlag = "--write-seeds=";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with(kFlag)) return std::string(arg.substr(kFlag.size()));
  }
  return "";
}

// Writes `seeds` into `dir` (created if needed) as seed-0, seed-1, ...; exits 0, or 1 on failure.
[[noreturn]] inline void WriteSeedsAndExit(const std::string& dir,
                                           const std::vector<std::string>& seeds) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(dir + "/seed-" + std::to_string(i), std::ios::binary | std::ios::trunc);
    out.write(seeds[i].data(), static_cast<std::streamsize>(seeds[i].size()));
    if (!out) {
      std::fprintf(stderr, "cannot write the seed %s/seed-%zu\n", dir.c_str(), i);
      std::exit(1);
    }
  }
  std::fprintf(stderr, "wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  std::exit(0);
}

// A fresh, empty directory for a target's files: under /dev/shm when it can be written (syncs
// cost nothing there), else under the system's temporary directory; named for `name` and the
// process. The directories of targets no longer running (a finding aborts before any cleanup) are
// removed first.
inline std::string FreshDirectory(const std::string& name) {
  std::filesystem::path base = "/dev/shm";
  if (::access(base.c_str(), W_OK) != 0) base = std::filesystem::temp_directory_path();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(base, error)) {
    const std::string file = entry.path().filename().string();
    const size_t pid_at = file.rfind('_');
    if (!file.starts_with("weft_fuzz_") || pid_at == std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(file.c_str() + pid_at + 1));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
      std::filesystem::remove_all(entry.path(), error);
  }
  const std::filesystem::path dir = base / ("weft_fuzz_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace weft::fuzz
