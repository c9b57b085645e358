// The small TinyLm the examples tests train: small enough for many steps under the sanitizers.
#pragma once

#include "examples/tiny_lm.h"

namespace weft::examples::testing {

inline TinyLmConfig SmallTinyLm(int layers, int max_seq) {
  TinyLmConfig config;
  config.d_model = 16;
  config.layers = layers;
  config.heads = 2;
  config.d_ff = 32;
  config.max_seq = max_seq;
  return config;
}

}  // namespace weft::examples::testing
