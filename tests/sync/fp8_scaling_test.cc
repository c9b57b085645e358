#include "sync/fp8_scaling.h"

#include <doctest/doctest.h>

#include "sync/serving.h"

#include <cmath>
#include <random>

namespace weft::sync {
namespace {

TEST_CASE("tile runs cover a range in order, each element in its own tile") {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t rows = 1 + rng() % 300, cols = 1 + rng() % 300;
    const uint32_t block = trial % 5 == 0 ? 0 : 1 + static_cast<uint32_t>(rng() % 130);
    BlockScaling scaling{rows, cols, block};
    const uint64_t n = rows * cols;
    uint64_t begin = rng() % n, end = begin + rng() % (n - begin + 1);
    uint64_t next = begin;
    ForEachTileRun(scaling, begin, end, [&](uint64_t b, uint64_t e, uint64_t tile) {
      REQUIRE(b == next);
      REQUIRE(e > b);
      for (uint64_t i = b; i < e; ++i) REQUIRE(scaling.ScaleIndex(i / cols, i % cols) == tile);
      next = e;
    });
    CHECK(next == end);
  }
}

TEST_CASE("scales are amax / max_finite per tile, NaN ignored, 1 for an all-zero tile") {
  const uint64_t rows = 5, cols = 7;
  BlockScaling scaling{rows, cols, 4};  // tiles: 2 x 2
  std::vector<float> w(rows * cols, 0.0f);
  w[0] = -448.0f * 2;       // tile (0,0)
  w[1] = NAN;               // ignored
  w[4] = 0.5f;              // tile (0,1)
  w[4 * cols + 6] = 44.8f;  // tile (1,1)
  std::vector<float> scales = ComputeScales(w, scaling, Fp8Format::kE4M3);
  REQUIRE(scales.size() == 4);
  CHECK(scales[0] == 2.0f);
  CHECK(scales[1] == 0.5f / 448.0f);
  CHECK(scales[2] == 1.0f);
  CHECK(scales[3] == 44.8f / 448.0f);
  std::vector<uint8_t> q(w.size());
  ConvertToServing({DType::kF8E4M3, Saturation::kSaturateFinite, &scaling, scales}, w, 0, q);
  for (uint64_t i = 0; i < w.size(); ++i) {
    float s = scales[scaling.ScaleIndex(i / cols, i % cols)];
    CHECK(q[i] == FloatToFp8Ref(w[i] / s, Fp8Format::kE4M3, Saturation::kSaturateFinite));
  }
  CHECK(q[0] == 0xFE);  // -448: the tile's extreme maps to the largest finite value
}

TEST_CASE("per-tensor and per-block shapes") {
  std::vector<uint64_t> shape = {3, 300, 260};
  BlockScaling blocks = ScalingForShape(shape, 128);
  CHECK(blocks.rows == 900);
  CHECK(blocks.cols == 260);
  CHECK(blocks.scale_shape() == std::vector<uint64_t>{8, 3});
  CHECK(ScalingForShape(shape, 0).scale_shape().empty());
  CHECK(ScalingForShape({}, 128).scale_count() == 1);
}

}  // namespace
}  // namespace weft::sync
