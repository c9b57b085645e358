// The example policy's optimisers, behind one interface: AdamW, and Muon for the hidden matrices
// with AdamW for everything else.
//
// Both minimise a loss: Step() moves the weights against `gradient` (pass the gradient of the
// loss, i.e. the negative of what Trainer::Accumulate gives for an objective to maximise). Both
// clip the global gradient norm first, and apply decoupled weight decay to the tensors whose
// `decays` flag is set.
//
// Muon (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024; the
// reference is KellerJordan/Muon muon.py) updates each hidden matrix (blocks.*.attn.qkv, attn.out,
// mlp.up, mlp.down) by the orthogonalised momentum of its gradient:
//   buffer = lerp(buffer, g, 1 - momentum);  update = lerp(g, buffer, momentum) (Nesterov)
//   O = NewtonSchulz(update)                  (about U V^T of the update's SVD)
//   w = w - lr * weight_decay * w - lr * 0.2 * sqrt(max(rows, cols)) * O
// The factor 0.2 * sqrt(max(rows, cols)) is Moonshot's ("Muon is Scalable for LLM Training",
// 2025): an orthogonal matrix of that shape has RMS 1 / sqrt(max(rows, cols)), so a full-rank
// update's RMS is about 0.2, what AdamW's typically is, which lets one learning rate and weight
// decay serve both (on TinyLm's fine-tuning steps Muon still needs three to four times AdamW's
// rate for the same progress: docs/run.md, "Muon versus AdamW"). attn.qkv is orthogonalised as
// its three [d_model, d_model] blocks (queries, keys and values apart, as modded-nanogpt does),
// each scaled by its own shape. The embeddings, the output projection and the norm gains get
// AdamW, the same code as the AdamW class.
//
// Deterministic, and the same for any thread count (each output element is computed by one thread
// in a fixed order). Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "examples/tiny_lm.h"

namespace weft::examples {

struct AdamWConfig {
  double learning_rate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double weight_decay = 0.0;
  double clip_norm = 1.0;  // global gradient norm clip; 0: none
};

enum class OptimizerKind { kAdamW, kMuon };
// "adamw", "muon": the names the run config uses (trainer.optimizer).
std::string_view OptimizerName(OptimizerKind kind);
std::optional<OptimizerKind> OptimizerFromName(std::string_view name);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One step; returns the gradient's global norm before clipping.
  virtual double Step(std::span<float> weights, std::span<const float> gradient) = 0;
  // The learning rate, weight decay and clip (Muon's as well: see above), and AdamW's betas and
  // epsilon. Changes take effect at the next Step (a fine-tuning phase lowers the learning rate).
  virtual AdamWConfig& config() = 0;
  virtual uint64_t steps() const = 0;
  virtual OptimizerKind kind() const = 0;
};

class AdamW : public Optimizer {
 public:
  AdamW(const TinyLmLayout& layout, AdamWConfig config);
  // Updates only the tensors `tensors` (indices into layout.parameters()); the clip still uses
  // the norm of the whole gradient. Muon hands its other tensors to one of these.
  AdamW(const TinyLmLayout& layout, AdamWConfig config, std::vector<size_t> tensors);
  double Step(std::span<float> weights, std::span<const float> gradient) override;
  AdamWConfig& config() override { return config_; }
  uint64_t steps() const override { return steps_; }
  OptimizerKind kind() const override { return OptimizerKind::kAdamW; }

 private:
  const TinyLmLayout& layout_;
  AdamWConfig config_;
  std::vector<size_t> tensors_;
  std::vector<float> m_, v_;
  uint64_t steps_ = 0;
};

struct MuonConfig {
  double momentum = 0.95;
  bool nesterov = true;
  int newton_schulz_steps = 5;
};

class Muon : public Optimizer {
 public:
  // `config` as for AdamW (learning rate, weight decay and clip for every tensor); `threads`
  // orthogonalise the matrices in parallel.
  Muon(const TinyLmLayout& layout, AdamWConfig config, MuonConfig muon = {}, int threads = 1);
  double Step(std::span<float> weights, std::span<const float> gradient) override;
  AdamWConfig& config() override { return adamw_.config(); }
  uint64_t steps() const override { return adamw_.steps(); }
  OptimizerKind kind() const override { return OptimizerKind::kMuon; }

  // A block of a hidden matrix orthogonalised on its own: rows x cols elements, element (r, c) at
  // offset + r * stride + c of the flat buffer.
  struct Block {
    size_t offset, rows, cols, stride;
  };
  const std::vector<Block>& blocks() const { return blocks_; }

 private:
  AdamW adamw_;  // the tensors that are not hidden matrices
  MuonConfig muon_;
  int threads_;
  std::vector<Block> blocks_;
  std::vector<float> momentum_;  // the layout's size; only the blocks' elements are used
};

// Moonshot's factor for Muon's orthogonalised update of a rows x cols matrix: 0.2 sqrt(max(rows,
// cols)), which brings the update's RMS to about 0.2, AdamW's.
double MuonUpdateScale(size_t rows, size_t cols);

// AdamW or Muon over `layout` (Muon orthogonalises on `threads` threads).
std::unique_ptr<Optimizer> MakeOptimizer(OptimizerKind kind, const TinyLmLayout& layout,
                                         const AdamWConfig& config, int threads = 1);

// Muon's orthogonalisation of the rows x cols row-major matrix `x`, in place: `steps` iterations
// of the Newton-Schulz quintic X <- a X + (b A + c A A) X with A = X X^T and (a, b, c) = (3.4445,
// -4.7750, 2.0315), on X / (||X||_F + 1e-7), on the transpose when rows > cols (so A is the
// smaller Gram matrix). Each singular value s of the normalised X becomes p(p(...p(s))) with
// p(s) = a s + b s^3 + c s^5, the singular vectors unchanged: with 5 steps every s in [0.005, 1]
// lands in [0.68, 1.16] (an approximate U V^T, as Muon intends; smaller ones stay smaller).
// Plain C++ matrix products, parallel over row blocks on `threads` threads; about
// steps * (4 r^2 c + 2 r^3) floating-point operations with r = min(rows, cols), c = max.
void NewtonSchulz(std::span<float> x, size_t rows, size_t cols, int steps, int threads);

}  // namespace weft::examples
