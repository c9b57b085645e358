#include "policy_store/store_client.h"

#include <cstdlib>

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

std::string Deltas(size_t count) { return std::to_string(count) + (count == 1 ? " delta" : " deltas"); }

}  // namespace

std::vector<uint8_t> KeyframeBytes(const sync::ServedModel& model) {
  std::vector<sync::TensorToWrite> tensors;
  for (const auto& t : model.tensors()) tensors.push_back({t.spec.name, t.spec.dtype, t.spec.shape, t.bytes});
  Result<sync::SafetensorsLayout> layout = sync::PlanSafetensors(tensors, {});
  std::vector<uint8_t> bytes = layout->header;  // served tensors always form a valid file
  for (size_t i : layout->order) bytes.insert(bytes.end(), tensors[i].data.begin(), tensors[i].data.end());
  return bytes;
}

Result<Manifest> PublishVersion(ObjectStore& store, const std::string& run_id,
                                const Manifest* previous, const sync::ServedModel& model,
                                const sync::ModelDelta* delta, const KeyframePolicy& policy) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  if ((previous == nullptr) != (delta == nullptr)) {
    return InvalidArgument("a version after the first needs a delta from its predecessor");
  }
  Manifest manifest;
  manifest.run_id = run_id;
  manifest.version = previous ? previous->version + 1 : 0;
  for (const auto& t : model.tensors()) manifest.tensors.push_back({t.spec.name, t.spec.dtype, t.spec.shape, t.digest});

  // Blobs first.
  uint64_t delta_bytes = 0;
  if (delta != nullptr) {
    std::vector<uint8_t> bytes = sync::SerializeModelDelta(*delta);
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, bytes));
    manifest.delta = blob;
    manifest.delta_base = previous->version;
    delta_bytes = bytes.size();
  }
  bool keyframe = previous == nullptr || manifest.version - previous->last_keyframe >= policy.interval;
  if (!keyframe) {
    // The budget is relative to the last keyframe's size, read from its manifest.
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, store.Get(ManifestKey(run_id, previous->last_keyframe)));
    WEFT_ASSIGN_OR_RETURN(Manifest last, Manifest::FromJson({reinterpret_cast<const char*>(text.data()), text.size()}));
    const double budget = policy.delta_budget * static_cast<double>(last.keyframe ? last.keyframe->bytes : 0);
    keyframe = static_cast<double>(previous->delta_bytes_since_keyframe + delta_bytes) > budget;
  }
  if (keyframe) {
    WEFT_ASSIGN_OR_RETURN(BlobRef blob, PutBlob(store, KeyframeBytes(model)));
    manifest.keyframe = blob;
    manifest.last_keyframe = manifest.version;
    manifest.delta_bytes_since_keyframe = 0;
  } else {
    manifest.last_keyframe = previous->last_keyframe;
    manifest.delta_bytes_since_keyframe = previous->delta_bytes_since_keyframe + delta_bytes;
  }
  // Then the manifest, then the pointer.
  Status status = store.PutImmutable(ManifestKey(run_id, manifest.version), AsBytes(manifest.ToJson()));
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
    if (latest.ok() && std::string(latest->begin(), latest->end()) == VersionText(manifest.version)) return manifest;
    return status.WithContext("run '" + run_id + "': latest moved while publishing version " +
                              std::to_string(manifest.version));
  }
  WEFT_RETURN_IF_ERROR(status);
  return manifest;
}

Result<uint64_t> StoreReader::Latest() {
  Result<std::vector<uint8_t>> bytes = store_.Get(LatestKey(run_id_));
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return NotFound("run '" + run_id_ + "' has no published version");
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
  const std::string key = ManifestKey(run_id_, version);
  Result<std::vector<uint8_t>> bytes = store_.Get(key);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return NotFound("run '" + run_id_ + "' has no version " + std::to_string(version));
    }
    return bytes.status();
  }
  Result<Manifest> manifest = Manifest::FromJson({reinterpret_cast<const char*>(bytes->data()), bytes->size()});
  if (!manifest.ok()) return DataLoss(manifest.status().message()).WithContext(key);
  if (manifest->run_id != run_id_ || manifest->version != version) {
    return DataLoss(key + ": manifest names run '" + manifest->run_id + "' version " + std::to_string(manifest->version));
  }
  return manifest;
}

Result<std::vector<uint64_t>> StoreReader::Versions() {
  WEFT_ASSIGN_OR_RETURN(std::vector<std::string> keys, store_.List("runs/" + run_id_ + "/versions/"));
  std::vector<uint64_t> versions;
  for (const std::string& key : keys) {
    size_t slash = key.rfind('/');
    std::string name = key.substr(slash + 1);
    if (name.size() != 25 || name.substr(20) != ".json") continue;
    versions.push_back(std::strtoull(name.substr(0, 20).c_str(), nullptr, 10));
  }
  return versions;
}

Result<std::vector<uint8_t>> StoreReader::FetchBlob(const BlobRef& blob, const std::string& what) {
  Result<std::vector<uint8_t>> bytes = store_.Get(BlobKey(blob.sha256));
  if (!bytes.ok()) return bytes.status().WithContext(what);
  if (bytes->size() != blob.bytes || Sha256Hex(*bytes) != blob.sha256) {
    return DataLoss(what + ": blob " + blob.sha256 + " is corrupted (its content does not match its hash)");
  }
  return bytes;
}

Status StoreReader::CheckAgainstManifest(const sync::ServedModel& model, const Manifest& manifest) {
  if (model.tensors().size() != manifest.tensors.size()) {
    return DataLoss("version " + std::to_string(manifest.version) + " has " + std::to_string(manifest.tensors.size()) +
                    " tensors, the local copy " + std::to_string(model.tensors().size()));
  }
  for (const ManifestTensor& t : manifest.tensors) {
    const sync::ServedModel::Tensor* local = model.Find(t.name);
    if (local == nullptr || local->spec.dtype != t.dtype || local->spec.shape != t.shape || local->digest != t.digest) {
      return DataLoss("tensor '" + t.name + "' does not match version " + std::to_string(manifest.version) + "'s manifest");
    }
  }
  return Status::Ok();
}

Result<sync::ServedModel> StoreReader::LoadKeyframe(const Manifest& manifest) {
  const std::string what = "keyframe of version " + std::to_string(manifest.version);
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, FetchBlob(*manifest.keyframe, what));
  Result<sync::SafetensorsFile> file = sync::SafetensorsFile::Parse(bytes);
  if (!file.ok()) return file.status().WithContext(what);
  std::vector<sync::TensorSpec> specs;
  std::vector<std::vector<uint8_t>> data;
  for (const ManifestTensor& t : manifest.tensors) {
    const sync::SafetensorsTensor* tensor = file->Find(t.name);
    if (tensor == nullptr) return DataLoss(what + " lacks tensor '" + t.name + "'");
    specs.push_back({t.name, tensor->dtype, tensor->shape});
    data.emplace_back(tensor->data.begin(), tensor->data.end());
  }
  sync::ServedModel model = sync::ServedModel::FromTensors(std::move(specs), std::move(data), threads_);
  WEFT_RETURN_IF_ERROR(CheckAgainstManifest(model, manifest).WithContext(what));
  return model;
}

Result<PullReport> StoreReader::Pull(uint64_t target, std::optional<uint64_t> have, sync::ServedModel* model) {
  WEFT_ASSIGN_OR_RETURN(Manifest goal, GetManifest(target));
  PullReport report;
  report.from = have;
  report.to = target;
  if (have) {
    if (*have > target) return InvalidArgument("cannot go back from version " + std::to_string(*have) + " to " + std::to_string(target));
    WEFT_ASSIGN_OR_RETURN(Manifest held, GetManifest(*have));
    WEFT_RETURN_IF_ERROR(CheckAgainstManifest(*model, held).WithContext("the local copy"));
  }
  // The manifests from the first version after `have` (or after the keyframe) up to the target.
  std::vector<Manifest> chain;
  uint64_t chain_bytes = 0;
  const uint64_t keyframe_version = goal.last_keyframe;
  WEFT_ASSIGN_OR_RETURN(Manifest keyframe, GetManifest(keyframe_version));
  const uint64_t keyframe_path_bytes = keyframe.keyframe->bytes + goal.delta_bytes_since_keyframe;
  bool use_chain = false;
  if (have) {
    for (uint64_t v = *have + 1; v <= target; ++v) {
      WEFT_ASSIGN_OR_RETURN(Manifest m, GetManifest(v));
      if (!m.delta || *m.delta_base != v - 1) return DataLoss("version " + std::to_string(v) + " has no delta from its predecessor");
      chain_bytes += m.delta->bytes;
      chain.push_back(std::move(m));
    }
    use_chain = chain_bytes <= keyframe_path_bytes || *have >= keyframe_version;
  }
  if (!use_chain) {
    chain.clear();
    for (uint64_t v = keyframe_version + 1; v <= target; ++v) {
      WEFT_ASSIGN_OR_RETURN(Manifest m, GetManifest(v));
      if (!m.delta || *m.delta_base != v - 1) return DataLoss("version " + std::to_string(v) + " has no delta from its predecessor");
      chain.push_back(std::move(m));
    }
    report.path = "keyframe v" + std::to_string(keyframe_version);
    if (!chain.empty()) report.path += " + " + Deltas(chain.size());
  } else {
    report.path = chain.empty() ? "already at the target" : Deltas(chain.size()) + " from v" + std::to_string(*have);
  }
  // Fetch and verify every blob before touching anything, then work on a copy: on any error the
  // caller's model is exactly as it was.
  std::vector<std::vector<uint8_t>> blobs;
  for (const Manifest& m : chain) {
    WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, FetchBlob(*m.delta, "delta of version " + std::to_string(m.version)));
    report.bytes_downloaded += bytes.size();
    blobs.push_back(std::move(bytes));
  }
  sync::ServedModel work;
  if (use_chain) {
    work = *model;
  } else {
    WEFT_ASSIGN_OR_RETURN(work, LoadKeyframe(keyframe));
    report.bytes_downloaded += keyframe.keyframe->bytes;
  }
  for (size_t i = 0; i < chain.size(); ++i) {
    const std::string what = "delta of version " + std::to_string(chain[i].version);
    Result<sync::ModelDelta> delta = sync::ParseModelDelta(blobs[i]);
    if (!delta.ok()) return delta.status().WithContext(what);
    WEFT_RETURN_IF_ERROR(work.Apply(*delta, threads_).WithContext(what));
  }
  WEFT_RETURN_IF_ERROR(CheckAgainstManifest(work, goal));
  *model = std::move(work);
  return report;
}

Result<std::optional<uint64_t>> StoreReader::IdentifyVersion(const sync::ServedModel& model, uint64_t max_versions) {
  WEFT_ASSIGN_OR_RETURN(uint64_t latest, Latest());
  for (uint64_t checked = 0; checked < max_versions && checked <= latest; ++checked) {
    WEFT_ASSIGN_OR_RETURN(Manifest m, GetManifest(latest - checked));
    if (CheckAgainstManifest(model, m).ok()) return std::optional<uint64_t>(m.version);
  }
  return std::optional<uint64_t>();
}

}  // namespace weft::policy_store
