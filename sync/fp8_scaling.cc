#include "sync/fp8_scaling.h"

#include <algorithm>
#include <cmath>

namespace weft::sync {

std::vector<uint64_t> BlockScaling::scale_shape() const {
  if (block == 0) return {};
  return {block_rows(), block_cols()};
}

BlockScaling ScalingForShape(std::span<const uint64_t> shape, uint32_t block) {
  BlockScaling scaling;
  scaling.block = block;
  scaling.cols = shape.empty() ? 1 : shape.back();
  scaling.rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) scaling.rows *= shape[d];
  return scaling;
}

std::vector<float> ComputeScales(const MasterValues& weights, const BlockScaling& scaling,
                                 Fp8Format format) {
  std::vector<float> amax(scaling.scale_count(), 0.0f);
  ForEachFloatBlock(weights, [&](std::span<const float> block, uint64_t first) {
    ForEachTileRun(
        scaling, first, first + block.size(), [&](uint64_t begin, uint64_t end, uint64_t tile) {
          amax[tile] = std::max(amax[tile], AbsMax(block.subspan(begin - first, end - begin)));
        });
  });
  const float max_finite = Fp8MaxFinite(format);
  for (float& value : amax) value = value == 0.0f ? 1.0f : value / max_finite;
  return amax;
}

}  // namespace weft::sync
