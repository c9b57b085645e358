// libFuzzer target: the sparse and context chunk decoders, fed directly (no checksum in the way).
// The first byte's top bit picks the decoder. Sparse: the first 16 bytes choose the header, the
// rest is the payload. Context: 64 bytes choose the header (and seed the base values the contexts
// come from), the rest is the payload. Anything decoded must be a well-formed change list, and
// re-encoding it must decode to the same list.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "sync/chunk_codec.h"
#include "sync/context_codec.h"

using namespace weft::sync;

namespace {

void CheckWellFormed(const ChangeList& decoded, uint32_t chunk, uint8_t width) {
  const uint64_t mask = width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
  for (size_t j = 0; j < decoded.size(); ++j) {
    if (decoded.offsets[j] >= chunk || decoded.residuals[j] == 0 || decoded.residuals[j] > mask ||
        (j > 0 && decoded.offsets[j] <= decoded.offsets[j - 1])) {
      std::abort();
    }
  }
}

int FuzzContext(const uint8_t* data, size_t size) {
  if (size < 64) return 0;
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};
  const DType dtype = types[(data[0] & 0x7F) % 5];
  const uint8_t width = static_cast<uint8_t>(Info(dtype).size);
  const uint32_t chunk = 1 + (data[1] | (data[2] << 8)) % 5000;  // any length, not only blocks
  // Base values from a generator seeded by the input: every exponent occurs.
  std::vector<uint8_t> base(size_t{chunk} * width);
  uint64_t state = data[3] | (uint64_t{data[4]} << 8) | 1;
  for (uint8_t& b : base) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(state >> 56);
  }
  ContextHeader header;
  header.exponent_low = data[5];
  header.k_big = data[6] % 32;
  header.k_mag = data[7] % 32;
  header.big_count = data[8] | (data[9] << 8);
  const size_t payload_size = size - 64;
  // The positions, then the three value streams.
  size_t cuts[3] = {payload_size * data[10] / 255, payload_size * data[11] / 255,
                    payload_size * data[12] / 255};
  if (cuts[0] > cuts[1]) std::swap(cuts[0], cuts[1]);
  if (cuts[1] > cuts[2]) std::swap(cuts[1], cuts[2]);
  if (cuts[0] > cuts[1]) std::swap(cuts[0], cuts[1]);
  for (int c = 0; c < kContexts; ++c) {
    const uint8_t* field = data + 16 + 3 * c;
    header.counts[c] = field[1] | (field[2] << 8);
    if (header.counts[c] == 0) continue;
    header.present |= static_cast<uint16_t>(1u << c);
    header.k_gap[c] = field[0] % 32;
  }
  header.gap_bytes = static_cast<uint32_t>(cuts[0]);
  header.sign_bytes = static_cast<uint32_t>(cuts[1] - cuts[0]);
  header.big_bytes = static_cast<uint32_t>(cuts[2] - cuts[1]);
  header.mag_bytes = static_cast<uint32_t>(payload_size - cuts[2]);
  ChangeList decoded;
  if (!DecodeContextChanges(header, {data + 64, payload_size}, dtype, base.data(), chunk, &decoded)
           .ok()) {
    return 0;
  }
  CheckWellFormed(decoded, chunk, width);
  ContextHeader again;
  std::vector<uint8_t> payload;
  EncodeContextChanges(decoded, dtype, base.data(), chunk, &again, &payload);
  ChangeList round_trip;
  if (!DecodeContextChanges(again, payload, dtype, base.data(), chunk, &round_trip).ok() ||
      round_trip.offsets != decoded.offsets || round_trip.residuals != decoded.residuals) {
    std::abort();
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && (data[0] & 0x80) != 0) return FuzzContext(data, size);
  if (size < 16) return 0;
  const uint8_t width_choice = data[0] % 4;  // 0: byte XOR, 1..3: ordered diff of width 1, 2, 4
  const uint8_t width = width_choice == 0 ? 1 : (width_choice == 3 ? 4 : width_choice);
  const ValueCoding coding = width_choice == 0 ? ValueCoding::kXor : ValueCoding::kOrderedDiff;
  const uint32_t chunk = 1u << (10 + data[1] % 7);
  SparseHeader header;
  header.k_gap = data[2] % 32;
  header.k_big = data[3] % 32;
  header.k_mag = data[4] % 32;
  header.change_count = data[5] | (data[6] << 8);
  header.big_count = data[7] | (data[8] << 8);
  const size_t payload_size = size - 16;
  // Split the payload into the four streams at positions chosen by bytes 9..14.
  size_t cuts[3] = {payload_size * data[9] / 255, payload_size * data[10] / 255,
                    payload_size * data[11] / 255};
  if (cuts[0] > cuts[1]) std::swap(cuts[0], cuts[1]);
  if (cuts[1] > cuts[2]) std::swap(cuts[1], cuts[2]);
  if (cuts[0] > cuts[1]) std::swap(cuts[0], cuts[1]);
  header.gap_bytes = static_cast<uint32_t>(cuts[0]);
  header.sign_bytes = static_cast<uint32_t>(cuts[1] - cuts[0]);
  header.big_bytes = static_cast<uint32_t>(cuts[2] - cuts[1]);
  header.mag_bytes = static_cast<uint32_t>(payload_size - cuts[2]);
  ChangeList decoded;
  if (!DecodeChanges(header, {data + 16, payload_size}, chunk, width, coding, &decoded).ok())
    return 0;
  CheckWellFormed(decoded, chunk, width);
  SparseHeader again;
  std::vector<uint8_t> payload;
  EncodeChanges(decoded, width, coding, &again, &payload);
  ChangeList round_trip;
  if (!DecodeChanges(again, payload, chunk, width, coding, &round_trip).ok() ||
      round_trip.offsets != decoded.offsets || round_trip.residuals != decoded.residuals) {
    std::abort();
  }
  return 0;
}
