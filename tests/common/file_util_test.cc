#include "common/file_util.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/byte_io.h"
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
    REQUIRE(WriteAll(fd, TextBytes(partial), path).ok());
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

TEST_CASE("files: a writable mapping's changes, flushed, are the file's; network file systems") {
  const std::string dir = testing::TempPath("mapped_flush");
  fs::create_directories(dir);
  const std::string path = dir + "/data.bin";
  std::ofstream(path, std::ios::binary) << "0123456789";
  Result<MappedFile> mapped = MappedFile::OpenWritable(path);
  REQUIRE(mapped.ok());
  mapped->writable_bytes()[2] = 'x';
  REQUIRE(mapped->Flush().ok());
  CHECK(Text(*ReadFile(path)) == "01x3456789");
  Result<MappedFile> read_only = MappedFile::Open(path);
  REQUIRE(read_only.ok());
  CHECK(read_only->Flush().ok());  // nothing to write back
  // Which file systems other hosts read through caches of their own.
  CHECK(IsNetworkFileSystemType(0x6969));       // NFS
  CHECK(IsNetworkFileSystemType(0xFF534D42));   // CIFS
  CHECK(IsNetworkFileSystemType(0x0BD00BD0));   // Lustre
  CHECK(IsNetworkFileSystemType(0x65735546));   // FUSE
  CHECK(!IsNetworkFileSystemType(0xEF53));      // ext4
  CHECK(!IsNetworkFileSystemType(0x58465342));  // xfs
  CHECK(!IsNetworkFileSystemType(0x01021994));  // tmpfs
  CHECK(!IsNetworkFileSystemType(0x794C7630));  // overlayfs
  CHECK(OnNetworkFileSystem(dir).ok());
  Status nowhere = OnNetworkFileSystem(dir + "/missing/deeper").status();
  CHECK(nowhere.code() == StatusCode::kUnavailable);
  CHECK(nowhere.message().find(dir + "/missing/deeper") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("files: a spill file has no name, holds what was written, and lets its pages go") {
  const std::string dir = testing::TempPath("spill");
  fs::create_directories(dir);
  const uint64_t size = 3 << 20;
  Result<SpillFile> spill = SpillFile::Create(dir, size);
  REQUIRE_MESSAGE(spill.ok(), spill.status().ToString());
  CHECK(fs::is_empty(dir));  // nothing to leave behind
  std::vector<uint8_t> pattern(size);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  REQUIRE(spill->WriteAt(1 << 20, std::span<const uint8_t>(pattern).subspan(1 << 20)).ok());
  REQUIRE(spill->WriteAt(0, std::span<const uint8_t>(pattern).first(1 << 20)).ok());
  CHECK(spill->WriteAt(size - 1, std::span<const uint8_t>(pattern).first(2)).code() ==
        StatusCode::kInternal);
  Result<MappedFile> mapped = spill->Map();
  REQUIRE(mapped.ok());
  CHECK(std::equal(pattern.begin(), pattern.end(), mapped->bytes().begin()));
  // Its pages let go (a range not on page boundaries), then read again from the file.
  mapped->Release(mapped->bytes().subspan(1000, 2 << 20));
  mapped->Release(mapped->bytes());
  CHECK(std::equal(pattern.begin(), pattern.end(), mapped->bytes().begin()));
  // Moved, it stays whole; gone, nothing is left.
  SpillFile moved = std::move(*spill);
  CHECK(moved.size() == size);
  CHECK(SpillFile::Create(dir + "/missing", 10).status().message().find(dir + "/missing") !=
        std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace weft
