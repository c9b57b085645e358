#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "tests/source_dir.h"

namespace weft::testing {

std::string SourceDir() { return WEFT_SOURCE_DIR; }

}  // namespace weft::testing
