// The example policy's optimisers: Muon's orthogonalisation against the quintic's scalar map, its
// split of the model between Muon and AdamW, and learning with it.
#include "examples/optimizers.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "examples/grpo.h"
#include "tests/examples/small_model.h"

namespace weft::examples {
namespace {

// `count` orthonormal columns of length `size` (Gram-Schmidt on Gaussian vectors), column-major.
std::vector<double> OrthonormalColumns(size_t size, size_t count, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> q(size * count);
  for (size_t j = 0; j < count; ++j) {
    double* col = &q[j * size];
    for (size_t i = 0; i < size; ++i) col[i] = normal(rng);
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t p = 0; p < j; ++p) {
        double dot = 0;
        for (size_t i = 0; i < size; ++i) dot += col[i] * q[p * size + i];
        for (size_t i = 0; i < size; ++i) col[i] -= dot * q[p * size + i];
      }
    }
    double norm = 0;
    for (size_t i = 0; i < size; ++i) norm += col[i] * col[i];
    for (size_t i = 0; i < size; ++i) col[i] /= std::sqrt(norm);
  }
  return q;
}

// What 5 quintic steps do to one singular value of the normalised matrix.
double Quintic5(double s) {
  for (int i = 0; i < 5; ++i) s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * std::pow(s, 5);
  return s;
}

TEST_CASE("Newton-Schulz: singular vectors kept, singular values mapped into the quintic's band") {
  // X = U diag(s) V^T with known factors and a condition number of 50: after normalisation every
  // singular value is in [0.005, 1], which 5 steps of the quintic map into [0.68, 1.16].
  const size_t rows = 24, cols = 40;
  std::mt19937_64 rng(11);
  const std::vector<double> u = OrthonormalColumns(rows, rows, rng);
  const std::vector<double> v = OrthonormalColumns(cols, rows, rng);
  std::vector<double> s(rows);
  double frobenius = 0;
  for (size_t k = 0; k < rows; ++k) {
    s[k] = 3.0 * std::pow(50.0, -static_cast<double>(k) / (rows - 1));
    frobenius += s[k] * s[k];
  }
  frobenius = std::sqrt(frobenius);
  std::vector<float> x(rows * cols, 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (size_t k = 0; k < rows; ++k) sum += u[k * rows + i] * s[k] * v[k * cols + j];
      x[i * cols + j] = static_cast<float>(sum);
    }
  }
  std::vector<float> y = x;
  NewtonSchulz(y, rows, cols, 5, 1);
  // U^T Y V: diagonal, the quintic's image of each normalised singular value.
  double worst_off_diagonal = 0, worst_diagonal = 0;
  for (size_t a = 0; a < rows; ++a) {
    for (size_t b = 0; b < rows; ++b) {
      double sum = 0;
      for (size_t i = 0; i < rows; ++i) {
        for (size_t j = 0; j < cols; ++j)
          sum += u[a * rows + i] * y[i * cols + j] * v[b * cols + j];
      }
      if (a != b) {
        worst_off_diagonal = std::max(worst_off_diagonal, std::fabs(sum));
        continue;
      }
      const double expected = Quintic5(s[a] / frobenius);
      CHECK(expected >= 0.68);
      CHECK(expected <= 1.16);
      worst_diagonal = std::max(worst_diagonal, std::fabs(sum - expected));
    }
  }
  CHECK(worst_off_diagonal < 1e-3);
  CHECK(worst_diagonal < 1e-3);

  // A tall matrix is done on its transpose; the thread count changes nothing.
  std::vector<float> tall(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) tall[j * rows + i] = x[i * cols + j];
  }
  NewtonSchulz(tall, cols, rows, 5, 2);
  bool transposed = true;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) transposed &= tall[j * rows + i] == y[i * cols + j];
  }
  CHECK(transposed);
}

TEST_CASE("Muon: hidden matrices by blocks, everything else by AdamW's own code") {
  const TinyLmLayout layout = TinyLmLayout(testing::SmallTinyLm(2, 8));
  const size_t d = 16, f = 32;
  AdamWConfig config;
  config.learning_rate = 1e-3;
  Muon muon(layout, config, MuonConfig{}, 2);
  REQUIRE(muon.blocks().size() == 2 * 6);
  CHECK(muon.blocks()[0].offset == layout.blocks[0].qkv);
  CHECK(muon.blocks()[1].offset == layout.blocks[0].qkv + d);  // the keys: a column block
  CHECK(muon.blocks()[1].stride == 3 * d);
  CHECK(muon.blocks()[4].rows == d);  // mlp.up [d, f]
  CHECK(muon.blocks()[4].cols == f);
  CHECK(muon.blocks()[5].rows == f);  // mlp.down [f, d]

  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> gradient(layout.size());
  for (float& g : gradient) g = normal(rng);
  const std::vector<float> start = layout.Initialize(1);
  std::vector<float> by_muon = start, by_adamw = start;
  AdamW adamw(layout, config);
  CHECK(muon.Step(by_muon, gradient) == adamw.Step(by_adamw, gradient));
  CHECK(muon.steps() == 1);

  std::vector<bool> hidden(layout.size(), false);
  for (const Muon::Block& b : muon.blocks()) {
    // On a fresh momentum the first update is the orthogonalised gradient, scaled by
    // 0.2 sqrt(max(rows, cols)) and the learning rate.
    std::vector<float> block(b.rows * b.cols);
    for (size_t r = 0; r < b.rows; ++r) {
      for (size_t c = 0; c < b.cols; ++c)
        block[r * b.cols + c] = gradient[b.offset + r * b.stride + c];
    }
    NewtonSchulz(block, b.rows, b.cols, 5, 1);
    const double scale =
        config.learning_rate * 0.2 * std::sqrt(static_cast<double>(std::max(b.rows, b.cols)));
    double worst = 0, squares = 0;
    for (size_t r = 0; r < b.rows; ++r) {
      for (size_t c = 0; c < b.cols; ++c) {
        const size_t k = b.offset + r * b.stride + c;
        hidden[k] = true;
        const double moved = static_cast<double>(start[k]) - by_muon[k];
        worst = std::max(worst, std::fabs(moved - scale * block[r * b.cols + c]));
        squares += moved * moved;
      }
    }
    CHECK(worst < 1e-3 * scale);
    // The update's RMS is about 0.2 lr (the orthogonalised singular values are 0.68 to 1.2).
    const double rms = std::sqrt(squares / static_cast<double>(b.rows * b.cols));
    CHECK(rms > 0.1 * config.learning_rate);
    CHECK(rms < 0.25 * config.learning_rate);
  }
  size_t others = 0;
  bool same_as_adamw = true;
  for (size_t k = 0; k < layout.size(); ++k) {
    if (hidden[k]) continue;
    ++others;
    same_as_adamw &= by_muon[k] == by_adamw[k];
  }
  CHECK(others == layout.size() - 2 * (3 * d * d + d * d + 2 * d * f));
  CHECK(same_as_adamw);
}

TEST_CASE("Muon lowers the supervised loss on the arithmetic task; optimisers by name") {
  const ArithmeticTask task(1);
  const TinyLmLayout layout = TinyLmLayout(testing::SmallTinyLm(2, task.max_length()));
  std::vector<float> w = layout.Initialize(7);
  const std::vector<std::string> held_out = {"1+2=", "3+4=", "5+5=", "9+0=", "7+8=", "2+6="};
  const double before = SupervisedLoss(layout, w, task, held_out, 1).value();
  AdamWConfig config;
  config.learning_rate = 3e-3;
  const std::unique_ptr<Optimizer> muon = MakeOptimizer(OptimizerKind::kMuon, layout, config, 2);
  CHECK(muon->kind() == OptimizerKind::kMuon);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 30; ++i) REQUIRE(SupervisedStep(layout, w, *muon, task, rng, 32, 2).ok());
  const double after = SupervisedLoss(layout, w, task, held_out, 2).value();
  MESSAGE("held-out loss " << before << " -> " << after << " after 30 Muon steps");
  CHECK(after < before - 0.5);

  CHECK(OptimizerFromName("adamw") == OptimizerKind::kAdamW);
  CHECK(OptimizerFromName("muon") == OptimizerKind::kMuon);
  CHECK(!OptimizerFromName("Muon").has_value());
  CHECK(OptimizerName(OptimizerKind::kMuon) == "muon");
}

}  // namespace
}  // namespace weft::examples
