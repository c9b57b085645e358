// Names that travel in URLs, file names, metric labels and logs: cluster ids, regions, run ids.
// One rule for all of them, so a name accepted in one place can be used in every other: 1 to 128
// characters from [A-Za-z0-9._-], starting with a letter or a digit.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace weft {

inline constexpr size_t kMaxNameLength = 128;

// Ok, or kInvalidArgument saying what is wrong with `name`; `what` names it ("cluster id").
Status CheckName(std::string_view name, std::string_view what);

// `text` shown safely in an error or a log line: printable ASCII as it is, other bytes as \xNN,
// at most 64 bytes of it.
std::string Printable(std::string_view text);

}  // namespace weft
