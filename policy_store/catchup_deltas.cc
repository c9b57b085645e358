#include "policy_store/catchup_deltas.h"

#include <functional>
#include <set>

#include "common/byte_io.h"
#include "policy_store/pins.h"
#include "policy_store/planner.h"
#include "policy_store/run_objects.h"

namespace weft::policy_store {

Result<std::vector<DerivedDelta>> PublishCatchups(ObjectStore& store, const std::string& run_id,
                                                  const Manifest& manifest,
                                                  const sync::ModelDelta& delta,
                                                  const KeyframePolicy& policy, int threads,
                                                  const RecentDeltas* recent,
                                                  const DeltaBlobCoding* coding) {
  const DeltaBlobCoding plain;
  if (coding == nullptr) coding = &plain;
  std::vector<DerivedDelta> written;
  const uint64_t target = manifest.version;
  if (policy.max_catchup_bases == 0 || target < 2) return written;
  WEFT_ASSIGN_OR_RETURN(auto pins, ListPins(store, run_id));
  std::set<uint64_t, std::greater<uint64_t>> bases;  // newest first: the cheapest to keep
  for (const auto& [holder, version] : pins) {
    if (version + 1 < target && target - version <= policy.max_catchup_lag) bases.insert(version);
  }
  std::optional<Manifest> before;  // version target - 1's, read when a new pin needs a chain
  for (uint64_t base : bases) {
    if (written.size() == policy.max_catchup_bases) break;
    const std::string what =
        "catch-up delta from version " + std::to_string(base) + " to " + std::to_string(target);
    // From `base` to target - 1: held, or the previous catch-up delta, or the cheapest chain.
    std::vector<const sync::ModelDelta*> chain;
    std::vector<LoadedDelta> loaded;  // `chain` may point into these
    if (const sync::ModelDelta* held = recent ? recent->Find(base, target - 1) : nullptr) {
      chain.push_back(held);
    } else {
      WEFT_ASSIGN_OR_RETURN(std::optional<BlobRef> previous,
                            FindCatchup(store, run_id, target - 1, base));
      std::vector<BlobRef> blobs;
      if (previous) {
        blobs.push_back(*previous);
      } else {
        if (!before) {
          Result<Manifest> read = ReadManifest(store, run_id, target - 1);
          if (!read.ok()) return read.status().WithContext(what);
          before = std::move(*read);
        }
        Result<PullPlan> plan = PlanPath(store, run_id, *before, base, false);
        if (!plan.ok()) continue;  // the pinned version was collected or never chained
        for (const PullPlan::Step& step : plan->steps) blobs.push_back(step.blob);
      }
      for (const BlobRef& blob : blobs) {
        WEFT_ASSIGN_OR_RETURN(LoadedDelta next, FetchDelta(store, blob, what));
        loaded.push_back(std::move(next));
      }
      for (const LoadedDelta& d : loaded) {
        if (sync::HasContextChunks(d.delta)) break;  // squashes only with its base's weights
        chain.push_back(&d.delta);
      }
      if (chain.size() != loaded.size() || chain.empty()) continue;
    }
    chain.push_back(&delta);
    Result<sync::ModelDelta> squashed = sync::SquashChain(chain, threads);
    if (!squashed.ok()) return squashed.status().WithContext(what);
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, coding->Serialize(*squashed));
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    Catchup record{run_id, base, target, blob};
    const std::string text = record.ToJson();
    WEFT_RETURN_IF_ERROR(store.PutImmutable(CatchupKey(run_id, target, base), TextBytes(text)));
    written.push_back({base, blob, std::move(squashed).value()});
  }
  return written;
}

}  // namespace weft::policy_store
