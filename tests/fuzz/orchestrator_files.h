// The orchestrator's files (docs/formats.md section 7) for the fuzz targets of their readers
// (journal_fuzz, snapshot_fuzz): journal records framed as the journal frames them, snapshot files
// as DurableCore::Compact writes them, and a small run of a DurableCore whose real journals and
// snapshots seed both targets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::fuzz {

// The journal's magic followed by each payload framed (u32 length, u64 XXH64, payload).
std::string JournalOf(const std::vector<std::string_view>& payloads);
// A snapshot file of `generation` holding `state` (its header with the right length and hash).
std::string SnapshotFileOf(uint64_t generation, std::string_view state);
// The pieces of `bytes` between 0xFF bytes, which well-formed UTF-8 (and so a JSON record) never
// holds; nothing for an empty input.
std::vector<std::string_view> SplitAtFF(std::string_view bytes);
std::string JoinWithFF(const std::vector<std::string>& pieces);

// What a small run of a DurableCore wrote: clusters registered, versions announced, jobs leased,
// submitted (once again as a duplicate), delivered stale and fresh, acknowledged, drained, expired
// by a tick, a cluster gone; then a Compact() and more events.
struct CoreRun {
  std::string journal;                // generation 0's journal file before the compaction
  std::vector<std::string> records;   // ... its records
  std::vector<std::string> states;    // OrchestratorCore::Snapshot() at points of the run
  std::string snapshot_file;          // generation 1's snapshot file
  std::vector<std::string> records1;  // the records of generation 1's journal
};
// Runs it in `dir` (which it empties); aborts if any step fails.
CoreRun RunSmallCore(const std::string& dir);

// Writes `bytes` to `path`, or aborts.
void WriteFileOrDie(const std::string& path, std::string_view bytes);

}  // namespace weft::fuzz
