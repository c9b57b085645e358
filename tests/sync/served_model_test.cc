#include "sync/served_model.h"

#include <doctest/doctest.h>

#include <random>

namespace weft::sync {
namespace {

struct Masters {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<uint64_t>> shapes = {{48, 64}, {64}};
  explicit Masters(uint64_t seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (const auto& shape : shapes) {
      uint64_t count = 1;
      for (uint64_t d : shape) count *= d;
      values.emplace_back(count);
      for (float& v : values.back()) v = normal(rng);
    }
  }
  void Step(float step, uint64_t seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (auto& tensor : values) {
      for (float& v : tensor) v += (rng() & 1) ? step : -step;
    }
  }
  std::vector<MasterTensor> View() const {
    return {{"w", shapes[0], values[0]}, {"b", shapes[1], values[1]}};
  }
};

TEST_CASE("served model: the publisher's updates make a replica serve the same bytes") {
  for (ServingPlan plan : {ServingPlan{DType::kBF16, 0, Saturation::kSaturateFinite},
                           ServingPlan{DType::kF8E4M3, 16, Saturation::kSaturateFinite}}) {
    CAPTURE(static_cast<int>(plan.dtype));
    Masters masters(1);
    Result<ServedModel> publisher = ServedModel::FromMaster(masters.View(), plan, 2);
    REQUIRE(publisher.ok());
    const bool fp8 = plan.dtype == DType::kF8E4M3;
    // FP8 tensors come with their scale tensors, each before its tensor.
    REQUIRE(publisher->tensors().size() == (fp8 ? 4u : 2u));
    if (fp8) {
      CHECK(publisher->tensors()[0].spec.name == "w_scale_inv");
      CHECK(publisher->tensors()[0].spec.shape == std::vector<uint64_t>{3, 4});
      CHECK(publisher->Find("b_scale_inv") != nullptr);
    }
    CHECK(publisher->byte_count() ==
          48 * 64 * Info(plan.dtype).size + 64 * Info(plan.dtype).size + (fp8 ? (12 + 4) * 4 : 0));
    // A replica from the publisher's tensors, as a keyframe would carry them.
    std::vector<TensorSpec> specs;
    std::vector<std::vector<uint8_t>> bytes;
    for (const auto& t : publisher->tensors()) {
      specs.push_back(t.spec);
      bytes.push_back(t.bytes);
    }
    ServedModel replica = ServedModel::FromTensors(specs, bytes, 1);
    for (int step = 0; step < 3; ++step) {
      masters.Step(1e-4f, step);
      Result<ModelDelta> delta = publisher->Update(masters.View(), CodecOptions{10, 2});
      REQUIRE(delta.ok());
      REQUIRE(replica.Apply(*delta, 2).ok());
      for (const auto& t : publisher->tensors()) {
        const ServedModel::Tensor* other = replica.Find(t.spec.name);
        REQUIRE(other != nullptr);
        CHECK(other->bytes == t.bytes);
        CHECK(other->digest == t.digest);
        CHECK(t.digest == TensorDigest(t.spec.dtype, t.bytes));
      }
      // The views the writers and the encoder take are the model's own bytes.
      CHECK(publisher->AsTensorBytes().size() == publisher->tensors().size());
      CHECK(publisher->AsTensorsToWrite()[0].data.data() == publisher->tensors()[0].bytes.data());
    }
  }
}

TEST_CASE("served model: bad masters and deltas are refused and change nothing") {
  Masters masters(2);
  CHECK(ServedModel::FromMaster(masters.View(), {DType::kF32, 0, Saturation::kSaturateFinite}, 1)
            .status()
            .code() == StatusCode::kInvalidArgument);
  std::vector<MasterTensor> wrong = masters.View();
  wrong[1].shape = {65};
  CHECK(ServedModel::FromMaster(wrong, ServingPlan{}, 1).status().message() ==
        "master tensor 'b' does not match its shape");
  ServedModel model = std::move(ServedModel::FromMaster(masters.View(), ServingPlan{}, 1)).value();
  const ServedModel before = model;
  std::vector<MasterTensor> unknown = masters.View();
  unknown[0].name = "x";
  CHECK(model.Update(unknown, CodecOptions{10, 1}).status().code() == StatusCode::kInvalidArgument);
  // A delta made for another state: refused before any tensor is written.
  ServedModel other = model;
  masters.Step(1e-3f, 9);
  ModelDelta delta = std::move(other.Update(masters.View(), CodecOptions{10, 1})).value();
  REQUIRE(other.Apply(delta, 1).code() == StatusCode::kConflict);  // already applied
  ModelDelta renamed = delta.Copy();
  renamed.tensors[1].spec.name = "nope";
  CHECK(model.Apply(renamed, 1).message() == "delta changes unknown tensor 'nope'");
  for (size_t t = 0; t < model.tensors().size(); ++t) {
    CHECK(model.tensors()[t].bytes == before.tensors()[t].bytes);
  }
  REQUIRE(model.Apply(delta, 1).ok());
  CHECK(model.Find("w")->bytes == other.Find("w")->bytes);
}

}  // namespace
}  // namespace weft::sync
