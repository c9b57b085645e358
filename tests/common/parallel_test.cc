#include "common/parallel.h"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace weft {
namespace {

TEST_CASE("ParallelFor visits every index exactly once") {
  for (int threads : {1, 2, 8}) {
    std::vector<std::atomic<int>> seen(1000);
    ParallelFor(seen.size(), threads, [&](size_t i) { seen[i].fetch_add(1); });
    for (auto& s : seen) CHECK(s.load() == 1);
  }
  ParallelFor(0, 4, [](size_t) { FAIL("called for an empty range"); });
}

TEST_CASE("ParallelFor nests and runs from several threads at once without deadlock") {
  std::atomic<int> total{0};
  // Nested: the inner loops run inline on whichever thread runs the outer item.
  ParallelFor(8, 4, [&](size_t) { ParallelFor(10, 4, [&](size_t) { total.fetch_add(1); }); });
  CHECK(total.load() == 80);
  // Concurrent callers: one holds the pool, the others run inline; every index still runs once.
  total = 0;
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round)
        ParallelFor(100, 3, [&](size_t) { total.fetch_add(1); });
    });
  }
  for (auto& caller : callers) caller.join();
  CHECK(total.load() == 4 * 50 * 100);
}

}  // namespace
}  // namespace weft
