#include "common/json_text.h"

#include <array>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

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

// The UTF-8 sequence starting at text[i] (a byte >= 0x80): its length, or 0 when it is not
// well-formed (overlong, a surrogate, above U+10FFFF, truncated, a stray continuation byte).
size_t Utf8Length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) low = 0xA0;
    if (c == 0xED) high = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (text.size() - i < length) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

// The bytes a string may hold as they are: printable ASCII but the quote and the backslash.
constexpr auto kPlain = [] {
  std::array<bool, 256> plain{};
  for (int c = 0x20; c < 0x80; ++c) plain[c] = c != '"' && c != '\\';
  return plain;
}();

// A checking scanner: one pass, an explicit stack, no tree.
class Validator {
 public:
  static constexpr size_t kMaxMembers = 10000;

  Validator(std::string_view text, size_t max_depth, std::vector<TopMember>* members)
      : text_(text), max_depth_(max_depth), members_(members) {}

  std::string Run() {
    if (text_.starts_with("\xEF\xBB\xBF")) pos_ = 3;
    if (!Value()) return error_;
    pos_ = SkipSpace(text_, pos_);
    if (pos_ != text_.size()) Fail("text after the JSON value");
    return error_;
  }

 private:
  struct Frame {
    bool object = false;
    std::unordered_set<std::string_view> keys;  // an object's keys so far (into text_ or decoded)
    std::deque<std::string> decoded;            // keys that had escapes, decoded
  };

  bool Fail(const std::string& what) {
    if (error_.empty()) error_ = "byte " + std::to_string(pos_) + ": " + what;
    return false;
  }
  bool At(char c) {
    pos_ = SkipSpace(text_, pos_);
    return pos_ < text_.size() && text_[pos_] == c;
  }

  // One value, with everything nested in it (iteratively: the depth is bounded by max_depth_, the
  // C++ stack is not used for it).
  bool Value() {
    std::vector<Frame> stack;
    while (true) {
      // A value starts here.
      pos_ = SkipSpace(text_, pos_);
      if (pos_ >= text_.size()) return Fail("the text ends where a value should be");
      const char c = text_[pos_];
      const bool top_member = stack.size() == 1 && stack[0].object;
      if (top_member) member_begin_ = pos_;
      bool opened = false;
      if (c == '{' || c == '[') {
        if (stack.size() >= max_depth_)
          return Fail("nested more than " + std::to_string(max_depth_) + " deep");
        ++pos_;
        stack.emplace_back();
        stack.back().object = c == '{';
        opened = true;
        if (At(c == '{' ? '}' : ']')) {
          ++pos_;
          stack.pop_back();
          opened = false;
        } else if (c == '{' && !Key(&stack.back(), stack.size() == 1)) {
          return false;
        }
      } else if (c == '"') {
        if (!String(nullptr)) return false;
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (!Number()) return false;
      } else if (!Literal("true") && !Literal("false") && !Literal("null")) {
        return Fail("not a JSON value");
      }
      if (opened) continue;  // its first element or member value is next
      if (top_member) EndMember();
      // The value is complete: close what ends here, then move to the next element or member.
      while (true) {
        if (stack.empty()) return true;
        Frame& frame = stack.back();
        if (At(',')) {
          ++pos_;
          if (frame.object && !Key(&frame, stack.size() == 1)) return false;
          break;
        }
        if (At(frame.object ? '}' : ']')) {
          ++pos_;
          stack.pop_back();
          if (stack.size() == 1 && stack[0].object) EndMember();  // a top member's value closed
          continue;
        }
        return Fail(frame.object ? "expected ',' or '}' in an object"
                                 : "expected ',' or ']' in an array");
      }
    }
  }

  // The value of a member of the top object ends at pos_.
  void EndMember() {
    if (members_ != nullptr)
      members_->push_back({std::move(key_), text_.substr(member_begin_, pos_ - member_begin_)});
  }

  // A member's key and its colon; the key must be new in `frame` (the top object when `top`).
  bool Key(Frame* frame, bool top) {
    if (!At('"')) return Fail("expected a string key");
    const size_t begin = pos_;
    std::string decoded;
    bool escaped = false;
    if (!String(&decoded, &escaped)) return false;
    if (frame->keys.size() >= kMaxMembers)
      return Fail("an object with more than " + std::to_string(kMaxMembers) + " members");
    std::string_view key = text_.substr(begin + 1, pos_ - begin - 2);
    if (escaped) key = frame->decoded.emplace_back(std::move(decoded));
    if (!frame->keys.insert(key).second) {
      pos_ = begin;
      return Fail("a key repeated in one object: " + std::string(text_.substr(begin, 64)));
    }
    if (top && members_ != nullptr) key_ = std::string(key);
    if (!At(':')) return Fail("expected ':' after a key");
    ++pos_;
    return true;
  }

  // A string at pos_ (an opening quote); `decoded` (if given) receives its value when it has
  // escapes (`*escaped` says whether it had).
  bool String(std::string* decoded, bool* escaped = nullptr) {
    ++pos_;
    size_t plain = pos_;  // start of the run not yet copied to `decoded`
    auto flush = [&](size_t end) {
      if (decoded != nullptr) decoded->append(text_.substr(plain, end - plain));
    };
    while (true) {
      // Plain characters in a run (most of any string), then whatever needs a look.
      while (pos_ < text_.size() && kPlain[static_cast<unsigned char>(text_[pos_])]) ++pos_;
      if (pos_ >= text_.size()) return Fail("a string is not closed");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        flush(pos_);
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("a control character in a string (it must be escaped)");
      if (c >= 0x80) {
        const size_t length = Utf8Length(text_, pos_);
        if (length == 0) return Fail("a string is not well-formed UTF-8");
        pos_ += length;
        continue;
      }
      if (c != '\\') {
        ++pos_;
        continue;
      }
      flush(pos_);
      if (escaped != nullptr) *escaped = true;
      if (pos_ + 1 >= text_.size()) return Fail("a string ends in an escape");
      const char e = text_[pos_ + 1];
      const char* simple = "\"\\/bfnrt";
      const char* meaning = "\"\\/\b\f\n\r\t";
      if (const char* found = std::strchr(simple, e); found != nullptr && e != 0) {
        if (decoded != nullptr) decoded->push_back(meaning[found - simple]);
        pos_ += 2;
      } else if (e == 'u') {
        uint32_t code = 0;
        if (!Hex4(pos_ + 2, &code)) return Fail("a \\u escape without four hex digits");
        pos_ += 6;
        if (code >= 0xDC00 && code <= 0xDFFF) return Fail("a lone low surrogate escape");
        if (code >= 0xD800 && code <= 0xDBFF) {
          uint32_t low = 0;
          if (pos_ + 1 >= text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u' ||
              !Hex4(pos_ + 2, &low) || low < 0xDC00 || low > 0xDFFF) {
            return Fail("a high surrogate escape without its low surrogate");
          }
          pos_ += 6;
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        if (decoded != nullptr) AppendUtf8(code, decoded);
      } else {
        return Fail("an unknown escape in a string");
      }
      plain = pos_;
    }
  }

  bool Hex4(size_t at, uint32_t* code) {
    if (text_.size() < at + 4) return false;
    *code = 0;
    for (size_t k = 0; k < 4; ++k) {
      const int digit = HexDigit(text_[at + k]);
      if (digit < 0) return false;
      *code = *code * 16 + static_cast<uint32_t>(digit);
    }
    return true;
  }

  bool Digits() {
    const size_t begin = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ > begin;
  }

  bool Number() {
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (!Digits()) {
      return Fail("a number without digits");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!Digits()) return Fail("a number with no digits after its point");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!Digits()) return Fail("a number with no digits in its exponent");
    }
    return true;
  }

  bool Literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  std::string_view text_;
  size_t max_depth_;
  std::vector<TopMember>* members_;
  size_t pos_ = 0;
  size_t member_begin_ = 0;  // where the value of the current top member starts
  std::string key_;          // the current top member's key
  std::string error_;
};

}  // namespace

std::string Validate(std::string_view text, size_t max_depth, std::vector<TopMember>* members) {
  if (members != nullptr) members->clear();
  return Validator(text, max_depth, members).Run();
}

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
