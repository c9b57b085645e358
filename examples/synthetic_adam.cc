#include "examples/synthetic_adam.h"

#include <cmath>

#include "common/parallel.h"
#include "examples/optimizers.h"

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

size_t BlockCount(uint64_t n) { return static_cast<size_t>((n + kBlock - 1) / kBlock); }

// The generator of tensor t's initial values, and of its noise at a step.
Random InitialRandom(uint64_t seed, size_t t, size_t block) {
  return Random(seed, (uint64_t{t} << 40) | (uint64_t{1} << 39) | block);
}
Random StepRandom(uint64_t seed, size_t t, int step, size_t block) {
  return Random(seed, (uint64_t{t} << 40) | (static_cast<uint64_t>(step) << 20) | block);
}

void Initialize(uint64_t seed, size_t t, uint64_t n, const AdamConfig& config, int threads,
                std::vector<float>& weights, std::vector<float>& signal) {
  weights.resize(n);
  signal.resize(n);
  ParallelFor(BlockCount(n), threads, [&](size_t b) {
    Random random = InitialRandom(seed, t, b);
    for (uint64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      weights[i] = config.init_std * random.Normal();
      signal[i] = config.signal_std * random.Normal();
    }
  });
}

// Calls apply(i, gradient) for every element i of tensor t at `step`: its signal plus the step's
// noise.
template <typename Apply>
void ForEachGradient(uint64_t seed, size_t t, int step, std::span<const float> signal, int threads,
                     const Apply& apply) {
  const uint64_t n = signal.size();
  ParallelFor(BlockCount(n), threads, [&](size_t b) {
    Random random = StepRandom(seed, t, step, b);
    for (uint64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
      apply(i, signal[i] + random.Normal());
  });
}

// Adam's update of one element (bias corrections computed once per step).
struct AdamStep {
  float learning_rate, beta1, beta2, correction1, correction2, epsilon;
  AdamStep(const AdamConfig& config, int step)
      : learning_rate(static_cast<float>(config.learning_rate)),
        beta1(static_cast<float>(config.beta1)),
        beta2(static_cast<float>(config.beta2)),
        correction1(static_cast<float>(1.0 - std::pow(config.beta1, step))),
        correction2(static_cast<float>(1.0 - std::pow(config.beta2, step))),
        epsilon(static_cast<float>(config.epsilon)) {}
  void Apply(float gradient, float& weight, float& first_moment, float& second_moment) const {
    const float m = beta1 * first_moment + (1.0f - beta1) * gradient;
    const float v = beta2 * second_moment + (1.0f - beta2) * gradient * gradient;
    first_moment = m;
    second_moment = v;
    weight -= learning_rate * (m / correction1) / (std::sqrt(v / correction2) + epsilon);
  }
};

}  // namespace

SyntheticWorkload::SyntheticWorkload(std::vector<SyntheticTensor> tensors,
                                     const SyntheticMuonConfig& config, bool muon, uint64_t seed,
                                     int threads)
    : tensors_(std::move(tensors)),
      config_(config),
      muon_(muon),
      seed_(seed),
      state_(tensors_.size()) {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    State& s = state_[t];
    Initialize(seed_, t, ElementCount(tensors_[t]), config_.adam, threads, s.weights, s.signal);
    s.first_moment.assign(s.weights.size(), 0.0f);
    if (!MovedByMuon(t)) s.second_moment.assign(s.weights.size(), 0.0f);
  }
}

uint64_t SyntheticWorkload::parameter_count() const {
  uint64_t total = 0;
  for (const State& s : state_) total += s.weights.size();
  return total;
}

void SyntheticWorkload::Step(int threads) {
  ++step_;
  const AdamStep adam(config_.adam, step_);
  const float beta = static_cast<float>(config_.momentum);
  std::vector<float> update;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    State& s = state_[t];
    if (!MovedByMuon(t)) {
      ForEachGradient(seed_, t, step_, s.signal, threads, [&](uint64_t i, float g) {
        adam.Apply(g, s.weights[i], s.first_moment[i], s.second_moment[i]);
      });
      continue;
    }
    const uint64_t n = s.weights.size();
    update.resize(n);
    ForEachGradient(seed_, t, step_, s.signal, threads, [&](uint64_t i, float g) {
      s.first_moment[i] = beta * s.first_moment[i] + (1.0f - beta) * g;
      update[i] =
          config_.nesterov ? (1.0f - beta) * g + beta * s.first_moment[i] : s.first_moment[i];
    });
    const uint64_t rows = tensors_[t].shape[0], cols = tensors_[t].shape[1];
    NewtonSchulz(update, rows, cols, config_.newton_schulz_steps, threads);
    const float step = static_cast<float>(config_.adam.learning_rate * MuonUpdateScale(rows, cols));
    ParallelFor(BlockCount(n), threads, [&](size_t b) {
      for (uint64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i)
        s.weights[i] -= step * update[i];
    });
  }
}

SyntheticAdam::SyntheticAdam(std::vector<SyntheticTensor> tensors, const AdamConfig& config,
                             uint64_t seed, int threads)
    : SyntheticWorkload(std::move(tensors), SyntheticMuonConfig{.adam = config}, /*muon=*/false,
                        seed, threads) {}

SyntheticMuon::SyntheticMuon(std::vector<SyntheticTensor> tensors,
                             const SyntheticMuonConfig& config, uint64_t seed, int threads)
    : SyntheticWorkload(std::move(tensors), config, /*muon=*/true, seed, threads) {}

std::vector<sync::MasterTensor> MasterView(const SyntheticWorkload& workload) {
  std::vector<sync::MasterTensor> master;
  for (size_t t = 0; t < workload.tensor_count(); ++t)
    master.push_back({workload.tensor(t).name, workload.tensor(t).shape, workload.weights(t)});
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
