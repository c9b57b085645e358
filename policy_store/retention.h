// Retention: deleting what no reader can still need (formats.md section 6.4).
//
// Pins are the explicit `pins` and those in the store (pins.h); the latest version is always
// pinned. Every version at or above the oldest pinned one must stay readable, so the versions kept
// are those from the keyframe it is rebuilt from (its `last_keyframe`) up to `latest`. Older
// manifests are deleted, oldest first, and then every blob only they referenced. `latest` and the
// pinned versions are never touched. Blobs that no manifest references (left by a publisher that
// died before writing its manifest) are not deleted: they cannot be told apart from a publish in
// progress. Parts of sharded versions already committed go, and catch-up deltas to versions before
// `latest` (no reader targets them). Thread-safe as the store is; one collector per run at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy_store/object_store.h"

namespace weft::policy_store {

struct CollectReport {
  uint64_t kept_from = 0;  // the oldest version kept
  uint64_t versions_deleted = 0;
  uint64_t blobs_deleted = 0;
  uint64_t bytes_freed = 0;
};

// `pins` are versions still needed besides the store's pins (workers, in-flight jobs' staleness
// windows, the trainer). With `dry_run`, nothing is deleted: the report says what would be.
Result<CollectReport> CollectGarbage(ObjectStore& store, const std::string& run_id,
                                     const std::vector<uint64_t>& pins, bool dry_run);

// What a publisher killed between writing a version's manifest (or a rank's part) and moving
// `latest` to it leaves: objects of versions after `latest`, which no reader sees. A rerun with the
// same weights completes them; other weights for that version would conflict with them for ever.
struct Unpublished {
  uint64_t latest = 0;
  std::vector<uint64_t> manifests;  // versions after `latest` with a manifest
  std::vector<std::string> keys;    // every object of versions after `latest` (manifests, parts
                                    // of sharded versions, catch-up records), sorted
};
Result<Unpublished> FindUnpublished(ObjectStore& store, const std::string& run_id);
// Makes `latest` name the version after it, whose manifest a publisher wrote but never made
// latest, once its manifest reads and every blob it references is in the store (compare-and-swap:
// safe whatever else runs). Returns that version.
Result<uint64_t> FinishUnpublished(ObjectStore& store, const std::string& run_id);
// Deletes every object of versions after `latest` (their blobs are left to gc), so that the next
// version can be published with other weights. Only while no publisher of the run runs: a rerun
// completing one of these versions meanwhile would be left without its manifest. Refuses if
// `latest` moves while it works. Returns what it deleted.
Result<Unpublished> DiscardUnpublished(ObjectStore& store, const std::string& run_id);

}  // namespace weft::policy_store
