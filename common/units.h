// Parsing of the sizes, rates and durations that flags and configs take.
//
// ParseByteSize: a non-negative number with an optional unit: B, K/KB, M/MB, G/GB, T/TB (powers of
// 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive: "512", "64MiB", "1.5G".
// ParseDuration: a non-negative number with a unit: us, ms, s, m, h ("50ms", "2.5s", "10m").
// Errors name the text and what was expected. FormatBytes prints a size in binary units
// ("512 B", "1.5 KiB", "10.0 GiB").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace weft {

Result<uint64_t> ParseByteSize(const std::string& text);
Result<std::chrono::microseconds> ParseDuration(const std::string& text);
std::string FormatBytes(double bytes);

}  // namespace weft
