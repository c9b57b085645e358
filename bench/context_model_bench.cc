// Which models of a delta's positions and values would make context-coded deltas smaller, measured
// on real optimiser steps: each idea's adaptive code length, next to the independent-positions
// floor and the bytes weft's plain and context modes write for the same step.
//
// Workload: the example policy (TinyLm, d_model 128 and d_ff 512 unless --d-model says otherwise)
// warmed up by supervised AdamW steps, then fine-tuned with AdamW at 1e-6, 3e-6 and 3e-5; the
// weights after 9, 10 and 11 fine-tuning steps are served as BF16 and as FP8 E4M3 with 128 x 128
// block scales. The step coded is 10 -> 11 (codec_bench's real step); a replica that applied
// 9 -> 10 knows that step too.
//
// An idea is a context: what the receiver knows when it decodes an element (its base value, the
// changes it has already decoded, the previous step). Its cost is the code length of an adaptive
// model with that context: Krichevsky-Trofimov estimates per context, learnt from nothing at the
// start of every tensor, the size an arithmetic coder driven by the model writes (to within a few
// bytes per tensor). It includes the model's learning, so a context that splits the data too
// finely shows as a loss. Three parts of a delta are modelled separately:
//  - positions: one binary event per element, "changed", in row-major order;
//  - signs: one per change, the direction of the order-preserving difference;
//  - magnitudes: one per change, the size class of |difference| (its bit length) adaptively and
//    the bits below the leading one as they are.
//
// The floor is codec_bench's: per tensor, n * H(changes / n) plus, per change, the empirical
// entropy of the signed difference. weft's streams are the positions, signs and magnitudes it
// writes without file, tensor and chunk headers; its totals include them.
//
// Usage: build/bench/context_model_bench [--quick] [--d-model N]
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/real_step_workload.h"
#include "common/parallel.h"
#include "sync/served_model.h"

namespace {

using namespace weft;
using namespace weft::sync;

// Adaptive code lengths, in bits: Krichevsky-Trofimov (Dirichlet 1/2) estimates over a fixed
// alphabet, one set of counts per context.
class AdaptiveModel {
 public:
  AdaptiveModel(size_t contexts, int symbols)
      : symbols_(symbols), counts_(contexts * symbols, 0), totals_(contexts, 0) {}
  // The cost of coding `symbol` in `context`, after which the model learns it.
  double Code(size_t context, int symbol) {
    uint32_t& count = counts_[context * symbols_ + symbol];
    const double p = (count + 0.5) / (totals_[context] + 0.5 * symbols_);
    ++count;
    ++totals_[context];
    return -std::log2(p);
  }

 private:
  int symbols_;
  std::vector<uint32_t> counts_;
  std::vector<uint32_t> totals_;
};

double BinaryEntropy(double p) {
  return p <= 0 || p >= 1 ? 0 : -p * std::log2(p) - (1 - p) * std::log2(1 - p);
}

int BitLength(uint64_t x) { return x == 0 ? 0 : 64 - __builtin_clzll(x); }

// The position ideas, each a context for "this element changed".
enum Position {
  kOneRate,
  kExponent,
  kLeft,
  kAbove,
  kPrevious,
  kEdge,
  kNeighbours,
  kAll,
  kPositions
};
constexpr const char* kPositionNames[kPositions] = {
    "one rate per tensor (the floor's model)",
    "base exponent (weft's context mode)",
    "exponent + left neighbour changed",
    "exponent + element above changed (rows)",
    "exponent + changed in the previous step",
    "exponent + mantissa at a binade edge",
    "exponent + left + above",
    "exponent + left + above + previous + edge",
};
// The sign ideas.
enum Sign { kSignBit, kSignAdaptive, kSignPrevious, kSignLast, kSignExponent, kSigns };
constexpr const char* kSignNames[kSigns] = {
    "one bit (weft)",
    "adaptive, one per tensor",
    "previous step's direction here",
    "direction of the last change decoded",
    "base exponent",
};
// The magnitude ideas.
enum Magnitude { kMagnitudeTensor, kMagnitudeExponent, kMagnitudePrevious, kMagnitudes };
constexpr const char* kMagnitudeNames[kMagnitudes] = {
    "one distribution per tensor",
    "base exponent",
    "base exponent + previous step's size here",
};

struct Sizes {
  std::array<double, kPositions> positions{};
  std::array<double, kSigns> signs{};
  std::array<double, kMagnitudes> magnitudes{};
  double floor = 0;  // bits
  uint64_t changes = 0, elements = 0;
};

// Exponent field position and width of a dtype's bit pattern (the sign masked off).
struct ExponentField {
  int shift;
  uint32_t mask;
  uint32_t mantissa_mask;
};
ExponentField FieldOf(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {7, 0xFF, 0x7F};
    case DType::kF16:
      return {10, 0x1F, 0x3FF};
    case DType::kF8E4M3:
      return {3, 0x0F, 0x7};
    case DType::kF8E5M2:
      return {2, 0x1F, 0x3};
    default:
      return {23, 0xFF, 0x7FFFFF};
  }
}

// Adds the code lengths of every idea for one tensor's step a -> b, p being the step before a.
template <typename T>
void MeasureTensor(const TensorSpec& spec, const uint8_t* p_bytes, const uint8_t* a_bytes,
                   const uint8_t* b_bytes, Sizes* sizes) {
  const uint64_t n = spec.element_count();
  const KeyKind kind = KeyKindFor(spec.dtype);
  const ExponentField field = FieldOf(spec.dtype);
  const uint64_t columns = spec.shape.size() >= 2 ? spec.shape.back() : 0;
  constexpr int kWidth = 8 * sizeof(T);
  constexpr int kSizeClasses = kWidth + 1;
  const size_t exponents = field.mask + 1;
  std::vector<AdaptiveModel> positions;
  for (int idea = 0; idea < kPositions; ++idea) positions.emplace_back(exponents * 16, 2);
  std::vector<AdaptiveModel> signs;
  for (int idea = 0; idea < kSigns; ++idea) signs.emplace_back(exponents * 3, 2);
  std::vector<AdaptiveModel> magnitudes;
  for (int idea = 0; idea < kMagnitudes; ++idea)
    magnitudes.emplace_back(exponents * (kSizeClasses + 1), kSizeClasses);
  std::vector<uint8_t> changed(n, 0);
  std::map<int64_t, uint64_t> histogram;
  uint64_t changes = 0;
  int last_sign = 0;
  auto load = [](const uint8_t* bytes, uint64_t i) {
    T x;
    std::memcpy(&x, bytes + i * sizeof(T), sizeof(T));
    return x;
  };
  constexpr T kMagnitudeBits = static_cast<T>(static_cast<T>(~T{0}) >> 1);
  for (uint64_t i = 0; i < n; ++i) {
    const T p = load(p_bytes, i), a = load(a_bytes, i), b = load(b_bytes, i);
    const size_t e = ((a & kMagnitudeBits) >> field.shift) & field.mask;
    const uint32_t mantissa = a & field.mantissa_mask;
    const int edge = mantissa == 0 || mantissa == field.mantissa_mask;
    const int left = i > 0 && (columns == 0 || i % columns != 0) ? changed[i - 1] : 0;
    const int above = columns != 0 && i >= columns ? changed[i - columns] : 0;
    const int previous = p != a;
    const int x = a != b;
    changed[i] = static_cast<uint8_t>(x);
    const std::array<size_t, kPositions> context = {
        0,
        e,
        e * 16 + left,
        e * 16 + above,
        e * 16 + previous,
        e * 16 + edge,
        e * 16 + left * 2 + above,
        e * 16 + left * 8 + above * 4 + previous * 2 + edge,
    };
    for (int idea = 0; idea < kPositions; ++idea)
      sizes->positions[idea] += positions[idea].Code(context[idea], x);
    if (!x) continue;
    ++changes;
    const T residual = Residual<T>(kind, a, b);
    const auto d = static_cast<std::make_signed_t<T>>(residual);
    ++histogram[d];
    const int sign = kind == KeyKind::kXor ? 0 : d < 0;
    const uint64_t m = kind == KeyKind::kXor ? residual
                       : d < 0               ? uint64_t{0} - static_cast<uint64_t>(int64_t{d})
                                             : static_cast<uint64_t>(d);
    // The previous step here: its direction (0 none, 1 up, 2 down) and size class.
    int previous_direction = 0, previous_class = 0;
    if (previous) {
      const auto pd = static_cast<std::make_signed_t<T>>(Residual<T>(kind, p, a));
      previous_direction = pd < 0 ? 2 : 1;
      const uint64_t pm = kind == KeyKind::kXor ? Residual<T>(kind, p, a)
                          : pd < 0              ? uint64_t{0} - static_cast<uint64_t>(int64_t{pd})
                                                : static_cast<uint64_t>(pd);
      previous_class = BitLength(pm);
    }
    if (kind != KeyKind::kXor) {
      const std::array<size_t, kSigns> sign_context = {
          0, 0, static_cast<size_t>(previous_direction), static_cast<size_t>(last_sign), e};
      sizes->signs[kSignBit] += 1;
      for (int idea = kSignAdaptive; idea < kSigns; ++idea)
        sizes->signs[idea] += signs[idea].Code(sign_context[idea], sign);
      last_sign = 1 + sign;
    }
    const int size_class = BitLength(m);
    const double low_bits = size_class - 1;  // the bits below the leading one, as they are
    const std::array<size_t, kMagnitudes> magnitude_context = {
        0, e, e * (kSizeClasses + 1) + previous_class};
    for (int idea = 0; idea < kMagnitudes; ++idea)
      sizes->magnitudes[idea] +=
          magnitudes[idea].Code(magnitude_context[idea], size_class) + low_bits;
  }
  if (changes > 0) {
    double value_entropy = 0;
    for (const auto& [value, count] : histogram) {
      const double q = static_cast<double>(count) / changes;
      value_entropy -= q * std::log2(q);
    }
    sizes->floor += n * BinaryEntropy(static_cast<double>(changes) / n) + changes * value_entropy;
  }
  sizes->changes += changes;
  sizes->elements += n;
}

Sizes Measure(const ServedModel& p, const ServedModel& a, const ServedModel& b) {
  Sizes sizes;
  for (size_t t = 0; t < a.tensors().size(); ++t) {
    const auto& spec = a.tensors()[t].spec;
    const uint8_t *pb = p.tensors()[t].bytes.data(), *ab = a.tensors()[t].bytes.data(),
                  *bb = b.tensors()[t].bytes.data();
    switch (Info(spec.dtype).size) {
      case 1:
        MeasureTensor<uint8_t>(spec, pb, ab, bb, &sizes);
        break;
      case 2:
        MeasureTensor<uint16_t>(spec, pb, ab, bb, &sizes);
        break;
      default:
        MeasureTensor<uint32_t>(spec, pb, ab, bb, &sizes);
        break;
    }
  }
  return sizes;
}

int Run(bool quick, int d_model) {
  const int threads = HardwareThreads();
  const bench::RealStepWorkload workload =
      bench::MakeRealStepWorkload("context_model_bench", quick, d_model, threads, 9, 3);
  std::printf(
      "Bits per changed element: adaptive code lengths of each idea (positions + signs + "
      "magnitudes), the independent-positions floor, and what weft writes for the same step.\n");
  for (const bench::RealStepVersions& run : workload.rates) {
    const double lr = run.learning_rate;
    const std::vector<std::vector<float>>& versions = run.weights;
    for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
      const ServingPlan plan{dtype, 128, Saturation::kSaturateFinite};
      std::vector<ServedModel> served;
      for (const auto& w : versions) {
        auto model = ServedModel::FromMaster(workload.layout.Master(w), plan, threads);
        if (!model.ok()) {
          std::fprintf(stderr, "context_model_bench: %s\n", model.status().ToString().c_str());
          return 1;
        }
        served.push_back(std::move(*model));
      }
      const Sizes sizes = Measure(served[0], served[1], served[2]);
      // What weft writes for 11 -> 12 in each mode.
      std::array<DeltaStats, 2> weft;
      for (DeltaMode mode : {DeltaMode::kPlain, DeltaMode::kContext}) {
        ServedModel publisher = std::move(
            ServedModel::FromMaster(workload.layout.Master(versions[1]), plan, threads).value());
        auto delta = publisher.Update(workload.layout.Master(versions[2]),
                                      {kDefaultChunkLog2, threads, mode});
        if (!delta.ok()) {
          std::fprintf(stderr, "context_model_bench: %s\n", delta.status().ToString().c_str());
          return 1;
        }
        weft[mode == DeltaMode::kContext] = ComputeStats(*delta);
      }
      const double per_change = 1.0 / sizes.changes;
      const double floor = sizes.floor * per_change;
      auto bits = [&](uint64_t bytes) { return 8.0 * bytes * per_change; };
      std::printf("\n%s lr=%.0e: %llu changes in %llu elements (%.3f%%), %zu tensors\n",
                  dtype == DType::kBF16 ? "bf16" : "fp8-b128", lr,
                  static_cast<unsigned long long>(sizes.changes),
                  static_cast<unsigned long long>(sizes.elements),
                  100.0 * sizes.changes / sizes.elements, served[1].tensors().size());
      std::printf("  %-46s %8.2f\n", "floor (independent positions)", floor);
      for (int mode = 0; mode < 2; ++mode) {
        const DeltaStats& s = weft[mode];
        std::printf("  weft %-7s streams %6.2f (%.3fx floor), with headers %6.2f (%.3fx floor)\n",
                    mode ? "context" : "plain", bits(s.total_bytes - s.header_bytes),
                    bits(s.total_bytes - s.header_bytes) / floor, bits(s.total_bytes),
                    bits(s.total_bytes) / floor);
      }
      std::printf("  %-46s %8s %9s\n", "positions", "bits", "vs exp.");
      for (int idea = 0; idea < kPositions; ++idea)
        std::printf("  %-46s %8.3f %+8.1f%%\n", kPositionNames[idea],
                    sizes.positions[idea] * per_change,
                    100.0 * (sizes.positions[idea] / sizes.positions[kExponent] - 1));
      std::printf("  %-46s %8s %9s\n", "signs", "bits", "vs bit");
      for (int idea = 0; idea < kSigns; ++idea)
        std::printf("  %-46s %8.3f %+8.1f%%\n", kSignNames[idea], sizes.signs[idea] * per_change,
                    100.0 * (sizes.signs[idea] / sizes.signs[kSignBit] - 1));
      std::printf("  %-46s %8s %9s\n", "magnitudes", "bits", "vs tensor");
      for (int idea = 0; idea < kMagnitudes; ++idea)
        std::printf("  %-46s %8.3f %+8.1f%%\n", kMagnitudeNames[idea],
                    sizes.magnitudes[idea] * per_change,
                    100.0 * (sizes.magnitudes[idea] / sizes.magnitudes[kMagnitudeTensor] - 1));
      double best_positions = sizes.positions[0], best_signs = sizes.signs[0],
             best_magnitudes = sizes.magnitudes[0];
      for (double s : sizes.positions) best_positions = std::min(best_positions, s);
      for (double s : sizes.signs) best_signs = std::min(best_signs, s);
      for (double s : sizes.magnitudes) best_magnitudes = std::min(best_magnitudes, s);
      const double current = (sizes.positions[kExponent] + sizes.signs[kSignBit] +
                              sizes.magnitudes[kMagnitudeTensor]) *
                             per_change;
      const double best = (best_positions + best_signs + best_magnitudes) * per_change;
      std::printf("  %-46s %8.3f (%.3fx floor)\n", "adaptive, weft's contexts", current,
                  current / floor);
      std::printf("  %-46s %8.3f (%.3fx floor)\n", "adaptive, best idea of each part", best,
                  best / floor);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int d_model = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--d-model" && i + 1 < argc) {
      d_model = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: context_model_bench [--quick] [--d-model N]\n");
      return 2;
    }
  }
  return Run(quick, d_model);
}
