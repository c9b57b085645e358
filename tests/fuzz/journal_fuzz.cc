// libFuzzer target: the orchestrator's journal and snapshot readers (docs/formats.md section 7),
// through DurableCore::Open (Journal::Open and Journal::Replay, ReadSnapshot, event parsing and
// replay into the core).
//
// The first byte of an input chooses what it becomes, in a fresh directory:
//   0: the rest is the whole journal file (magic included);
//   1: the journal's magic, then the rest;
//   2: the journal's magic, then the rest's pieces between 0xFF bytes, each framed as a record
//      (length and hash right), so that the fuzzer reaches the event parser and the core;
//   3: a snapshot file of generation 1 holding the first piece (header right), and generation 1's
//      journal of the other pieces framed as records.
// Open must refuse or succeed without crashing. When it succeeds, the files it leaves must open
// again to exactly the same state (replay is deterministic, and cutting a torn tail is done once
// for all), and after a Compact() they must still open to that state (the snapshot keeps it all).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/logging.h"
#include "orchestrator/durable_core.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/orchestrator_files.h"

namespace weft::fuzz {
namespace {

using orchestrator::DurableCore;
using orchestrator::OrchestratorCore;

const std::string& Directory() {
  static const std::string* dir = new std::string(FreshDirectory("journal"));
  return *dir;
}

void Empty(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    std::filesystem::remove_all(entry.path());
}

std::string StateOf(const DurableCore& core) {
  return core.Inspect([](const OrchestratorCore& c) { return c.Snapshot(); });
}

[[noreturn]] void Finding(const std::string& what, const std::string& first,
                          const std::string& second) {
  std::fprintf(stderr, "\n==== weft fuzz finding: %s\n---- first:\n%s\n---- then:\n%s\n----\n",
               what.c_str(), first.substr(0, 8192).c_str(), second.substr(0, 8192).c_str());
  std::abort();
}

std::vector<std::string> Seeds() {
  const CoreRun run = RunSmallCore(Directory() + "/seed-run");
  std::vector<std::string> seeds;
  auto add = [&](char kind, const std::string& rest) { seeds.push_back(kind + rest); };
  add('\0', run.journal);
  add('\0', run.journal.substr(0, run.journal.size() - 5));  // a torn last record
  add('\1', run.journal.substr(8));
  add('\2', JoinWithFF(run.records));
  std::vector<std::string> generation1 = {run.states[1]};
  generation1.insert(generation1.end(), run.records1.begin(), run.records1.end());
  add('\3', JoinWithFF(generation1));
  add('\3', run.states[0]);
  return seeds;
}

}  // namespace
}  // namespace weft::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace weft::fuzz;
  weft::SetLogLevel(weft::LogLevel::kError);  // a torn tail cut is a warning for every input
  std::atexit([] { std::filesystem::remove_all(Directory()); });
  const std::string seeds = SeedDirectoryArgument(*argc, *argv);
  if (!seeds.empty()) WriteSeedsAndExit(seeds, Seeds());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft::fuzz;
  if (size == 0) return 0;
  const std::string& dir = Directory();
  Empty(dir);
  const std::string journal = dir + "/journal";
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      WriteFileOrDie(journal, rest);
      break;
    case 1:
      WriteFileOrDie(journal, "WEFTJRN1" + std::string(rest));
      break;
    case 2:
      WriteFileOrDie(journal, JournalOf(SplitAtFF(rest)));
      break;
    default: {
      std::vector<std::string_view> pieces = SplitAtFF(rest);
      const std::string_view state = pieces.empty() ? std::string_view() : pieces.front();
      if (!pieces.empty()) pieces.erase(pieces.begin());
      WriteFileOrDie(journal + ".snapshot.1", SnapshotFileOf(1, state));
      WriteFileOrDie(journal + ".1", JournalOf(pieces));
    }
  }
  const weft::orchestrator::CoreConfig config;
  auto opened = DurableCore::Open(journal, config);
  if (!opened.ok()) return 0;
  const std::string state = StateOf(**opened);
  opened->reset();
  auto again = DurableCore::Open(journal, config);
  if (!again.ok())
    Finding("the files open once, then not again: " + again.status().message(), state, "");
  if (StateOf(**again) != state)
    Finding("the files open again to another state", state, StateOf(**again));
  weft::Status compacted = (*again)->Compact();
  if (!compacted.ok()) Finding("Compact() fails: " + compacted.message(), state, "");
  again->reset();
  auto compacted_again = DurableCore::Open(journal, config);
  if (!compacted_again.ok())
    Finding("after Compact() the files do not open: " + compacted_again.status().message(), state,
            "");
  if (StateOf(**compacted_again) != state)
    Finding("after Compact() the files open to another state", state, StateOf(**compacted_again));
  return 0;
}
