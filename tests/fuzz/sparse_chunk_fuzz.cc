// libFuzzer target: the sparse chunk decoder, fed directly (no checksum in the way). The first 16
// bytes choose the header, the rest is the payload. Anything decoded must be a well-formed change
// list, and re-encoding it must decode to the same list.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "sync/chunk_codec.h"

using namespace weft::sync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
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
  const uint64_t mask = width == 4 ? 0xFFFFFFFFull : (uint64_t{1} << (8 * width)) - 1;
  for (size_t j = 0; j < decoded.size(); ++j) {
    if (decoded.offsets[j] >= chunk || decoded.residuals[j] == 0 || decoded.residuals[j] > mask ||
        (j > 0 && decoded.offsets[j] <= decoded.offsets[j - 1])) {
      std::abort();
    }
  }
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
