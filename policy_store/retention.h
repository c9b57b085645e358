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

}  // namespace weft::policy_store
