#include "orchestrator/journal.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/temp_path.h"

namespace weft::orchestrator {
namespace {

using testing::TempPath;

std::vector<std::string> ReplayAll(const std::string& path, Status* status = nullptr) {
  std::vector<std::string> records;
  auto journal = Journal::Open(path, [&](std::string_view r) {
    records.emplace_back(r);
    return Status::Ok();
  });
  if (status != nullptr) *status = journal.status();
  return records;
}

TEST_CASE("journal: records come back in order after reopening; concurrent appends share syncs") {
  const std::string path = TempPath("journal");
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 50; ++i)
          REQUIRE(journal->Append("t" + std::to_string(t) + " r" + std::to_string(i)).ok());
      });
    }
    for (auto& thread : threads) thread.join();
    CHECK(journal->records() == 400);
    CHECK(journal->syncs() <= 400);
    REQUIRE(journal->Append(std::string(100000, 'x')).ok());
  }
  auto records = ReplayAll(path);
  REQUIRE(records.size() == 401);
  for (int t = 0; t < 8; ++t) {  // each thread's records in its order
    int next = 0;
    for (const auto& r : records) {
      if (r.rfind("t" + std::to_string(t) + " ", 0) == 0)
        CHECK(r == "t" + std::to_string(t) + " r" + std::to_string(next++));
    }
    CHECK(next == 50);
  }
  CHECK(records.back().size() == 100000);
  // Appending after a reopen continues the file.
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append("after").ok());
  }
  CHECK(ReplayAll(path).back() == "after");
  std::filesystem::remove(path);
}

TEST_CASE("journal: rotation moves later records to a new file; the old one replays intact") {
  const std::string first = TempPath("journal_a"), second = TempPath("journal_b");
  {
    auto journal =
        std::move(Journal::Open(first, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append("one").ok());
    REQUIRE(journal->Enqueue("two").ok());
    auto rotation = journal->Rotate(second);
    REQUIRE(rotation.ok());
    REQUIRE(journal->Enqueue("three").ok());
    REQUIRE(journal->Wait(*rotation).ok());
    CHECK(journal->path() == second);
    REQUIRE(journal->Append("four").ok());
    CHECK(journal->size() ==
          8 + 2 * (12 + 4) + 1);  // magic, two 12-byte headers, "three" and "four"
  }
  std::vector<std::string> old;
  REQUIRE(Journal::Replay(first, [&](std::string_view r) {
            old.emplace_back(r);
            return Status::Ok();
          }).ok());
  CHECK(old == std::vector<std::string>{"one", "two"});
  CHECK(ReplayAll(second) == std::vector<std::string>{"three", "four"});
  // A file rotated away from must be whole: a damaged tail there is an error, not a cut.
  std::filesystem::resize_file(first, std::filesystem::file_size(first) - 1);
  Status damaged = Journal::Replay(first, [](std::string_view) { return Status::Ok(); });
  CHECK(damaged.message().find("not the last journal file") != std::string::npos);
  std::filesystem::remove(first);
  std::filesystem::remove(second);
}

TEST_CASE(
    "journal: a torn tail is cut off; damage in the middle, a foreign file, a failing replay are "
    "errors") {
  const std::string path = TempPath("journal_torn");
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    for (int i = 0; i < 3; ++i) REQUIRE(journal->Append("record " + std::to_string(i)).ok());
  }
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 3);  // the last write torn by a crash
  CHECK(ReplayAll(path).size() == 2);
  CHECK(std::filesystem::file_size(path) < size - 3);  // cut back to the last whole record
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append("record 2 again").ok());
  }
  CHECK(ReplayAll(path).back() == "record 2 again");
  // Flip a byte of the first record: intact records follow, so this is damage.
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8 + 12 + 2);
    file.put('#');
  }
  Status status;
  ReplayAll(path, &status);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("followed by intact records") != std::string::npos);
  {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file << "not a journal at all";
  }
  ReplayAll(path, &status);
  CHECK(status.message().find("bad magic") != std::string::npos);
  std::filesystem::remove(path);
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append("x").ok());
  }
  auto refused =
      Journal::Open(path, [](std::string_view) { return InvalidArgument("unknown event"); });
  CHECK(refused.status().message().find("replaying record 0") != std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace weft::orchestrator
