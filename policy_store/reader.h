// StoreReader: brings a local copy of a run's served tensors to a version, along the path of fewest
// bytes (planner.h), with everything checked.
//
// Every blob's SHA-256 is checked against its manifest, every delta's digests as it is applied,
// and the result's digests against the target's manifest; nothing that fails a check reaches the
// caller. A reader one or more versions behind applies the deltas of its path in place, in
// O(changed elements) and bounded memory (sync::ServedModel::Apply for one small delta, ApplyChain
// for a catch-up; deltas larger than a fraction of the model are spilled to unnamed files in
// `spill_dir`). On error the copy is as it was, except where a spilled delta read back differs
// from its first reading after part of the copy was written: then the copy is emptied (it is no
// version), and the next pull starts from a keyframe. A reader with nothing (or whose version
// retention removed) loads a keyframe into a new model (in new host memory, or in the storage a
// KeyframePlacement gives), swapped in once it matches the target.
// Blobs are fetched in parts (blob_fetch.h) and verified as they arrive. Not thread-safe; one per
// caller.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "policy_store/blob_fetch.h"
#include "policy_store/manifest.h"
#include "policy_store/object_store.h"
#include "policy_store/planner.h"
#include "sync/served_model.h"

namespace weft::policy_store {

struct PullReport {
  std::optional<uint64_t> from;  // the version held before, if the path started from it
  uint64_t to = 0;
  uint64_t bytes_downloaded = 0;
  std::string path;              // e.g. "keyframe v100 + 3 deltas" or "4 deltas from v96"
  std::vector<BlobRef> fetched;  // the blobs of that path, in the order they apply
  Manifest manifest;             // the target's manifest, which the copy now matches
  bool dropped_copy = false;     // the copy held was dropped to start from a keyframe
};

// Whether `model` holds exactly the manifest's tensors: names, dtypes, shapes and digests. By
// default the digests the model keeps are compared (O(tensors)), after `pending` (if given) would
// be applied; with `recompute`, every digest is recomputed from the bytes on `threads` threads
// (O(bytes): the full proof that the bytes are the version's). kDataLoss names the first tensor
// that differs.
Status CheckAgainstManifest(const sync::ServedModel& model, const Manifest& manifest,
                            const sync::ModelDelta* pending = nullptr, bool recompute = false,
                            int threads = 1);

// Where a keyframe's tensors are assembled, for a caller that keeps its copy elsewhere than in
// new host memory (a mapped file, say). The bytes arrive straight into that storage as they are
// fetched.
class KeyframePlacement {
 public:
  virtual ~KeyframePlacement() = default;
  // The keyframe whose manifest is `keyframe` is about to arrive: lay out storage for its
  // tensors. An error fails the pull.
  virtual Status Prepare(const Manifest& keyframe) = 0;
  // The storage of one of those tensors, exactly `bytes` long, as the keyframe's header names it
  // (from several threads at once, for a keyframe in parts). An error fails the pull.
  virtual Result<sync::TensorStorage> Storage(const sync::TensorSpec& spec, uint64_t bytes) = 0;
};

class StoreReader {
 public:
  // `threads` compute (decoding, digests); up to `fetch.concurrency` requests are in flight
  // (manifests, and the parts of blobs). Without `fetch`, the store's own (its URI's range_size
  // and parallel: FetchOptionsFor).
  StoreReader(ObjectStore& store, std::string run_id, int threads)
      : StoreReader(store, std::move(run_id), threads, FetchOptionsFor(store)) {}
  StoreReader(ObjectStore& store, std::string run_id, int threads, FetchOptions fetch)
      : store_(store), run_id_(std::move(run_id)), threads_(threads), fetch_(fetch) {}

  // The latest complete version; kNotFound when the run has none.
  Result<uint64_t> Latest();
  // What WatchLatest found: the latest version (nullopt: the run has none), and whether the store
  // waited for it to change (false: it cannot push, and the caller polls).
  struct LatestWatch {
    std::optional<uint64_t> version;
    bool waited = false;
  };
  // The latest version once `latest` holds other than what the last call saw, or once `wait` has
  // passed (the first call reads it at once): a long poll of stores that push
  // (ObjectStore::WaitForChange), a read of those that do not. kUnavailable once `cancel` (when
  // given) holds true; kDataLoss when `latest` does not hold a version number.
  Result<LatestWatch> WatchLatest(std::chrono::milliseconds wait,
                                  const std::atomic<bool>* cancel = nullptr);
  Result<Manifest> GetManifest(uint64_t version);
  // Versions with a manifest, ascending.
  Result<std::vector<uint64_t>> Versions();

  // Brings `*model` to `target`. `have` is the version `*model` holds (its digests must match that
  // version's manifest), or nullopt for an empty model; `held`, when given, is that version's
  // manifest (saving a fetch). On error `*model` is unchanged (but see DropCopyForKeyframe).
  Result<PullReport> Pull(uint64_t target, std::optional<uint64_t> have, sync::ServedModel* model,
                          const Manifest* held = nullptr);

  // When a pull's path starts from a keyframe although `*model` holds a version (no deltas from it
  // remain, or they cost more than the keyframe), drops that copy before the keyframe arrives, so
  // that the pull needs the memory of one model rather than two. On an error the model is then
  // empty rather than unchanged. Off by default; for a caller whose serving engine keeps weights
  // of its own.
  void DropCopyForKeyframe(bool drop) { drop_copy_for_keyframe_ = drop; }

  // Where the tensors of a keyframe go: new host memory (null, the default), or `placement`'s
  // storage (which must outlive the pulls).
  void PlaceKeyframes(KeyframePlacement* placement) { placement_ = placement; }

  // Where the deltas of a path are kept while it is fetched and applied, when they would take more
  // than `fraction` of the model's size in memory: unnamed files in `dir` (by default the system's
  // temporary directory), each part streamed there as it arrives, then mapped and applied a
  // window at a time, the window's pages let go as it is done (sync::ApplyChainOptions). A
  // catch-up from any lag then holds the model and a window of its deltas, not all of them. An
  // empty `dir` keeps every delta in memory; a spill file that cannot be made does too (logged).
  void SpillDeltas(std::string dir, double fraction = 1.0 / 16) {
    spill_dir_ = std::move(dir);
    spill_fraction_ = fraction;
  }

  // The system's temporary directory (TMPDIR, else /tmp), where deltas spill by default.
  static std::string DefaultSpillDir();

  // The version whose manifest digests equal `model`'s, searching back from `latest`; nullopt
  // when none of the last `max_versions` matches.
  Result<std::optional<uint64_t>> IdentifyVersion(const sync::ServedModel& model,
                                                  uint64_t max_versions = 1000);

 private:
  // Applies the deltas of `plan` (parsed, in `chain`) to `*model`; on error it is unchanged
  // unless `*partly_written` says otherwise. `release`, for deltas in mapped spill files, lets a
  // delta's pages go (sync::ApplyChainOptions).
  Status ApplyPath(std::span<const sync::ModelDelta* const> chain, const PullPlan& plan,
                   sync::ServedModel* model,
                   const std::function<void(size_t, std::span<const uint8_t>)>& release,
                   bool* partly_written);

  ObjectStore& store_;
  std::string run_id_;
  // What WatchLatest last saw `latest` hold (nullopt: absent), once it has read it.
  std::optional<std::optional<std::string>> latest_seen_;
  int threads_;
  FetchOptions fetch_;
  bool drop_copy_for_keyframe_ = false;
  KeyframePlacement* placement_ = nullptr;
  std::string spill_dir_ = DefaultSpillDir();
  double spill_fraction_ = 1.0 / 16;
};

}  // namespace weft::policy_store
