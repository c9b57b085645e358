#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace weft {
namespace {

// Splits "1.5GiB" into 1.5 and "gib" (lower case); false when there is no number.
bool SplitNumber(const std::string& text, double* number, std::string* unit) {
  const char* begin = text.c_str();
  char* end = nullptr;
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
    return false;
  *number = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(*number) || *number < 0) return false;
  unit->clear();
  for (const char* c = end; *c != '\0'; ++c) {
    if (*c == ' ' && unit->empty()) continue;
    unit->push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(*c))));
  }
  return true;
}

}  // namespace

Result<uint64_t> ParseByteSize(const std::string& text) {
  double number = 0;
  std::string unit;
  const std::string expected = "'" + text +
                               "' is not a byte size (expected a number with an optional unit: B, "
                               "KB, MB, GB, TB, KiB, MiB, GiB, TiB)";
  if (!SplitNumber(text, &number, &unit)) return InvalidArgument(expected);
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"b", 1},
                                                          {"k", 1e3},
                                                          {"kb", 1e3},
                                                          {"m", 1e6},
                                                          {"mb", 1e6},
                                                          {"g", 1e9},
                                                          {"gb", 1e9},
                                                          {"t", 1e12},
                                                          {"tb", 1e12},
                                                          {"kib", 1024.0},
                                                          {"mib", 1048576.0},
                                                          {"gib", 1073741824.0},
                                                          {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = number * scale;
    if (bytes >= 1.8e19) return InvalidArgument("'" + text + "' is too large");
    return static_cast<uint64_t>(std::llround(bytes));
  }
  return InvalidArgument(expected);
}

Result<std::chrono::microseconds> ParseDuration(const std::string& text) {
  double number = 0;
  std::string unit;
  const std::string expected =
      "'" + text + "' is not a duration (expected a number with a unit: us, ms, s, m, h)";
  if (!SplitNumber(text, &number, &unit)) return InvalidArgument(expected);
  static const std::pair<const char*, double> kUnits[] = {
      {"us", 1}, {"ms", 1e3}, {"s", 1e6}, {"m", 6e7}, {"h", 3.6e9}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double micros = number * scale;
    if (micros >= 9e18) return InvalidArgument("'" + text + "' is too long");
    return std::chrono::microseconds(static_cast<int64_t>(std::llround(micros)));
  }
  return InvalidArgument(expected);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

}  // namespace weft
