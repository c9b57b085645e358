#include "policy_store/store_client.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include "common/concurrent.h"
#include "common/logging.h"
#include "sync/safetensors.h"

namespace weft::policy_store {
namespace {

std::span<const uint8_t> AsBytes(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

Result<BlobRef> PutBlob(ObjectStore& store, std::span<const uint8_t> bytes) {
  BlobRef blob{Sha256Hex(bytes), bytes.size()};
  WEFT_RETURN_IF_ERROR(store.PutImmutable(BlobKey(blob.sha256), bytes));
  return blob;
}

std::string VersionText(uint64_t version) { return std::to_string(version) + "\n"; }

std::string Deltas(size_t count) {
  return std::to_string(count) + (count == 1 ? " delta" : " deltas");
}

Result<Manifest> ReadManifest(ObjectStore& store, const std::string& run_id, uint64_t version) {
  const std::string key = ManifestKey(run_id, version);
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, store.Get(key));
  Result<Manifest> manifest =
      Manifest::FromJson({reinterpret_cast<const char*>(text.data()), text.size()});
  if (!manifest.ok()) return DataLoss(manifest.status().message()).WithContext(key);
  if (manifest->run_id != run_id || manifest->version != version) {
    return DataLoss(key + ": manifest names run '" + manifest->run_id + "' version " +
                    std::to_string(manifest->version));
  }
  return manifest;
}

}  // namespace

// Skip deltas of span 2^j ending at `version`, each the squash of the two of span 2^(j-1) ending at
// version - 2^(j-1) (read back from the store) and at `version` (the previous level, in memory).
Status PublishSkips(ObjectStore& store, const std::string& run_id, uint64_t version,
                    const sync::ModelDelta* delta, const KeyframePolicy& policy, int threads,
                    std::vector<SkipDelta>* skips) {
  if (delta == nullptr) return Status::Ok();
  const sync::ModelDelta* right = delta;
  sync::ModelDelta squashed_right;
  for (int level = 1; level <= policy.max_skip_level; ++level) {
    const uint64_t span = uint64_t{1} << level;
    if (version % span != 0 || version < span) break;
    const uint64_t middle = version - span / 2;
    WEFT_ASSIGN_OR_RETURN(Manifest left_manifest, ReadManifest(store, run_id, middle));
    std::optional<BlobRef> left_blob;
    if (level == 1) {
      left_blob = left_manifest.delta;
    } else {
      for (const SkipDelta& skip : left_manifest.skips) {
        if (skip.base == version - span) left_blob = skip.blob;
      }
    }
    if (!left_blob) break;  // published without skips: nothing longer can be built
    WEFT_ASSIGN_OR_RETURN(
        std::vector<uint8_t> left_bytes,
        FetchVerifiedBlob(store, *left_blob,
                          "skip delta ending at version " + std::to_string(middle)));
    Result<sync::ModelDelta> left = sync::ParseModelDelta(left_bytes);
    if (!left.ok())
      return left.status().WithContext("skip delta ending at version " + std::to_string(middle));
    WEFT_ASSIGN_OR_RETURN(sync::ModelDelta squashed,
                          sync::SquashModelDeltas(*left, *right, threads));
    std::vector<uint8_t> bytes = sync::SerializeModelDelta(squashed);
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    skips->push_back({version - span, blob});
    squashed_right = std::move(squashed);
    right = &squashed_right;
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> FetchVerifiedBlob(ObjectStore& store, const BlobRef& blob,
                                               const std::string& what) {
  constexpr int kTries = 3;
  for (int attempt = 1;; ++attempt) {
    Result<std::vector<uint8_t>> bytes = store.Get(BlobKey(blob.sha256));
    if (!bytes.ok()) return bytes.status().WithContext(what);
    if (bytes->size() == blob.bytes && Sha256Hex(*bytes) == blob.sha256) return bytes;
    // Corrupted in transit, or at rest: fetch it again; a copy corrupted at rest stays so.
    WEFT_LOG(kWarning) << what << ": blob " << blob.sha256 << " from " << store.Describe()
                       << " does not match its hash (try " << attempt << " of " << kTries << ")";
    if (attempt == kTries) {
      return DataLoss(what + ": blob " + blob.sha256 +
                      " is corrupted (its content does not match its hash on " +
                      std::to_string(kTries) + " fetches)");
    }
  }
}

std::vector<uint8_t> KeyframeBytes(const sync::ServedModel& model) {
  std::vector<sync::TensorToWrite> tensors = model.AsTensorsToWrite();
  Result<sync::SafetensorsLayout> layout = sync::PlanSafetensors(tensors, {});
  std::vector<uint8_t> bytes = layout->header;  // served tensors always form a valid file
  for (size_t i : layout->order)
    bytes.insert(bytes.end(), tensors[i].data.begin(), tensors[i].data.end());
  return bytes;
}

Result<bool> KeyframeDue(ObjectStore& store, const std::string& run_id, const Manifest* previous,
                         const KeyframePolicy& policy) {
  if (previous == nullptr || previous->version + 1 - previous->last_keyframe >= policy.interval)
    return true;
  if (previous->delta_bytes_since_keyframe == 0) return false;
  // The budget is relative to the last keyframe's size, read from its manifest.
  WEFT_ASSIGN_OR_RETURN(Manifest last, ReadManifest(store, run_id, previous->last_keyframe));
  const double budget =
      policy.delta_budget * static_cast<double>(last.keyframe ? last.keyframe->bytes : 0);
  return static_cast<double>(previous->delta_bytes_since_keyframe) > budget;
}

namespace {

std::vector<ManifestTensor> ManifestTensors(const sync::ServedModel& model) {
  std::vector<ManifestTensor> tensors;
  for (const auto& t : model.tensors())
    tensors.push_back({t.spec.name, t.spec.dtype, t.spec.shape, t.digest});
  return tensors;
}

// Writes a version whose tensors, delta and keyframe (made only when one is due) are given: blobs,
// skip deltas, manifest, then `latest`.
Result<Manifest> PublishContent(ObjectStore& store, const std::string& run_id,
                                const Manifest* previous, std::vector<ManifestTensor> tensors,
                                const sync::ModelDelta* delta,
                                const std::function<Result<std::vector<uint8_t>>()>& keyframe_bytes,
                                const KeyframePolicy& policy, int threads) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
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
    std::vector<uint8_t> bytes = sync::SerializeModelDelta(*delta);
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    manifest.delta = blob;
    manifest.delta_base = previous->version;
    delta_bytes = bytes.size();
  }
  WEFT_RETURN_IF_ERROR(
      PublishSkips(store, run_id, manifest.version, delta, policy, threads, &manifest.skips));
  WEFT_ASSIGN_OR_RETURN(bool keyframe, KeyframeDue(store, run_id, previous, policy));
  if (keyframe) {
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, keyframe_bytes());
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    manifest.keyframe = blob;
    manifest.last_keyframe = manifest.version;
    manifest.delta_bytes_since_keyframe = 0;
  } else {
    manifest.last_keyframe = previous->last_keyframe;
    manifest.delta_bytes_since_keyframe = previous->delta_bytes_since_keyframe + delta_bytes;
  }
  // Then the manifest, then the pointer.
  Status status =
      store.PutImmutable(ManifestKey(run_id, manifest.version), AsBytes(manifest.ToJson()));
  if (status.code() == StatusCode::kConflict) {
    return Conflict("run '" + run_id + "' version " + std::to_string(manifest.version) +
                    " was already published differently (another publisher?)");
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
  if (delta != nullptr) {
    Status catchups = PublishCatchups(store, run_id, manifest, *delta, policy, threads);
    if (!catchups.ok()) {
      WEFT_LOG(kWarning) << "run '" << run_id << "' version " << manifest.version
                         << ": catch-up deltas not written: " << catchups.message();
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
                                int threads) {
  return PublishContent(
      store, run_id, previous, ManifestTensors(model), delta,
      [&model]() -> Result<std::vector<uint8_t>> { return KeyframeBytes(model); }, policy, threads);
}

Result<Manifest> PublishShard(ObjectStore& store, const std::string& run_id,
                              const Manifest* previous, uint64_t rank, uint64_t world,
                              const sync::ServedModel& shard, const sync::ModelDelta* delta,
                              const KeyframePolicy& policy) {
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
  WEFT_ASSIGN_OR_RETURN(bool keyframe, KeyframeDue(store, run_id, previous, policy));
  if (keyframe) {
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, KeyframeBytes(shard)));
    part.keyframe = blob;
    part.last_keyframe = part.version;
  } else {
    part.last_keyframe = previous->last_keyframe;
  }
  Status status =
      store.PutImmutable(ShardKey(run_id, part.version, rank, world), AsBytes(part.ToJson()));
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
                              std::chrono::milliseconds deadline) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  const uint64_t version = previous ? previous->version + 1 : 0;
  const std::string where = "run '" + run_id + "' version " + std::to_string(version);
  std::vector<std::optional<Manifest>> parts(world);
  WEFT_ASSIGN_OR_RETURN(
      bool complete, PollUntil(deadline, [&]() -> Result<bool> {
        for (uint64_t rank = 0; rank < world; ++rank) {
          if (parts[rank]) continue;
          Result<std::vector<uint8_t>> text = store.Get(ShardKey(run_id, version, rank, world));
          if (!text.ok() && text.status().code() == StatusCode::kNotFound) return false;
          if (!text.ok()) return text.status();
          Result<Manifest> part =
              Manifest::FromJson({reinterpret_cast<const char*>(text->data()), text->size()});
          if (!part.ok())
            return DataLoss(part.status().message())
                .WithContext(ShardKey(run_id, version, rank, world));
          parts[rank] = std::move(*part);
        }
        return true;
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
    if (part->keyframe.has_value() != parts[0]->keyframe.has_value())
      return DataLoss(which + ": the parts disagree on the keyframe");
    for (const ManifestTensor& t : part->tensors) {
      if (!names.insert(t.name).second)
        return DataLoss(which + ": tensor '" + t.name + "' is in two parts");
      tensors.push_back(t);
    }
  }
  sync::ModelDelta delta;
  std::vector<std::vector<uint8_t>> delta_blobs;  // parsed deltas point into these
  if (previous != nullptr) {
    for (const std::optional<Manifest>& part : parts) {
      const std::string what = where + ", the delta of rank " + std::to_string(part->shard->rank);
      WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                            FetchVerifiedBlob(store, *part->delta, what));
      delta_blobs.push_back(std::move(bytes));
      Result<sync::ModelDelta> shard_delta = sync::ParseModelDelta(delta_blobs.back());
      if (!shard_delta.ok()) return shard_delta.status().WithContext(what);
      for (sync::TensorDelta& t : shard_delta->tensors) delta.tensors.push_back(std::move(t));
    }
  }
  // The keyframe, when one is due, is the parts' keyframes as one safetensors file.
  auto keyframe = [&]() -> Result<std::vector<uint8_t>> {
    std::vector<sync::TensorSpec> specs;
    std::vector<std::vector<uint8_t>> datas;
    for (const std::optional<Manifest>& part : parts) {
      const std::string what =
          where + ", the keyframe of rank " + std::to_string(part->shard->rank);
      if (!part->keyframe) return DataLoss(what + " is missing: a keyframe is due");
      WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                            FetchVerifiedBlob(store, *part->keyframe, what));
      Result<sync::SafetensorsFile> file = sync::SafetensorsFile::Parse(bytes);
      if (!file.ok()) return file.status().WithContext(what);
      sync::ServedModel model = sync::ServedModel::FromSafetensors(*file, threads);
      for (const auto& t : model.tensors()) {
        specs.push_back(t.spec);
        datas.push_back(t.bytes);
      }
    }
    return KeyframeBytes(
        sync::ServedModel::FromTensors(std::move(specs), std::move(datas), threads));
  };
  return PublishContent(store, run_id, previous, std::move(tensors), previous ? &delta : nullptr,
                        keyframe, policy, threads);
}

Result<Manifest> WaitForVersion(ObjectStore& store, const std::string& run_id, uint64_t version,
                                std::chrono::milliseconds deadline) {
  WEFT_ASSIGN_OR_RETURN(bool visible, PollUntil(deadline, [&]() -> Result<bool> {
                          Result<std::vector<uint8_t>> latest = store.Get(LatestKey(run_id));
                          if (!latest.ok())
                            return latest.status().code() == StatusCode::kNotFound
                                       ? Result<bool>(false)
                                       : Result<bool>(latest.status());
                          return std::strtoull(std::string(latest->begin(), latest->end()).c_str(),
                                               nullptr, 10) >= version;
                        }));
  if (!visible)
    return Timeout("run '" + run_id + "' version " + std::to_string(version) +
                   " was not committed in time");
  return ReadManifest(store, run_id, version);
}

Status SetPin(ObjectStore& store, const std::string& run_id, const std::string& holder,
              uint64_t version) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  WEFT_RETURN_IF_ERROR(ValidateHolder(holder));
  const std::string key = PinKey(run_id, holder);
  for (int attempt = 0;; ++attempt) {
    Result<std::vector<uint8_t>> current = store.Get(key);
    std::optional<std::string> expected;
    if (current.ok()) {
      expected = std::string(current->begin(), current->end());
    } else if (current.status().code() != StatusCode::kNotFound) {
      return current.status();
    }
    if (expected == VersionText(version)) return Status::Ok();
    Status status = store.CompareAndSwap(key, expected, VersionText(version));
    if (status.code() != StatusCode::kConflict || attempt >= 8)
      return status;  // raced another writer: read again
  }
}

Status RemovePin(ObjectStore& store, const std::string& run_id, const std::string& holder) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  WEFT_RETURN_IF_ERROR(ValidateHolder(holder));
  return store.Delete(PinKey(run_id, holder));
}

Result<std::map<std::string, uint64_t>> ListPins(ObjectStore& store, const std::string& run_id) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  const std::string prefix = "runs/" + run_id + "/pins/";
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> keys, store.List(prefix));
  std::map<std::string, uint64_t> pins;
  for (const std::string& key : keys) {
    Result<std::vector<uint8_t>> text = store.Get(key);
    if (!text.ok() && text.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
    if (!text.ok()) return text.status();
    std::string value(text->begin(), text->end());
    char* end = nullptr;
    const unsigned long long version = std::strtoull(value.c_str(), &end, 10);
    if (value.empty() || end == value.c_str() || (*end != '\n' && *end != '\0'))
      return DataLoss(key + " does not hold a version number");
    pins[key.substr(prefix.size())] = version;
  }
  return pins;
}

namespace {

// Squashes the deltas in `blobs` (each parsed in place), in order.
Result<std::vector<uint8_t>> SquashBlobs(const std::vector<std::vector<uint8_t>>& blobs,
                                         const sync::ModelDelta* last, int threads) {
  std::optional<sync::ModelDelta> squashed;
  std::vector<uint8_t> owned;  // the serialized squash, which later squashes read from
  for (const auto& bytes : blobs) {
    WEFT_ASSIGN_OR_RETURN(sync::ModelDelta next, sync::ParseModelDelta(bytes));
    if (!squashed) {
      squashed = std::move(next);
      continue;
    }
    WEFT_ASSIGN_OR_RETURN(sync::ModelDelta both, sync::SquashModelDeltas(*squashed, next, threads));
    owned = sync::SerializeModelDelta(both);
    WEFT_ASSIGN_OR_RETURN(squashed, sync::ParseModelDelta(owned));
  }
  if (last != nullptr) {
    if (!squashed) return sync::SerializeModelDelta(*last);
    WEFT_ASSIGN_OR_RETURN(sync::ModelDelta both,
                          sync::SquashModelDeltas(*squashed, *last, threads));
    return sync::SerializeModelDelta(both);
  }
  return sync::SerializeModelDelta(*squashed);
}

}  // namespace

Status PublishCatchups(ObjectStore& store, const std::string& run_id, const Manifest& manifest,
                       const sync::ModelDelta& delta, const KeyframePolicy& policy, int threads) {
  const uint64_t target = manifest.version;
  if (policy.max_catchup_bases == 0 || target < 2) return Status::Ok();
  WEFT_ASSIGN_OR_RETURN(auto pins, ListPins(store, run_id));
  std::set<uint64_t, std::greater<uint64_t>> bases;  // newest first: the cheapest to keep
  for (const auto& [holder, version] : pins) {
    if (version + 1 < target && target - version <= policy.max_catchup_lag) bases.insert(version);
  }
  StoreReader reader(store, run_id, threads);
  size_t written = 0;
  for (uint64_t base : bases) {
    if (written++ == policy.max_catchup_bases) break;
    const std::string what =
        "catch-up delta from version " + std::to_string(base) + " to " + std::to_string(target);
    // From base to target - 1: the previous catch-up delta, or the cheapest chain of deltas.
    std::vector<std::vector<uint8_t>> blobs;
    WEFT_ASSIGN_OR_RETURN(std::optional<BlobRef> previous, reader.FindCatchup(target - 1, base));
    if (previous) {
      WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, FetchVerifiedBlob(store, *previous, what));
      blobs.push_back(std::move(bytes));
    } else {
      Result<Manifest> before = reader.GetManifest(target - 1);
      if (!before.ok()) return before.status().WithContext(what);
      Result<StoreReader::Plan> plan = reader.PlanPath(*before, base, false);
      if (!plan.ok()) continue;  // the pinned version was collected or never chained: nothing to do
      for (const StoreReader::Plan::Step& step : plan->steps) {
        WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                              FetchVerifiedBlob(store, step.blob, what));
        blobs.push_back(std::move(bytes));
      }
    }
    Result<std::vector<uint8_t>> bytes = SquashBlobs(blobs, &delta, threads);
    if (!bytes.ok()) return bytes.status().WithContext(what);
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, *bytes));
    Catchup record{run_id, base, target, blob};
    WEFT_RETURN_IF_ERROR(
        store.PutImmutable(CatchupKey(run_id, target, base), AsBytes(record.ToJson())));
  }
  return Status::Ok();
}

Result<uint64_t> StoreReader::Latest() {
  Result<std::vector<uint8_t>> bytes = store_.Get(LatestKey(run_id_));
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound)
      return NotFound("run '" + run_id_ + "' has no published version");
    return bytes.status();
  }
  std::string text(bytes->begin(), bytes->end());
  char* end = nullptr;
  unsigned long long version = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || (*end != '\n' && *end != '\0')) {
    return DataLoss(LatestKey(run_id_) + " does not hold a version number");
  }
  return static_cast<uint64_t>(version);
}

Result<Manifest> StoreReader::GetManifest(uint64_t version) {
  Result<Manifest> manifest = ReadManifest(store_, run_id_, version);
  if (!manifest.ok() && manifest.status().code() == StatusCode::kNotFound) {
    return NotFound("run '" + run_id_ + "' has no version " + std::to_string(version));
  }
  return manifest;
}

Result<std::vector<uint64_t>> StoreReader::Versions() {
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                        store_.List("runs/" + run_id_ + "/versions/"));
  std::vector<uint64_t> versions;
  for (const std::string& key : keys) {
    size_t slash = key.rfind('/');
    std::string name = key.substr(slash + 1);
    if (name.size() != 25 || name.substr(20) != ".json") continue;
    versions.push_back(std::strtoull(name.substr(0, 20).c_str(), nullptr, 10));
  }
  return versions;
}

Status StoreReader::CheckAgainstManifest(const sync::ServedModel& model, const Manifest& manifest,
                                         const sync::ModelDelta* pending) {
  if (model.tensors().size() != manifest.tensors.size()) {
    return DataLoss("version " + std::to_string(manifest.version) + " has " +
                    std::to_string(manifest.tensors.size()) + " tensors, the local copy " +
                    std::to_string(model.tensors().size()));
  }
  for (const ManifestTensor& t : manifest.tensors) {
    const sync::ServedModel::Tensor* local = model.Find(t.name);
    const sync::TensorDelta* change = pending ? pending->Find(t.name) : nullptr;
    const sync::Digest digest = change  ? change->result_digest
                                : local ? local->digest
                                        : sync::Digest{};
    if (local == nullptr || local->spec.dtype != t.dtype || local->spec.shape != t.shape ||
        digest != t.digest) {
      return DataLoss("tensor '" + t.name + "' does not match version " +
                      std::to_string(manifest.version) + "'s manifest");
    }
  }
  return Status::Ok();
}

Result<sync::ServedModel> StoreReader::LoadKeyframe(const Manifest& manifest,
                                                    std::span<const uint8_t> bytes) {
  const std::string what = "keyframe of version " + std::to_string(manifest.version);
  Result<sync::SafetensorsFile> file = sync::SafetensorsFile::Parse(bytes);
  if (!file.ok()) return file.status().WithContext(what);
  sync::ServedModel model = sync::ServedModel::FromSafetensors(*file, threads_);
  WEFT_RETURN_IF_ERROR(CheckAgainstManifest(model, manifest).WithContext(what));
  return model;
}

std::string StoreReader::Plan::Describe() const {
  std::string text = from_keyframe ? "keyframe v" + std::to_string(start) : "";
  size_t catchups = 0;
  for (const Step& step : steps) catchups += step.catchup ? 1 : 0;
  if (!steps.empty()) {
    std::string what =
        catchups == steps.size() && steps.size() == 1 ? "1 catch-up delta" : Deltas(steps.size());
    text += (from_keyframe ? " + " : "") + what +
            (from_keyframe ? "" : " from v" + std::to_string(start));
  } else if (!from_keyframe) {
    text = "already at the target";
  }
  return text;
}

Result<std::optional<BlobRef>> StoreReader::FindCatchup(uint64_t target, uint64_t base) {
  const std::string key = CatchupKey(run_id_, target, base);
  Result<std::vector<uint8_t>> text = store_.Get(key);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<BlobRef>();
    return text.status();
  }
  Result<Catchup> catchup =
      Catchup::FromJson({reinterpret_cast<const char*>(text->data()), text->size()});
  if (!catchup.ok() || catchup->run_id != run_id_ || catchup->target != target ||
      catchup->base != base) {
    // A catch-up delta is an optimisation: a bad one is reported and planned around.
    WEFT_LOG(kWarning) << key << " is not a valid catch-up record; ignoring it";
    return std::optional<BlobRef>();
  }
  return std::optional<BlobRef>(catchup->blob);
}

Result<StoreReader::Plan> StoreReader::PlanPath(const Manifest& goal, std::optional<uint64_t> have,
                                                bool allow_keyframe) {
  const uint64_t target = goal.version;
  Plan plan;
  plan.target = target;
  if (allow_keyframe) {
    WEFT_ASSIGN_OR_RETURN(plan.keyframe, GetManifest(goal.last_keyframe));
    if (!plan.keyframe.keyframe)
      return DataLoss("version " + std::to_string(goal.last_keyframe) +
                      " is named as a keyframe but has none");
  } else if (!have) {
    return InvalidArgument("a path of deltas needs a starting version");
  }
  // Cheapest path in bytes: starts are the local copy (free) and the keyframe (its size); edges
  // are each version's delta from its predecessor, its skip deltas, and a catch-up delta from
  // the local copy's version straight to the target when the publisher wrote one.
  const uint64_t low =
      have ? (allow_keyframe ? std::min(*have, goal.last_keyframe) : *have) : goal.last_keyframe;
  const size_t count = static_cast<size_t>(target - low + 1);
  constexpr uint64_t kUnreachable = ~uint64_t{0};
  std::vector<uint64_t> cost(count, kUnreachable);
  std::vector<std::optional<Plan::Step>> via(count);
  if (allow_keyframe) cost[goal.last_keyframe - low] = plan.keyframe.keyframe->bytes;
  if (have) cost[*have - low] = 0;
  // The manifests of the range, fetched concurrently (each is a round trip on a remote store),
  // with the catch-up record.
  std::vector<Manifest> manifests(target - low);
  std::optional<BlobRef> catchup;
  WEFT_RETURN_IF_ERROR(ForEachConcurrently(manifests.size() + 1, fetch_concurrency_, [&](size_t i) {
    if (i == manifests.size()) {
      if (!have || *have + 1 >= target) return Status::Ok();
      Result<std::optional<BlobRef>> found = FindCatchup(target, *have);
      if (!found.ok()) return found.status();
      catchup = *found;
      return Status::Ok();
    }
    Result<Manifest> m =
        i + 1 == manifests.size() ? Result<Manifest>(goal) : GetManifest(low + 1 + i);
    if (!m.ok()) return m.status();
    manifests[i] = std::move(*m);
    return Status::Ok();
  }));
  for (uint64_t v = low + 1; v <= target; ++v) {
    const Manifest& m = manifests[v - low - 1];
    std::vector<Plan::Step> edges;
    if (m.delta) edges.push_back({*m.delta_base, *m.delta, false});
    for (const SkipDelta& skip : m.skips) edges.push_back({skip.base, skip.blob, false});
    if (v == target && catchup) edges.push_back({*have, *catchup, true});
    for (const Plan::Step& edge : edges) {
      if (edge.base < low || cost[edge.base - low] == kUnreachable) continue;
      const uint64_t total = cost[edge.base - low] + edge.blob.bytes;
      if (total < cost[v - low]) {
        cost[v - low] = total;
        via[v - low] = edge;
      }
    }
  }
  if (cost[target - low] == kUnreachable)
    return DataLoss("no chain of deltas reaches version " + std::to_string(target));
  uint64_t at = target;
  while (via[at - low]) {
    plan.steps.push_back(*via[at - low]);
    at = via[at - low]->base;
  }
  std::reverse(plan.steps.begin(), plan.steps.end());
  plan.start = at;
  plan.from_keyframe = !(have && at == *have);
  return plan;
}

Result<PullReport> StoreReader::Pull(uint64_t target, std::optional<uint64_t> have,
                                     sync::ServedModel* model) {
  WEFT_ASSIGN_OR_RETURN(Manifest goal, GetManifest(target));
  PullReport report;
  report.from = have;
  report.to = target;
  if (have) {
    if (*have > target)
      return InvalidArgument("cannot go back from version " + std::to_string(*have) + " to " +
                             std::to_string(target));
    Result<Manifest> held = GetManifest(*have);
    if (!held.ok() && held.status().code() == StatusCode::kNotFound) {
      have.reset();  // retention removed it: nothing chains from there any more, start from a
                     // keyframe
    } else {
      if (!held.ok()) return held.status();
      WEFT_RETURN_IF_ERROR(CheckAgainstManifest(*model, *held).WithContext("the local copy"));
    }
  }
  WEFT_ASSIGN_OR_RETURN(Plan plan, PlanPath(goal, have, true));
  const bool from_keyframe = plan.from_keyframe;
  const Manifest& keyframe = plan.keyframe;
  const std::vector<Plan::Step>& path = plan.steps;
  report.path = plan.Describe();

  // Fetch and verify every blob before touching anything, then work on a copy: on any error the
  // caller's model is exactly as it was.
  // Every blob of the path (and the keyframe) is fetched concurrently.
  std::vector<std::vector<uint8_t>> blobs(path.size());
  std::vector<uint8_t> keyframe_bytes;
  WEFT_RETURN_IF_ERROR(
      ForEachConcurrently(path.size() + (from_keyframe ? 1 : 0), fetch_concurrency_, [&](size_t i) {
        if (i == path.size()) {
          Result<std::vector<uint8_t>> bytes =
              FetchVerifiedBlob(store_, *keyframe.keyframe,
                                "keyframe of version " + std::to_string(keyframe.version));
          if (!bytes.ok()) return bytes.status();
          keyframe_bytes = std::move(*bytes);
          return Status::Ok();
        }
        Result<std::vector<uint8_t>> bytes = FetchVerifiedBlob(
            store_, path[i].blob, "delta from version " + std::to_string(path[i].base));
        if (!bytes.ok()) return bytes.status();
        blobs[i] = std::move(*bytes);
        return Status::Ok();
      }));
  for (const auto& bytes : blobs) report.bytes_downloaded += bytes.size();
  report.bytes_downloaded += keyframe_bytes.size();
  if (from_keyframe) report.fetched.push_back(*keyframe.keyframe);
  for (const Plan::Step& step : path) report.fetched.push_back(step.blob);
  if (!from_keyframe && path.size() == 1) {
    // One delta (the common case of a reader one version behind) applies atomically in place:
    // check that it lands on the target's digests, then apply, which verifies it before writing.
    Result<sync::ModelDelta> delta = sync::ParseModelDelta(blobs[0]);
    if (!delta.ok())
      return delta.status().WithContext("delta from version " + std::to_string(path[0].base));
    WEFT_RETURN_IF_ERROR(
        CheckAgainstManifest(*model, goal, &*delta)
            .WithContext("the delta from version " + std::to_string(path[0].base)));
    WEFT_RETURN_IF_ERROR(model->Apply(*delta, threads_)
                             .WithContext("delta from version " + std::to_string(path[0].base)));
    return report;
  }
  sync::ServedModel work;
  if (from_keyframe) {
    WEFT_ASSIGN_OR_RETURN(work, LoadKeyframe(keyframe, keyframe_bytes));
  } else {
    work = *model;  // a chain is applied to a copy, so that a failure halfway changes nothing
  }
  for (size_t i = 0; i < path.size(); ++i) {
    const std::string what = "delta from version " + std::to_string(path[i].base);
    Result<sync::ModelDelta> delta = sync::ParseModelDelta(blobs[i]);
    if (!delta.ok()) return delta.status().WithContext(what);
    WEFT_RETURN_IF_ERROR(work.Apply(*delta, threads_).WithContext(what));
  }
  WEFT_RETURN_IF_ERROR(CheckAgainstManifest(work, goal));
  *model = std::move(work);
  return report;
}

Result<CollectReport> CollectGarbage(ObjectStore& store, const std::string& run_id,
                                     const std::vector<uint64_t>& pins, bool dry_run) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  StoreReader reader(store, run_id, 1);
  WEFT_ASSIGN_OR_RETURN(uint64_t latest, reader.Latest());
  uint64_t oldest_pin = latest;
  for (uint64_t pin : pins) {
    if (pin > latest)
      return InvalidArgument("pinned version " + std::to_string(pin) + " is after the latest, " +
                             std::to_string(latest));
    oldest_pin = std::min(oldest_pin, pin);
  }
  WEFT_ASSIGN_OR_RETURN(auto stored_pins, ListPins(store, run_id));
  for (const auto& [holder, pin] : stored_pins) {
    if (pin > latest)
      return DataLoss("holder '" + holder + "' pins version " + std::to_string(pin) +
                      ", after the latest, " + std::to_string(latest));
    oldest_pin = std::min(oldest_pin, pin);
  }
  WEFT_ASSIGN_OR_RETURN(Manifest pinned, reader.GetManifest(oldest_pin));
  CollectReport report;
  report.kept_from = pinned.last_keyframe;
  WEFT_ASSIGN_OR_RETURN(std::vector<uint64_t> versions, reader.Versions());
  // Blobs referenced by kept manifests (including versions above `latest`, still being published).
  std::set<std::string> kept_blobs;
  std::vector<Manifest> doomed;
  for (uint64_t v : versions) {
    WEFT_ASSIGN_OR_RETURN(Manifest m, reader.GetManifest(v));
    if (v >= report.kept_from) {
      if (m.keyframe) kept_blobs.insert(m.keyframe->sha256);
      if (m.delta) kept_blobs.insert(m.delta->sha256);
      for (const SkipDelta& skip : m.skips) kept_blobs.insert(skip.blob.sha256);
    } else {
      doomed.push_back(std::move(m));
    }
  }
  std::map<std::string, uint64_t> doomed_blobs;
  for (const Manifest& m : doomed) {
    std::vector<BlobRef> refs;
    if (m.keyframe) refs.push_back(*m.keyframe);
    if (m.delta) refs.push_back(*m.delta);
    for (const SkipDelta& skip : m.skips) refs.push_back(skip.blob);
    for (const BlobRef& blob : refs) {
      if (!kept_blobs.count(blob.sha256)) doomed_blobs[blob.sha256] = blob.bytes;
    }
  }
  // Parts of sharded versions that are committed (at or below `latest`) were merged into their
  // version's blobs: they and the blobs only they reference go.
  std::vector<std::string> doomed_parts;
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> part_keys,
                        store.List("runs/" + run_id + "/shards/"));
  for (const std::string& key : part_keys) {
    const size_t start = ("runs/" + run_id + "/shards/").size();
    if (std::strtoull(key.substr(start, 20).c_str(), nullptr, 10) > latest) continue;
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, store.Get(key));
    Result<Manifest> part =
        Manifest::FromJson({reinterpret_cast<const char*>(text.data()), text.size()});
    if (!part.ok()) return DataLoss(part.status().message()).WithContext(key);
    doomed_parts.push_back(key);
    for (const std::optional<BlobRef>& blob : {part->delta, part->keyframe}) {
      if (blob && !kept_blobs.count(blob->sha256)) doomed_blobs[blob->sha256] = blob->bytes;
    }
  }
  // Catch-up deltas to versions before `latest`: no reader plans towards them any more.
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> catchup_keys,
                        store.List("runs/" + run_id + "/catchup/"));
  std::set<std::string> kept_catchup_blobs;
  for (const std::string& key : catchup_keys) {
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, store.Get(key));
    Result<Catchup> record =
        Catchup::FromJson({reinterpret_cast<const char*>(text.data()), text.size()});
    const bool stale = !record.ok() || record->target < latest;
    if (stale) {
      doomed_parts.push_back(key);
      if (record.ok() && !kept_blobs.count(record->blob.sha256))
        doomed_blobs[record->blob.sha256] = record->blob.bytes;
    } else {
      kept_catchup_blobs.insert(record->blob.sha256);
    }
  }
  for (const std::string& sha256 : kept_catchup_blobs) doomed_blobs.erase(sha256);
  report.versions_deleted = doomed.size();
  report.blobs_deleted = doomed_blobs.size();
  for (const auto& [sha256, bytes] : doomed_blobs) report.bytes_freed += bytes;
  if (dry_run) return report;
  // Manifests first, so that no listed version ever lacks its blobs.
  for (const Manifest& m : doomed)
    WEFT_RETURN_IF_ERROR(store.Delete(ManifestKey(run_id, m.version)));
  for (const std::string& key : doomed_parts) WEFT_RETURN_IF_ERROR(store.Delete(key));
  for (const auto& [sha256, bytes] : doomed_blobs)
    WEFT_RETURN_IF_ERROR(store.Delete(BlobKey(sha256)));
  return report;
}

Result<std::optional<uint64_t>> StoreReader::IdentifyVersion(const sync::ServedModel& model,
                                                             uint64_t max_versions) {
  WEFT_ASSIGN_OR_RETURN(uint64_t latest, Latest());
  for (uint64_t checked = 0; checked < max_versions && checked <= latest; ++checked) {
    WEFT_ASSIGN_OR_RETURN(Manifest m, GetManifest(latest - checked));
    if (CheckAgainstManifest(model, m).ok()) return std::optional<uint64_t>(m.version);
  }
  return std::optional<uint64_t>();
}

}  // namespace weft::policy_store
