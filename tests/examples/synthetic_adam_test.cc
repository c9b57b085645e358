// The synthetic workloads: Muon's against Adam's on the same noisy gradients.
#include "examples/synthetic_adam.h"

#include <doctest/doctest.h>

#include <cmath>

namespace weft::examples {
namespace {

TEST_CASE("synthetic Muon: matrices move by Muon's RMS, the rest exactly as under Adam") {
  const std::vector<SyntheticTensor> shapes = {{"proj", {32, 48}}, {"norm", {50}}};
  SyntheticMuonConfig config;
  config.adam.learning_rate = 1e-4;
  SyntheticMuon muon(shapes, config, 9, 1), muon2(shapes, config, 9, 2);
  SyntheticAdam adam(shapes, config.adam, 9, 1);
  const std::vector<float> start(muon.weights(0).begin(), muon.weights(0).end());
  for (int i = 0; i < 3; ++i) {
    muon.Step(1);
    muon2.Step(2);
    adam.Step(1);
  }
  CHECK(muon.steps_taken() == 3);
  CHECK(muon.parameter_count() == 32 * 48 + 50);
  // Same seed and shapes: the same initial weights and, for the vector, the same Adam steps.
  CHECK(std::equal(start.begin(), start.end(),
                   SyntheticAdam(shapes, config.adam, 9, 1).weights(0).begin()));
  CHECK(std::equal(muon.weights(1).begin(), muon.weights(1).end(), adam.weights(1).begin()));
  // Thread count independent.
  for (size_t t = 0; t < 2; ++t)
    CHECK(std::equal(muon.weights(t).begin(), muon.weights(t).end(), muon2.weights(t).begin()));
  // Three steps of RMS about 0.2 lr each (0.68 to 1.16 of it, directions correlated by the
  // signal and the momentum): between 0.2 and 0.7 lr in all.
  double squares = 0;
  for (size_t i = 0; i < start.size(); ++i) {
    const double moved = static_cast<double>(muon.weights(0)[i]) - start[i];
    squares += moved * moved;
  }
  const double rms = std::sqrt(squares / static_cast<double>(start.size()));
  CHECK(rms > 0.2 * config.adam.learning_rate);
  CHECK(rms < 0.7 * config.adam.learning_rate);
  const std::vector<sync::MasterTensor> master = MasterView(muon);
  REQUIRE(master.size() == 2);
  CHECK(master[0].name == "proj");
  CHECK(master[0].shape == std::vector<uint64_t>{32, 48});
}

}  // namespace
}  // namespace weft::examples
