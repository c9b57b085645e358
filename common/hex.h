// Lowercase hexadecimal text: what digests, hashes and tokens are written as.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace weft {

// Two lowercase hex digits per byte.
std::string HexEncode(std::span<const uint8_t> bytes);
// Whether `text` holds only the digits 0-9 and a-f (an empty text does).
bool IsLowerHex(std::string_view text);

}  // namespace weft
