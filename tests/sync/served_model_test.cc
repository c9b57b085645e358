#include "sync/served_model.h"

#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>

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
      bytes.push_back(t.bytes.ToVector());
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

// BF16 bit patterns of `values` (round to nearest even), and those patterns widened back to FP32.
std::vector<uint16_t> ToBf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  ConvertBf16Ref(values, bits);
  return bits;
}
std::vector<float> Widen(const std::vector<uint16_t>& bits) {
  std::vector<float> wide(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) wide[i] = Bf16ToFloat(bits[i]);
  return wide;
}

TEST_CASE("served model: BF16 masters serve exactly as their FP32 values, read in place") {
  Masters masters(3);
  // Special values among the weights: NaN with a payload, infinities, signed zero, a subnormal.
  masters.values[0][0] = std::numeric_limits<float>::infinity();
  masters.values[0][1] = -0.0f;
  masters.values[0][2] = 1e-40f;
  for (ServingPlan plan : {ServingPlan{DType::kBF16, 0, Saturation::kSaturateFinite},
                           ServingPlan{DType::kF16, 0, Saturation::kSaturateFinite},
                           ServingPlan{DType::kF8E4M3, 16, Saturation::kSaturateFinite},
                           ServingPlan{DType::kF8E5M2, 0, Saturation::kSaturateFinite}}) {
    CAPTURE(static_cast<int>(plan.dtype));
    std::vector<std::vector<uint16_t>> bf16 = {ToBf16(masters.values[0]),
                                               ToBf16(masters.values[1])};
    bf16[1][5] = 0x7F81;  // a signalling NaN's payload: BF16 served from BF16 keeps it
    auto view_bf16 = [&] {
      return std::vector<MasterTensor>{{"w", masters.shapes[0], MasterValues::Bf16(bf16[0])},
                                       {"b", masters.shapes[1], MasterValues::Bf16(bf16[1])}};
    };
    std::vector<std::vector<float>> wide = {Widen(bf16[0]), Widen(bf16[1])};
    auto view_wide = [&] {
      return std::vector<MasterTensor>{{"w", masters.shapes[0], wide[0]},
                                       {"b", masters.shapes[1], wide[1]}};
    };
    Result<ServedModel> from_bf16 = ServedModel::FromMaster(view_bf16(), plan, 2);
    Result<ServedModel> from_wide = ServedModel::FromMaster(view_wide(), plan, 2);
    REQUIRE(from_bf16.ok());
    REQUIRE(from_wide.ok());
    auto same = [&] {
      REQUIRE(from_bf16->tensors().size() == from_wide->tensors().size());
      for (size_t t = 0; t < from_wide->tensors().size(); ++t) {
        const ServedModel::Tensor& a = from_bf16->tensors()[t];
        const ServedModel::Tensor& b = from_wide->tensors()[t];
        CHECK(a.spec.name == b.spec.name);
        if (plan.dtype == DType::kBF16 && a.spec.name == "b") {
          // Identical except the NaN, which keeps its payload from a BF16 master.
          std::vector<uint8_t> expected = b.bytes.ToVector();
          std::memcpy(expected.data() + 10, &bf16[1][5], 2);
          CHECK(a.bytes == expected);
        } else {
          CHECK(a.bytes == b.bytes);
        }
      }
    };
    same();
    if (plan.dtype == DType::kBF16) {
      CHECK(std::memcmp(from_bf16->Find("w")->bytes.data(), bf16[0].data(), bf16[0].size() * 2) ==
            0);
    }
    for (int step = 0; step < 2; ++step) {
      masters.Step(3e-4f, 40 + step);
      bf16[0] = ToBf16(masters.values[0]);
      wide[0] = Widen(bf16[0]);
      const std::vector<uint8_t> before = from_wide->Find("w")->bytes.ToVector();
      uint64_t changed_bf16 = 0, changed_wide = 0;
      REQUIRE(from_bf16->Update(view_bf16(), CodecOptions{10, 2}, &changed_bf16).ok());
      REQUIRE(from_wide->Update(view_wide(), CodecOptions{10, 2}, &changed_wide).ok());
      same();
      CHECK(changed_bf16 == changed_wide);
      // The count is the elements whose served bytes changed (and scales, for FP8).
      const TensorStorage& after = from_wide->Find("w")->bytes;
      const size_t width = Info(plan.dtype).size;
      uint64_t differ = 0;
      for (size_t k = 0; k < after.size(); k += width)
        differ += std::memcmp(after.data() + k, before.data() + k, width) != 0;
      CHECK(differ > 0);
      if (width == 2) CHECK(changed_wide == differ);
      if (width == 1) CHECK(changed_wide >= differ);
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

TEST_CASE("tensor storage: a view is read and written in place; a copy of it has its own bytes") {
  auto memory = std::make_shared<std::vector<uint8_t>>(64, 7);
  TensorStorage view = TensorStorage::View(std::span<uint8_t>(*memory).subspan(8, 16), memory);
  CHECK(view.is_view());
  CHECK(view.size() == 16);
  CHECK(view.data() == memory->data() + 8);
  view[0] = 1;
  CHECK((*memory)[8] == 1);
  TensorStorage copy = view;
  CHECK(!copy.is_view());
  CHECK(copy.data() != view.data());
  CHECK(copy == view);
  copy[1] = 9;
  CHECK((*memory)[9] == 7);
  CHECK(copy != view);
  CHECK(copy == copy.ToVector());
  const uint8_t* at = view.data();
  TensorStorage moved = std::move(view);
  CHECK(moved.data() == at);
  CHECK(moved.is_view());
  CHECK(view.empty());  // NOLINT(bugprone-use-after-move)
  std::vector<uint8_t> vector(10, 3);
  const uint8_t* buffer = vector.data();
  TensorStorage owned = std::move(vector);
  TensorStorage owned_again = std::move(owned);
  CHECK(owned_again.data() == buffer);
  CHECK(!owned_again.is_view());
  // Resizing a view gives it storage of its own.
  moved.resize(4);
  CHECK(!moved.is_view());
  CHECK(moved.size() == 4);
  CHECK(moved[0] == 1);
  CHECK(memory.use_count() == 1);
}

TEST_CASE("served model: over memory it does not own, deltas and chains are applied there") {
  Masters masters(5);
  ServedModel publisher =
      std::move(ServedModel::FromMaster(masters.View(), ServingPlan{}, 1)).value();
  // The replica's bytes live in one buffer (as a mapped file's would), one tensor after another.
  auto file = std::make_shared<std::vector<uint8_t>>(publisher.byte_count() + 8);
  std::vector<TensorSpec> specs;
  std::vector<TensorStorage> storage;
  std::vector<Digest> digests;
  size_t offset = 8;
  for (const auto& t : publisher.tensors()) {
    std::memcpy(file->data() + offset, t.bytes.data(), t.bytes.size());
    specs.push_back(t.spec);
    storage.push_back(
        TensorStorage::View(std::span<uint8_t>(*file).subspan(offset, t.bytes.size()), file));
    digests.push_back(t.digest);
    offset += t.bytes.size();
  }
  ServedModel replica = ServedModel::FromStorage(specs, std::move(storage), digests);
  const uint8_t* w_at = replica.Find("w")->bytes.data();
  masters.Step(1e-3f, 11);
  ModelDelta one = std::move(publisher.Update(masters.View(), CodecOptions{10, 1})).value();
  REQUIRE(replica.Apply(one, 2).ok());
  masters.Step(1e-3f, 12);
  ModelDelta two = std::move(publisher.Update(masters.View(), CodecOptions{10, 1})).value();
  masters.Step(1e-3f, 13);
  ModelDelta three = std::move(publisher.Update(masters.View(), CodecOptions{10, 1})).value();
  const ModelDelta* chain[] = {&two, &three};
  REQUIRE(replica.ApplyChain(chain, 2).ok());
  // Still in the buffer, which holds the publisher's bytes; the digests moved with them.
  CHECK(replica.Find("w")->bytes.data() == w_at);
  CHECK(replica.Find("w")->bytes.is_view());
  offset = 8;
  for (const auto& t : publisher.tensors()) {
    CAPTURE(t.spec.name);
    CHECK(std::memcmp(file->data() + offset, t.bytes.data(), t.bytes.size()) == 0);
    CHECK(replica.Find(t.spec.name)->digest == t.digest);
    CHECK(TensorDigest(t.spec.dtype, replica.Find(t.spec.name)->bytes) == t.digest);
    offset += t.bytes.size();
  }
  // A copy of the model is a model of its own: changing it leaves the buffer alone.
  ServedModel copy = replica;
  CHECK(!copy.Find("w")->bytes.is_view());
  masters.Step(1e-3f, 14);
  ModelDelta four = std::move(publisher.Update(masters.View(), CodecOptions{10, 1})).value();
  REQUIRE(copy.Apply(four, 1).ok());
  CHECK(copy.Find("w")->bytes != replica.Find("w")->bytes);
  CHECK(TensorDigest(DType::kBF16, replica.Find("w")->bytes) == replica.Find("w")->digest);
}

}  // namespace
}  // namespace weft::sync
