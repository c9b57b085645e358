// Env: the machine's and the in-memory one behave alike where they should, and the in-memory one
// keeps across a crash exactly what a disk would.
#include "common/env.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "common/byte_io.h"
#include "common/mem_env.h"
#include "tests/temp_path.h"

namespace weft {
namespace {

std::string Text(const Result<std::vector<uint8_t>>& bytes) {
  REQUIRE_MESSAGE(bytes.ok(), bytes.status().ToString());
  return std::string(bytes->begin(), bytes->end());
}

// The same script on either Env, in directory `dir`.
void Script(Env& env, const std::string& dir) {
  const std::string a = dir + "/a", b = dir + "/b";
  CHECK(!env.Exists(a).value());
  CHECK(env.OpenWritable(a, false).status().code() == StatusCode::kNotFound);
  CHECK(env.ReadFile(a).status().code() == StatusCode::kNotFound);
  {
    auto file = std::move(env.OpenWritable(a, true)).value();
    REQUIRE(file->Append(TextBytes("hello ")).ok());
    REQUIRE(file->Append(TextBytes("world")).ok());
    REQUIRE(file->Sync().ok());
    REQUIRE(file->Truncate(5).ok());
    REQUIRE(file->Append(TextBytes("!")).ok());
    REQUIRE(file->Sync().ok());
  }
  CHECK(Text(env.ReadFile(a)) == "hello!");
  {
    auto file = std::move(env.OpenWritable(a, false)).value();  // appends at the end
    REQUIRE(file->Append(TextBytes("?")).ok());
    REQUIRE(file->Sync().ok());
  }
  CHECK(Text(env.ReadFile(a)) == "hello!?");
  const std::span<const uint8_t> parts[] = {TextBytes("one "), TextBytes("two")};
  REQUIRE(env.WriteAtomic(b, parts).ok());
  CHECK(Text(env.ReadFile(b)) == "one two");
  std::vector<std::string> names = env.List(dir).value();
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"a", "b"});
  REQUIRE(env.Remove(a).ok());
  REQUIRE(env.Remove(a).ok());  // gone already: fine
  CHECK(!env.Exists(a).value());
  CHECK(env.List(dir + "/none").status().code() == StatusCode::kNotFound);
  {
    auto file = std::move(env.OpenWritable(b, true)).value();  // emptied
  }
  CHECK(Text(env.ReadFile(b)).empty());
  const int64_t before = env.MonotonicMicros();
  env.SleepFor(std::chrono::microseconds(1000));
  CHECK(env.MonotonicMicros() - before >= 1000);
}

std::string ReadAll(ReadableFile& file) {
  std::string text;
  uint8_t piece[3];
  for (uint64_t at = 0;;) {
    Result<size_t> got = file.ReadAt(at, piece);
    REQUIRE_MESSAGE(got.ok(), got.status().ToString());
    if (*got == 0) return text;
    text.append(reinterpret_cast<const char*>(piece), *got);
    at += *got;
  }
}

Status WriteTemporary(Env& env, const std::string& path, std::string_view text) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env.CreateTemporary(path));
  WEFT_RETURN_IF_ERROR(file->Append(TextBytes(text)));
  return file->Sync();
}

// Directories, temporary files moved into place, readers and locks: the same on either Env.
void DirectoryScript(Env& env, const std::string& dir) {
  const std::string objects = dir + "/objects", deep = objects + "/a/b";
  CHECK(*env.TypeOf(objects) == PathType::kNone);
  REQUIRE(env.CreateDirectories(deep).ok());
  REQUIRE(env.CreateDirectories(deep + "/").ok());  // there already: fine
  CHECK(*env.TypeOf(objects) == PathType::kDirectory);
  CHECK(*env.TypeOf(deep) == PathType::kDirectory);
  CHECK(env.ListDirectory(deep)->empty());

  // A temporary file, moved into place once synced; a second move to the same name loses.
  const std::string temp = deep + "/.x.tmp-1", other = deep + "/.x.tmp-2", x = deep + "/x";
  REQUIRE(WriteTemporary(env, temp, "first").ok());
  CHECK(env.CreateTemporary(temp).status().code() == StatusCode::kConflict);
  REQUIRE(env.RenameIfAbsent(temp, x).ok());
  CHECK(*env.TypeOf(temp) == PathType::kNone);
  CHECK(Text(env.ReadFile(x)) == "first");
  REQUIRE(WriteTemporary(env, other, "second").ok());
  CHECK(env.RenameIfAbsent(other, x).code() == StatusCode::kConflict);
  CHECK(Text(env.ReadFile(x)) == "first");
  CHECK(Text(env.ReadFile(other)) == "second");  // left where it was
  CHECK(env.RenameIfAbsent(other, objects + "/a").code() == StatusCode::kConflict);  // a directory
  CHECK(env.RenameIfAbsent(deep + "/missing", deep + "/y").code() == StatusCode::kNotFound);
  REQUIRE(env.Remove(other).ok());

  // A file where a directory would be, and a directory where a file would be.
  CHECK(env.CreateDirectories(x + "/sub").code() == StatusCode::kConflict);
  CHECK(env.CreateDirectories(x).code() == StatusCode::kConflict);
  CHECK(*env.TypeOf(x + "/sub") == PathType::kNone);
  CHECK(env.CreateTemporary(objects + "/a").status().code() == StatusCode::kConflict);
  CHECK(env.Remove(objects + "/a").code() == StatusCode::kInvalidArgument);
  CHECK(*env.TypeOf(objects + "/a") == PathType::kDirectory);
  CHECK(env.Remove(x + "/sub").ok());  // under a file: nothing there

  // Listing, with types.
  REQUIRE(WriteTemporary(env, objects + "/a/z", "").ok());
  CHECK(*env.ListDirectory(objects + "/a") ==
        std::vector<DirectoryEntry>{{"b", PathType::kDirectory}, {"z", PathType::kFile}});
  CHECK(env.ListDirectory(objects + "/none").status().code() == StatusCode::kNotFound);
  CHECK(env.ListDirectory(x).status().code() == StatusCode::kNotFound);

  // Reading at offsets; a reader keeps the file it opened, which grows while it is written.
  CHECK(env.OpenReadable(deep + "/none").status().code() == StatusCode::kNotFound);
  CHECK(env.OpenReadable(deep).status().code() == StatusCode::kInvalidArgument);
  CHECK(env.OpenReadable(x + "/sub").status().code() == StatusCode::kNotFound);
  auto reader = std::move(env.OpenReadable(x)).value();
  CHECK(*reader->Size() == 5);
  uint8_t two[2];
  CHECK(*reader->ReadAt(3, two) == 2);
  CHECK(std::string(two, two + 2) == "st");
  CHECK(*reader->ReadAt(4, two) == 1);
  CHECK(*reader->ReadAt(5, two) == 0);
  CHECK(*reader->ReadAt(50, two) == 0);
  const std::span<const uint8_t> replacement[] = {TextBytes("replaced")};
  REQUIRE(env.WriteAtomic(x, replacement).ok());
  CHECK(ReadAll(*reader) == "first");
  auto growing = std::move(env.CreateTemporary(deep + "/.g")).value();
  auto grown = std::move(env.OpenReadable(deep + "/.g")).value();
  CHECK(ReadAll(*grown).empty());
  REQUIRE(growing->Append(TextBytes("more")).ok());
  CHECK(*grown->Size() == 4);
  CHECK(ReadAll(*grown) == "more");
  // Stamps: a write changes the file's, another file in its place has another.
  const FileStamp before = std::move(grown->Stamp()).value();
  CHECK(before.size == 4);
  CHECK(*grown->Stamp() == before);
  REQUIRE(growing->Append(TextBytes("!")).ok());
  const FileStamp after = std::move(grown->Stamp()).value();
  CHECK(after != before);
  CHECK(after.identity == before.identity);
  CHECK(after.size == 5);
  const FileStamp replaced = std::move(std::move(env.OpenReadable(x)).value()->Stamp()).value();
  CHECK(replaced.identity != std::move(reader->Stamp()).value().identity);
  REQUIRE(env.Remove(deep + "/.g").ok());
  CHECK(ReadAll(*grown) == "more!");

  // Temporary files named at random: never the same name twice.
  std::string first_name, second_name;
  REQUIRE(CreateTemporaryNamed(env, deep + "/.t-", &first_name).ok());
  REQUIRE(CreateTemporaryNamed(env, deep + "/.t-", &second_name).ok());
  CHECK(first_name.rfind(deep + "/.t-", 0) == 0);
  CHECK(first_name.size() == deep.size() + 4 + 12);
  CHECK(first_name != second_name);
  CHECK(*env.TypeOf(second_name) == PathType::kFile);

  // A lock waits while another holds it.
  const std::string lock_path = dir + "/.lock";
  auto held = std::move(env.LockFile(lock_path)).value();
  CHECK(*env.TypeOf(lock_path) == PathType::kFile);
  std::atomic<bool> taken{false};
  std::thread other_holder([&] {
    auto lock = std::move(env.LockFile(lock_path)).value();
    taken = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!taken);
  held.reset();
  other_holder.join();
  CHECK(taken);
  REQUIRE(env.LockFile(lock_path).ok());
}

TEST_CASE("env: the machine's files and the in-memory ones behave alike") {
  const std::string dir = testing::TempPath("env_script");
  std::filesystem::create_directories(dir);
  Script(Env::Default(), dir);
  DirectoryScript(Env::Default(), dir);
  std::filesystem::remove_all(dir);
  MemEnv mem;
  Script(mem, "/data");
  DirectoryScript(mem, "/data");
}

TEST_CASE("mem env: a crash keeps what was synced and a prefix of the rest") {
  for (uint64_t keep : {0, 2, 100}) {
    CAPTURE(keep);
    MemEnv env;
    auto file = std::move(env.OpenWritable("/j", true)).value();
    REQUIRE(file->Append(TextBytes("synced")).ok());
    REQUIRE(file->Sync().ok());
    REQUIRE(file->Append(TextBytes("-torn")).ok());
    env.Crash(keep);
    CHECK(Text(env.ReadFile("/j")) ==
          std::string("synced-torn").substr(0, 6 + std::min<uint64_t>(keep, 5)));
    // The file handed out before the crash writes nowhere now (as into a removed file).
    REQUIRE(file->Append(TextBytes("late")).ok());
    REQUIRE(file->Sync().ok());
    CHECK(Text(env.ReadFile("/j")).find("late") == std::string::npos);
  }
}

TEST_CASE("mem env: a crash keeps directories and what was moved into place after a sync") {
  for (uint64_t keep : {0, 3, 100}) {
    CAPTURE(keep);
    MemEnv env;
    REQUIRE(env.CreateDirectories("/store/a").ok());
    REQUIRE(WriteTemporary(env, "/store/a/.synced", "whole").ok());
    REQUIRE(env.RenameIfAbsent("/store/a/.synced", "/store/a/synced").ok());
    // Moved into place without a sync: what a crash keeps of it is torn like any unsynced write.
    auto unsynced = std::move(env.CreateTemporary("/store/a/.unsynced")).value();
    REQUIRE(unsynced->Append(TextBytes("torn")).ok());
    REQUIRE(env.RenameIfAbsent("/store/a/.unsynced", "/store/a/unsynced").ok());
    REQUIRE(env.CreateTemporary("/store/a/.left").ok());
    auto lock = std::move(env.LockFile("/store/.lock")).value();
    env.Crash(keep);
    CHECK(*env.TypeOf("/store/a") == PathType::kDirectory);
    CHECK(Text(env.ReadFile("/store/a/synced")) == "whole");
    CHECK(Text(env.ReadFile("/store/a/unsynced")) ==
          std::string("torn").substr(0, std::min<uint64_t>(keep, 4)));
    CHECK(env.Exists("/store/a/.left").value());  // a temporary file may be left: the harder case
    CHECK(env.LockFile("/store/.lock").ok());     // the crashed process's lock went with it
  }
  MemEnv empty;
  REQUIRE(empty.CreateDirectories("/store").ok());
  empty.Crash();
  CHECK(*empty.TypeOf("/store") == PathType::kDirectory);
  CHECK(*empty.DiskAfterCrash()->TypeOf("/store") == PathType::kDirectory);
}

TEST_CASE("mem env: syncs can be made to fail after some succeed; a failed move changes nothing") {
  MemEnv env;
  REQUIRE(env.CreateDirectories("/s").ok());
  env.FailSyncs(1, 1);
  REQUIRE(WriteTemporary(env, "/s/.t", "bytes").ok());  // the one that passes
  const Status failed = env.RenameIfAbsent("/s/.t", "/s/x");
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK(failed.message() == "cannot sync /s/x: Input/output error");
  CHECK(!env.Exists("/s/x").value());
  CHECK(Text(env.ReadFile("/s/.t")) == "bytes");
  CHECK(env.RenameIfAbsent("/s/.t", "/s/x").ok());  // the failures asked for are spent
  env.FailSyncs(1);
  CHECK(env.CreateDirectories("/s/d").code() == StatusCode::kUnavailable);
  CHECK(*env.TypeOf("/s/d") == PathType::kNone);
}

TEST_CASE("mem env: failed syncs and a full disk fail with what happened, changing nothing") {
  MemEnv env;
  auto file = std::move(env.OpenWritable("/j", true)).value();
  REQUIRE(file->Append(TextBytes("abc")).ok());
  env.FailSyncs(1);
  const Status failed = file->Sync();
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK(failed.message() == "cannot sync /j: Input/output error");
  env.Crash();
  CHECK(Text(env.ReadFile("/j")).empty());  // the failed sync made nothing durable

  MemEnv full;
  full.SetCapacity(10);
  auto f = std::move(full.OpenWritable("/f", true)).value();
  REQUIRE(f->Append(TextBytes("12345678")).ok());
  const Status no_space = f->Append(TextBytes("abc"));
  CHECK(no_space.message() == "cannot write /f: No space left on device");
  CHECK(full.used_bytes() == 8);
  const std::span<const uint8_t> parts[] = {TextBytes("abc")};
  CHECK(!full.WriteAtomic("/g", parts).ok());
  CHECK(!full.Exists("/g").value());
  full.SetCapacity(100);
  CHECK(f->Append(TextBytes("abc")).ok());
}

TEST_CASE("mem env: the clocks move when told; the wall clock can jump back, the other cannot") {
  MemEnv env(1000000);
  CHECK(env.WallMicros() == 1000000);
  CHECK(env.MonotonicMicros() == 0);
  env.Advance(std::chrono::microseconds(500));
  CHECK(env.WallMicros() == 1000500);
  CHECK(env.MonotonicMicros() == 500);
  env.JumpWall(std::chrono::microseconds(-800000));
  CHECK(env.WallMicros() == 200500);
  CHECK(env.MonotonicMicros() == 500);
  env.Advance(std::chrono::microseconds(-5));  // ignored
  CHECK(env.MonotonicMicros() == 500);
}

}  // namespace
}  // namespace weft
