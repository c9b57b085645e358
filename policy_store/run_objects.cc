#include "policy_store/run_objects.h"

#include <cstdlib>

#include "common/logging.h"
#include "policy_store/blob_fetch.h"
#include "sync/safetensors.h"

namespace weft::policy_store {
namespace {

std::string_view AsText(const std::vector<uint8_t>& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

Result<BlobRef> PutBlob(ObjectStore& store, std::span<const uint8_t> bytes) {
  BlobRef blob{Sha256Hex(bytes), bytes.size()};
  WEFT_RETURN_IF_ERROR(store.PutImmutable(BlobKey(blob.sha256), bytes));
  return blob;
}

Result<BlobRef> PutBlobPieces(ObjectStore& store,
                              std::span<const std::span<const uint8_t>> pieces) {
  Sha256 hash;
  uint64_t bytes = 0;
  for (std::span<const uint8_t> piece : pieces) {
    hash.Update(piece);
    bytes += piece.size();
  }
  BlobRef blob{hash.HexDigest(), bytes};
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                        store.NewImmutableWriter(BlobKey(blob.sha256)));
  // A bounded piece at a time: a writer that stages what it is given holds no more than that.
  constexpr size_t kWriteBytes = size_t{16} << 20;
  for (std::span<const uint8_t> piece : pieces) {
    for (size_t at = 0; at < piece.size(); at += kWriteBytes)
      WEFT_RETURN_IF_ERROR(
          writer->Write(piece.subspan(at, std::min(kWriteBytes, piece.size() - at))));
  }
  WEFT_RETURN_IF_ERROR(writer->Commit().status());
  return blob;
}

Result<std::vector<uint8_t>> FetchVerifiedBlob(ObjectStore& store, const BlobRef& blob,
                                               const std::string& what) {
  BytesSink sink(blob.bytes);
  const BlobFetch fetch{blob, what, &sink};
  WEFT_RETURN_IF_ERROR(FetchBlobs(store, {&fetch, 1}));
  return std::move(sink.bytes());
}

Result<LoadedDelta> ParseLoadedDelta(std::vector<uint8_t> bytes, const std::string& what) {
  LoadedDelta loaded;
  loaded.bytes = std::move(bytes);
  Result<sync::ModelDelta> delta = sync::ParseModelDelta(loaded.bytes);
  if (!delta.ok()) return delta.status().WithContext(what);
  loaded.delta = std::move(delta).value();
  return loaded;
}

Result<LoadedDelta> FetchDelta(ObjectStore& store, const BlobRef& blob, const std::string& what) {
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, FetchVerifiedBlob(store, blob, what));
  return ParseLoadedDelta(std::move(bytes), what);
}

Result<Manifest> ReadManifest(ObjectStore& store, const std::string& run_id, uint64_t version) {
  const std::string key = ManifestKey(run_id, version);
  Result<std::vector<uint8_t>> text = store.Get(key);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound) {
    return NotFound("run '" + run_id + "' has no version " + std::to_string(version));
  }
  if (!text.ok()) return text.status();
  Result<Manifest> manifest = Manifest::FromJson(AsText(*text));
  if (!manifest.ok()) return DataLoss(manifest.status().message()).WithContext(key);
  if (manifest->run_id != run_id || manifest->version != version) {
    return DataLoss(key + ": manifest names run '" + manifest->run_id + "' version " +
                    std::to_string(manifest->version));
  }
  return manifest;
}

Result<Manifest> ReadPart(ObjectStore& store, const std::string& key) {
  WEFT_ASSIGN_OR_RETURN(std::vector<uint8_t> text, store.Get(key));
  Result<Manifest> part = Manifest::FromJson(AsText(text));
  if (!part.ok()) return DataLoss(part.status().message()).WithContext(key);
  return part;
}

std::string VersionText(uint64_t version) { return std::to_string(version) + "\n"; }

std::optional<uint64_t> ParseVersionText(std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const unsigned long long version = std::strtoull(copy.c_str(), &end, 10);
  if (copy.empty() || end == copy.c_str() || (*end != '\n' && *end != '\0')) return std::nullopt;
  return static_cast<uint64_t>(version);
}

Result<uint64_t> ReadLatest(ObjectStore& store, const std::string& run_id) {
  Result<std::vector<uint8_t>> bytes = store.Get(LatestKey(run_id));
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return NotFound("run '" + run_id + "' has no published version");
    }
    return bytes.status();
  }
  std::optional<uint64_t> version = ParseVersionText(AsText(*bytes));
  if (!version) return DataLoss(LatestKey(run_id) + " does not hold a version number");
  return *version;
}

Result<std::vector<uint8_t>> KeyframeBytes(const sync::ServedModel& model) {
  return KeyframeBytes(model.AsTensorsToWrite());
}

Result<std::vector<uint8_t>> KeyframeBytes(const std::vector<sync::TensorToWrite>& tensors) {
  WEFT_ASSIGN_OR_RETURN(sync::SafetensorsLayout layout, sync::PlanSafetensors(tensors, {}));
  std::vector<uint8_t> bytes = std::move(layout.header);
  for (size_t i : layout.order) {
    bytes.insert(bytes.end(), tensors[i].data.begin(), tensors[i].data.end());
  }
  return bytes;
}

}  // namespace weft::policy_store
