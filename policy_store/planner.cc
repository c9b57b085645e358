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

}  // namespace

std::string PullPlan::Describe() const {
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

Result<PullPlan> PlanPath(ObjectStore& store, const std::string& run_id, const Manifest& goal,
                          std::optional<uint64_t> have, bool allow_keyframe,
                          int fetch_concurrency) {
  const uint64_t target = goal.version;
  PullPlan plan;
  plan.target = target;
  if (allow_keyframe) {
    WEFT_ASSIGN_OR_RETURN(plan.keyframe, ReadManifest(store, run_id, goal.last_keyframe));
    if (!plan.keyframe.keyframe) {
      return DataLoss("version " + std::to_string(goal.last_keyframe) +
                      " is named as a keyframe but has none");
    }
  } else if (!have) {
    return InvalidArgument("a path of deltas needs a starting version");
  }
  const uint64_t low =
      have ? (allow_keyframe ? std::min(*have, goal.last_keyframe) : *have) : goal.last_keyframe;
  const size_t count = static_cast<size_t>(target - low + 1);
  constexpr uint64_t kUnreachable = ~uint64_t{0};
  std::vector<uint64_t> cost(count, kUnreachable);
  std::vector<std::optional<PullPlan::Step>> via(count);
  if (allow_keyframe) cost[goal.last_keyframe - low] = plan.keyframe.keyframe->bytes;
  if (have) cost[*have - low] = 0;
  // The manifests of the range, fetched concurrently, with the catch-up record.
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
  // Versions in increasing order: every edge goes forward, so each cost is final when reached.
  for (uint64_t v = low + 1; v <= target; ++v) {
    const Manifest& m = manifests[v - low - 1];
    std::vector<PullPlan::Step> edges;
    if (m.delta) edges.push_back({*m.delta_base, *m.delta, false});
    for (const SkipDelta& skip : m.skips) edges.push_back({skip.base, skip.blob, false});
    if (v == target && catchup) edges.push_back({*have, *catchup, true});
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

}  // namespace weft::policy_store
