#include "sync/serving.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace weft::sync {
namespace {

std::vector<float> Weights(size_t count, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> w(count);
  for (float& v : w) v = normal(rng);
  w[3] = NAN;
  w[5] = -INFINITY;
  w[7] = 1e30f;
  return w;
}

TEST_CASE("serving: every format converts like its scalar reference, from any element on") {
  CHECK(IsServingFormat(DType::kBF16));
  CHECK(IsServingFormat(DType::kF8E5M2));
  CHECK(!IsServingFormat(DType::kF32));
  CHECK(!IsServingFormat(DType::kI8));
  const std::vector<uint64_t> shape = {40, 70};
  const std::vector<float> w = Weights(40 * 70, 3);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    for (uint32_t block : {0u, 16u}) {
      CAPTURE(static_cast<int>(dtype));
      CAPTURE(block);
      const ServedValues served = Serve(w, shape, dtype, block, Saturation::kSaturateFinite);
      const bool fp8 = Info(dtype).size == 1;
      CHECK(served.bytes.size() == w.size() * Info(dtype).size);
      CHECK(served.scales.size() == (fp8 ? served.scaling.scale_count() : 0));
      for (size_t i = 0; i < w.size(); ++i) {
        if (dtype == DType::kBF16) {
          uint16_t got;
          std::memcpy(&got, &served.bytes[2 * i], 2);
          if (!std::isnan(w[i])) CHECK(got == FloatToBf16Ref(w[i]));
        } else if (dtype == DType::kF16) {
          uint16_t got;
          std::memcpy(&got, &served.bytes[2 * i], 2);
          if (!std::isnan(w[i])) CHECK(got == FloatToF16Ref(w[i]));
        } else {
          const Fp8Format format = dtype == DType::kF8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
          const float scale = served.scales[served.scaling.ScaleIndex(i / 70, i % 70)];
          CHECK(served.bytes[i] ==
                FloatToFp8Ref(w[i] / scale, format, Saturation::kSaturateFinite));
        }
      }
      // A slice converted on its own, from its first element's index, equals the same bytes.
      const size_t first = 333, count = 1000;
      const ServeFormat format{dtype, Saturation::kSaturateFinite, fp8 ? &served.scaling : nullptr,
                               served.scales};
      std::vector<uint8_t> slice(count * Info(dtype).size);
      ConvertToServing(format, std::span<const float>(w).subspan(first, count), first, slice);
      CHECK(
          std::equal(slice.begin(), slice.end(),
                     served.bytes.begin() + static_cast<std::ptrdiff_t>(first * Info(dtype).size)));
    }
  }
}

}  // namespace
}  // namespace weft::sync
