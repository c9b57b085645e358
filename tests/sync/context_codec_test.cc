// Context chunks (chunk mode 3): lossless round trips for every dtype that has them, through the
// file format, from master weights, recoded between modes and squashed on a base; smaller than
// sparse chunks when changes follow the exponent; rejected cleanly when damaged.
#include "sync/context_codec.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "sync/delta_codec.h"
#include "sync/served_model.h"
#include "tests/sync/round_trip.h"
#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

using testing::CheckRoundTrip;
using testing::Perturb;
using testing::RandomTensor;

const DType kContextTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                               DType::kF8E5M2};

CodecOptions ContextOptions(int chunk_log2 = 14, int threads = 2) {
  return CodecOptions{chunk_log2, threads, DeltaMode::kContext};
}

uint64_t CountChunks(const ModelDelta& delta, ChunkMode mode) {
  uint64_t n = 0;
  for (const TensorDelta& t : delta.tensors) {
    for (const DeltaChunk& c : t.chunks) n += c.mode == mode;
  }
  return n;
}

// Weights N(0, 0.02) served in BF16, stepped by about `step` each: the small weights change far
// more often than the large ones, as after an optimiser step.
struct Weights {
  std::mt19937 rng;
  std::vector<float> values;
  Weights(uint64_t count, uint32_t seed) : rng(seed), values(count) {
    std::normal_distribution<float> weight(0.0f, 0.02f);
    for (float& v : values) v = weight(rng);
  }
  void Step(float step) {
    std::normal_distribution<float> noise(0.0f, 1.0f);
    for (float& v : values) v += step * noise(rng);
  }
  std::vector<uint8_t> Bf16() const {
    std::vector<uint8_t> bytes(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint32_t a;
      std::memcpy(&a, &values[i], 4);
      const uint16_t x = static_cast<uint16_t>((a + 0x7FFF + ((a >> 16) & 1)) >> 16);
      std::memcpy(&bytes[i * 2], &x, 2);
    }
    return bytes;
  }
};

std::pair<std::vector<uint8_t>, std::vector<uint8_t>> Bf16Step(uint64_t count, float step,
                                                               uint32_t seed) {
  Weights w(count, seed);
  std::vector<uint8_t> before = w.Bf16();
  w.Step(step);
  return {before, w.Bf16()};
}

TEST_CASE("context chunks: every float dtype round-trips bit for bit, specials included") {
  std::mt19937_64 rng(7);
  for (DType dtype : kContextTypes) {
    CAPTURE(Info(dtype).safetensors_name);
    // A tail that is not a whole block of 64, and chunks of 1024 elements.
    for (uint64_t count : {uint64_t{1}, uint64_t{63}, uint64_t{1000}, uint64_t{5000}}) {
      for (double density : {0.001, 0.02, 0.3, 1.0}) {
        CAPTURE(count);
        CAPTURE(density);
        const TensorSpec spec{"t", dtype, {count}};
        const std::vector<uint8_t> before = RandomTensor(dtype, count, rng);
        const std::vector<uint8_t> after = Perturb(before, dtype, density, rng);
        CheckRoundTrip(spec, before, after, ContextOptions(10));
        // The chunk coder itself, whether or not a context chunk would be the smaller.
        ChangeList changes;
        ScanChanges(KeyKindFor(dtype), Info(dtype).size, before.data(), after.data(),
                    static_cast<uint32_t>(count), 0, 0, &changes, nullptr);
        if (changes.empty()) continue;
        for (bool from_result : {false, true}) {
          ContextHeader header;
          std::vector<uint8_t> payload;
          if (from_result) {
            EncodeContextChangesFromResult(changes, dtype, after.data(),
                                           static_cast<uint32_t>(count), &header, &payload);
          } else {
            EncodeContextChanges(changes, dtype, before.data(), static_cast<uint32_t>(count),
                                 &header, &payload);
          }
          CHECK(payload.size() == header.payload_bytes());
          ChangeList decoded;
          const Status status = DecodeContextChanges(header, payload, dtype, before.data(),
                                                     static_cast<uint32_t>(count), &decoded);
          REQUIRE_MESSAGE(status.ok(), status.ToString());
          CHECK(decoded.offsets == changes.offsets);
          CHECK(decoded.residuals == changes.residuals);
        }
      }
    }
  }
}

TEST_CASE("context chunks: smaller than sparse ones when changes follow the exponent") {
  const uint64_t count = 1 << 16;
  auto [before, after] = Bf16Step(count, 1e-6f, 3);
  const TensorSpec spec{"w", DType::kBF16, {count}};
  Result<TensorDelta> plain = EncodeTensorDelta(spec, before, after, CodecOptions{14, 1});
  Result<TensorDelta> context = EncodeTensorDelta(spec, before, after, ContextOptions(14, 1));
  REQUIRE(plain.ok());
  REQUIRE(context.ok());
  ModelDelta a, b;
  a.tensors.push_back(std::move(plain).value());
  b.tensors.push_back(std::move(context).value());
  const DeltaStats sa = ComputeStats(a), sb = ComputeStats(b);
  MESSAGE("density " << 100.0 * sa.changes / count << "%: " << sa.total_bytes << " bytes plain, "
                     << sb.total_bytes << " context");
  CHECK(sa.changes == sb.changes);
  CHECK(sb.context_chunks == 4);
  CHECK(sb.format_version == 2);
  CHECK(sa.format_version == 1);
  CHECK(sb.total_bytes < 0.9 * sa.total_bytes);
  CheckRoundTrip(spec, before, after, ContextOptions(14, 1));
}

TEST_CASE("context chunks: the fused path from master weights, BF16 and block-scaled FP8") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> weights(256 * 256);
  for (float& w : weights) w = normal(rng);
  for (ServingPlan plan : {ServingPlan{DType::kBF16, 0, Saturation::kSaturateFinite},
                           ServingPlan{DType::kF8E4M3, 32, Saturation::kSaturateFinite}}) {
    CAPTURE(static_cast<int>(plan.dtype));
    std::vector<float> master = weights;
    std::vector<MasterTensor> view = {{"w", {256, 256}, master}};
    Result<ServedModel> publisher = ServedModel::FromMaster(view, plan, 1);
    REQUIRE(publisher.ok());
    ServedModel replica = *publisher;
    uint64_t context_chunks = 0;
    for (int step = 0; step < 4; ++step) {
      // A few percent of the elements change per step (FP8's steps are coarser).
      const float size = plan.dtype == DType::kBF16 ? 1e-6f : 3e-5f;
      for (float& w : master) w += size * normal(rng) / 0.02f;
      Result<ModelDelta> delta = publisher->Update(view, ContextOptions(14, 2));
      REQUIRE(delta.ok());
      context_chunks += CountChunks(*delta, ChunkMode::kContext);
      const std::vector<uint8_t> bytes = SerializeModelDelta(*delta);
      Result<ModelDelta> parsed = ParseModelDelta(bytes);
      REQUIRE(parsed.ok());
      const Status applied = replica.Apply(*parsed, 2);
      REQUIRE_MESSAGE(applied.ok(), applied.ToString());
      for (const auto& t : publisher->tensors()) {
        CHECK(replica.Find(t.spec.name)->bytes == t.bytes);
        CHECK(replica.Find(t.spec.name)->digest == t.digest);
      }
    }
    CHECK(context_chunks > 0);
  }
}

TEST_CASE("context chunks: recoding between modes keeps the changes and the digests") {
  const uint64_t count = 40000;
  auto [before, after] = Bf16Step(count, 1e-6f, 5);
  const TensorSpec spec{"w", DType::kBF16, {count}};
  Result<TensorDelta> plain = EncodeTensorDelta(spec, before, after, CodecOptions{14, 1});
  REQUIRE(plain.ok());
  ModelDelta delta;
  delta.tensors.push_back(std::move(plain).value());
  const std::vector<TensorBytes> bases = {{spec, before, std::nullopt}};
  const std::vector<TensorBytes> results = {{spec, after, std::nullopt}};

  // From the result (what a publisher holds), and from the base: the same bytes.
  Result<ModelDelta> from_result = RecodeModelDelta(delta, DeltaMode::kContext, {}, results, 2);
  Result<ModelDelta> from_base = RecodeModelDelta(delta, DeltaMode::kContext, bases, {}, 2);
  REQUIRE(from_result.ok());
  REQUIRE(from_base.ok());
  CHECK(CountChunks(*from_result, ChunkMode::kContext) > 0);
  CHECK(SerializeModelDelta(*from_result) == SerializeModelDelta(*from_base));
  // Back to plain needs the base: the result alone cannot place a context chunk's changes.
  Result<ModelDelta> back = RecodeModelDelta(*from_result, DeltaMode::kPlain, bases, {}, 2);
  REQUIRE(back.ok());
  CHECK(SerializeModelDelta(*back) == SerializeModelDelta(delta));
  Result<ModelDelta> blind = RecodeModelDelta(*from_result, DeltaMode::kPlain, {}, results, 2);
  CHECK(blind.status().code() == StatusCode::kInvalidArgument);
  // The wrong base is refused by digest.
  Result<ModelDelta> wrong = RecodeModelDelta(delta, DeltaMode::kContext, results, {}, 2);
  CHECK(wrong.status().code() == StatusCode::kConflict);
}

TEST_CASE("context chunks: squashed only on their base, in either mode") {
  const uint64_t count = 40000;
  Weights weights(count, 9);
  std::vector<std::vector<uint8_t>> states = {weights.Bf16()};
  for (int k = 0; k < 4; ++k) {
    weights.Step(1e-6f);
    states.push_back(weights.Bf16());
  }
  const TensorSpec spec{"w", DType::kBF16, {count}};
  std::vector<ModelDelta> deltas(4);
  for (int k = 0; k < 4; ++k) {
    // Alternate modes: a chain may mix them.
    const CodecOptions options = k % 2 == 0 ? ContextOptions(14, 1) : CodecOptions{14, 1};
    Result<TensorDelta> d = EncodeTensorDelta(spec, states[k], states[k + 1], options);
    REQUIRE(d.ok());
    deltas[k].tensors.push_back(std::move(d).value());
  }
  std::vector<const ModelDelta*> chain = {&deltas[0], &deltas[1], &deltas[2], &deltas[3]};
  Result<ModelDelta> weightless = SquashChain(chain, 1);
  CHECK(weightless.status().code() == StatusCode::kInvalidArgument);
  CHECK(weightless.status().message().find("base weights") != std::string::npos);

  const std::vector<TensorBytes> base = {{spec, states[0], std::nullopt}};
  for (DeltaMode mode : {DeltaMode::kPlain, DeltaMode::kContext}) {
    Result<ModelDelta> squashed = SquashChainOnBase(chain, base, mode, 2);
    REQUIRE_MESSAGE(squashed.ok(), squashed.status().ToString());
    CHECK(HasContextChunks(*squashed) == (mode == DeltaMode::kContext));
    std::vector<uint8_t> served = states[0];
    REQUIRE(ApplyTensorDelta(squashed->tensors[0], served, std::nullopt, 1).ok());
    CHECK(served == states[4]);
  }
  // Another base is refused by digest, and a damaged link is named.
  const std::vector<TensorBytes> other = {{spec, states[1], std::nullopt}};
  CHECK(SquashChainOnBase(chain, other, DeltaMode::kPlain, 1).status().code() ==
        StatusCode::kConflict);
  ModelDelta damaged = deltas[2].Copy();
  for (DeltaChunk& chunk : damaged.tensors[0].chunks) {
    if (chunk.mode != ChunkMode::kContext) continue;
    std::vector<uint8_t> bytes(chunk.payload.begin(), chunk.payload.end());
    bytes[0] ^= 0x5A;
    chunk.Own(std::move(bytes));
    break;
  }
  chain[2] = &damaged;
  size_t failed = 99;
  Result<ModelDelta> bad = SquashChainOnBase(chain, base, DeltaMode::kPlain, 2, &failed);
  CHECK(!bad.ok());
  CHECK(failed == 2);
}

TEST_CASE("context chunks: damage is refused and the served tensor is unchanged") {
  const uint64_t count = 1 << 14;
  auto [before, after] = Bf16Step(count, 1e-6f, 13);
  const TensorSpec spec{"w", DType::kBF16, {count}};
  Result<TensorDelta> delta = EncodeTensorDelta(spec, before, after, ContextOptions(14, 1));
  REQUIRE(delta.ok());
  REQUIRE(delta->chunks[0].mode == ChunkMode::kContext);
  const DeltaChunk& chunk = delta->chunks[0];
  std::mt19937_64 rng(17);
  int refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    TensorDelta damaged;
    damaged.spec = delta->spec;
    damaged.chunk_log2 = delta->chunk_log2;
    damaged.base_digest = delta->base_digest;
    damaged.result_digest = delta->result_digest;
    DeltaChunk& c = damaged.chunks.emplace_back();
    c.mode = chunk.mode;
    c.context = chunk.context;
    std::vector<uint8_t> bytes(chunk.payload.begin(), chunk.payload.end());
    switch (trial % 4) {
      case 0:
        bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
        break;
      case 1:
        bytes.resize(bytes.size() - 1 - rng() % 8);
        break;
      case 2: {
        const int ctx = std::countr_zero(c.context.present);
        c.context.counts[ctx] += 1 + static_cast<uint32_t>(rng() % 3);
        break;
      }
      default:
        c.context.exponent_low = static_cast<uint8_t>(c.context.exponent_low + 1 + rng() % 4);
        break;
    }
    c.Own(std::move(bytes));
    std::vector<uint8_t> served = before;
    const Status status = ApplyTensorDelta(damaged, served, std::nullopt, 1);
    CHECK(served == before);
    if (!status.ok()) {
      ++refused;
      CHECK(status.code() == StatusCode::kDataLoss);
    }
  }
  // A flipped bit in a stream may still decode: then the result digest refuses it.
  CHECK(refused == 300);
}

}  // namespace
}  // namespace weft::sync
