// Writing and reading versions of a run in an ObjectStore (layout: manifest.h).
//
// PublishVersion writes one version in the order that keeps the store readable at every instant:
// blobs, then the manifest, then `latest` by compare-and-swap from the previous version. A
// publisher killed at any point leaves `latest` at a complete version; a rerun either completes
// the same version (immutable objects with equal bytes are accepted again) or fails with
// kConflict when another publisher wrote that version differently.
//
// StoreReader brings a local copy of the served tensors to a target version along the path of
// fewest bytes, starting from the version it holds or from the newest keyframe at or below the
// target, over plain deltas and skip deltas. Manifests and blobs are fetched concurrently. Every
// blob's SHA-256 is checked against its manifest, every delta's digests are checked as it is
// applied, and the result's digests against the target's manifest; nothing that fails a check
// reaches the caller. Not thread-safe; one per caller.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

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
};

// Pins: the version each holder (a worker, an in-flight job, the trainer) still needs, kept in
// the store (PinKey) so that retention and the publisher see them. SetPin creates or moves a pin.
Status SetPin(ObjectStore& store, const std::string& run_id, const std::string& holder,
              uint64_t version);
Status RemovePin(ObjectStore& store, const std::string& run_id, const std::string& holder);
Result<std::map<std::string, uint64_t>> ListPins(ObjectStore& store, const std::string& run_id);

// Catch-up deltas: after publishing `manifest` (version t, with `delta` from t - 1), writes for
// every pinned version p with p < t - 1 (up to the policy's limits) the single delta from p to t
// (docs/formats.md, section 6.7): the squash of the one from p to t - 1 with `delta`, or, for a
// new pin, of the cheapest chain from p. A reader that holds p then downloads exactly that delta.
Status PublishCatchups(ObjectStore& store, const std::string& run_id, const Manifest& manifest,
                       const sync::ModelDelta& delta, const KeyframePolicy& policy, int threads);

// A blob's bytes, checked against its size and SHA-256. A copy that fails the check is reported
// and fetched again (three tries), then kDataLoss.
Result<std::vector<uint8_t>> FetchVerifiedBlob(ObjectStore& store, const BlobRef& blob,
                                               const std::string& what);

// The served tensors as one safetensors file (the keyframe blob format).
std::vector<uint8_t> KeyframeBytes(const sync::ServedModel& model);

// Publishes `model` (the served tensors of the new version) as version `previous->version + 1`
// (or 0 when `previous` is null) with `delta` from the previous version (null for version 0).
// At a version v divisible by 2^j (1 <= j <= max_skip_level, 2^j <= v) it also publishes the skip
// delta from v - 2^j, the squash of the two skip deltas of span 2^(j-1) ending at v - 2^(j-1) and
// at v, so a reader far behind downloads a few squashed deltas instead of the whole chain.
// Returns the new manifest.
Result<Manifest> PublishVersion(ObjectStore& store, const std::string& run_id,
                                const Manifest* previous, const sync::ServedModel& model,
                                const sync::ModelDelta* delta, const KeyframePolicy& policy,
                                int threads = 1);

// Whether the version after `previous` gets a keyframe: version 0, then once `interval` versions
// have passed since the last keyframe, or once the deltas since it (up to `previous`) exceed
// `delta_budget` times its size. Depends on `previous` only, so every rank of a sharded trainer
// decides alike.
Result<bool> KeyframeDue(ObjectStore& store, const std::string& run_id, const Manifest* previous,
                         const KeyframePolicy& policy);

// Sharded trainers: each rank writes its part of the version after `previous` (null for version
// 0): the delta of its tensors and, when a keyframe is due, their keyframe, then its part
// manifest (ShardKey). Then one rank calls CommitShards, which waits up to `deadline` for all
// `world` parts, checks that they continue `previous`, agree and hold disjoint tensors, merges
// them into one delta (and keyframe) and publishes the version as PublishVersion does. Both are
// idempotent: a rerun after a crash rewrites the same bytes. WaitForVersion lets the other ranks
// wait until the version is visible.
Result<Manifest> PublishShard(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t rank, uint64_t world,
                              const sync::ServedModel& shard, const sync::ModelDelta* delta,
                              const KeyframePolicy& policy);
Result<Manifest> CommitShards(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t world,
                              const KeyframePolicy& policy, int threads,
                              std::chrono::milliseconds deadline);
Result<Manifest> WaitForVersion(ObjectStore& store, const std::string& run_id, uint64_t version,
                                std::chrono::milliseconds deadline);

// Publishes the skip deltas of `version` (see PublishVersion) and lists them in `skips`.
Status PublishSkips(ObjectStore& store, const std::string& run_id, uint64_t version,
                    const sync::ModelDelta* delta, const KeyframePolicy& policy, int threads,
                    std::vector<SkipDelta>* skips);

struct PullReport {
  std::optional<uint64_t> from;  // the version held before, if any
  uint64_t to = 0;
  uint64_t bytes_downloaded = 0;
  std::string path;              // e.g. "keyframe v100 + 3 deltas" or "4 deltas from v96"
  std::vector<BlobRef> fetched;  // the blobs of that path, in the order they are applied
};

// Retention. Pins are the explicit `pins` and those in the store (ListPins). Every version at or
// above the oldest pinned one must stay readable, so the versions
// kept are those from the keyframe it is rebuilt from (its `last_keyframe`) up to `latest`. Older
// manifests are deleted, oldest first, and then every blob only they referenced. `latest` and the
// pinned versions are never touched. Blobs that no manifest references (left by a publisher that
// died before writing its manifest) are not deleted: they cannot be told apart from a publish in
// progress. Catch-up deltas to versions before `latest` are deleted (no reader targets them).
struct CollectReport {
  uint64_t kept_from = 0;  // the oldest version kept
  uint64_t versions_deleted = 0;
  uint64_t blobs_deleted = 0;
  uint64_t bytes_freed = 0;
};
// `pins` are the versions still needed (workers, in-flight jobs' staleness windows, the trainer);
// the latest version is always pinned. With `dry_run`, nothing is deleted.
Result<CollectReport> CollectGarbage(ObjectStore& store, const std::string& run_id,
                                     const std::vector<uint64_t>& pins, bool dry_run);

class StoreReader {
 public:
  // `threads` compute (decoding, digests); up to `fetch_concurrency` requests are in flight at
  // once.
  StoreReader(ObjectStore& store, std::string run_id, int threads, int fetch_concurrency = 16)
      : store_(store),
        run_id_(std::move(run_id)),
        threads_(threads),
        fetch_concurrency_(fetch_concurrency) {}

  // The latest complete version; kNotFound when the run has none.
  Result<uint64_t> Latest();
  Result<Manifest> GetManifest(uint64_t version);
  // Versions with a manifest, ascending.
  Result<std::vector<uint64_t>> Versions();

  // Brings `*model` to `target`. `have` is the version `*model` holds (its digests must match
  // that version's manifest), or nullopt for an empty model. Every blob is fetched and verified
  // before anything is applied, and the deltas are applied to a copy that replaces `*model` only
  // once its digests equal the target's: on error `*model` is unchanged.
  Result<PullReport> Pull(uint64_t target, std::optional<uint64_t> have, sync::ServedModel* model);

  // The version whose manifest digests equal `model`'s, searching back from `latest`; nullopt
  // when none of the last `max_versions` matches.
  Result<std::optional<uint64_t>> IdentifyVersion(const sync::ServedModel& model,
                                                  uint64_t max_versions = 1000);

 private:
  friend Status PublishCatchups(ObjectStore&, const std::string&, const Manifest&,
                                const sync::ModelDelta&, const KeyframePolicy&, int);
  // The cheapest way to `goal`: from the keyframe at or below it (when `allow_keyframe`) or from
  // `have`, over plain, skip and catch-up deltas.
  struct Plan {
    struct Step {
      uint64_t base = 0;
      BlobRef blob;
      bool catchup = false;
    };
    uint64_t target = 0;
    bool from_keyframe = false;
    uint64_t start = 0;  // the keyframe's version, or `have`
    Manifest keyframe;   // when allowed: the manifest of the keyframe at or below the target
    std::vector<Step> steps;
    std::string Describe() const;
  };
  Result<Plan> PlanPath(const Manifest& goal, std::optional<uint64_t> have, bool allow_keyframe);
  // The catch-up delta from `base` to `target`, if the publisher wrote one.
  Result<std::optional<BlobRef>> FindCatchup(uint64_t target, uint64_t base);

  // The keyframe blob `bytes` (already verified) as a model checked against its manifest.
  Result<sync::ServedModel> LoadKeyframe(const Manifest& manifest, std::span<const uint8_t> bytes);
  // Whether `model`, after `pending` (if given) were applied, holds exactly the manifest's tensors
  // (names, dtypes, shapes, digests). Reads digests only.
  Status CheckAgainstManifest(const sync::ServedModel& model, const Manifest& manifest,
                              const sync::ModelDelta* pending = nullptr);

  ObjectStore& store_;
  std::string run_id_;
  int threads_;
  int fetch_concurrency_;
};

}  // namespace weft::policy_store
