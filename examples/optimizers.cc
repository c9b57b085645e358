#include "examples/optimizers.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/parallel.h"

namespace weft::examples {
namespace {

constexpr float kQuinticA = 3.4445f, kQuinticB = -4.7750f, kQuinticC = 2.0315f;
// Moonshot's factor: the update's RMS becomes about 0.2, AdamW's.
constexpr double kRmsMatch = 0.2;
// Rows of the product each task computes: their partial sums stay in L1 while the other factor
// streams past once per task.
constexpr size_t kRowTile = 4;

double ClipScale(double norm, double clip_norm) {
  return clip_norm > 0 && norm > clip_norm ? clip_norm / norm : 1.0;
}

// c (m x n) = a (m x k) b (k x n), row-major. Every element is summed over k in order by one
// task, so the result is the same for any thread count.
void MatMul(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, int threads) {
  const size_t tiles = (m + kRowTile - 1) / kRowTile;
  ParallelFor(tiles, threads, [&](size_t tile) {
    const size_t first = tile * kRowTile, rows = std::min(kRowTile, m - first);
    float* out = c + first * n;
    std::fill(out, out + rows * n, 0.0f);
    if (rows < kRowTile) {
      for (size_t r = 0; r < rows; ++r) {
        float* __restrict row = out + r * n;
        for (size_t d = 0; d < k; ++d) {
          const float x = a[(first + r) * k + d];
          const float* __restrict from = b + d * n;
          for (size_t j = 0; j < n; ++j) row[j] += x * from[j];
        }
      }
      return;
    }
    float* __restrict c0 = out;
    float* __restrict c1 = out + n;
    float* __restrict c2 = out + 2 * n;
    float* __restrict c3 = out + 3 * n;
    for (size_t d = 0; d < k; ++d) {
      const float a0 = a[first * k + d], a1 = a[(first + 1) * k + d], a2 = a[(first + 2) * k + d],
                  a3 = a[(first + 3) * k + d];
      const float* __restrict from = b + d * n;
      for (size_t j = 0; j < n; ++j) {
        const float x = from[j];
        c0[j] += a0 * x;
        c1[j] += a1 * x;
        c2[j] += a2 * x;
        c3[j] += a3 * x;
      }
    }
  });
}

// to (cols x rows) = from (rows x cols) transposed.
void Transpose(const float* from, size_t rows, size_t cols, float* to) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) to[c * rows + r] = from[r * cols + c];
  }
}

// The hidden matrices of `layout`, attn.qkv as its three column blocks.
std::vector<Muon::Block> HiddenBlocks(const TinyLmLayout& layout) {
  const size_t d = static_cast<size_t>(layout.config().d_model);
  const size_t f = static_cast<size_t>(layout.config().d_ff);
  std::vector<Muon::Block> blocks;
  for (const TinyLmLayout::Block& b : layout.blocks) {
    for (size_t part = 0; part < 3; ++part) blocks.push_back({b.qkv + part * d, d, d, 3 * d});
    blocks.push_back({b.out, d, d, d});
    blocks.push_back({b.up, d, f, f});
    blocks.push_back({b.down, f, d, d});
  }
  return blocks;
}

// The layout's tensors that are not hidden matrices.
std::vector<size_t> OtherTensors(const TinyLmLayout& layout) {
  std::vector<size_t> hidden;
  for (const TinyLmLayout::Block& b : layout.blocks)
    hidden.insert(hidden.end(), {b.qkv, b.out, b.up, b.down});
  std::vector<size_t> others;
  for (size_t i = 0; i < layout.parameters().size(); ++i) {
    if (std::find(hidden.begin(), hidden.end(), layout.parameters()[i].offset) == hidden.end())
      others.push_back(i);
  }
  return others;
}

std::vector<size_t> AllTensors(const TinyLmLayout& layout) {
  std::vector<size_t> all(layout.parameters().size());
  std::iota(all.begin(), all.end(), size_t{0});
  return all;
}

}  // namespace

std::string_view OptimizerName(OptimizerKind kind) {
  return kind == OptimizerKind::kMuon ? "muon" : "adamw";
}

std::optional<OptimizerKind> OptimizerFromName(std::string_view name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "muon") return OptimizerKind::kMuon;
  return std::nullopt;
}

AdamW::AdamW(const TinyLmLayout& layout, AdamWConfig config)
    : AdamW(layout, config, AllTensors(layout)) {}

AdamW::AdamW(const TinyLmLayout& layout, AdamWConfig config, std::vector<size_t> tensors)
    : layout_(layout),
      config_(config),
      tensors_(std::move(tensors)),
      m_(layout.size()),
      v_(layout.size()) {}

double AdamW::Step(std::span<float> weights, std::span<const float> gradient) {
  double squares = 0.0;
  for (float g : gradient) squares += static_cast<double>(g) * g;
  const double norm = std::sqrt(squares);
  const double clip = ClipScale(norm, config_.clip_norm);
  ++steps_;
  const double correction1 = 1.0 - std::pow(config_.beta1, static_cast<double>(steps_));
  const double correction2 = 1.0 - std::pow(config_.beta2, static_cast<double>(steps_));
  const float b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  for (size_t tensor : tensors_) {
    const ParameterInfo& p = layout_.parameters()[tensor];
    const float decay =
        p.decays ? static_cast<float>(config_.learning_rate * config_.weight_decay) : 0.0f;
    for (size_t k = p.offset; k < p.offset + p.size; ++k) {
      const float g = static_cast<float>(gradient[k] * clip);
      m_[k] = b1 * m_[k] + (1.0f - b1) * g;
      v_[k] = b2 * v_[k] + (1.0f - b2) * g * g;
      const double m_hat = m_[k] / correction1, v_hat = v_[k] / correction2;
      weights[k] -=
          static_cast<float>(config_.learning_rate * m_hat / (std::sqrt(v_hat) + config_.epsilon)) +
          decay * weights[k];
    }
  }
  return norm;
}

Muon::Muon(const TinyLmLayout& layout, AdamWConfig config, MuonConfig muon, int threads)
    : adamw_(layout, config, OtherTensors(layout)),
      muon_(muon),
      threads_(threads),
      blocks_(HiddenBlocks(layout)),
      momentum_(layout.size()) {}

double Muon::Step(std::span<float> weights, std::span<const float> gradient) {
  // AdamW moves the other tensors and measures the global norm the clip needs.
  const double norm = adamw_.Step(weights, gradient);
  const AdamWConfig& config = adamw_.config();
  const double clip = ClipScale(norm, config.clip_norm);
  const float beta = static_cast<float>(muon_.momentum);
  const float decay = static_cast<float>(config.learning_rate * config.weight_decay);
  ParallelFor(blocks_.size(), threads_, [&](size_t i) {
    const Block& b = blocks_[i];
    std::vector<float> update(b.rows * b.cols);
    for (size_t r = 0; r < b.rows; ++r) {
      for (size_t c = 0; c < b.cols; ++c) {
        const size_t k = b.offset + r * b.stride + c;
        const float g = static_cast<float>(gradient[k] * clip);
        momentum_[k] = beta * momentum_[k] + (1.0f - beta) * g;
        update[r * b.cols + c] =
            muon_.nesterov ? (1.0f - beta) * g + beta * momentum_[k] : momentum_[k];
      }
    }
    NewtonSchulz(update, b.rows, b.cols, muon_.newton_schulz_steps, 1);
    const float step = static_cast<float>(config.learning_rate * MuonUpdateScale(b.rows, b.cols));
    for (size_t r = 0; r < b.rows; ++r) {
      for (size_t c = 0; c < b.cols; ++c) {
        const size_t k = b.offset + r * b.stride + c;
        weights[k] -= step * update[r * b.cols + c] + decay * weights[k];
      }
    }
  });
  return norm;
}

double MuonUpdateScale(size_t rows, size_t cols) {
  return kRmsMatch * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

std::unique_ptr<Optimizer> MakeOptimizer(OptimizerKind kind, const TinyLmLayout& layout,
                                         const AdamWConfig& config, int threads) {
  if (kind == OptimizerKind::kMuon)
    return std::make_unique<Muon>(layout, config, MuonConfig{}, threads);
  return std::make_unique<AdamW>(layout, config);
}

void NewtonSchulz(std::span<float> x, size_t rows, size_t cols, int steps, int threads) {
  const bool tall = rows > cols;
  const size_t m = tall ? cols : rows, n = tall ? rows : cols;
  std::vector<float> X(m * n), Xt(n * m), A(m * m), AA(m * m), BX(m * n);
  if (tall) {
    Transpose(x.data(), rows, cols, X.data());
  } else {
    std::copy(x.begin(), x.end(), X.begin());
  }
  double squares = 0.0;
  for (float v : X) squares += static_cast<double>(v) * v;
  const float scale = static_cast<float>(1.0 / (std::sqrt(squares) + 1e-7));
  for (float& v : X) v *= scale;
  for (int step = 0; step < steps; ++step) {
    Transpose(X.data(), m, n, Xt.data());
    MatMul(X.data(), Xt.data(), A.data(), m, n, m, threads);
    MatMul(A.data(), A.data(), AA.data(), m, m, m, threads);
    for (size_t i = 0; i < A.size(); ++i) A[i] = kQuinticB * A[i] + kQuinticC * AA[i];
    MatMul(A.data(), X.data(), BX.data(), m, m, n, threads);
    for (size_t i = 0; i < X.size(); ++i) X[i] = kQuinticA * X[i] + BX[i];
  }
  if (tall) {
    Transpose(X.data(), m, n, x.data());
  } else {
    std::copy(X.begin(), X.end(), x.begin());
  }
}

}  // namespace weft::examples
