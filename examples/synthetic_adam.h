// A synthetic RL fine-tuning workload: FP32 master weights ~ N(0, init_std) updated by Adam
// (decoupled weight decay off) on noisy gradients.
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

class SyntheticAdam {
 public:
  SyntheticAdam(std::vector<SyntheticTensor> tensors, const AdamConfig& config, uint64_t seed,
                int threads);

  // One optimiser step on every tensor.
  void Step(int threads);

  size_t tensor_count() const { return tensors_.size(); }
  const SyntheticTensor& tensor(size_t t) const { return tensors_[t]; }
  std::span<const float> weights(size_t t) const { return state_[t].weights; }
  uint64_t parameter_count() const;
  int steps_taken() const { return step_; }
  void set_learning_rate(double learning_rate) { config_.learning_rate = learning_rate; }

 private:
  struct State {
    std::vector<float> weights, first_moment, second_moment, signal;
  };
  std::vector<SyntheticTensor> tensors_;
  AdamConfig config_;
  uint64_t seed_;
  int step_ = 0;
  std::vector<State> state_;
};

// The master weights as the publisher takes them (views into `adam`, valid until its next Step).
std::vector<sync::MasterTensor> MasterView(const SyntheticAdam& adam);

// `count` (at most six) square attention and MLP projections of side `side`, as the benchmarks use.
std::vector<SyntheticTensor> ProjectionShapes(uint64_t side, size_t count);

}  // namespace weft::examples
