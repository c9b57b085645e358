#include "policy_store/publish.h"

#include <functional>
#include <set>
#include <thread>

#include "common/byte_io.h"
#include "common/logging.h"
#include "policy_store/catchup_deltas.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"
#include "policy_store/skip_deltas.h"
#include "sync/safetensors.h"

namespace weft::policy_store {

const sync::ModelDelta* RecentDeltas::Find(uint64_t base, uint64_t target) const {
  auto found = entries_.find({base, target});
  return found == entries_.end() ? nullptr : &found->second.delta;
}

void RecentDeltas::Erase(std::map<std::pair<uint64_t, uint64_t>, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

const sync::ModelDelta* RecentDeltas::Keep(int level, uint64_t base, uint64_t target,
                                           sync::ModelDelta&& delta) {
  if (auto same = entries_.find({base, target}); same != entries_.end()) Erase(same);
  const uint64_t size = sync::SerializedSize(delta);
  if (bytes_ + size > max_bytes_) return nullptr;
  bytes_ += size;
  Entry& entry = entries_[{base, target}];
  entry = {level, size, std::move(delta)};
  return &entry.delta;
}

const sync::ModelDelta* RecentDeltas::KeepSkip(int level, uint64_t base, uint64_t target,
                                               sync::ModelDelta&& delta) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.level == level) Erase(it);
    it = next;
  }
  return Keep(level, base, target, std::move(delta));
}

const sync::ModelDelta* RecentDeltas::KeepCatchup(uint64_t base, uint64_t target,
                                                  sync::ModelDelta&& delta) {
  return Keep(-1, base, target, std::move(delta));
}

void RecentDeltas::ForgetCatchupsBefore(uint64_t target) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.level < 0 && it->first.second < target) Erase(it);
    it = next;
  }
}

Result<std::vector<uint8_t>> DeltaBlobCoding::Serialize(const sync::ModelDelta& delta) const {
  if (mode == sync::DeltaMode::kPlain || result.empty()) return sync::SerializeModelDelta(delta);
  WEFT_ASSIGN_OR_RETURN(sync::ModelDelta coded,
                        sync::RecodeModelDelta(delta, mode, {}, result, threads));
  return sync::SerializeModelDelta(coded);
}

std::optional<uint64_t> RecentDeltas::KeyframeSize(uint64_t version) const {
  if (!keyframe_ || keyframe_->first != version) return std::nullopt;
  return keyframe_->second;
}

Result<bool> KeyframeDue(ObjectStore& store, const std::string& run_id, const Manifest* previous,
                         const KeyframePolicy& policy, RecentDeltas* recent) {
  if (previous == nullptr || previous->version + 1 - previous->last_keyframe >= policy.interval)
    return true;
  if (previous->delta_bytes_since_keyframe == 0) return false;
  // The budget is relative to the last keyframe's size: held, or read from its manifest.
  std::optional<uint64_t> size =
      recent ? recent->KeyframeSize(previous->last_keyframe) : std::nullopt;
  if (!size) {
    WEFT_ASSIGN_OR_RETURN(Manifest last, ReadManifest(store, run_id, previous->last_keyframe));
    size = last.keyframe_bytes();
    if (recent != nullptr) recent->KeepKeyframeSize(previous->last_keyframe, *size);
  }
  return static_cast<double>(previous->delta_bytes_since_keyframe) >
         policy.delta_budget * static_cast<double>(*size);
}

namespace {

std::vector<ManifestTensor> ManifestTensors(const sync::ServedModel& model) {
  std::vector<ManifestTensor> tensors;
  for (const auto& t : model.tensors())
    tensors.push_back({t.spec.name, t.spec.dtype, t.spec.shape, t.digest});
  return tensors;
}

// A keyframe of `model` in one blob, written from the model's tensors as they are (the blob's
// bytes are never gathered in memory: a publisher holds one copy of the model, not two).
Result<std::vector<BlobRef>> PutKeyframe(ObjectStore& store, const sync::ServedModel& model) {
  const std::vector<sync::TensorToWrite> tensors = model.AsTensorsToWrite();
  WEFT_ASSIGN_OR_RETURN(sync::SafetensorsLayout layout, sync::PlanSafetensors(tensors, {}));
  std::vector<std::span<const uint8_t>> pieces{layout.header};
  for (size_t i : layout.order) pieces.push_back(tensors[i].data);
  WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlobPieces(store, pieces));
  return std::vector<BlobRef>{blob};
}

// Writes a version whose tensors, delta and keyframe (its blobs written by `keyframe_blobs`, called
// only when one is due) are given: blobs,
// skip deltas, manifest, `latest`, then catch-up deltas; once it is published, `recent` keeps
// what the next versions squash. `model`, the version's served tensors when the caller holds
// them, lets delta blobs be written with context chunks.
Result<Manifest> PublishContent(ObjectStore& store, const std::string& run_id,
                                const Manifest* previous, std::vector<ManifestTensor> tensors,
                                const sync::ModelDelta* delta,
                                const std::function<Result<std::vector<BlobRef>>()>& keyframe_blobs,
                                const KeyframePolicy& policy, int threads, RecentDeltas* recent,
                                const sync::ServedModel* model) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  DeltaBlobCoding coding;
  coding.threads = threads;
  if (model != nullptr && policy.delta_mode != sync::DeltaMode::kPlain) {
    coding.mode = policy.delta_mode;
    coding.result = model->AsTensorBytes();
  }
  if ((previous == nullptr) != (delta == nullptr)) {
    return InvalidArgument("a version after the first needs a delta from its predecessor");
  }
  Manifest manifest;
  manifest.run_id = run_id;
  manifest.version = previous ? previous->version + 1 : 0;
  manifest.tensors = std::move(tensors);

  // Blobs first.
  uint64_t delta_bytes = 0;
  if (delta != nullptr) {
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, coding.Serialize(*delta));
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    manifest.delta = blob;
    manifest.delta_base = previous->version;
    delta_bytes = bytes.size();
  }
  std::vector<DerivedDelta> skips;
  if (delta != nullptr) {
    WEFT_ASSIGN_OR_RETURN(skips, PublishSkips(store, run_id, manifest.version, *delta, policy,
                                              threads, recent, &coding));
  }
  for (const DerivedDelta& skip : skips) manifest.skips.push_back({skip.base, skip.blob});
  WEFT_ASSIGN_OR_RETURN(bool keyframe, KeyframeDue(store, run_id, previous, policy, recent));
  if (keyframe) {
    WEFT_ASSIGN_OR_RETURN(manifest.keyframe, keyframe_blobs());
    manifest.last_keyframe = manifest.version;
    manifest.delta_bytes_since_keyframe = 0;
  } else {
    manifest.last_keyframe = previous->last_keyframe;
    manifest.delta_bytes_since_keyframe = previous->delta_bytes_since_keyframe + delta_bytes;
  }
  // Then the manifest, then the pointer.
  Status status =
      store.PutImmutable(ManifestKey(run_id, manifest.version), TextBytes(manifest.ToJson()));
  if (status.code() == StatusCode::kConflict) {
    return Conflict("run '" + run_id + "' version " + std::to_string(manifest.version) +
                    " was already published differently: by another publisher, or by one killed "
                    "before it made the version latest (weft store recover --run " +
                    run_id + " shows it)");
  }
  WEFT_RETURN_IF_ERROR(status);
  std::optional<std::string> expected;
  if (previous != nullptr) expected = VersionText(previous->version);
  status = store.CompareAndSwap(LatestKey(run_id), expected, VersionText(manifest.version));
  if (status.code() == StatusCode::kConflict) {
    // A rerun of a publisher that died after moving the pointer finds it already moved here.
    Result<std::vector<uint8_t>> latest = store.Get(LatestKey(run_id));
    if (!latest.ok() ||
        std::string(latest->begin(), latest->end()) != VersionText(manifest.version)) {
      return status.WithContext("run '" + run_id + "': latest moved while publishing version " +
                                std::to_string(manifest.version));
    }
  } else {
    WEFT_RETURN_IF_ERROR(status);
  }
  // Catch-up deltas for pinned readers come after the pointer (readers one version behind, the
  // common case, need none): a failure there costs readers bytes, never correctness.
  std::vector<DerivedDelta> catchups;
  if (delta != nullptr) {
    Result<std::vector<DerivedDelta>> written =
        PublishCatchups(store, run_id, manifest, *delta, policy, threads, recent, &coding);
    if (written.ok()) {
      catchups = std::move(written).value();
    } else {
      WEFT_LOG(kWarning) << "run '" << run_id << "' version " << manifest.version
                         << ": catch-up deltas not written: " << written.status().message();
    }
  }
  if (recent != nullptr) {
    if (manifest.has_keyframe())
      recent->KeepKeyframeSize(manifest.version, manifest.keyframe_bytes());
    if (delta != nullptr) {
      recent->KeepSkip(0, previous->version, manifest.version, delta->Copy());
      for (size_t level = 0; level < skips.size(); ++level) {
        recent->KeepSkip(static_cast<int>(level + 1), skips[level].base, manifest.version,
                         std::move(skips[level].delta));
      }
      for (DerivedDelta& c : catchups) {
        recent->KeepCatchup(c.base, manifest.version, std::move(c.delta));
      }
      recent->ForgetCatchupsBefore(manifest.version);
    }
  }
  return manifest;
}

// Polls `ready` with backoff until it returns true or `deadline` passes.
Result<bool> PollUntil(std::chrono::milliseconds deadline,
                       const std::function<Result<bool>()>& ready) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::chrono::milliseconds pause(5);
  while (true) {
    WEFT_ASSIGN_OR_RETURN(bool done, ready());
    if (done) return true;
    if (std::chrono::steady_clock::now() + pause > end) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace

Result<Manifest> PublishVersion(ObjectStore& store, const std::string& run_id,
                                const Manifest* previous, const sync::ServedModel& model,
                                const sync::ModelDelta* delta, const KeyframePolicy& policy,
                                int threads, RecentDeltas* recent) {
  return PublishContent(
      store, run_id, previous, ManifestTensors(model), delta,
      [&] { return PutKeyframe(store, model); }, policy, threads, recent, &model);
}

Result<Manifest> PublishModel(ObjectStore& store, const std::string& run_id,
                              const sync::ServedModel& model, const KeyframePolicy& policy,
                              int threads, std::optional<uint64_t> expected) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  Result<uint64_t> latest = ReadLatest(store, run_id);
  if (!latest.ok() && latest.status().code() != StatusCode::kNotFound) return latest.status();
  const uint64_t version = latest.ok() ? *latest + 1 : 0;
  if (expected && *expected != version) {
    return Conflict("run '" + run_id + "' is at " +
                    (latest.ok() ? "version " + std::to_string(*latest) : "no version") +
                    "; the next version is " + std::to_string(version) + ", not " +
                    std::to_string(*expected));
  }
  if (!latest.ok()) return PublishVersion(store, run_id, nullptr, model, nullptr, policy, threads);
  // The delta is taken against the published state, rebuilt from the store.
  StoreReader reader(store, run_id, threads);
  sync::ServedModel current;
  WEFT_ASSIGN_OR_RETURN(PullReport pulled, reader.Pull(*latest, std::nullopt, &current));
  Result<sync::ModelDelta> delta =
      sync::EncodeModelDelta(current.AsTensorBytes(), model.AsTensorBytes(),
                             sync::CodecOptions{sync::kDefaultChunkLog2, threads});
  if (!delta.ok()) {
    return InvalidArgument("the model does not hold the tensors of version " +
                           std::to_string(*latest) + " (" + delta.status().message() +
                           "); a different tensor set needs a new run");
  }
  return PublishVersion(store, run_id, &pulled.manifest, model, &*delta, policy, threads);
}

Result<Manifest> PublishShard(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t rank, uint64_t world,
                              const sync::ServedModel& shard, const sync::ModelDelta* delta,
                              const KeyframePolicy& policy, RecentDeltas* recent) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  if (world < 1 || rank >= world)
    return InvalidArgument("rank " + std::to_string(rank) + " is not in a world of " +
                           std::to_string(world));
  if ((previous == nullptr) != (delta == nullptr)) {
    return InvalidArgument("a version after the first needs a delta from its predecessor");
  }
  Manifest part;
  part.run_id = run_id;
  part.version = previous ? previous->version + 1 : 0;
  part.shard = Manifest::Shard{rank, world};
  part.tensors = ManifestTensors(shard);
  if (delta != nullptr) {
    std::vector<uint8_t> bytes = sync::SerializeModelDelta(*delta);
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    part.delta = blob;
    part.delta_base = previous->version;
  }
  WEFT_ASSIGN_OR_RETURN(bool keyframe, KeyframeDue(store, run_id, previous, policy, recent));
  if (keyframe) {
    WEFT_ASSIGN_OR_RETURN(part.keyframe, PutKeyframe(store, shard));
    part.last_keyframe = part.version;
  } else {
    part.last_keyframe = previous->last_keyframe;
  }
  Status status =
      store.PutImmutable(ShardKey(run_id, part.version, rank, world), TextBytes(part.ToJson()));
  if (status.code() == StatusCode::kConflict) {
    return Conflict("rank " + std::to_string(rank) + " of " + std::to_string(world) +
                    " already published a different part of run '" + run_id + "' version " +
                    std::to_string(part.version));
  }
  WEFT_RETURN_IF_ERROR(status);
  return part;
}

Result<Manifest> CommitShards(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t world,
                              const KeyframePolicy& policy, int threads,
                              std::chrono::milliseconds deadline, RecentDeltas* recent) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  const uint64_t version = previous ? previous->version + 1 : 0;
  const std::string where = "run '" + run_id + "' version " + std::to_string(version);
  std::vector<std::optional<Manifest>> parts(world);
  // Every missing part is looked for in each round, so that a timeout names exactly those.
  WEFT_ASSIGN_OR_RETURN(bool complete, PollUntil(deadline, [&]() -> Result<bool> {
                          bool all = true;
                          for (uint64_t rank = 0; rank < world; ++rank) {
                            if (parts[rank]) continue;
                            Result<Manifest> part =
                                ReadPart(store, ShardKey(run_id, version, rank, world));
                            if (!part.ok() && part.status().code() == StatusCode::kNotFound) {
                              all = false;
                              continue;
                            }
                            if (!part.ok()) return part.status();
                            parts[rank] = std::move(*part);
                          }
                          return all;
                        }));
  if (!complete) {
    std::string missing;
    for (uint64_t rank = 0; rank < world; ++rank) {
      if (!parts[rank]) missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
    }
    return Timeout(where + ": ranks " + missing + " of " + std::to_string(world) +
                   " did not publish their parts in time");
  }
  // Every part must continue the same version and agree on the keyframe.
  std::vector<ManifestTensor> tensors;
  std::set<std::string> names;
  for (const std::optional<Manifest>& part : parts) {
    const std::string which =
        where + ", rank " + std::to_string(part->shard ? part->shard->rank : 0);
    if (part->run_id != run_id || part->version != version || !part->shard ||
        part->shard->world != world ||
        part->delta_base !=
            (previous ? std::optional<uint64_t>(previous->version) : std::nullopt)) {
      return DataLoss(which + ": the part does not continue version " +
                      (previous ? std::to_string(previous->version) : "none"));
    }
    if (part->keyframe.size() > 1)
      return DataLoss(which + ": a rank's part has a keyframe in parts of its own");
    if (part->has_keyframe() != parts[0]->has_keyframe())
      return DataLoss(which + ": the parts disagree on the keyframe");
    for (const ManifestTensor& t : part->tensors) {
      if (!names.insert(t.name).second)
        return DataLoss(which + ": tensor '" + t.name + "' is in two parts");
      tensors.push_back(t);
    }
  }
  sync::ModelDelta delta;
  std::vector<LoadedDelta> shard_deltas;  // `delta`'s tensors point into their bytes
  if (previous != nullptr) {
    for (const std::optional<Manifest>& part : parts) {
      const std::string what = where + ", the delta of rank " + std::to_string(part->shard->rank);
      WEFT_ASSIGN_OR_RETURN(LoadedDelta loaded, FetchDelta(store, *part->delta, what));
      for (sync::TensorDelta& t : loaded.delta.tensors) delta.tensors.push_back(std::move(t));
      shard_deltas.push_back(std::move(loaded));
    }
  }
  // The keyframe, when one is due, is the ranks' keyframes, referenced in rank order as the parts
  // of one: their bytes are not read here.
  auto keyframe = [&]() -> Result<std::vector<BlobRef>> {
    std::vector<BlobRef> blobs;
    for (const std::optional<Manifest>& part : parts) {
      if (!part->has_keyframe()) {
        return DataLoss(where + ", the keyframe of rank " + std::to_string(part->shard->rank) +
                        " is missing: a keyframe is due");
      }
      blobs.push_back(part->keyframe.front());
    }
    return blobs;
  };
  return PublishContent(store, run_id, previous, std::move(tensors), previous ? &delta : nullptr,
                        keyframe, policy, threads, recent, nullptr);
}

Result<Manifest> WaitForVersion(ObjectStore& store, const std::string& run_id, uint64_t version,
                                std::chrono::milliseconds deadline) {
  WEFT_ASSIGN_OR_RETURN(bool visible, PollUntil(deadline, [&]() -> Result<bool> {
                          Result<uint64_t> latest = ReadLatest(store, run_id);
                          if (!latest.ok() && latest.status().code() == StatusCode::kNotFound) {
                            return false;
                          }
                          if (!latest.ok()) return latest.status();
                          return *latest >= version;
                        }));
  if (!visible)
    return Timeout("run '" + run_id + "' version " + std::to_string(version) +
                   " was not committed in time");
  return ReadManifest(store, run_id, version);
}

}  // namespace weft::policy_store
