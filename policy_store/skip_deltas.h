// Skip deltas (formats.md section 6.3): at a version v divisible by 2^j (1 <= j <=
// max_skip_level, 2^j <= v), the delta from v - 2^j straight to v, the squash of the two skip
// deltas of span 2^(j-1) ending at v - 2^(j-1) and at v (span 1: the plain deltas). A reader far
// behind then downloads a few squashed deltas instead of the whole chain. Part of publishing
// (publish.h); thread-safe as the store is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy_store/object_store.h"
#include "policy_store/publish.h"
#include "sync/delta_codec.h"

namespace weft::policy_store {

// Writes the skip deltas ending at `version`, whose plain delta (from version - 1) is `delta`,
// and returns them by increasing span, written as `coding` says (plain without it). The left halves
// come from `recent` when it holds them, otherwise from the store (verified). Stops at the first
// span whose left half was never published, or was written with context chunks (which squash only
// with weights the publisher no longer holds).
Result<std::vector<DerivedDelta>> PublishSkips(ObjectStore& store, const std::string& run_id,
                                               uint64_t version, const sync::ModelDelta& delta,
                                               const KeyframePolicy& policy, int threads,
                                               const RecentDeltas* recent = nullptr,
                                               const DeltaBlobCoding* coding = nullptr);

}  // namespace weft::policy_store
