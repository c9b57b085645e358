#include "common/json_text.h"

#include <nlohmann/json.hpp>
#include <string>

namespace weft::json_text {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// `pos` is at an opening quote; the position just past the closing one.
size_t StringEnd(std::string_view text, size_t pos) {
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  return text.size();
}

// Whether the quoted string text[begin, end) means `key`.
bool KeyIs(std::string_view text, size_t begin, size_t end, std::string_view key) {
  const std::string_view quoted = text.substr(begin, end - begin);
  if (quoted.size() < 2) return false;
  const std::string_view inner = quoted.substr(1, quoted.size() - 2);
  if (inner.find('\\') == std::string_view::npos) return inner == key;
  const nlohmann::json decoded = nlohmann::json::parse(quoted, nullptr, false);
  return decoded.is_string() && decoded.get_ref<const std::string&>() == key;
}

}  // namespace

size_t SkipSpace(std::string_view text, size_t pos) {
  while (pos < text.size() && IsSpace(text[pos])) ++pos;
  return pos;
}

size_t ValueEnd(std::string_view text, size_t begin) {
  size_t i = SkipSpace(text, begin);
  if (i >= text.size()) return text.size();
  if (text[i] == '"') return StringEnd(text, i);
  if (text[i] != '{' && text[i] != '[') {
    // A number or a literal: up to the next delimiter.
    while (i < text.size() && !IsSpace(text[i]) && text[i] != ',' && text[i] != ']' &&
           text[i] != '}')
      ++i;
    return i;
  }
  size_t depth = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      i = StringEnd(text, i) - 1;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return text.size();
}

std::optional<std::string_view> Member(std::string_view text, size_t begin, std::string_view key) {
  size_t i = SkipSpace(text, begin);
  if (i >= text.size() || text[i] != '{') return std::nullopt;
  std::optional<std::string_view> found;
  ++i;
  while (true) {
    i = SkipSpace(text, i);
    if (i >= text.size() || text[i] != '"') return found;  // '}' (or not an object after all)
    const size_t key_end = StringEnd(text, i);
    const bool wanted = KeyIs(text, i, key_end, key);
    i = SkipSpace(text, key_end);
    if (i >= text.size() || text[i] != ':') return found;
    const size_t value_begin = SkipSpace(text, i + 1);
    const size_t value_end = ValueEnd(text, value_begin);
    if (wanted) found = text.substr(value_begin, value_end - value_begin);
    i = SkipSpace(text, value_end);
    if (i >= text.size() || text[i] != ',') return found;
    ++i;
  }
}

std::vector<size_t> Elements(std::string_view text, size_t begin) {
  std::vector<size_t> starts;
  size_t i = SkipSpace(text, begin);
  if (i >= text.size() || text[i] != '[') return starts;
  i = SkipSpace(text, i + 1);
  if (i < text.size() && text[i] == ']') return starts;
  while (i < text.size()) {
    starts.push_back(i);
    i = SkipSpace(text, ValueEnd(text, i));
    if (i >= text.size() || text[i] != ',') break;
    i = SkipSpace(text, i + 1);
  }
  return starts;
}

}  // namespace weft::json_text
