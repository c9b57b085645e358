// Publishing the versions of a run (layout: manifest.h; formats.md section 6).
//
// PublishVersion writes one version in the order that keeps the store readable at every instant:
// blobs (the delta, skip deltas, a keyframe when one is due), then the manifest, then `latest` by
// compare-and-swap from the previous version, then catch-up deltas for pinned readers. A publisher
// killed at any point leaves `latest` at a complete version; a rerun either completes the same
// version (immutable objects with equal bytes are accepted again) or fails with kConflict when
// another publisher wrote that version differently.
//
// Sharded trainers publish per rank (PublishShard) and one rank merges the parts (CommitShards).
// PublishModel publishes a whole served model (a checkpoint) as the next version of a run.
//
// A publisher that goes on from version to version passes a RecentDeltas, so that skip and
// catch-up deltas are squashed from the deltas it keeps in memory instead of from blobs it wrote
// itself and would read back. Thread-safe as the store is, but one publisher per run (per rank).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "policy_store/manifest.h"
#include "policy_store/object_store.h"
#include "sync/served_model.h"

namespace weft::policy_store {

struct KeyframePolicy {
  uint64_t interval = 50;           // a keyframe at least every this many versions
  double delta_budget = 0.5;        // ... or once the delta bytes since the last keyframe exceed
                                    // this fraction of the keyframe's size
  int max_skip_level = 10;          // skip deltas span up to 2^max_skip_level versions (0: none)
  size_t max_catchup_bases = 16;    // catch-up deltas for at most this many pinned versions
  uint64_t max_catchup_lag = 1024;  // ... at most this many versions behind
  // How delta blobs are coded: context chunks are smaller but cost more to encode and to apply.
  // A publisher keeps its deltas in memory in the plain mode either way (RecentDeltas), since
  // only those squash without the weights.
  sync::DeltaMode delta_mode = sync::DeltaMode::kPlain;
};

// How the delta blobs of one version are written: every delta a publish writes (the version's
// own, skip and catch-up deltas) ends at that version, so the contexts of context chunks are
// read from its served tensors, `result`. Without them (a sharded commit, which holds no
// weights) deltas are written in the plain mode.
struct DeltaBlobCoding {
  sync::DeltaMode mode = sync::DeltaMode::kPlain;
  std::vector<sync::TensorBytes> result;
  int threads = 1;

  Result<std::vector<uint8_t>> Serialize(const sync::ModelDelta& delta) const;
};

// The deltas a publisher's next publishes squash, kept in memory: for each skip level the newest
// delta of that span (level 0: the plain delta of the last version), and the catch-up deltas to
// the last version; and the size of the last keyframe. What is not held (a publisher that
// restarted, a budget spent) is read back from the store, with the same result. At most
// `max_bytes` of deltas (counted serialised) are held; a delta that would not fit is not kept.
// Not thread-safe.
class RecentDeltas {
 public:
  explicit RecentDeltas(uint64_t max_bytes = uint64_t{1} << 30) : max_bytes_(max_bytes) {}

  // The delta from `base` to `target`, if held.
  const sync::ModelDelta* Find(uint64_t base, uint64_t target) const;
  // Holds `delta` (from `base` to `target`) as the newest skip delta of `level`, replacing the
  // previous one. Returns the delta held, or null (and `delta` untouched) when it does not fit.
  const sync::ModelDelta* KeepSkip(int level, uint64_t base, uint64_t target,
                                   sync::ModelDelta&& delta);
  // Holds a catch-up delta (the same way); ForgetCatchupsBefore drops those to older targets.
  const sync::ModelDelta* KeepCatchup(uint64_t base, uint64_t target, sync::ModelDelta&& delta);
  void ForgetCatchupsBefore(uint64_t target);

  void KeepKeyframeSize(uint64_t version, uint64_t bytes) { keyframe_ = {version, bytes}; }
  std::optional<uint64_t> KeyframeSize(uint64_t version) const;

  uint64_t bytes() const { return bytes_; }

 private:
  struct Entry {
    int level = -1;  // skip level, or -1 for a catch-up delta
    uint64_t bytes = 0;
    sync::ModelDelta delta;
  };
  const sync::ModelDelta* Keep(int level, uint64_t base, uint64_t target, sync::ModelDelta&& delta);
  void Erase(std::map<std::pair<uint64_t, uint64_t>, Entry>::iterator it);

  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, Entry> entries_;  // (base, target) -> delta
  std::optional<std::pair<uint64_t, uint64_t>> keyframe_;   // (version, bytes)
};

// A delta the publisher derived and wrote (a skip or catch-up delta): its base, its blob, and the
// delta itself, which the publisher keeps in its RecentDeltas once the version is published.
struct DerivedDelta {
  uint64_t base = 0;
  BlobRef blob;
  sync::ModelDelta delta;
};

// Publishes `model` (the served tensors of the new version) as version `previous->version + 1`
// (or 0 when `previous` is null) with `delta` from the previous version (null for version 0).
// At a version v divisible by 2^j (1 <= j <= max_skip_level, 2^j <= v) it also publishes the skip
// delta from v - 2^j (skip_deltas.h), and after the pointer the catch-up deltas of pinned readers
// (catchup_deltas.h). Returns the new manifest.
Result<Manifest> PublishVersion(ObjectStore& store, const std::string& run_id,
                                const Manifest* previous, const sync::ServedModel& model,
                                const sync::ModelDelta* delta, const KeyframePolicy& policy,
                                int threads = 1, RecentDeltas* recent = nullptr);

// Whether the version after `previous` gets a keyframe: version 0, then once `interval` versions
// have passed since the last keyframe, or once the deltas since it (up to `previous`) exceed
// `delta_budget` times its size. Depends on `previous` only, so every rank of a sharded trainer
// decides alike.
Result<bool> KeyframeDue(ObjectStore& store, const std::string& run_id, const Manifest* previous,
                         const KeyframePolicy& policy, RecentDeltas* recent = nullptr);

// Publishes a whole served model (read from a checkpoint, say) as the next version of the run:
// version 0 when the run has none, otherwise with the delta from the latest version, rebuilt from
// the store. `expected`, when given, must be that next version (kConflict otherwise). The model
// must hold the latest version's tensors (names, dtypes, shapes): a different set needs a new run.
Result<Manifest> PublishModel(ObjectStore& store, const std::string& run_id,
                              const sync::ServedModel& model, const KeyframePolicy& policy,
                              int threads, std::optional<uint64_t> expected = std::nullopt);

// Sharded trainers: each rank writes its part of the version after `previous` (null for version
// 0): the delta of its tensors and, when a keyframe is due, their keyframe, then its part
// manifest (ShardKey). Then one rank calls CommitShards, which waits up to `deadline` for all
// `world` parts, checks that they continue `previous`, agree and hold disjoint tensors, merges
// their deltas into one (reading them: a few percent of the weights' size) and publishes the
// version as PublishVersion does. A keyframe is not merged: the manifest names the ranks'
// keyframes, in rank order, as the parts of the version's keyframe, so the committing rank never
// reads another rank's weights. Both are idempotent: a rerun after a crash rewrites the same
// bytes. WaitForVersion lets the other ranks wait until the version is visible.
Result<Manifest> PublishShard(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t rank, uint64_t world,
                              const sync::ServedModel& shard, const sync::ModelDelta* delta,
                              const KeyframePolicy& policy, RecentDeltas* recent = nullptr);
Result<Manifest> CommitShards(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t world,
                              const KeyframePolicy& policy, int threads,
                              std::chrono::milliseconds deadline, RecentDeltas* recent = nullptr);
Result<Manifest> WaitForVersion(ObjectStore& store, const std::string& run_id, uint64_t version,
                                std::chrono::milliseconds deadline);

}  // namespace weft::policy_store
