#include "common/logging.h"

#include <doctest/doctest.h>

namespace weft {
namespace {

int Counted(int* calls) {
  ++*calls;
  return *calls;
}

TEST_CASE("log lines below the threshold are not even evaluated") {
  LogLevel saved = GetLogLevel();
  int calls = 0;
  SetLogLevel(LogLevel::kWarning);
  WEFT_LOG(kInfo) << "skipped " << Counted(&calls);
  CHECK(calls == 0);
  WEFT_LOG(kError) << "logged " << Counted(&calls);
  CHECK(calls == 1);
  SetLogLevel(LogLevel::kDebug);
  CHECK(GetLogLevel() == LogLevel::kDebug);
  WEFT_LOG(kDebug) << "logged " << Counted(&calls);
  CHECK(calls == 2);
  SetLogLevel(saved);
}

}  // namespace
}  // namespace weft
