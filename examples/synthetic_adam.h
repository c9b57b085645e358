// A synthetic RL fine-tuning workload: FP32 master weights ~ N(0, init_std) updated by Adam
// (decoupled weight decay off) on noisy gradients; SyntheticMuon below is the same under Muon.
//
// Each element has a persistent gradient signal ~ N(0, signal_std) and every step adds fresh
// N(0, 1) noise, which is what per-step policy gradients look like: mostly noise with a small
// consistent direction. Adam normalises the step per element, so every weight moves by roughly
// the learning rate and the served (rounded) value changes only when it crosses a rounding
// threshold. That makes the per-step density of changed served elements realistic for a given
// learning rate and weight scale.
//
// Deterministic for a given seed and thread count independent (noise is drawn per block from a
// counter-based generator). Not thread-safe; Step() itself runs on `threads` threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sync/served_model.h"

namespace weft::examples {

struct SyntheticTensor {
  std::string name;
  std::vector<uint64_t> shape;
};

struct AdamConfig {
  double learning_rate = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  float init_std = 0.02f;
  float signal_std = 0.3f;
};

// SyntheticMuon's configuration.
struct SyntheticMuonConfig {
  // The learning rate (of both rules), the weights' and signal's scales, and the betas and epsilon
  // of the Adam that moves tensors that are not 2-D.
  AdamConfig adam;
  double momentum = 0.95;
  bool nesterov = true;
  int newton_schulz_steps = 5;
};

// The tensors, their optimiser state and the step count of SyntheticAdam and SyntheticMuon, which
// draw the same initial weights and the same gradients and differ only in the 2-D tensors' rule.
class SyntheticWorkload {
 public:
  // One optimiser step on every tensor.
  void Step(int threads);

  size_t tensor_count() const { return tensors_.size(); }
  const SyntheticTensor& tensor(size_t t) const { return tensors_[t]; }
  std::span<const float> weights(size_t t) const { return state_[t].weights; }
  uint64_t parameter_count() const;
  int steps_taken() const { return step_; }
  void set_learning_rate(double learning_rate) { config_.adam.learning_rate = learning_rate; }

 protected:
  // Muon moves the 2-D tensors if `muon`; Adam (config.adam) moves all the others.
  SyntheticWorkload(std::vector<SyntheticTensor> tensors, const SyntheticMuonConfig& config,
                    bool muon, uint64_t seed, int threads);

 private:
  struct State {
    // first_moment is Muon's momentum buffer for a tensor Muon moves (which has no
    // second_moment), Adam's first moment otherwise.
    std::vector<float> weights, first_moment, second_moment, signal;
  };
  bool MovedByMuon(size_t t) const { return muon_ && tensors_[t].shape.size() == 2; }

  std::vector<SyntheticTensor> tensors_;
  SyntheticMuonConfig config_;
  bool muon_;
  uint64_t seed_;
  int step_ = 0;
  std::vector<State> state_;
};

class SyntheticAdam : public SyntheticWorkload {
 public:
  SyntheticAdam(std::vector<SyntheticTensor> tensors, const AdamConfig& config, uint64_t seed,
                int threads);
};

// The same workload under Muon (examples/optimizers.h) instead of Adam: the same weights and
// the same noisy gradients (for equal tensors and seed, the very gradients SyntheticAdam draws),
// but each 2-D tensor moves by its orthogonalised momentum:
//   buffer = momentum * buffer + (1 - momentum) * g;  u = (1 - momentum) * g + momentum * buffer
//   w -= learning_rate * 0.2 * sqrt(max(rows, cols)) * NewtonSchulz(u)
// (Nesterov momentum; Moonshot's 0.2 * sqrt(max(rows, cols)) makes the update's RMS about 0.2, as
// Adam's is, so the same learning rates give comparable movement). Tensors that are not 2-D get
// Adam exactly as in SyntheticAdam. Under Muon an element's move is not about the learning rate
// for every element, as under Adam, but spread around a common RMS per matrix, which changes
// which served elements cross a rounding threshold.
//
// Cost: Newton-Schulz is matrix products, about newton_schulz_steps * (4 r^2 c + 2 r^3) operations
// per r x c tensor (r <= c) per step, 30 side^3 for a square one: 0.5 GFLOP at side 256, 4 GFLOP
// at 512, 32 GFLOP at 1024. The products are plain C++ (no BLAS), parallel over row blocks: keep
// sides at 512 or below on a few CPU cores (codec_bench-sized 4096^2 tensors would take minutes
// per step). Everything else is as SyntheticAdam: deterministic for a seed, the same for any
// thread count, not thread-safe; Step() runs on `threads` threads.
class SyntheticMuon : public SyntheticWorkload {
 public:
  SyntheticMuon(std::vector<SyntheticTensor> tensors, const SyntheticMuonConfig& config,
                uint64_t seed, int threads);
};

// The master weights as the publisher takes them (views into `workload`, valid until its next
// Step).
std::vector<sync::MasterTensor> MasterView(const SyntheticWorkload& workload);

// `count` (at most six) square attention and MLP projections of side `side`, as the benchmarks use.
std::vector<SyntheticTensor> ProjectionShapes(uint64_t side, size_t count);

}  // namespace weft::examples
