#include "examples/synthetic_adam.h"

#include <cmath>

#include "common/parallel.h"

namespace weft::examples {
namespace {

constexpr uint64_t kBlock = 1 << 16;

// A small counter-based generator: every (seed, stream) pair gives an independent sequence.
class Random {
 public:
  Random(uint64_t seed, uint64_t stream)
      : state_(seed * 0x9E3779B97F4A7C15ull ^ (stream + 1) * 0xD1B54A32D192ED03ull) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1): the sum of four uniforms, rescaled (Irwin-Hall), which is plenty for
  // gradient noise and much faster than an exact sampler.
  float Normal() {
    uint64_t bits = Next();
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((bits >> (16 * i)) & 0xFFFF);
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
  }

 private:
  uint64_t state_;
};

uint64_t ElementCount(const SyntheticTensor& tensor) {
  uint64_t n = 1;
  for (uint64_t d : tensor.shape) n *= d;
  return n;
}

}  // namespace

SyntheticAdam::SyntheticAdam(std::vector<SyntheticTensor> tensors, const AdamConfig& config,
                             uint64_t seed, int threads)
    : tensors_(std::move(tensors)), config_(config), seed_(seed), state_(tensors_.size()) {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    uint64_t n = ElementCount(tensors_[t]);
    State& s = state_[t];
    s.weights.resize(n);
    s.first_moment.assign(n, 0.0f);
    s.second_moment.assign(n, 0.0f);
    s.signal.resize(n);
    size_t blocks = static_cast<size_t>((n + kBlock - 1) / kBlock);
    ParallelFor(blocks, threads, [&](size_t b) {
      Random random(seed_, (t << 40) | (uint64_t{1} << 39) | b);
      for (uint64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        s.weights[i] = config_.init_std * random.Normal();
        s.signal[i] = config_.signal_std * random.Normal();
      }
    });
  }
}

uint64_t SyntheticAdam::parameter_count() const {
  uint64_t total = 0;
  for (const State& s : state_) total += s.weights.size();
  return total;
}

void SyntheticAdam::Step(int threads) {
  ++step_;
  const float lr = static_cast<float>(config_.learning_rate);
  const float beta1 = static_cast<float>(config_.beta1);
  const float beta2 = static_cast<float>(config_.beta2);
  const float correction1 = static_cast<float>(1.0 - std::pow(config_.beta1, step_));
  const float correction2 = static_cast<float>(1.0 - std::pow(config_.beta2, step_));
  const float epsilon = static_cast<float>(config_.epsilon);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    State& s = state_[t];
    const uint64_t n = s.weights.size();
    size_t blocks = static_cast<size_t>((n + kBlock - 1) / kBlock);
    ParallelFor(blocks, threads, [&](size_t b) {
      Random random(seed_, (t << 40) | (static_cast<uint64_t>(step_) << 20) | b);
      for (uint64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        float gradient = s.signal[i] + random.Normal();
        float m = beta1 * s.first_moment[i] + (1.0f - beta1) * gradient;
        float v = beta2 * s.second_moment[i] + (1.0f - beta2) * gradient * gradient;
        s.first_moment[i] = m;
        s.second_moment[i] = v;
        s.weights[i] -= lr * (m / correction1) / (std::sqrt(v / correction2) + epsilon);
      }
    });
  }
}

std::vector<sync::MasterTensor> MasterView(const SyntheticAdam& adam) {
  std::vector<sync::MasterTensor> master;
  for (size_t t = 0; t < adam.tensor_count(); ++t)
    master.push_back({adam.tensor(t).name, adam.tensor(t).shape, adam.weights(t)});
  return master;
}

std::vector<SyntheticTensor> ProjectionShapes(uint64_t side, size_t count) {
  std::vector<SyntheticTensor> shapes;
  for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"}) {
    if (shapes.size() < count) shapes.push_back({name, {side, side}});
  }
  return shapes;
}

}  // namespace weft::examples
