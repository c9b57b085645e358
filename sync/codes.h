// Internal: the prefix codes of the delta codec's streams (docs/formats.md, "Sparse payload") and
// the three value streams (signs, large-change positions, magnitudes) that sparse and context
// chunks share. Use chunk_codec.h or context_codec.h instead.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sync/bit_stream.h"
#include "sync/dtype.h"

namespace weft::sync::detail {

inline constexpr int kRiceEscape = 24;  // unary prefixes reaching this length escape to 32 bits
inline constexpr int kMaxRiceParameter = 26;
inline constexpr int kMaxExpGolombOrder = 30;

inline uint32_t BytesFor(uint64_t bits) { return static_cast<uint32_t>((bits + 7) / 8); }

inline void PutRice(BitWriter& out, uint32_t value, int k) {
  const uint32_t quotient = value >> k;
  if (quotient < kRiceEscape) {
    // Unary quotient (zeros, then a one), then the k low bits: at most 24 + 26 bits.
    const uint64_t low = value & ((uint64_t{1} << k) - 1);
    out.Put((uint64_t{1} << quotient) | (low << (quotient + 1)),
            static_cast<int>(quotient) + 1 + k);
  } else {
    out.Put(0, kRiceEscape);
    out.Put(value, 32);
  }
}

// Decodes one Rice code; the reader must hold at least 56 bits unless the stream ends sooner.
inline uint32_t GetRice(BitReader& in, int k) {
  in.Refill();
  const uint64_t bits = in.bits();
  const int zeros = std::countr_zero(bits | (uint64_t{1} << kRiceEscape));
  if (zeros < kRiceEscape) {
    const uint32_t low = static_cast<uint32_t>(bits >> (zeros + 1)) & ((uint32_t{1} << k) - 1);
    in.Consume(zeros + 1 + k);
    return (static_cast<uint32_t>(zeros) << k) | low;
  }
  in.Consume(kRiceEscape);
  return static_cast<uint32_t>(in.Get(32));
}

inline uint64_t ExpGolombBits(uint32_t value, int k) {
  const uint64_t x = uint64_t{value} + (uint64_t{1} << k);
  const int length = std::bit_width(x);
  return 2 * static_cast<uint64_t>(length) - static_cast<uint64_t>(k) - 1;
}

// Exp-Golomb of order k: with x = value + 2^k of bit length L, L - k - 1 zeros, a one, then the
// low L - 1 bits of x.
inline void PutExpGolomb(BitWriter& out, uint32_t value, int k) {
  const uint64_t x = uint64_t{value} + (uint64_t{1} << k);
  const int length = std::bit_width(x);
  const int zeros = length - k - 1;
  out.Put(uint64_t{1} << zeros, zeros + 1);
  if (length > 1) out.Put(x & ((uint64_t{1} << (length - 1)) - 1), length - 1);
}

// The parameter in [0, max_k] that minimises the exact cost, and that cost. The cost of these
// codes is convex in k, so a local search from the estimate log2(mean) finds the minimum.
template <typename CostFn>
std::pair<int, uint64_t> ChooseParameter(double mean, int max_k, CostFn cost) {
  int best = mean < 1.0 ? 0 : std::min(max_k, static_cast<int>(std::log2(mean)));
  uint64_t best_cost = cost(best);
  for (int step : {-1, +1}) {
    for (int k = best + step; k >= 0 && k <= max_k; k += step) {
      const uint64_t c = cost(k);
      if (c >= best_cost) break;
      best = k;
      best_cost = c;
    }
  }
  return {best, best_cost};
}

// The exact size in bits of `values` Rice-coded with parameter k.
uint64_t RiceCost(std::span<const uint32_t> values, int k);

// The best Rice parameter for `values` (non-empty) and the stream's size in bits.
std::pair<int, uint64_t> ChooseRice(std::span<const uint32_t> values);

// The sizes and parameters of value streams as a header declares them.
struct ValueStreamHeader {
  uint8_t k_big = 0;
  uint8_t k_mag = 0;
  uint32_t change_count = 0;
  uint32_t big_count = 0;
  uint32_t sign_bytes = 0;
  uint32_t big_bytes = 0;
  uint32_t mag_bytes = 0;
};

// Signs, positions of the changes whose magnitude exceeds one, and their magnitudes, for
// residuals in change order (docs/formats.md, "Sparse payload", streams 2 to 4).
class ValueStreams {
 public:
  ValueStreams(std::span<const uint32_t> residuals, uint8_t width, ValueCoding coding);

  // What a chunk header declares of them.
  const ValueStreamHeader& header() const { return header_; }
  // Writes the three streams at `out`, which has room for them plus kBitWriterSlack bytes.
  void Write(uint8_t* out) const;

 private:
  ValueStreamHeader header_;
  std::vector<uint8_t> signs_;
  std::vector<uint32_t> big_gaps_;
  std::vector<uint32_t> big_values_;
};

// Checks the declared sizes against each other before anything is allocated: parameters in
// range, counts that the streams can hold, the sign stream's exact length.
Status CheckValueStreams(const ValueStreamHeader& header, ValueCoding coding);

// Decodes the three streams (`streams` holds them back to back) into residuals[0, change_count).
Status DecodeValueStreams(const ValueStreamHeader& header, std::span<const uint8_t> streams,
                          uint8_t width, ValueCoding coding, uint32_t* residuals);

}  // namespace weft::sync::detail
