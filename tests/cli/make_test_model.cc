// weft_make_test_model OUT.safetensors SEED VERSION
//
// Writes a deterministic model for the CLI tests: FP32 weight matrices ~ N(0, 0.02) with special
// values (NaN payloads, infinities, signed zeros, subnormals) and one tensor of every other dtype.
// A fifth argument "small" makes every tensor tiny (fuzzing seeds), "big" makes the matrices 16
// times taller (about 7 MB), "huge" 64 times (about 29 MB). VERSION > 0 applies that many small
// update steps, so versions 0, 1, 2 ... of the same seed differ the way consecutive training steps
// do.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "sync/safetensors.h"
#include "tests/sync/test_util.h"

using namespace weft::sync;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s OUT.safetensors SEED VERSION [small]\n", argv[0]);
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const int version = std::atoi(argv[3]);
  const std::string size = argc == 5 ? argv[4] : "";
  if (!size.empty() && size != "small" && size != "big" && size != "huge") {
    std::fprintf(stderr, "the fifth argument is 'small', 'big' or 'huge', not '%s'\n",
                 size.c_str());
    return 2;
  }
  const int scale = size == "small" ? 20 : 1;  // tiny tensors, for fuzzing seeds
  // About 7 MB ("big") or 29 MB ("huge"), for transfers that take a while; "huge" is more than
  // loopback socket buffers hold, so a server killed mid-transfer really cuts it.
  const int grow = size == "big" ? 16 : size == "huge" ? 64 : 1;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  struct Owned {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Owned> tensors;
  for (auto [name, rows, cols] : {std::tuple{"model.layers.0.attn.q_proj.weight", 300, 260},
                                  std::tuple{"model.layers.0.mlp.up_proj.weight", 257, 130},
                                  std::tuple{"model.norm.weight", 1, 260}}) {
    rows = std::max(1, rows / scale) * (rows > 1 ? grow : 1);
    cols = std::max(8, cols / scale);
    std::vector<float> w(static_cast<size_t>(rows) * cols);
    for (float& x : w) x = normal(rng);
    const float specials[] = {NAN, -INFINITY, INFINITY, -0.0f, 1e-41f, -3e-39f, 1e5f};
    for (size_t i = 0; i < std::size(specials); ++i) w[i * 17] = specials[i];
    std::vector<uint8_t> bytes(w.size() * 4);
    std::memcpy(bytes.data(), w.data(), bytes.size());
    std::vector<uint64_t> shape = rows == 1 ? std::vector<uint64_t>{uint64_t(cols)}
                                            : std::vector<uint64_t>{uint64_t(rows), uint64_t(cols)};
    tensors.push_back({name, DType::kF32, shape, bytes});
  }
  for (DType dtype : testing::kAllDTypes) {
    if (dtype == DType::kF32) continue;
    tensors.push_back({"extra." + std::string(Info(dtype).safetensors_name),
                       dtype,
                       {7, uint64_t(91 / scale)},
                       testing::RandomTensor(dtype, 7 * (91 / scale), rng)});
  }
  // Each version: FP32 weights take a small step (most BF16/FP8 values stay put), other tensors
  // change in about 2% of their elements.
  for (int v = 1; v <= version; ++v) {
    std::mt19937_64 step_rng(seed * 1000 + v);
    for (Owned& t : tensors) {
      if (t.dtype == DType::kF32) {
        float* w = reinterpret_cast<float*>(t.bytes.data());
        for (size_t i = 0; i < t.bytes.size() / 4; ++i)
          w[i] -= 2e-5f * std::normal_distribution<float>(0, 1)(step_rng);
      } else {
        t.bytes = testing::Perturb(t.bytes, t.dtype, 0.02, step_rng);
      }
    }
  }
  std::vector<TensorToWrite> out;
  for (const Owned& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes});
  weft::Status status = WriteSafetensors(argv[1], out, {{"format", "pt"}});
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
