// Minimal leveled logging to stderr.
//
//   WEFT_LOG(kInfo) << "published version " << v;
//
// One line per statement, written with a single write so that lines from several threads do not
// interleave. The threshold is process-wide (SetLogLevel), read with relaxed atomics; everything
// here is thread-safe.
#pragma once

#include <sstream>

namespace weft {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

}  // namespace weft

#define WEFT_LOG(level)                                  \
  if (::weft::LogLevel::level < ::weft::GetLogLevel()) { \
  } else                                                 \
    ::weft::LogLine(::weft::LogLevel::level, __FILE__, __LINE__)
