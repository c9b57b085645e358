// Pins: the version each holder (a worker, an in-flight job, the trainer) still needs, kept in the
// store at PinKey (formats.md section 6.4), so that retention (retention.h) and the publisher's
// catch-up deltas (catchup_deltas.h) see them. Thread-safe as the store is.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "policy_store/object_store.h"

namespace weft::policy_store {

// Creates or moves the pin of `holder` (by compare-and-swap, retried against racing writers).
Status SetPin(ObjectStore& store, const std::string& run_id, const std::string& holder,
              uint64_t version);
Status RemovePin(ObjectStore& store, const std::string& run_id, const std::string& holder);
// Holder -> pinned version.
Result<std::map<std::string, uint64_t>> ListPins(ObjectStore& store, const std::string& run_id);

}  // namespace weft::policy_store
