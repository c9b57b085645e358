#include "sync/delta_codec.h"

#include <doctest/doctest.h>
#include <sys/mman.h>

#include <random>

#include "tests/sync/round_trip.h"
#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

TensorSpec Spec(DType dtype, std::vector<uint64_t> shape, std::string name = "w") {
  return TensorSpec{std::move(name), dtype, std::move(shape)};
}

TEST_CASE("lossless round trip for every dtype, density, chunk size and thread count") {
  std::mt19937_64 rng(11);
  for (DType dtype : testing::kAllDTypes) {
    for (double density : {0.0, 0.001, 0.02, 0.3, 1.0}) {
      for (int threads : {1, 2}) {
        CAPTURE(Info(dtype).safetensors_name);
        CAPTURE(density);
        TensorSpec spec = Spec(dtype, {3, 1000 + static_cast<uint64_t>(rng() % 500)});
        std::vector<uint8_t> old_bytes = testing::RandomTensor(dtype, spec.element_count(), rng);
        std::vector<uint8_t> new_bytes = testing::Perturb(old_bytes, dtype, density, rng);
        testing::CheckRoundTrip(spec, old_bytes, new_bytes, CodecOptions{10, threads});
      }
    }
  }
}

TEST_CASE("empty and scalar tensors") {
  std::mt19937_64 rng(12);
  testing::CheckRoundTrip(Spec(DType::kBF16, {0, 7}), {}, {}, CodecOptions{});
  std::vector<uint8_t> a = {0x80, 0x3F}, b = {0x81, 0x3F};
  testing::CheckRoundTrip(Spec(DType::kBF16, {}), a, b, CodecOptions{});
}

TEST_CASE("chunks are chosen adaptively: unchanged, sparse, raw") {
  std::mt19937_64 rng(13);
  TensorSpec spec = Spec(DType::kBF16, {3 << 10});
  std::vector<uint8_t> old_bytes = testing::RandomTensor(spec.dtype, spec.element_count(), rng);
  std::vector<uint8_t> new_bytes = old_bytes;
  // Chunk 0 unchanged, chunk 1 a few +1 ulp moves, chunk 2 entirely new.
  for (int i = 1024; i < 2048; i += 97) new_bytes[2 * i] += 1;
  for (int i = 2048; i < 3072; ++i) new_bytes[2 * i + 1] ^= 0x55;
  Result<TensorDelta> delta = EncodeTensorDelta(spec, old_bytes, new_bytes, CodecOptions{10, 1});
  REQUIRE(delta.ok());
  REQUIRE(delta->chunks.size() == 3);
  CHECK(delta->chunks[0].mode == ChunkMode::kUnchanged);
  CHECK(delta->chunks[1].mode == ChunkMode::kSparse);
  CHECK(delta->chunks[2].mode == ChunkMode::kRaw);
  CHECK(delta->chunks[2].payload.size() == 2048);  // never larger than the raw bytes
}

TEST_CASE("fused cast + diff + encode equals cast, then diff, then encode") {
  std::mt19937_64 rng(14);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const uint64_t rows = 300, cols = 260;
  std::vector<float> master(rows * cols);
  for (float& w : master) w = normal(rng);
  master[5] = NAN;
  master[6] = -INFINITY;
  master[7] = -0.0f;
  master[8] = 1e-41f;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    for (uint32_t block : {0u, 128u}) {
      if (block != 0 && Info(dtype).size != 1) continue;
      CAPTURE(Info(dtype).safetensors_name);
      CAPTURE(block);
      TensorSpec spec = Spec(dtype, {rows, cols});
      const Fp8Format fp8 = dtype == DType::kF8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
      BlockScaling scaling = ScalingForShape(spec.shape, block);
      auto serve = [&](const std::vector<float>& weights, std::vector<float>* scales) {
        std::vector<uint8_t> out(spec.byte_count());
        if (dtype == DType::kBF16)
          ConvertBf16Ref(weights, {reinterpret_cast<uint16_t*>(out.data()), weights.size()});
        if (dtype == DType::kF16)
          ConvertF16Ref(weights, {reinterpret_cast<uint16_t*>(out.data()), weights.size()});
        if (Info(dtype).size == 1) {
          *scales = ComputeScales(weights, scaling, fp8);
          for (size_t i = 0; i < weights.size(); ++i) {
            const float scale = (*scales)[scaling.ScaleIndex(i / scaling.cols, i % scaling.cols)];
            out[i] = FloatToFp8Ref(weights[i] / scale, fp8, Saturation::kSaturateFinite);
          }
        }
        return out;
      };
      std::vector<float> old_scales, new_scales;
      std::vector<uint8_t> served = serve(master, &old_scales);
      std::vector<float> next = master;
      for (float& w : next) w += 1e-4f * normal(rng);
      std::vector<uint8_t> expected = serve(next, &new_scales);
      std::vector<uint8_t> old_served = served;
      Digest digest = TensorDigest(dtype, served);
      ServeFormat format{dtype, Saturation::kSaturateFinite, nullptr, {}};
      if (Info(dtype).size == 1) {
        format.scaling = &scaling;
        format.scales = new_scales;
      }
      for (int threads : {1, 2}) {
        std::vector<uint8_t> work = old_served;
        Digest work_digest = digest;
        Result<TensorDelta> delta =
            EncodeFromMaster(spec, next, format, work, &work_digest, CodecOptions{12, threads});
        REQUIRE(delta.ok());
        CHECK(work == expected);
        CHECK(work_digest == TensorDigest(dtype, expected));
        CHECK(delta->result_digest == work_digest);
        std::vector<uint8_t> replica = old_served;
        REQUIRE(ApplyTensorDelta(*delta, replica, digest, threads).ok());
        CHECK(replica == expected);
      }
    }
  }
}

TEST_CASE("squash: A->B then B->C equals A->C, without the weights") {
  std::mt19937_64 rng(15);
  for (DType dtype :
       {DType::kBF16, DType::kF32, DType::kF8E4M3, DType::kU8, DType::kI16, DType::kF64}) {
    for (double density : {0.01, 0.5}) {
      CAPTURE(Info(dtype).safetensors_name);
      TensorSpec spec = Spec(dtype, {5000});
      auto a = testing::RandomTensor(dtype, spec.element_count(), rng);
      auto b = testing::Perturb(a, dtype, density, rng);
      auto c = testing::Perturb(b, dtype, density, rng);
      // Some elements return to their value in A: their changes cancel.
      for (size_t i = 0; i < c.size(); i += 37) c[i] = a[i];
      CodecOptions options{10, 2};
      Result<TensorDelta> ab = EncodeTensorDelta(spec, a, b, options);
      Result<TensorDelta> bc = EncodeTensorDelta(spec, b, c, options);
      REQUIRE(ab.ok());
      REQUIRE(bc.ok());
      Result<TensorDelta> ac = SquashTensorDeltas(*ab, *bc, 2);
      REQUIRE(ac.ok());
      std::vector<uint8_t> served = a;
      REQUIRE(ApplyTensorDelta(*ac, served, std::nullopt, 1).ok());
      CHECK(served == c);
      // In the wrong order the digests do not chain.
      CHECK(SquashTensorDeltas(*bc, *ab, 1).status().code() == StatusCode::kConflict);
    }
  }
}

TEST_CASE("squash a chain: A->B->C->D as one A->D; the link that breaks is named") {
  using Links = std::vector<const ModelDelta*>;
  std::mt19937_64 rng(17);
  const TensorSpec spec = Spec(DType::kBF16, {3000});
  std::vector<std::vector<uint8_t>> states = {testing::RandomTensor(spec.dtype, 3000, rng)};
  for (int i = 0; i < 3; ++i)
    states.push_back(testing::Perturb(states.back(), spec.dtype, 0.05, rng));
  std::vector<ModelDelta> deltas(3);
  for (int i = 0; i < 3; ++i) {
    deltas[i].tensors.push_back(
        std::move(EncodeTensorDelta(spec, states[i], states[i + 1], CodecOptions{10, 1})).value());
  }
  Result<ModelDelta> all = SquashChain(Links{&deltas[0], &deltas[1], &deltas[2]}, 2);
  REQUIRE(all.ok());
  std::vector<uint8_t> served = states[0];
  REQUIRE(ApplyTensorDelta(all->tensors[0], served, std::nullopt, 1).ok());
  CHECK(served == states[3]);
  Result<ModelDelta> one = SquashChain(Links{&deltas[1]}, 1);
  REQUIRE(one.ok());
  CHECK(SerializeModelDelta(*one) == SerializeModelDelta(deltas[1]));
  size_t failed = 0;
  CHECK(SquashChain(Links{&deltas[0], &deltas[2]}, 1, &failed).status().code() ==
        StatusCode::kConflict);
  CHECK(failed == 1);
  CHECK(SquashChain(Links{}, 1).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a delta for another base is refused and changes nothing") {
  std::mt19937_64 rng(16);
  TensorSpec spec = Spec(DType::kBF16, {2048});
  auto a = testing::RandomTensor(spec.dtype, 2048, rng);
  auto b = testing::Perturb(a, spec.dtype, 0.05, rng);
  auto other = testing::Perturb(a, spec.dtype, 0.01, rng);
  Result<TensorDelta> delta = EncodeTensorDelta(spec, a, b, CodecOptions{10, 1});
  REQUIRE(delta.ok());
  std::vector<uint8_t> served = other;
  Status status = ApplyTensorDelta(*delta, served, std::nullopt, 1);
  CHECK(status.code() == StatusCode::kConflict);
  CHECK(status.message().find("digest") != std::string::npos);
  CHECK(served == other);
}

TEST_CASE("hostile deltas: every truncation and single-byte corruption is rejected or harmless") {
  std::mt19937_64 rng(17);
  TensorSpec spec = Spec(DType::kBF16, {3000});
  auto a = testing::RandomTensor(spec.dtype, 3000, rng);
  auto b = testing::Perturb(a, spec.dtype, 0.03, rng);
  for (size_t i = 4000; i < 6000; ++i) b[i] ^= 0x5A;  // a raw chunk too
  ModelDelta model;
  Result<TensorDelta> delta = EncodeTensorDelta(spec, a, b, CodecOptions{10, 1});
  REQUIRE(delta.ok());
  model.tensors.push_back(std::move(delta).value());
  const std::vector<uint8_t> bytes = SerializeModelDelta(model);

  auto outcome = [&](const std::vector<uint8_t>& candidate) {
    Result<ModelDelta> parsed = ParseModelDelta(candidate);
    if (!parsed.ok()) return 0;
    if (parsed->tensors.size() != 1) return 0;
    std::vector<uint8_t> served = a;
    Status status = ApplyTensorDelta(parsed->tensors[0], served, std::nullopt, 1);
    if (!status.ok()) {
      REQUIRE(served == a);  // nothing half-applied
      return 0;
    }
    REQUIRE(served == b);  // an accepted delta is the true one
    return 1;
  };
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    REQUIRE(outcome(std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut)) == 0);
  }
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::vector<uint8_t> bad = bytes;
    bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    outcome(bad);
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  CHECK(outcome(longer) == 0);
}

TEST_CASE("parse errors say what is wrong") {
  CHECK(
      ParseModelDelta(std::vector<uint8_t>{'n', 'o', 'p', 'e'}).status().message().find("magic") !=
      std::string::npos);
  ModelDelta empty;
  std::vector<uint8_t> bytes = SerializeModelDelta(empty);
  bytes[8] = 9;  // format version
  CHECK(ParseModelDelta(bytes).status().message().find("version 9") != std::string::npos);
}

TEST_CASE("tensors over 2^32 elements: indices, digests and chunks are 64-bit") {
  // Two 4 GiB + 1 MiB byte tensors of zero pages that are never written except where changed.
  const uint64_t count = (uint64_t{1} << 32) + (1 << 20);
  auto map = [&] {
    void* p = mmap(nullptr, count, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(p != MAP_FAILED);
    return static_cast<uint8_t*>(p);
  };
  uint8_t* old_bytes = map();
  uint8_t* new_bytes = map();
  uint8_t* served = map();
  const uint64_t changed[] = {5, (uint64_t{1} << 32) - 1, uint64_t{1} << 32, count - 1};
  Digest expected_change;
  for (uint64_t i : changed) {
    new_bytes[i] = static_cast<uint8_t>(i % 251 + 1);
    expected_change += ElementChange(i, 0, new_bytes[i]);
  }
  TensorSpec spec = Spec(DType::kI8, {count});
  const Digest base{42, 43};  // a full digest of 4 GiB takes too long for a unit test
  Result<TensorDelta> delta = EncodeTensorDelta(spec, {old_bytes, count}, {new_bytes, count},
                                                CodecOptions{kMaxChunkLog2, 2}, base);
  REQUIRE(delta.ok());
  CHECK(delta->chunks.size() == 65);
  CHECK(delta->result_digest == base + expected_change);
  REQUIRE(ApplyTensorDelta(*delta, {served, count}, base, 2).ok());
  for (uint64_t i : changed) CHECK(served[i] == new_bytes[i]);
  CHECK(served[(uint64_t{1} << 32) + 1] == 0);
  munmap(old_bytes, count);
  munmap(new_bytes, count);
  munmap(served, count);
}

TEST_CASE("a model delta: tensors matched by name in any order; a copy owns its payloads") {
  std::mt19937_64 rng(21);
  const TensorSpec a = Spec(DType::kBF16, {100, 30}, "a"), b = Spec(DType::kF32, {77}, "b");
  const std::vector<uint8_t> a0 = testing::RandomTensor(a.dtype, a.element_count(), rng);
  const std::vector<uint8_t> b0 = testing::RandomTensor(b.dtype, b.element_count(), rng);
  const std::vector<uint8_t> a1 = testing::Perturb(a0, a.dtype, 0.05, rng);
  const std::vector<uint8_t> b1 = testing::Perturb(b0, b.dtype, 0.05, rng);
  const CodecOptions options{10, 2};
  Result<ModelDelta> delta = EncodeModelDelta({{a, a0, {}}, {b, b0, TensorDigest(b.dtype, b0)}},
                                              {{b, b1, {}}, {a, a1, {}}}, options);
  REQUIRE(delta.ok());
  REQUIRE(delta->tensors.size() == 2);
  CHECK(delta->tensors[0].spec.name == "a");  // the old model's order
  CHECK(delta->tensors[1].result_digest == TensorDigest(b.dtype, b1));
  // A copy of a parsed delta outlives the bytes it was parsed from.
  std::vector<uint8_t> bytes = SerializeModelDelta(*delta);
  ModelDelta copy = std::move(ParseModelDelta(bytes)).value().Copy();
  std::fill(bytes.begin(), bytes.end(), 0);
  CHECK(SerializeModelDelta(copy) == SerializeModelDelta(*delta));
  std::vector<uint8_t> served = a0;
  REQUIRE(ApplyTensorDelta(copy.tensors[0], served, std::nullopt, 1).ok());
  CHECK(served == a1);
  // Models that do not hold the same tensors are refused, naming the first difference.
  CHECK(EncodeModelDelta({{a, a0, {}}}, {{a, a1, {}}, {b, b1, {}}}, options).status().message() ==
        "the old model has 1 tensors, the new one 2");
  CHECK(EncodeModelDelta({{a, a0, {}}, {b, b0, {}}},
                         {{a, a1, {}}, {Spec(b.dtype, {77}, "c"), b1, {}}}, options)
            .status()
            .message() == "tensor 'b' is not in the new model");
  CHECK(EncodeModelDelta({{b, b0, {}}}, {{Spec(DType::kF32, {7, 11}, "b"), b1, {}}}, options)
            .status()
            .message() == "tensor 'b' has a different dtype or shape in the new model");
}

}  // namespace
}  // namespace weft::sync
