#include "policy_store/pins.h"

#include "policy_store/manifest.h"
#include "policy_store/run_objects.h"

namespace weft::policy_store {

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
    if (status.code() != StatusCode::kConflict || attempt >= 8) return status;  // raced: read again
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
    std::optional<uint64_t> version =
        ParseVersionText({reinterpret_cast<const char*>(text->data()), text->size()});
    if (!version) return DataLoss(key + " does not hold a version number");
    pins[key.substr(prefix.size())] = *version;
  }
  return pins;
}

}  // namespace weft::policy_store
