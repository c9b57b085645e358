#include "common/names.h"

#include <cstdio>

namespace weft {
namespace {

bool Alphanumeric(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

std::string Printable(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02X", c);
      out += escaped;
    }
  }
  if (text.size() > 64) out += "...";
  return out;
}

Status CheckName(std::string_view name, std::string_view what) {
  const std::string label(what);
  if (name.empty() || name.size() > kMaxNameLength) {
    return InvalidArgument(label + " must be 1 to " + std::to_string(kMaxNameLength) +
                           " characters (it has " + std::to_string(name.size()) + ")");
  }
  for (char c : name) {
    if (!Alphanumeric(c) && c != '.' && c != '_' && c != '-') {
      return InvalidArgument(label + " '" + Printable(name) +
                             "' has a character outside [A-Za-z0-9._-]");
    }
  }
  if (!Alphanumeric(name.front()))
    return InvalidArgument(label + " '" + Printable(name) +
                           "' must start with a letter or a digit");
  return Status::Ok();
}

}  // namespace weft
