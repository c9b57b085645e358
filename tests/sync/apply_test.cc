// Applying deltas: the model-level prepare and commit (one parallel loop over every tensor's
// chunks), the sparse decoder that resolves changes while it decodes, chains applied in place
// chunk by chunk, and the guarantee that a delta (or a whole chain) is proven in full before
// anything is written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "sync/bit_stream.h"
#include "sync/delta_codec.h"
#include "sync/served_model.h"
#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

struct Model {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> bytes;

  std::vector<TensorBytes> View() const {
    std::vector<TensorBytes> view;
    for (size_t t = 0; t < specs.size(); ++t) view.push_back({specs[t], bytes[t], std::nullopt});
    return view;
  }
};

// Many small tensors of mixed dtypes (some of several chunks at chunk_log2 10), and the same
// model with about `density` of the elements changed, a few tensors not at all, one entirely.
std::pair<Model, Model> SmallTensors(std::mt19937_64& rng, size_t count, double density) {
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kF8E4M3, DType::kU8, DType::kI16};
  Model before, after;
  for (size_t t = 0; t < count; ++t) {
    const DType dtype = dtypes[t % 5];
    const uint64_t elements = 1 + rng() % 3000;
    before.specs.push_back({"t" + std::to_string(t), dtype, {elements}});
    before.bytes.push_back(testing::RandomTensor(dtype, elements, rng));
    const double p = t % 7 == 3 ? 0.0 : (t % 11 == 5 ? 1.0 : density);
    after.bytes.push_back(testing::Perturb(before.bytes.back(), dtype, p, rng));
  }
  after.specs = before.specs;
  return {std::move(before), std::move(after)};
}

TEST_CASE("apply: a model of many small tensors, in one parallel loop, as tensor by tensor") {
  std::mt19937_64 rng(31);
  auto [before, after] = SmallTensors(rng, 60, 0.03);
  for (DeltaMode mode : {DeltaMode::kPlain, DeltaMode::kContext}) {
    Result<ModelDelta> delta =
        EncodeModelDelta(before.View(), after.View(), CodecOptions{10, 2, mode});
    REQUIRE(delta.ok());
    for (int threads : {1, 2, 3}) {
      CAPTURE(threads);
      ServedModel replica = ServedModel::FromTensors(before.specs, before.bytes, threads);
      REQUIRE(replica.Apply(*delta, threads).ok());
      for (size_t t = 0; t < after.specs.size(); ++t) {
        CHECK(replica.tensors()[t].bytes == after.bytes[t]);
        CHECK(replica.tensors()[t].digest == TensorDigest(after.specs[t].dtype, after.bytes[t]));
        std::vector<uint8_t> served = before.bytes[t];
        REQUIRE(ApplyTensorDelta(delta->tensors[t], served, std::nullopt, threads).ok());
        CHECK(served == after.bytes[t]);
      }
    }
  }
}

TEST_CASE("apply: a bad last tensor leaves every tensor unchanged") {
  std::mt19937_64 rng(32);
  // Not a structured binding: the lambda below captures `before`.
  auto pair = SmallTensors(rng, 12, 0.05);
  auto& before = pair.first;
  auto& after = pair.second;
  before.specs.push_back({"last", DType::kBF16, {5000}});
  before.bytes.push_back(testing::RandomTensor(DType::kBF16, 5000, rng));
  after.specs = before.specs;
  after.bytes.push_back(testing::Perturb(before.bytes.back(), DType::kBF16, 0.02, rng));
  const ModelDelta delta =
      std::move(EncodeModelDelta(before.View(), after.View(), CodecOptions{10, 2})).value();
  const TensorDelta& last = delta.tensors.back();
  REQUIRE(std::count_if(last.chunks.begin(), last.chunks.end(),
                        [](const DeltaChunk& c) { return c.mode == ChunkMode::kSparse; }) == 5);

  auto check_refused = [&](const ModelDelta& bad, StatusCode code) {
    for (int threads : {1, 2}) {
      ServedModel replica = ServedModel::FromTensors(before.specs, before.bytes, threads);
      const Status status = replica.Apply(bad, threads);
      CHECK(status.code() == code);
      for (size_t t = 0; t < before.specs.size(); ++t) {
        CHECK(replica.tensors()[t].bytes == before.bytes[t]);
        CHECK(replica.tensors()[t].digest == TensorDigest(before.specs[t].dtype, before.bytes[t]));
      }
      // The same replica still takes the true delta afterwards.
      REQUIRE(replica.Apply(delta, threads).ok());
      CHECK(replica.tensors().back().bytes == after.bytes.back());
    }
  };
  SUBCASE("a corrupted payload in its last chunk") {
    // Corrupted after parsing (a flipped byte in a file fails its checksum first): every byte of
    // the last chunk's payload in turn, each rejected as malformed or by the result digest.
    for (size_t at = 0; at < last.chunks.back().payload.size(); at += 7) {
      ModelDelta bad = delta.Copy();
      std::vector<uint8_t>& payload = bad.tensors.back().chunks.back().owned;
      payload[at] ^= 0x24;
      check_refused(bad, StatusCode::kDataLoss);
    }
  }
  SUBCASE("a result digest that the changes do not produce") {
    ModelDelta bad = delta.Copy();
    bad.tensors.back().result_digest.lane1 ^= 1;
    check_refused(bad, StatusCode::kDataLoss);
  }
  SUBCASE("a base digest of another tensor") {
    ModelDelta bad = delta.Copy();
    bad.tensors.back().base_digest.lane0 ^= 1;
    check_refused(bad, StatusCode::kConflict);
  }
}

TEST_CASE("apply: the model-level prepare reports the first failing tensor in the delta's order") {
  std::mt19937_64 rng(33);
  auto [before, after] = SmallTensors(rng, 4, 0.05);
  ModelDelta delta =
      std::move(EncodeModelDelta(before.View(), after.View(), CodecOptions{10, 1})).value();
  std::vector<ServedBytes> served;
  for (const auto& bytes : before.bytes) served.push_back({bytes, std::nullopt});
  PreparedModelDelta prepared;
  REQUIRE(PrepareModelDelta(delta, served, 2, &prepared).ok());
  REQUIRE(prepared.tensors.size() == 4);

  ModelDelta bad = delta.Copy();
  bad.tensors[1].base_digest.lane0 ^= 1;    // a conflict in tensor 1
  bad.tensors[3].result_digest.lane0 ^= 1;  // data loss in tensor 3
  Status status = PrepareModelDelta(bad, served, 2, &prepared);
  CHECK(status.code() == StatusCode::kConflict);
  CHECK(status.message().find("'t1'") != std::string::npos);
  bad = delta.Copy();
  bad.tensors[0].result_digest.lane0 ^= 1;
  bad.tensors[2].base_digest.lane0 ^= 1;
  status = PrepareModelDelta(bad, served, 2, &prepared);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("'t0'") != std::string::npos);
  CHECK(PrepareModelDelta(delta, std::span(served).first(3), 2, &prepared).code() ==
        StatusCode::kInvalidArgument);
}

// A one-tensor delta of `units` units of `dtype` whose single chunk is exactly `changes`.
struct SparseCase {
  TensorDelta delta;
  std::vector<uint8_t> before, after;
};

SparseCase MakeSparseCase(DType dtype, uint32_t units, const ChangeList& changes,
                          std::mt19937_64& rng) {
  const uint8_t width = CodedWidth(dtype);
  const KeyKind kind = KeyKindFor(dtype);
  SparseCase c;
  c.before = testing::RandomTensor(dtype, units, rng);
  c.after = c.before;
  for (size_t j = 0; j < changes.size(); ++j) {
    uint64_t value = 0;
    std::memcpy(&value, &c.after[size_t{changes.offsets[j]} * width], width);
    switch (width) {
      case 1:
        value = ApplyResidual<uint8_t>(kind, static_cast<uint8_t>(value),
                                       static_cast<uint8_t>(changes.residuals[j]));
        break;
      case 2:
        value = ApplyResidual<uint16_t>(kind, static_cast<uint16_t>(value),
                                        static_cast<uint16_t>(changes.residuals[j]));
        break;
      default:
        value = ApplyResidual<uint32_t>(kind, static_cast<uint32_t>(value), changes.residuals[j]);
        break;
    }
    std::memcpy(&c.after[size_t{changes.offsets[j]} * width], &value, width);
  }
  c.delta.spec = {"w", dtype, {units}};
  c.delta.chunk_log2 = 20;
  c.delta.base_digest = TensorDigest(dtype, c.before);
  c.delta.result_digest = TensorDigest(dtype, c.after);
  DeltaChunk& chunk = c.delta.chunks.emplace_back();
  chunk.mode = ChunkMode::kSparse;
  std::vector<uint8_t> payload;
  EncodeChanges(changes, width, CodingFor(dtype), &chunk.sparse, &payload);
  chunk.Own(std::move(payload));
  return c;
}

TEST_CASE("apply: changes resolved while decoding equal the decoded list, for every code path") {
  std::mt19937_64 rng(34);
  const uint32_t units = 1 << 16;
  // Residuals of one unit mostly, some larger, some the largest the width allows.
  auto residual = [&](DType dtype) -> uint32_t {
    const uint8_t width = CodedWidth(dtype);
    const uint64_t mask = width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
    if (CodingFor(dtype) == ValueCoding::kXor) return static_cast<uint32_t>(1 + rng() % mask);
    const uint64_t half = (mask >> 1) + 1;
    uint64_t magnitude = 1;
    switch (rng() % 16) {
      case 0:
        magnitude = 2 + rng() % 6;
        break;
      case 1:
        magnitude = 1 + rng() % half;
        break;
      case 2:
        magnitude = half;
        break;
    }
    return static_cast<uint32_t>((rng() & 1 ? magnitude : 0 - magnitude) & mask);
  };
  struct Pattern {
    const char* name;
    std::vector<uint32_t> offsets;
  };
  std::vector<Pattern> patterns;
  auto add = [&](const char* name, auto&& keep) {
    Pattern& p = patterns.emplace_back();
    p.name = name;
    for (uint32_t i = 0; i < units; ++i) {
      if (keep(i)) p.offsets.push_back(i);
    }
  };
  std::bernoulli_distribution two_percent(0.02), dense(0.45);
  add("2% density", [&](uint32_t) { return two_percent(rng); });
  add("45% density", [&](uint32_t) { return dense(rng); });
  // A dense run and then one gap long enough to escape (quotient >= 24 at a small parameter).
  add("escaped gap", [&](uint32_t i) { return i < 3000 || i == units - 1; });
  // Gaps of 29 (Rice parameter 4 or 5) with one of about 300 in every 4096 units, whose unary
  // part is beyond what four codes per refill allow but short of an escape.
  add("long codes", [&](uint32_t i) { return i % 29 == 0 && i % 4096 >= 280; });
  // Counts that leave a partial last block and a partial group of eight, ending at the last unit.
  add("partial blocks", [&](uint32_t i) { return i >= units - 3 * 64 - 5; });
  add("one change", [&](uint32_t i) { return i == 12345; });

  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF8E4M3, DType::kI8, DType::kU8,
                      DType::kI16, DType::kI32, DType::kF64}) {
    for (const Pattern& pattern : patterns) {
      CAPTURE(Info(dtype).safetensors_name);
      CAPTURE(pattern.name);
      ChangeList changes;
      for (uint32_t offset : pattern.offsets) {
        changes.offsets.push_back(offset);
        changes.residuals.push_back(residual(dtype));
      }
      // `units` coded units (bytes, for the 8-byte types).
      const uint32_t elements = units * CodedWidth(dtype) / Info(dtype).size;
      SparseCase c = MakeSparseCase(dtype, elements, changes, rng);
      ChangeList decoded;
      REQUIRE(DecodeChanges(c.delta.chunks[0].sparse, c.delta.chunks[0].payload, units,
                            CodedWidth(dtype), CodingFor(dtype), &decoded)
                  .ok());
      CHECK(decoded.offsets == changes.offsets);
      CHECK(decoded.residuals == changes.residuals);
      Result<PreparedTensorDelta> prepared = PrepareTensorDelta(c.delta, c.before, std::nullopt, 1);
      REQUIRE(prepared.ok());
      CHECK(prepared->result_digest == c.delta.result_digest);
      std::vector<uint8_t> served = c.before;
      CommitTensorDelta(*prepared, served, 1);
      CHECK(served == c.after);
    }
  }
}

// Writes the position stream of `offsets` Rice-coded with parameter k (docs/formats.md, "Sparse
// payload"), whatever k the encoder would choose.
std::vector<uint8_t> GapStream(const U32Vector& offsets, int k) {
  std::vector<uint8_t> bytes(offsets.size() * 8 + 16);
  BitWriter writer(bytes.data());
  uint32_t previous = UINT32_MAX;
  for (uint32_t offset : offsets) {
    const uint32_t gap = offset - previous - 1;
    previous = offset;
    const uint32_t quotient = gap >> k;
    if (quotient < 24) {
      writer.Put(0, static_cast<int>(quotient));
      writer.Put(1, 1);
      if (k > 0) writer.Put(gap & ((uint32_t{1} << k) - 1), k);
    } else {
      writer.Put(0, 24);
      writer.Put(gap, 32);
    }
  }
  bytes.resize(writer.bytes());
  return bytes;
}

TEST_CASE("apply: the sparse decoder takes any position code parameter") {
  std::mt19937_64 rng(36);
  const uint32_t units = 1 << 16;
  for (int k : {0, 3, 7, 8, 13, 21, 22, 26}) {
    for (uint32_t count : {1u, 63u, 64u, 200u, 1000u}) {
      CAPTURE(k);
      CAPTURE(count);
      // Gaps spread over the chunk, a few runs of neighbours: short and long unary parts,
      // escapes at small k.
      U32Vector offsets;
      for (uint32_t i = 0; i < units && offsets.size() < count; ++i) {
        if (rng() % (units / count) == 0 || (i % 5000 < 3)) offsets.push_back(i);
      }
      SparseHeader header;
      header.k_gap = static_cast<uint8_t>(k);
      header.change_count = static_cast<uint32_t>(offsets.size());
      std::vector<uint8_t> payload = GapStream(offsets, k);
      header.gap_bytes = static_cast<uint32_t>(payload.size());
      // All changes +1 except a few negative ones.
      header.sign_bytes = static_cast<uint32_t>((offsets.size() + 7) / 8);
      std::vector<uint8_t> signs(header.sign_bytes, 0);
      for (size_t j = 0; j < offsets.size(); j += 5) signs[j / 8] |= uint8_t(1u << (j % 8));
      payload.insert(payload.end(), signs.begin(), signs.end());

      ChangeList decoded;
      REQUIRE(DecodeChanges(header, payload, units, 2, ValueCoding::kOrderedDiff, &decoded).ok());
      REQUIRE(decoded.offsets == offsets);
      for (size_t j = 0; j < offsets.size(); ++j)
        CHECK(decoded.residuals[j] == (j % 5 == 0 ? 0xFFFFu : 1u));
      // The same chunk applied while it is decoded.
      SparseCase c = MakeSparseCase(DType::kBF16, units, decoded, rng);
      c.delta.chunks[0].sparse = header;
      c.delta.chunks[0].Own(std::vector<uint8_t>(payload));
      std::vector<uint8_t> served = c.before;
      REQUIRE(ApplyTensorDelta(c.delta, served, std::nullopt, 1).ok());
      CHECK(served == c.after);
      // One bit fewer or more in the position stream: refused.
      SparseHeader cut = header;
      cut.change_count -= 1;
      cut.sign_bytes = static_cast<uint32_t>((cut.change_count + 7) / 8);
      std::vector<uint8_t> shorter(payload.begin(), payload.begin() + header.gap_bytes);
      shorter.resize(shorter.size() + cut.sign_bytes, 0);
      if (cut.change_count > 0) {
        CHECK(!DecodeChanges(cut, shorter, units, 2, ValueCoding::kOrderedDiff, &decoded).ok());
      }
    }
  }
}

TEST_CASE("apply: a served model reuses its buffers across versions of any shape") {
  std::mt19937_64 rng(35);
  // Not a structured binding: the lambdas below capture the models.
  auto pair = SmallTensors(rng, 20, 0.04);
  auto& v0 = pair.first;
  auto& v1 = pair.second;
  Model v2;
  v2.specs = v1.specs;
  for (size_t t = 0; t < v1.bytes.size(); ++t)
    v2.bytes.push_back(testing::Perturb(v1.bytes[t], v1.specs[t].dtype, t % 2 ? 0.3 : 0.001, rng));
  const ModelDelta d01 =
      std::move(EncodeModelDelta(v0.View(), v1.View(), CodecOptions{10, 2})).value();
  const ModelDelta d12 =
      std::move(EncodeModelDelta(v1.View(), v2.View(), CodecOptions{10, 2})).value();
  const ModelDelta d10 =
      std::move(EncodeModelDelta(v1.View(), v0.View(), CodecOptions{10, 2})).value();
  // A delta of only some tensors, listed in another order.
  ModelDelta d21_part;
  {
    ModelDelta d21 = std::move(EncodeModelDelta(v2.View(), v1.View(), CodecOptions{10, 2})).value();
    for (size_t t = d21.tensors.size(); t-- > 0;) {
      if (t % 3 != 0) d21_part.tensors.push_back(std::move(d21.tensors[t]));
    }
  }
  ServedModel replica = ServedModel::FromTensors(v0.specs, v0.bytes, 2);
  auto expect = [&](const std::function<const std::vector<uint8_t>&(size_t)>& bytes) {
    for (size_t t = 0; t < v0.specs.size(); ++t) {
      CHECK(replica.tensors()[t].bytes == bytes(t));
      CHECK(replica.tensors()[t].digest == TensorDigest(v0.specs[t].dtype, bytes(t)));
    }
  };
  for (int round = 0; round < 2; ++round) {
    REQUIRE(replica.Apply(d01, 2).ok());
    expect([&](size_t t) -> const std::vector<uint8_t>& { return v1.bytes[t]; });
    REQUIRE(replica.Apply(d12, 1).ok());
    expect([&](size_t t) -> const std::vector<uint8_t>& { return v2.bytes[t]; });
    REQUIRE(replica.Apply(d21_part, 2).ok());
    expect([&](size_t t) -> const std::vector<uint8_t>& {
      return t % 3 != 0 ? v1.bytes[t] : v2.bytes[t];
    });
    // Back to v1 everywhere, then to v0.
    ModelDelta rest;
    for (size_t t = 0; t < d12.tensors.size(); t += 3) {
      rest.tensors.push_back(
          EncodeTensorDelta(v2.specs[t], v2.bytes[t], v1.bytes[t], CodecOptions{10, 1}).value());
    }
    REQUIRE(replica.Apply(rest, 2).ok());
    REQUIRE(replica.Apply(d10, 2).ok());
    expect([&](size_t t) -> const std::vector<uint8_t>& { return v0.bytes[t]; });
  }
  // A copy starts without buffers and applies the same.
  ServedModel copy = replica;
  REQUIRE(copy.Apply(d01, 2).ok());
  CHECK(copy.tensors()[0].bytes == v1.bytes[0]);
}

// Versions 0..n of SmallTensors-like models, each a step of about `density` from the one before,
// and the deltas between them in alternating modes (a chain may mix them).
struct History {
  std::vector<Model> versions;
  std::vector<ModelDelta> deltas;

  std::vector<const ModelDelta*> Chain(size_t from, size_t to) const {
    std::vector<const ModelDelta*> chain;
    for (size_t v = from; v < to; ++v) chain.push_back(&deltas[v]);
    return chain;
  }
};

History MakeHistory(std::mt19937_64& rng, size_t tensors, size_t steps, double density) {
  History h;
  h.versions.push_back(SmallTensors(rng, tensors, density).first);
  for (size_t v = 0; v < steps; ++v) {
    Model next = h.versions.back();
    for (size_t t = 0; t < next.specs.size(); ++t)
      next.bytes[t] = testing::Perturb(next.bytes[t], next.specs[t].dtype, density, rng);
    const DeltaMode mode = v % 2 == 0 ? DeltaMode::kContext : DeltaMode::kPlain;
    h.deltas.push_back(std::move(EncodeModelDelta(h.versions.back().View(), next.View(),
                                                  CodecOptions{10, 2, mode}))
                           .value());
    h.versions.push_back(std::move(next));
  }
  return h;
}

void CheckHolds(const ServedModel& model, const Model& expected) {
  REQUIRE(model.tensors().size() == expected.specs.size());
  for (size_t t = 0; t < expected.specs.size(); ++t) {
    CHECK(model.tensors()[t].bytes == expected.bytes[t]);
    CHECK(model.tensors()[t].digest == TensorDigest(expected.specs[t].dtype, expected.bytes[t]));
  }
}

TEST_CASE("apply: a chain applied in place equals its deltas applied one by one") {
  std::mt19937_64 rng(41);
  const History h = MakeHistory(rng, 30, 6, 0.04);
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    for (size_t from : {size_t{0}, size_t{2}, size_t{5}}) {
      CAPTURE(from);
      ServedModel replica =
          ServedModel::FromTensors(h.versions[from].specs, h.versions[from].bytes, threads);
      const std::vector<const ModelDelta*> chain = h.Chain(from, 6);
      REQUIRE(replica.ApplyChain(chain, threads).ok());
      CheckHolds(replica, h.versions[6]);
    }
    // A chain of one delta (its digests proven on the served bytes, without a copy): context
    // and plain chunks.
    for (size_t from : {size_t{4}, size_t{5}}) {
      CAPTURE(from);
      ServedModel replica =
          ServedModel::FromTensors(h.versions[from].specs, h.versions[from].bytes, threads);
      REQUIRE(replica.ApplyChain(h.Chain(from, from + 1), threads).ok());
      CheckHolds(replica, h.versions[from + 1]);
    }
  }
  // Raw chunks (every element changed) and tensors no delta names are handled too.
  Model dense = h.versions[0];
  dense.specs.push_back({"extra", DType::kBF16, {4000}});
  dense.bytes.push_back(testing::RandomTensor(DType::kBF16, 4000, rng));
  Model all = h.versions[0];
  for (size_t t = 0; t < all.specs.size(); ++t)
    all.bytes[t] = testing::Perturb(all.bytes[t], all.specs[t].dtype, 1.0, rng);
  const ModelDelta to_all =
      std::move(EncodeModelDelta(h.versions[0].View(), all.View(), CodecOptions{10, 2})).value();
  const ModelDelta back = std::move(EncodeModelDelta(all.View(), h.versions[1].View(),
                                                     CodecOptions{10, 2, DeltaMode::kContext}))
                              .value();
  ServedModel replica = ServedModel::FromTensors(dense.specs, dense.bytes, 2);
  const std::vector<const ModelDelta*> chain = {&to_all, &back, &h.deltas[1]};
  REQUIRE(replica.ApplyChain(chain, 2).ok());
  for (size_t t = 0; t < h.versions[2].specs.size(); ++t)
    CHECK(replica.tensors()[t].bytes == h.versions[2].bytes[t]);
  CHECK(replica.tensors().back().bytes == dense.bytes.back());
  // Raw chunks alone, in a chain of one.
  ServedModel alone = ServedModel::FromTensors(dense.specs, dense.bytes, 2);
  const std::vector<const ModelDelta*> raw = {&to_all};
  REQUIRE(alone.ApplyChain(raw, 2).ok());
  for (size_t t = 0; t < all.specs.size(); ++t) CHECK(alone.tensors()[t].bytes == all.bytes[t]);
}

TEST_CASE("apply: a chain with any bad link leaves every tensor unchanged, and names the link") {
  std::mt19937_64 rng(42);
  const History h = MakeHistory(rng, 12, 4, 0.05);
  auto check_refused = [&](const std::vector<const ModelDelta*>& chain, size_t link,
                           StatusCode code) {
    for (int threads : {1, 2}) {
      ServedModel replica =
          ServedModel::FromTensors(h.versions[0].specs, h.versions[0].bytes, threads);
      size_t failed = 99;
      const Status status = replica.ApplyChain(chain, threads, &failed);
      CHECK(status.code() == code);
      CHECK(failed == link);
      CheckHolds(replica, h.versions[0]);
      REQUIRE(replica.ApplyChain(h.Chain(0, 4), threads).ok());
      CheckHolds(replica, h.versions[4]);
    }
  };
  SUBCASE("a corrupted payload in the third delta") {
    // The last sparse or context chunk of the third delta, every 5th byte in turn: each is
    // malformed, or lands elsewhere than that delta's result digest.
    ModelDelta probe = h.deltas[2].Copy();
    size_t tensor = 0, chunk = 0;
    for (size_t t = 0; t < probe.tensors.size(); ++t) {
      for (size_t c = 0; c < probe.tensors[t].chunks.size(); ++c) {
        const ChunkMode mode = probe.tensors[t].chunks[c].mode;
        if (mode == ChunkMode::kSparse || mode == ChunkMode::kContext) tensor = t, chunk = c;
      }
    }
    const size_t size = probe.tensors[tensor].chunks[chunk].payload.size();
    REQUIRE(size > 0);
    for (size_t at = 0; at < size; at += 5) {
      ModelDelta bad = h.deltas[2].Copy();
      bad.tensors[tensor].chunks[chunk].owned[at] ^= 0x24;
      std::vector<const ModelDelta*> chain = h.Chain(0, 4);
      chain[2] = &bad;
      check_refused(chain, 2, StatusCode::kDataLoss);
    }
  }
  SUBCASE("a chain of one delta: corrupted, landing elsewhere, or for another base") {
    ModelDelta wrong = h.deltas[0].Copy();
    wrong.tensors.front().result_digest.lane0 ^= 1;
    check_refused({&wrong}, 0, StatusCode::kDataLoss);
    // Every coded chunk with a byte in its middle flipped: malformed, or other changes.
    ModelDelta bad = h.deltas[0].Copy();
    for (TensorDelta& tensor : bad.tensors) {
      for (DeltaChunk& chunk : tensor.chunks) {
        if (chunk.mode == ChunkMode::kSparse || chunk.mode == ChunkMode::kContext)
          chunk.owned[chunk.owned.size() / 2] ^= 0x5a;
      }
    }
    check_refused({&bad}, 0, StatusCode::kDataLoss);
    check_refused({&h.deltas[1]}, 0, StatusCode::kConflict);
  }
  SUBCASE("a result digest that the changes do not produce") {
    ModelDelta bad = h.deltas[1].Copy();
    bad.tensors.back().result_digest.lane1 ^= 1;
    ModelDelta next = h.deltas[2].Copy();
    next.tensors.back().base_digest = bad.tensors.back().result_digest;
    check_refused({&h.deltas[0], &bad, &next, &h.deltas[3]}, 1, StatusCode::kDataLoss);
  }
  SUBCASE("a link that does not continue the one before") {
    check_refused({&h.deltas[0], &h.deltas[2]}, 1, StatusCode::kConflict);
  }
  SUBCASE("a first delta made for another base") {
    check_refused({&h.deltas[1], &h.deltas[2]}, 0, StatusCode::kConflict);
  }
}

// A history's deltas as files hold them: each serialised and parsed from its own bytes.
struct ParsedChain {
  explicit ParsedChain(const History& h) {
    for (const ModelDelta& delta : h.deltas) files.push_back(SerializeModelDelta(delta));
    for (const std::vector<uint8_t>& file : files) parsed.push_back(ParseModelDelta(file).value());
    for (const ModelDelta& delta : parsed) chain.push_back(&delta);
  }
  std::vector<std::vector<uint8_t>> files;
  std::vector<ModelDelta> parsed;
  std::vector<const ModelDelta*> chain;
};

TEST_CASE("apply: a chain walked in windows lets each window's payloads go, with the same result") {
  std::mt19937_64 rng(43);
  History h = MakeHistory(rng, 40, 5, 0.05);
  ParsedChain deltas(h);
  const std::vector<std::vector<uint8_t>>& files = deltas.files;
  const std::vector<const ModelDelta*>& chain = deltas.chain;
  for (const ModelDelta* one : chain) CHECK(one->tensors.size() == 40);
  for (uint64_t window : {uint64_t{1}, uint64_t{2000}, uint64_t{1} << 30}) {
    for (size_t links : {size_t{1}, size_t{5}}) {
      CAPTURE(window);
      CAPTURE(links);
      const std::span<const ModelDelta* const> part(chain.data(), links);
      std::vector<uint64_t> released(links);
      size_t calls = 0;
      ApplyChainOptions options;
      options.window_bytes = window;
      options.release = [&](size_t k, std::span<const uint8_t> bytes) {
        REQUIRE(k < links);
        CHECK(bytes.data() >= files[k].data());
        CHECK(bytes.data() + bytes.size() <= files[k].data() + files[k].size());
        released[k] += bytes.size();
        ++calls;
      };
      ServedModel replica = ServedModel::FromTensors(h.versions[0].specs, h.versions[0].bytes, 2);
      REQUIRE(replica.ApplyChain(part, 2, nullptr, options).ok());
      CheckHolds(replica, h.versions[links]);
      // Every delta's payloads were let go, twice (once per walk); small windows, many calls.
      for (size_t k = 0; k < links; ++k) CHECK(released[k] > 0);
      if (window == 1) CHECK(calls > 20 * links);
    }
  }
}

TEST_CASE("apply: payloads read again other than they were first read stop the second walk") {
  std::mt19937_64 rng(44);
  History h = MakeHistory(rng, 20, 3, 0.05);
  for (bool late : {false, true}) {
    CAPTURE(late);
    ParsedChain deltas(h);
    std::vector<std::vector<uint8_t>>& files = deltas.files;
    const std::vector<ModelDelta>& parsed = deltas.parsed;
    const std::vector<const ModelDelta*>& chain = deltas.chain;
    // Between the walks, a byte of the second delta's first (or last) payload changes where it
    // is kept, as a spill file read back other than written would.
    const TensorDelta* target = nullptr;
    size_t target_chunk = 0;
    for (const TensorDelta& tensor : parsed[1].tensors) {
      for (size_t c = 0; c < tensor.chunks.size(); ++c) {
        if (tensor.chunks[c].payload.empty()) continue;
        if (target == nullptr || late) target = &tensor, target_chunk = c;
      }
    }
    REQUIRE(target != nullptr);
    const uint8_t* byte = target->chunks[target_chunk].payload.data();
    size_t calls = 0;
    ApplyChainOptions options;
    options.window_bytes = 500;
    bool partly = false;
    options.partly_written = &partly;
    options.release = [&](size_t, std::span<const uint8_t>) { ++calls; };
    // The first walk's windows are counted, then the byte flipped before the second walk.
    ServedModel counter = ServedModel::FromTensors(h.versions[0].specs, h.versions[0].bytes, 1);
    REQUIRE(counter.ApplyChain(chain, 1, nullptr, options).ok());
    const size_t first_walk_calls = calls / 2;
    calls = 0;
    options.release = [&](size_t, std::span<const uint8_t>) {
      if (++calls == first_walk_calls) files[1][byte - files[1].data()] ^= 0x40;
    };
    ServedModel replica = ServedModel::FromTensors(h.versions[0].specs, h.versions[0].bytes, 1);
    size_t failed = 99;
    const Status status = replica.ApplyChain(chain, 1, &failed, options);
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(status.message().find("changed between the two walks") != std::string::npos);
    CHECK(failed == 1);
    CHECK(partly == late);
    if (!late) CheckHolds(replica, h.versions[0]);
  }
}

}  // namespace
}  // namespace weft::sync
