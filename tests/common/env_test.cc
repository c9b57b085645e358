// Env: the machine's and the in-memory one behave alike where they should, and the in-memory one
// keeps across a crash exactly what a disk would.
#include "common/env.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "common/mem_env.h"
#include "tests/temp_path.h"

namespace weft {
namespace {

std::span<const uint8_t> Bytes(std::string_view text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

std::string Text(const Result<std::vector<uint8_t>>& bytes) {
  REQUIRE_MESSAGE(bytes.ok(), bytes.status().ToString());
  return std::string(bytes->begin(), bytes->end());
}

// The same script on either Env, in directory `dir`.
void Script(Env& env, const std::string& dir) {
  const std::string a = dir + "/a", b = dir + "/b";
  CHECK(!env.Exists(a));
  CHECK(env.OpenWritable(a, false).status().code() == StatusCode::kNotFound);
  CHECK(env.ReadFile(a).status().code() == StatusCode::kNotFound);
  {
    auto file = std::move(env.OpenWritable(a, true)).value();
    REQUIRE(file->Append(Bytes("hello ")).ok());
    REQUIRE(file->Append(Bytes("world")).ok());
    REQUIRE(file->Sync().ok());
    REQUIRE(file->Truncate(5).ok());
    REQUIRE(file->Append(Bytes("!")).ok());
    REQUIRE(file->Sync().ok());
  }
  CHECK(Text(env.ReadFile(a)) == "hello!");
  {
    auto file = std::move(env.OpenWritable(a, false)).value();  // appends at the end
    REQUIRE(file->Append(Bytes("?")).ok());
    REQUIRE(file->Sync().ok());
  }
  CHECK(Text(env.ReadFile(a)) == "hello!?");
  const std::span<const uint8_t> parts[] = {Bytes("one "), Bytes("two")};
  REQUIRE(env.WriteAtomic(b, parts).ok());
  CHECK(Text(env.ReadFile(b)) == "one two");
  std::vector<std::string> names = env.List(dir);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"a", "b"});
  REQUIRE(env.Remove(a).ok());
  REQUIRE(env.Remove(a).ok());  // gone already: fine
  CHECK(!env.Exists(a));
  CHECK(env.List(dir + "/none").empty());
  {
    auto file = std::move(env.OpenWritable(b, true)).value();  // emptied
  }
  CHECK(Text(env.ReadFile(b)).empty());
  const int64_t before = env.MonotonicMicros();
  env.SleepFor(std::chrono::microseconds(1000));
  CHECK(env.MonotonicMicros() - before >= 1000);
}

TEST_CASE("env: the machine's files and the in-memory ones behave alike") {
  const std::string dir = testing::TempPath("env_script");
  std::filesystem::create_directories(dir);
  Script(Env::Default(), dir);
  std::filesystem::remove_all(dir);
  MemEnv mem;
  Script(mem, "/data");
}

TEST_CASE("mem env: a crash keeps what was synced and a prefix of the rest") {
  for (uint64_t keep : {0, 2, 100}) {
    CAPTURE(keep);
    MemEnv env;
    auto file = std::move(env.OpenWritable("/j", true)).value();
    REQUIRE(file->Append(Bytes("synced")).ok());
    REQUIRE(file->Sync().ok());
    REQUIRE(file->Append(Bytes("-torn")).ok());
    env.Crash(keep);
    CHECK(Text(env.ReadFile("/j")) ==
          std::string("synced-torn").substr(0, 6 + std::min<uint64_t>(keep, 5)));
    // The file handed out before the crash writes nowhere now (as into a removed file).
    REQUIRE(file->Append(Bytes("late")).ok());
    REQUIRE(file->Sync().ok());
    CHECK(Text(env.ReadFile("/j")).find("late") == std::string::npos);
  }
}

TEST_CASE("mem env: failed syncs and a full disk fail with what happened, changing nothing") {
  MemEnv env;
  auto file = std::move(env.OpenWritable("/j", true)).value();
  REQUIRE(file->Append(Bytes("abc")).ok());
  env.FailSyncs(1);
  const Status failed = file->Sync();
  CHECK(failed.code() == StatusCode::kUnavailable);
  CHECK(failed.message() == "cannot sync /j: Input/output error");
  env.Crash();
  CHECK(Text(env.ReadFile("/j")).empty());  // the failed sync made nothing durable

  MemEnv full;
  full.SetCapacity(10);
  auto f = std::move(full.OpenWritable("/f", true)).value();
  REQUIRE(f->Append(Bytes("12345678")).ok());
  const Status no_space = f->Append(Bytes("abc"));
  CHECK(no_space.message() == "cannot write /f: No space left on device");
  CHECK(full.used_bytes() == 8);
  const std::span<const uint8_t> parts[] = {Bytes("abc")};
  CHECK(!full.WriteAtomic("/g", parts).ok());
  CHECK(!full.Exists("/g"));
  full.SetCapacity(100);
  CHECK(f->Append(Bytes("abc")).ok());
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
