#include "orchestrator/core_config.h"

#include <chrono>

#include "common/yaml_fields.h"

namespace weft::orchestrator {

const std::vector<std::string>& CoreConfigKeys() {
  static const std::vector<std::string> keys = {
      "max_staleness", "stale_policy",  "dispatch",     "lease",        "cluster_timeout",
      "stall_after",   "max_in_flight", "max_attempts", "remember_done"};
  return keys;
}

Status ParseCoreConfig(const YAML::Node& o, const std::string& where, const std::string& path,
                       CoreConfig* config) {
  const std::string file = path + ": ";
  auto check = [&](const Status& s) { return s.ok() ? s : s.WithContext(path); };
  WEFT_RETURN_IF_ERROR(check(ReadUnsigned(o, where, "max_staleness", &config->max_staleness)));
  std::string policy = config->stale_policy == StalePolicy::kDrop ? "drop" : "deliver_flagged";
  WEFT_RETURN_IF_ERROR(check(ReadString(o, where, "stale_policy", &policy)));
  if (policy == "drop") {
    config->stale_policy = StalePolicy::kDrop;
  } else if (policy == "deliver_flagged") {
    config->stale_policy = StalePolicy::kDeliverFlagged;
  } else {
    return InvalidArgument(file + where + ".stale_policy: '" + policy +
                           "' is not drop or deliver_flagged");
  }
  std::string dispatch = DispatchName(config->dispatch);
  WEFT_RETURN_IF_ERROR(check(ReadString(o, where, "dispatch", &dispatch)));
  Result<DispatchPolicy> parsed = ParseDispatch(dispatch);
  if (!parsed.ok())
    return InvalidArgument(file + where + ".dispatch: " + parsed.status().message());
  config->dispatch = *parsed;
  std::chrono::microseconds lease(config->lease_duration), timeout(config->cluster_timeout),
      stall(config->stall_after);
  WEFT_RETURN_IF_ERROR(check(ReadDuration(o, where, "lease", &lease)));
  WEFT_RETURN_IF_ERROR(check(ReadDuration(o, where, "cluster_timeout", &timeout)));
  WEFT_RETURN_IF_ERROR(check(ReadDuration(o, where, "stall_after", &stall)));
  const std::chrono::microseconds year = std::chrono::hours(24 * 365);
  if (lease.count() <= 0 || timeout.count() <= 0 || stall.count() <= 0 || lease > year ||
      timeout > year || stall > year) {
    return InvalidArgument(file + where +
                           ": lease, cluster_timeout and stall_after must be positive and at most "
                           "a year");
  }
  config->lease_duration = lease.count();
  config->cluster_timeout = timeout.count();
  config->stall_after = stall.count();
  WEFT_RETURN_IF_ERROR(check(ReadUnsigned(o, where, "max_in_flight", &config->max_in_flight)));
  if (config->max_in_flight < 1)
    return InvalidArgument(file + where + ".max_in_flight must be at least 1");
  uint64_t attempts = config->max_attempts;
  WEFT_RETURN_IF_ERROR(check(ReadUnsigned(o, where, "max_attempts", &attempts)));
  if (attempts < 1 || attempts > 1000)
    return InvalidArgument(file + where + ".max_attempts must be 1 to 1000");
  config->max_attempts = static_cast<uint32_t>(attempts);
  WEFT_RETURN_IF_ERROR(check(ReadUnsigned(o, where, "remember_done", &config->remember_done)));
  if (config->remember_done < 1)
    return InvalidArgument(file + where + ".remember_done must be at least 1");
  return Status::Ok();
}

}  // namespace weft::orchestrator
