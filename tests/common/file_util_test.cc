#include "common/file_util.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "tests/temp_path.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

std::string Text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

TEST_CASE("files: atomic writes replace whole files and leave nothing behind on failure") {
  const std::string dir = testing::TempPath("files");
  fs::create_directories(dir);
  const std::string path = dir + "/out.txt";
  REQUIRE(WriteTextFileAtomic(path, "first").ok());
  CHECK(Text(*ReadFile(path)) == "first");
  REQUIRE(WriteTextFileAtomic(path, "second, longer").ok());
  CHECK(Text(*ReadFile(path)) == "second, longer");
  // A writer that fails: the old file stays, and no temporary file is left.
  Status failed = WriteFileAtomic(path, [&](int fd) {
    const std::string partial = "torn";
    REQUIRE(WriteAll(fd, {reinterpret_cast<const uint8_t*>(partial.data()), partial.size()}, path)
                .ok());
    return Internal("the writer gave up");
  });
  CHECK(failed.message() == path + ": the writer gave up");
  CHECK(Text(*ReadFile(path)) == "second, longer");
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++files;
  CHECK(files == 1);
  // The temporary file's name is hidden, beside the target.
  Result<std::string> temporary =
      WriteTemporaryFile(path, [](int fd) { return WriteAll(fd, {}, "nothing"); });
  REQUIRE(temporary.ok());
  CHECK(fs::path(*temporary).parent_path() == fs::path(dir));
  CHECK(fs::path(*temporary).filename().string().rfind(".out.txt.tmp-", 0) == 0);
  fs::remove(*temporary);
  // Writing where no directory exists is an error naming the path.
  Status nowhere = WriteTextFileAtomic(dir + "/missing/out.txt", "x");
  CHECK(!nowhere.ok());
  CHECK(nowhere.message().find(dir + "/missing") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("files: reading and mapping, with errors that name the path") {
  const std::string dir = testing::TempPath("mapped");
  fs::create_directories(dir);
  const std::string path = dir + "/data.bin";
  std::ofstream(path, std::ios::binary) << "0123456789";
  Result<MappedFile> mapped = MappedFile::Open(path);
  REQUIRE(mapped.ok());
  CHECK(mapped->bytes().size() == 10);
  CHECK(mapped->bytes()[3] == '3');
  CHECK(mapped->path() == path);
  MappedFile moved = std::move(*mapped);
  CHECK(moved.bytes().size() == 10);
  std::ofstream(dir + "/empty.bin", std::ios::binary).flush();
  Result<MappedFile> empty = MappedFile::Open(dir + "/empty.bin");
  REQUIRE(empty.ok());
  CHECK(empty->bytes().empty());
  Status missing = MappedFile::Open(dir + "/none.bin").status();
  CHECK(!missing.ok());
  CHECK(missing.message().find(dir + "/none.bin") != std::string::npos);
  CHECK(ReadFile(dir + "/none.bin").status().code() == StatusCode::kNotFound);
  CHECK(Text(*ReadFile(path)) == "0123456789");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace weft
