// The store: manifests as the publisher writes them (keyframes, deltas, skip deltas), with blob
// sizes from the model's density and the codec's bits per changed element; and pull plans from the
// real planner (policy_store/planner.h), made once per (version held, target) and kept for the run.
#include "sim/simulation.h"

#include <cinttypes>
#include <cstdio>
#include <span>
#include <string>

#include "policy_store/planner.h"

namespace weft::sim::internal {
namespace {

constexpr double kDeltaOverheadBytes = 4096;  // headers and chunk index of one delta file

std::string BlobHash(uint64_t id) {
  char text[65];
  std::snprintf(text, sizeof(text), "%064" PRIx64, id);
  return text;
}
uint64_t BlobId(const std::string& sha) { return std::stoull(sha.substr(48), nullptr, 16); }

}  // namespace

void Simulation::BuildManifest(uint64_t v) {
  const ModelConfig& model = config_.model;
  const double elements = model.parameters;
  Manifest m;
  m.run_id = "sim";
  m.version = v;
  double published = 0;
  auto delta_bytes = [&](double changed_fraction) {
    return elements * changed_fraction * model_bits_ / 8 + kDeltaOverheadBytes;
  };
  bool keyframe = v == 0;
  if (v > 0) {
    const Manifest& prev = manifests_[v - 1];
    const double p = model.DensityAt(v);
    const double bytes = delta_bytes(p);
    m.delta_base = v - 1;
    m.delta = BlobRef{BlobHash(NewBlob()), static_cast<uint64_t>(std::round(bytes))};
    published += bytes;
    // Skip deltas: at v divisible by 2^j, one from v - 2^j (the squash of the span: the elements
    // any of its steps changed).
    for (uint32_t j = 1; j <= model.max_skip_level; ++j) {
      const uint64_t span = uint64_t{1} << j;
      if (span > v || v % span != 0) break;
      const double changed = 1 - std::pow(1 - p, static_cast<double>(span));
      const double skip = delta_bytes(changed);
      m.skips.push_back(
          {v - span, BlobRef{BlobHash(NewBlob()), static_cast<uint64_t>(std::round(skip))}});
      published += skip;
    }
    keyframe =
        v - prev.last_keyframe >= model.keyframe_interval ||
        static_cast<double>(prev.delta_bytes_since_keyframe) > model.delta_budget * keyframe_bytes_;
    m.last_keyframe = keyframe ? v : prev.last_keyframe;
    m.delta_bytes_since_keyframe = keyframe ? 0 : prev.delta_bytes_since_keyframe + m.delta->bytes;
  }
  if (keyframe) {
    m.keyframe = {BlobRef{BlobHash(NewBlob()), static_cast<uint64_t>(std::round(keyframe_bytes_))}};
    m.last_keyframe = v;
    published += keyframe_bytes_;
    ++keyframes_published_;
  }
  bytes_published_ += published;
  manifests_.push_back(std::move(m));
}

const Plan& Simulation::PlanFor(std::optional<uint64_t> have, uint64_t target) {
  const std::pair<int64_t, uint64_t> key{have ? static_cast<int64_t>(*have) : -1, target};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  const Manifest& goal = manifests_[target];
  const uint64_t low = policy_store::PlanLow(goal, have, true);
  std::span<const Manifest> between(manifests_.data() + low + 1, target - low);
  Result<policy_store::PullPlan> plan = policy_store::PlanFromManifests(
      goal, have, &manifests_[goal.last_keyframe], between, std::nullopt);
  Plan out;
  if (!plan.ok()) {
    Fail("planner", plan.status().message());
    return plans_[key] = out;
  }
  out.from_keyframe = plan->from_keyframe;
  if (plan->from_keyframe) {
    for (const BlobRef& part : plan->keyframe.keyframe)
      out.blobs.emplace_back(BlobId(part.sha256), part.bytes);
  }
  for (const auto& step : plan->steps)
    out.blobs.emplace_back(BlobId(step.blob.sha256), step.blob.bytes);
  out.deltas = plan->steps.size();
  out.manifests = target - low + (plan->from_keyframe ? 1 : 0);
  return plans_[key] = std::move(out);
}

}  // namespace weft::sim::internal
