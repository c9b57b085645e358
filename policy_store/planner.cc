#include "policy_store/planner.h"

#include <algorithm>

#include "common/concurrent.h"
#include "common/logging.h"
#include "policy_store/run_objects.h"

namespace weft::policy_store {
namespace {

std::string Deltas(size_t count) {
  return std::to_string(count) + (count == 1 ? " delta" : " deltas");
}

// Plans only go forward.
Status CheckNotPast(std::optional<uint64_t> have, uint64_t target) {
  if (have && *have > target) {
    return InvalidArgument("version " + std::to_string(*have) + " is past the target " +
                           std::to_string(target));
  }
  return Status::Ok();
}

}  // namespace

std::string PullPlan::Describe() const {
  std::string text = from_keyframe ? "keyframe v" + std::to_string(start) : "";
  if (from_keyframe && keyframe.keyframe.size() > 1)
    text += " (" + std::to_string(keyframe.keyframe.size()) + " parts)";
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

Result<std::optional<BlobRef>> FindCatchup(ObjectStore& store, const std::string& run_id,
                                           uint64_t target, uint64_t base) {
  const std::string key = CatchupKey(run_id, target, base);
  Result<std::vector<uint8_t>> text = store.Get(key);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<BlobRef>();
    return text.status();
  }
  Result<Catchup> catchup =
      Catchup::FromJson({reinterpret_cast<const char*>(text->data()), text->size()});
  if (!catchup.ok() || catchup->run_id != run_id || catchup->target != target ||
      catchup->base != base) {
    WEFT_LOG(kWarning) << key << " is not a valid catch-up record; ignoring it";
    return std::optional<BlobRef>();
  }
  return std::optional<BlobRef>(catchup->blob);
}

uint64_t PlanLow(const Manifest& goal, std::optional<uint64_t> have, bool allow_keyframe) {
  return have ? (allow_keyframe ? std::min(*have, goal.last_keyframe) : *have) : goal.last_keyframe;
}

Result<PullPlan> PlanFromManifests(const Manifest& goal, std::optional<uint64_t> have,
                                   const Manifest* keyframe, std::span<const Manifest> manifests,
                                   std::optional<BlobRef> catchup) {
  const uint64_t target = goal.version;
  PullPlan plan;
  plan.target = target;
  if (keyframe != nullptr) {
    if (!keyframe->has_keyframe() || keyframe->version != goal.last_keyframe) {
      return DataLoss("version " + std::to_string(goal.last_keyframe) +
                      " is named as a keyframe but has none");
    }
    plan.keyframe = *keyframe;
  } else if (!have) {
    return InvalidArgument("a path of deltas needs a starting version");
  }
  WEFT_RETURN_IF_ERROR(CheckNotPast(have, target));
  const uint64_t low = PlanLow(goal, have, keyframe != nullptr);
  if (manifests.size() != target - low) {
    return InvalidArgument("a plan from version " + std::to_string(low) + " to " +
                           std::to_string(target) + " needs " + std::to_string(target - low) +
                           " manifests, not " + std::to_string(manifests.size()));
  }
  const size_t count = static_cast<size_t>(target - low + 1);
  constexpr uint64_t kUnreachable = ~uint64_t{0};
  std::vector<uint64_t> cost(count, kUnreachable);
  std::vector<std::optional<PullPlan::Step>> via(count);
  if (keyframe != nullptr) cost[goal.last_keyframe - low] = keyframe->keyframe_bytes();
  if (have) cost[*have - low] = 0;
  // Versions in increasing order: every edge goes forward, so each cost is final when reached.
  for (uint64_t v = low + 1; v <= target; ++v) {
    const Manifest& m = v == target ? goal : manifests[v - low - 1];
    std::vector<PullPlan::Step> edges;
    if (m.delta) edges.push_back({*m.delta_base, *m.delta, false});
    for (const SkipDelta& skip : m.skips) edges.push_back({skip.base, skip.blob, false});
    if (v == target && catchup && have) edges.push_back({*have, *catchup, true});
    for (const PullPlan::Step& edge : edges) {
      if (edge.base < low || cost[edge.base - low] == kUnreachable) continue;
      const uint64_t total = cost[edge.base - low] + edge.blob.bytes;
      if (total < cost[v - low]) {
        cost[v - low] = total;
        via[v - low] = edge;
      }
    }
  }
  if (cost[target - low] == kUnreachable) {
    return DataLoss("no chain of deltas reaches version " + std::to_string(target));
  }
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

Result<PullPlan> PlanPath(ObjectStore& store, const std::string& run_id, const Manifest& goal,
                          std::optional<uint64_t> have, bool allow_keyframe,
                          int fetch_concurrency) {
  const uint64_t target = goal.version;
  if (!allow_keyframe && !have) {
    return InvalidArgument("a path of deltas needs a starting version");
  }
  WEFT_RETURN_IF_ERROR(CheckNotPast(have, target));
  std::optional<Manifest> keyframe;
  if (allow_keyframe) {
    WEFT_ASSIGN_OR_RETURN(keyframe, ReadManifest(store, run_id, goal.last_keyframe));
  }
  const uint64_t low = PlanLow(goal, have, allow_keyframe);
  // The manifests of the range (the goal, given, is the last), fetched concurrently, with the
  // catch-up record.
  std::vector<Manifest> manifests(target - low);
  std::optional<BlobRef> catchup;
  WEFT_RETURN_IF_ERROR(
      ForEachConcurrently(manifests.size() + 1, fetch_concurrency, [&](size_t i) -> Status {
        if (i == manifests.size()) {
          if (!have || *have + 1 >= target) return Status::Ok();
          WEFT_ASSIGN_OR_RETURN(catchup, FindCatchup(store, run_id, target, *have));
          return Status::Ok();
        }
        if (i + 1 == manifests.size()) {
          manifests[i] = goal;
          return Status::Ok();
        }
        WEFT_ASSIGN_OR_RETURN(manifests[i], ReadManifest(store, run_id, low + 1 + i));
        return Status::Ok();
      }));
  return PlanFromManifests(goal, have, keyframe ? &*keyframe : nullptr, manifests, catchup);
}

}  // namespace weft::policy_store
