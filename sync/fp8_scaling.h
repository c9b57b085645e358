// Scaled FP8: quantising FP32 weights to FP8 with per-tensor or per-block scales, as block-scaled
// FP8 checkpoints (DeepSeek-V3 style) are served.
//
// A 2-D weight [rows, cols] (higher-rank tensors are viewed as [product of leading dims, last])
// is split into block x block tiles; tile t has scale s_t = amax_t / max_finite (amax over the
// tile's non-NaN |w|; s_t = 1 when amax is 0), served as the FP32 tensor "<name>_scale_inv" of
// shape [ceil(rows / block), ceil(cols / block)]. Each element is served as fp8(w / s_t), with the
// division in FP32 and the conversion of sync/convert.h, so w ~= fp8 * s_t. block == 0 means a
// single scale for the whole tensor (shape []). Scales are served tensors like any other and are
// diffed by the delta codec. Functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sync/convert.h"
#include "sync/master_values.h"

namespace weft::sync {

// The served scale tensor of FP8 tensor `name` is named name + kScaleSuffix.
inline constexpr std::string_view kScaleSuffix = "_scale_inv";
inline std::string ScaleTensorName(const std::string& name) {
  return name + std::string(kScaleSuffix);
}

struct BlockScaling {
  uint64_t rows = 0;
  uint64_t cols = 0;
  uint32_t block = 0;  // 0: one scale per tensor

  uint64_t block_rows() const { return block == 0 ? 1 : (rows + block - 1) / block; }
  uint64_t block_cols() const { return block == 0 ? 1 : (cols + block - 1) / block; }
  uint64_t scale_count() const { return block_rows() * block_cols(); }
  // Shape of the scale tensor: [] for per-tensor, [block_rows, block_cols] for per-block.
  std::vector<uint64_t> scale_shape() const;
  // The scale index of element (row, col).
  uint64_t ScaleIndex(uint64_t row, uint64_t col) const {
    return block == 0 ? 0 : (row / block) * block_cols() + col / block;
  }
};

// The [rows, cols] view of a tensor shape (a 1-D shape is one row; a scalar is 1 x 1).
BlockScaling ScalingForShape(std::span<const uint64_t> shape, uint32_t block);

// s_t = amax_t / max_finite for every tile.
std::vector<float> ComputeScales(const MasterValues& weights, const BlockScaling& scaling,
                                 Fp8Format format);

// Calls fn(begin, end, tile) for the maximal runs of consecutive elements in [begin, end) that
// lie in one tile, in order; `tile` indexes the scale tensor. Used by the scale computation and the
// serving conversion (serving.h).
template <typename Fn>
void ForEachTileRun(const BlockScaling& scaling, uint64_t begin, uint64_t end, Fn&& fn) {
  if (begin >= end) return;
  if (scaling.block == 0) {
    fn(begin, end, uint64_t{0});
    return;
  }
  // Position tracked incrementally: divisions once at the start and once per row, not per run.
  const uint64_t block = scaling.block;
  uint64_t row = begin / scaling.cols;
  uint64_t col = begin % scaling.cols;
  uint64_t tile_col = col / block;
  uint64_t tile = (row / block) * scaling.block_cols() + tile_col;
  uint64_t tile_end_col = std::min<uint64_t>(scaling.cols, (tile_col + 1) * block);
  uint64_t i = begin;
  while (i < end) {
    const uint64_t run_end = std::min<uint64_t>(end, i + (tile_end_col - col));
    fn(i, run_end, tile);
    col += run_end - i;
    i = run_end;
    if (col == tile_end_col) {
      if (col == scaling.cols) {
        col = 0;
        tile_col = 0;
        ++row;
        tile = (row / block) * scaling.block_cols();
      } else {
        ++tile_col;
        ++tile;
      }
      tile_end_col = std::min<uint64_t>(scaling.cols, (tile_col + 1) * block);
    }
  }
}

}  // namespace weft::sync
