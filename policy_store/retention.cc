#include "policy_store/retention.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "policy_store/manifest.h"
#include "policy_store/pins.h"
#include "policy_store/reader.h"
#include "policy_store/run_objects.h"

namespace weft::policy_store {

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
      for (const BlobRef& blob : m.Blobs()) kept_blobs.insert(blob.sha256);
    } else {
      doomed.push_back(std::move(m));
    }
  }
  std::map<std::string, uint64_t> doomed_blobs;
  for (const Manifest& m : doomed) {
    for (const BlobRef& blob : m.Blobs()) {
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
    WEFT_ASSIGN_OR_RETURN(Manifest part, ReadPart(store, key));
    doomed_parts.push_back(key);
    for (const BlobRef& blob : part.Blobs()) {
      if (!kept_blobs.count(blob.sha256)) doomed_blobs[blob.sha256] = blob.bytes;
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

Result<Unpublished> FindUnpublished(ObjectStore& store, const std::string& run_id) {
  WEFT_RETURN_IF_ERROR(ValidateRunId(run_id));
  StoreReader reader(store, run_id, 1);
  Unpublished found;
  WEFT_ASSIGN_OR_RETURN(found.latest, reader.Latest());
  WEFT_ASSIGN_OR_RETURN(std::vector<uint64_t> versions, reader.Versions());
  for (uint64_t v : versions) {
    if (v <= found.latest) continue;
    found.manifests.push_back(v);
    found.keys.push_back(ManifestKey(run_id, v));
  }
  // Parts and catch-up records sit in a folder named by their version, in 20 digits.
  for (const std::string folder : {"shards", "catchup"}) {
    const std::string prefix = "runs/" + run_id + "/" + folder + "/";
    WEFT_ASSIGN_OR_RETURN(std::vector<std::string> keys, store.List(prefix));
    for (const std::string& key : keys) {
      if (std::strtoull(key.substr(prefix.size(), 20).c_str(), nullptr, 10) > found.latest)
        found.keys.push_back(key);
    }
  }
  std::sort(found.keys.begin(), found.keys.end());
  return found;
}

Result<uint64_t> FinishUnpublished(ObjectStore& store, const std::string& run_id) {
  WEFT_ASSIGN_OR_RETURN(Unpublished found, FindUnpublished(store, run_id));
  const uint64_t next = found.latest + 1;
  if (found.manifests.empty() || found.manifests.front() != next) {
    return NotFound("run " + run_id + ": no manifest of version " + std::to_string(next) +
                    " (the one after latest, " + std::to_string(found.latest) + ") to finish");
  }
  StoreReader reader(store, run_id, 1);
  WEFT_ASSIGN_OR_RETURN(Manifest manifest, reader.GetManifest(next));
  for (const BlobRef& blob : manifest.Blobs()) {
    WEFT_ASSIGN_OR_RETURN(bool present, store.Exists(BlobKey(blob.sha256)));
    if (!present) {
      return DataLoss("run " + run_id + ": version " + std::to_string(next) +
                      " cannot be finished: its blob " + blob.sha256 +
                      " is not in the store (discard it instead)");
    }
  }
  WEFT_RETURN_IF_ERROR(
      store.CompareAndSwap(LatestKey(run_id), VersionText(found.latest), VersionText(next)));
  return next;
}

Result<Unpublished> DiscardUnpublished(ObjectStore& store, const std::string& run_id) {
  WEFT_ASSIGN_OR_RETURN(Unpublished found, FindUnpublished(store, run_id));
  // Manifests first: a version without its manifest is no version, whatever parts remain.
  std::vector<std::string> order = found.keys;
  std::stable_partition(order.begin(), order.end(),
                        [&](const std::string& key) { return key.find("/versions/") != key.npos; });
  for (const std::string& key : order) WEFT_RETURN_IF_ERROR(store.Delete(key));
  WEFT_ASSIGN_OR_RETURN(uint64_t latest, ReadLatest(store, run_id));
  if (latest != found.latest) {
    return Conflict("run " + run_id + ": latest moved from " + std::to_string(found.latest) +
                    " to " + std::to_string(latest) +
                    " while unpublished versions were discarded: a publisher is running; check "
                    "the run with weft store ls");
  }
  return found;
}

}  // namespace weft::policy_store
