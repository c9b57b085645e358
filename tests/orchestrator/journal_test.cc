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

// Records are JSON objects; these carry a label.
std::string Rec(const std::string& label) { return "{\"" + label + "\"}"; }

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
          REQUIRE(journal->Append(Rec("t" + std::to_string(t) + " r" + std::to_string(i))).ok());
      });
    }
    for (auto& thread : threads) thread.join();
    CHECK(journal->records() == 400);
    CHECK(journal->syncs() <= 400);
    REQUIRE(journal->Append(Rec(std::string(100000, 'x'))).ok());
  }
  auto records = ReplayAll(path);
  REQUIRE(records.size() == 401);
  for (int t = 0; t < 8; ++t) {  // each thread's records in its order
    int next = 0;
    for (const auto& r : records) {
      if (r.rfind(Rec("t" + std::to_string(t) + " ").substr(0, 4), 0) == 0 &&
          r.find(" r") != std::string::npos)
        CHECK(r == Rec("t" + std::to_string(t) + " r" + std::to_string(next++)));
    }
    CHECK(next == 50);
  }
  CHECK(records.back().size() == 100004);
  // Appending after a reopen continues the file.
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append(Rec("after")).ok());
  }
  CHECK(ReplayAll(path).back() == Rec("after"));
  std::filesystem::remove(path);
}

TEST_CASE("journal: rotation moves later records to a new file; the old one replays intact") {
  const std::string first = TempPath("journal_a"), second = TempPath("journal_b");
  {
    auto journal =
        std::move(Journal::Open(first, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append(Rec("one")).ok());
    REQUIRE(journal->Enqueue(Rec("two")).ok());
    auto rotation = journal->Rotate(second);
    REQUIRE(rotation.ok());
    REQUIRE(journal->Enqueue(Rec("three")).ok());
    REQUIRE(journal->Wait(*rotation).ok());
    CHECK(journal->path() == second);
    REQUIRE(journal->Append(Rec("four")).ok());
    CHECK(journal->size() ==
          8 + 2 * (12 + 8) + 1);  // magic, two 12-byte headers, {"three"} and {"four"}
  }
  std::vector<std::string> old;
  REQUIRE(Journal::Replay(first, [&](std::string_view r) {
            old.emplace_back(r);
            return Status::Ok();
          }).ok());
  CHECK(old == std::vector<std::string>{Rec("one"), Rec("two")});
  CHECK(ReplayAll(second) == std::vector<std::string>{Rec("three"), Rec("four")});
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
    for (int i = 0; i < 3; ++i) REQUIRE(journal->Append(Rec("record " + std::to_string(i))).ok());
  }
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 3);  // the last write torn by a crash
  CHECK(ReplayAll(path).size() == 2);
  CHECK(std::filesystem::file_size(path) < size - 3);  // cut back to the last whole record
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    REQUIRE(journal->Append(Rec("record 2 again")).ok());
  }
  CHECK(ReplayAll(path).back() == Rec("record 2 again"));
  // Flip a byte of the first record: intact records follow, so this is damage.
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8 + 12 + 2);
    file.put('#');
  }
  Status status;
  ReplayAll(path, &status);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("at byte 8 is damaged") != std::string::npos);
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
    REQUIRE(journal->Append(Rec("x")).ok());
  }
  auto refused =
      Journal::Open(path, [](std::string_view) { return InvalidArgument("unknown event"); });
  CHECK(refused.status().message().find("replaying record 0 at byte 8") != std::string::npos);
  std::filesystem::remove(path);
}

// Writes `count` records and returns the file's bytes and where each record starts.
std::vector<uint8_t> WriteRecords(const std::string& path, int count, std::vector<size_t>* starts) {
  std::filesystem::remove(path);
  {
    auto journal =
        std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
    size_t at = 8;
    for (int i = 0; i < count; ++i) {
      const std::string record = Rec("record number " + std::to_string(i));
      starts->push_back(at);
      at += 12 + record.size();
      REQUIRE(journal->Append(record).ok());
    }
  }
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

TEST_CASE("journal: damage to a length field is refused, naming the offset, never cut as torn") {
  const std::string path = TempPath("journal_length");
  std::vector<size_t> starts;
  const std::vector<uint8_t> good = WriteRecords(path, 5, &starts);
  // The length of a record in the middle made huge: it seems to run past the end of the file.
  std::vector<uint8_t> bytes = good;
  bytes[starts[1] + 3] = 0x01;
  WriteBytes(path, bytes);
  Status status;
  CHECK(ReplayAll(path, &status).size() == 1);  // record 0, then the refusal
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("record 1 at byte " + std::to_string(starts[1])) !=
        std::string::npos);
  CHECK(std::filesystem::file_size(path) == good.size());  // nothing cut
  // The same in the last record: the bytes to the end of the file still match its hash.
  bytes = good;
  bytes[starts[4]] ^= 0x40;
  WriteBytes(path, bytes);
  ReplayAll(path, &status);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("length field is damaged") != std::string::npos);
  CHECK(std::filesystem::file_size(path) == good.size());
  // A length made smaller: the record is whole but fails its hash.
  bytes = good;
  bytes[starts[2]] -= 1;
  WriteBytes(path, bytes);
  ReplayAll(path, &status);
  CHECK(status.code() == StatusCode::kDataLoss);
  std::filesystem::remove(path);
}

TEST_CASE("journal: damage to the last record is refused; only a prefix of a write is torn") {
  const std::string path = TempPath("journal_last");
  std::vector<size_t> starts;
  const std::vector<uint8_t> good = WriteRecords(path, 4, &starts);
  for (size_t at : {starts[3] + 5, starts[3] + 12, good.size() - 1}) {  // hash, payload, last byte
    std::vector<uint8_t> bytes = good;
    bytes[at] ^= 0xFF;
    WriteBytes(path, bytes);
    Status status;
    ReplayAll(path, &status);
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(status.message().find("at byte " + std::to_string(starts[3])) != std::string::npos);
  }
  // Torn: a partial header, or a whole header whose payload was not all written.
  for (size_t keep : {starts[3] + 5, starts[3] + 12, good.size() - 1}) {
    WriteBytes(path, std::vector<uint8_t>(good.begin(), good.begin() + keep));
    Status status;
    CHECK(ReplayAll(path, &status).size() == 3);
    CHECK(status.ok());
    CHECK(std::filesystem::file_size(path) == starts[3]);
  }
  std::filesystem::remove(path);
}

TEST_CASE("journal: too large or non-object records are refused before anything is queued") {
  const std::string path = TempPath("journal_admits");
  auto journal =
      std::move(Journal::Open(path, [](std::string_view) { return Status::Ok(); })).value();
  CHECK(journal->Admits(Journal::kMaxRecordBytes).ok());
  CHECK(journal->Admits(Journal::kMaxRecordBytes + 1).code() == StatusCode::kInvalidArgument);
  CHECK(journal->Append("not an object").code() == StatusCode::kInvalidArgument);
  CHECK(journal->Append("").code() == StatusCode::kInvalidArgument);
  CHECK(journal->records() == 0);
  journal.reset();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace weft::orchestrator
