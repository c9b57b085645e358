// Deterministic random numbers for the simulator: the same seed gives the same draws on every
// platform (no std::*_distribution, whose output the standard leaves to the library). Each entity
// draws from its own stream, derived from the seed and the entity's number, so that adding a
// cluster does not change what the others draw.
#pragma once

#include <cmath>
#include <cstdint>

namespace weft::sim {

inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// xoshiro256**.
class Rng {
 public:
  Rng() : Rng(0, 0) {}
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t state = seed ^ (stream * 0xD1B54A32D192ED03ULL);
    for (uint64_t& word : s_) word = SplitMix64(state);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n).
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  bool Chance(double p) { return Uniform() < p; }
  // Exponential with the given mean.
  double Exponential(double mean) { return -mean * std::log1p(-Uniform()); }
  // Standard normal (Box-Muller, one of the pair).
  double Normal() {
    const double u = 1.0 - Uniform();  // (0, 1]
    const double v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  // Lognormal with the given median and sigma (sigma 0: the median).
  double Lognormal(double median, double sigma) {
    return sigma == 0 ? median : median * std::exp(sigma * Normal());
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace weft::sim
