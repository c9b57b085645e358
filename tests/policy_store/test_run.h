// A run of versions for the policy store's tests, published the way a trainer's publisher does
// (sync::ServedModel::Update for the delta, then PublishVersion with a RecentDeltas), from FP32
// master weights that take small random steps, as Adam's do: most served BF16 elements stay, a
// few move by one unit in the last place. `published[v]` is the served model of version v.
#pragma once

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "policy_store/publish.h"
#include "sync/served_model.h"

namespace weft::policy_store::testing {

struct TensorShape {
  std::string name;
  std::vector<uint64_t> shape;
};

class TestRun {
 public:
  TestRun(ObjectStore& store, std::string run, uint64_t keyframe_interval,
          std::vector<TensorShape> shapes = {{"q", {64, 300}}, {"norm", {300}}}, uint64_t seed = 5)
      : store_(store), run_(std::move(run)), rng_(seed) {
    policy.interval = keyframe_interval;
    policy.delta_budget = 100.0;  // keyframes by interval only, for predictable tests
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (TensorShape& t : shapes) {
      uint64_t count = 1;
      for (uint64_t d : t.shape) count *= d;
      std::vector<float> values(count);
      for (float& v : values) v = normal(rng_);
      names_.push_back(std::move(t.name));
      shapes_.push_back(std::move(t.shape));
      weights_.push_back(std::move(values));
    }
  }

  // The masters as ServedModel takes them.
  std::vector<sync::MasterTensor> Master() const {
    std::vector<sync::MasterTensor> master;
    for (size_t i = 0; i < names_.size(); ++i)
      master.push_back({names_[i], shapes_[i], weights_[i]});
    return master;
  }

  // One optimiser step: every weight moves by `step` up or down.
  void Step(float step = 5e-6f) {
    std::bernoulli_distribution up(0.5);
    for (std::vector<float>& values : weights_) {
      for (float& v : values) v += up(rng_) ? step : -step;
    }
  }

  // Version 0 from the current masters.
  Manifest Start() {
    served = std::move(sync::ServedModel::FromMaster(Master(), sync::ServingPlan{}, 1)).value();
    Result<Manifest> manifest =
        PublishVersion(store_, run_, nullptr, served, nullptr, policy, 1, &recent);
    REQUIRE_MESSAGE(manifest.ok(), manifest.status().ToString());
    last = *manifest;
    published = {served};
    return last;
  }

  // Steps the masters and publishes the next version.
  Manifest Next() {
    Step();
    Result<sync::ModelDelta> delta = served.Update(Master(), codec);
    REQUIRE(delta.ok());
    Result<Manifest> manifest =
        PublishVersion(store_, run_, &last, served, &*delta, policy, 1, &recent);
    REQUIRE_MESSAGE(manifest.ok(), manifest.status().ToString());
    last = *manifest;
    published.push_back(served);
    return last;
  }

  KeyframePolicy policy;
  sync::CodecOptions codec{10, 1};
  RecentDeltas recent;
  sync::ServedModel served;
  Manifest last;
  std::vector<sync::ServedModel> published;

 private:
  ObjectStore& store_;
  std::string run_;
  std::mt19937 rng_;
  std::vector<std::string> names_;
  std::vector<std::vector<uint64_t>> shapes_;
  std::vector<std::vector<float>> weights_;
};

// Whether two served models hold the same tensors, bytes and digests.
inline bool SameBytes(const sync::ServedModel& a, const sync::ServedModel& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (const auto& t : a.tensors()) {
    const auto* other = b.Find(t.spec.name);
    if (other == nullptr || other->bytes != t.bytes || other->digest != t.digest) return false;
  }
  return true;
}

}  // namespace weft::policy_store::testing
