#include "policy_store/skip_deltas.h"

#include <algorithm>

#include "policy_store/run_objects.h"

namespace weft::policy_store {

Result<std::vector<DerivedDelta>> PublishSkips(ObjectStore& store, const std::string& run_id,
                                               uint64_t version, const sync::ModelDelta& delta,
                                               const KeyframePolicy& policy, int threads,
                                               const RecentDeltas* recent,
                                               const DeltaBlobCoding* coding) {
  const DeltaBlobCoding plain;
  if (coding == nullptr) coding = &plain;
  std::vector<DerivedDelta> skips;
  skips.reserve(static_cast<size_t>(std::max(policy.max_skip_level, 0)));
  const sync::ModelDelta* right = &delta;  // the span 2^(level-1) ending at `version`
  for (int level = 1; level <= policy.max_skip_level; ++level) {
    const uint64_t span = uint64_t{1} << level;
    if (version % span != 0 || version < span) break;
    const uint64_t base = version - span;
    const uint64_t middle = version - span / 2;
    const std::string what =
        "skip delta from version " + std::to_string(base) + " to " + std::to_string(middle);
    // The left half: the delta of span 2^(level-1) ending at `middle`.
    const sync::ModelDelta* left = recent ? recent->Find(base, middle) : nullptr;
    LoadedDelta loaded;
    if (left == nullptr) {
      WEFT_ASSIGN_OR_RETURN(Manifest left_manifest, ReadManifest(store, run_id, middle));
      std::optional<BlobRef> left_blob;
      if (level == 1) {
        left_blob = left_manifest.delta;
      } else {
        for (const SkipDelta& skip : left_manifest.skips) {
          if (skip.base == base) left_blob = skip.blob;
        }
      }
      if (!left_blob) break;  // published without skips: nothing longer can be built
      WEFT_ASSIGN_OR_RETURN(loaded, FetchDelta(store, *left_blob, what));
      if (sync::HasContextChunks(loaded.delta)) break;  // squashes only with its base's weights
      left = &loaded.delta;
    }
    Result<sync::ModelDelta> squashed = sync::SquashModelDeltas(*left, *right, threads);
    if (!squashed.ok()) return squashed.status().WithContext(what);
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, coding->Serialize(*squashed));
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    skips.push_back({base, blob, std::move(squashed).value()});
    right = &skips.back().delta;
  }
  return skips;
}

}  // namespace weft::policy_store
