// Catch-up deltas for pinned readers (formats.md section 6.7): after publishing version t, for
// every pinned version p < t - 1 (newest first, up to max_catchup_bases, at most max_catchup_lag
// behind), the single delta from p to t, so that a reader holding p downloads exactly that. Each
// is the squash of the catch-up delta from p to t - 1 (or, for a new pin, of the cheapest chain of
// deltas from p) with t's plain delta, computed without the weights. Part of publishing
// (publish.h); thread-safe as the store is.
#pragma once

#include <string>
#include <vector>

#include "policy_store/manifest.h"
#include "policy_store/object_store.h"
#include "policy_store/publish.h"
#include "sync/delta_codec.h"

namespace weft::policy_store {

// Writes the catch-up deltas to `manifest`'s version, whose plain delta is `delta`, with their
// records (CatchupKey), and returns them. What leads to version t - 1 comes from `recent` when it
// holds it, otherwise from the store (verified).
Result<std::vector<DerivedDelta>> PublishCatchups(ObjectStore& store, const std::string& run_id,
                                                  const Manifest& manifest,
                                                  const sync::ModelDelta& delta,
                                                  const KeyframePolicy& policy, int threads,
                                                  const RecentDeltas* recent = nullptr,
                                                  const DeltaBlobCoding* coding = nullptr);

}  // namespace weft::policy_store
