// The objects of a run in an ObjectStore, read and written with their checks (layout: manifest.h):
// content-addressed blobs, manifests, the `latest` pointer, and the keyframe blob format. Shared by
// the publishing side (publish.h, skip_deltas.h, catchup_deltas.h) and the reading side (reader.h,
// planner.h, retention.h). Thread-safe as the store is.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "policy_store/manifest.h"
#include "policy_store/object_store.h"
#include "sync/delta_codec.h"
#include "sync/safetensors.h"
#include "sync/served_model.h"

namespace weft::policy_store {

// Writes `bytes` as blobs/<sha256> (immutable: writing the same bytes again succeeds).
Result<BlobRef> PutBlob(ObjectStore& store, std::span<const uint8_t> bytes);
// The same for a blob made of `pieces` one after another, never joined in memory: hashed in a
// first pass, then streamed to the store (ObjectStore::NewImmutableWriter).
Result<BlobRef> PutBlobPieces(ObjectStore& store, std::span<const std::span<const uint8_t>> pieces);

// A blob's bytes, checked against its size and SHA-256 (FetchBlobs: in parts, several at once,
// hashed as they arrive). A copy that fails the check is reported and fetched again (three
// fetches), then kDataLoss. `what` names the blob in messages.
Result<std::vector<uint8_t>> FetchVerifiedBlob(ObjectStore& store, const BlobRef& blob,
                                               const std::string& what);

// A delta blob fetched, verified and parsed: `delta` points into `bytes`, which it owns (moving a
// LoadedDelta keeps that true).
struct LoadedDelta {
  std::vector<uint8_t> bytes;
  sync::ModelDelta delta;
};
Result<LoadedDelta> FetchDelta(ObjectStore& store, const BlobRef& blob, const std::string& what);
// A verified delta blob's bytes, parsed; errors name `what`.
Result<LoadedDelta> ParseLoadedDelta(std::vector<uint8_t> bytes, const std::string& what);

// The manifest of `version` of `run_id`, checked to name that run and version: kNotFound when it
// does not exist, kDataLoss when it is not a valid manifest.
Result<Manifest> ReadManifest(ObjectStore& store, const std::string& run_id, uint64_t version);
// A parsed part manifest of a sharded version, stored at `key`.
Result<Manifest> ReadPart(ObjectStore& store, const std::string& key);

// The run's `latest` version: kNotFound when the run has none, kDataLoss when the object does not
// hold a version number.
Result<uint64_t> ReadLatest(ObjectStore& store, const std::string& run_id);
// How `latest` and pins store a version: decimal and a newline.
std::string VersionText(uint64_t version);
// The version in such a text, or nullopt.
std::optional<uint64_t> ParseVersionText(std::string_view text);

// Served tensors as one safetensors file (the keyframe blob format); kInvalidArgument when they
// cannot form one (two tensors of one name).
Result<std::vector<uint8_t>> KeyframeBytes(const std::vector<sync::TensorToWrite>& tensors);
Result<std::vector<uint8_t>> KeyframeBytes(const sync::ServedModel& model);

}  // namespace weft::policy_store
