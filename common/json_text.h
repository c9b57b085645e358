// Where values lie in JSON text, so that a large member (a trajectory group's samples) can be
// passed on as the text it came as instead of being parsed into a tree and printed again.
//
// The text must already be known to be valid JSON (a parser checked it first); these functions
// only find boundaries. They never read outside `text`, whatever it holds: on text that is not
// valid JSON they return positions that make no sense, never crash. Pure and thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::json_text {

// Checks that `text` is exactly one JSON value (RFC 8259; a leading byte order mark and white space
// around it allowed) in well-formed UTF-8, with no object repeating a key (compared after escapes
// are decoded), no object of more than 10000 members, and nesting at most `max_depth` arrays and
// objects deep. Returns "" when it is, or
// what is wrong and at which byte offset ("byte 17: a key repeated: \"cluster\""). It builds
// nothing: its memory is the nesting stack and the keys of the objects open at the moment, so it
// can run before a parser that builds a tree, on text from anyone.
// With `members`, the members of the top value when it is an object: each key (decoded) and the
// text of its value, in order, collected in the same pass.
struct TopMember {
  std::string key;
  std::string_view value;
};
std::string Validate(std::string_view text, size_t max_depth = 64,
                     std::vector<TopMember>* members = nullptr);

// The first position at or after `pos` that is not JSON white space.
size_t SkipSpace(std::string_view text, size_t pos);
// The position just past the value that starts at `begin` (white space before it is skipped).
size_t ValueEnd(std::string_view text, size_t begin);
// The text of the value of member `key` of the object that starts at `begin` (white space before
// it is skipped), or nullopt when it has none. A key repeated takes its last value, as parsers do;
// keys are compared after their escapes are decoded.
std::optional<std::string_view> Member(std::string_view text, size_t begin, std::string_view key);
// Where each element of the array that starts at `begin` starts.
std::vector<size_t> Elements(std::string_view text, size_t begin);

}  // namespace weft::json_text
