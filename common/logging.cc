#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>

namespace weft {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

LogLine::LogLine(LogLevel level, const char* file, int line) {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &utc);
  const char* base = std::strrchr(file, '/');
  stream_ << LevelLetter(level) << ' ' << stamp << '.' << (millis < 100 ? "0" : "")
          << (millis < 10 ? "0" : "") << millis << ' ' << (base ? base + 1 : file) << ':' << line
          << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  std::string text = stream_.str();
  // One write per line keeps concurrent lines whole; a short write to stderr is not worth a retry.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace weft
