// The path planner: the cheapest way, in bytes downloaded, to bring a copy of the served tensors
// to a target version. Readers (reader.h) follow its plans; the publisher (catchup_deltas.h) uses
// it to find the chain a new catch-up delta squashes.
//
// A path starts from the version the reader holds (free) or from the newest keyframe at or below
// the target (its size), and follows edges: each version's delta from its predecessor, its skip
// deltas (formats.md section 6.3), and a catch-up delta from the held version straight to the
// target when the publisher wrote one (section 6.7). Manifests are fetched concurrently, each a
// round trip on a remote store. Thread-safe as the store is.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "policy_store/manifest.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

struct PullPlan {
  struct Step {
    uint64_t base = 0;  // the version the delta applies to
    BlobRef blob;
    bool catchup = false;
  };
  uint64_t target = 0;
  bool from_keyframe = false;
  uint64_t start = 0;  // the keyframe's version, or the version held
  Manifest keyframe;  // when a keyframe was allowed: the manifest of the one at or below the target
  std::vector<Step> steps;  // in the order they apply
  // "keyframe v100 + 3 deltas", "4 deltas from v96", "1 catch-up delta from v90".
  std::string Describe() const;
};

// The cheapest path to `goal` (the target's manifest) from `have` (the version held, if any) or,
// when `allow_keyframe`, from the keyframe at or below it. kDataLoss when no chain reaches it;
// kInvalidArgument without a start.
Result<PullPlan> PlanPath(ObjectStore& store, const std::string& run_id, const Manifest& goal,
                          std::optional<uint64_t> have, bool allow_keyframe,
                          int fetch_concurrency = 16);

// The planner itself, a pure function of manifests (PlanPath fetches them and calls it; the
// simulator calls it on manifests it keeps in memory). `keyframe` is the manifest of
// goal.last_keyframe when a keyframe start is allowed, else null; `manifests` are those of
// PlanLow(...) + 1 up to the target, in order (the last is the goal's); `catchup` the catch-up
// delta from `have` to the target, if one was written.
Result<PullPlan> PlanFromManifests(const Manifest& goal, std::optional<uint64_t> have,
                                   const Manifest* keyframe, std::span<const Manifest> manifests,
                                   std::optional<BlobRef> catchup);
// The lowest version a plan looks at: the held version, or the keyframe when one may start it.
uint64_t PlanLow(const Manifest& goal, std::optional<uint64_t> have, bool allow_keyframe);

// The catch-up delta the publisher wrote from `base` to `target`, if any. A record that is not
// valid is reported and ignored (catch-up deltas are an optimisation).
Result<std::optional<BlobRef>> FindCatchup(ObjectStore& store, const std::string& run_id,
                                           uint64_t target, uint64_t base);

}  // namespace weft::policy_store
