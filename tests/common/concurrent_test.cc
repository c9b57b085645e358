#include "common/concurrent.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace weft {
namespace {

TEST_CASE("ForEachConcurrently: every index once, at most `concurrency` at a time") {
  std::vector<std::atomic<int>> seen(200);
  std::atomic<int> running{0}, most{0};
  REQUIRE(ForEachConcurrently(seen.size(), 5, [&](size_t i) {
            const int now = running.fetch_add(1) + 1;
            int previous = most.load();
            while (now > previous && !most.compare_exchange_weak(previous, now)) {
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            seen[i].fetch_add(1);
            running.fetch_sub(1);
            return Status::Ok();
          }).ok());
  for (auto& s : seen) CHECK(s.load() == 1);
  CHECK(most.load() <= 5);
  CHECK(ForEachConcurrently(0, 4, [](size_t) { return Internal("never called"); }).ok());
}

TEST_CASE(
    "ForEachConcurrently: the lowest failing index's error, and nothing new after a failure") {
  std::atomic<size_t> started{0};
  Status status = ForEachConcurrently(1000, 3, [&](size_t i) -> Status {
    started.fetch_add(1);
    if (i == 7 || i == 9) return NotFound("index " + std::to_string(i));
    return Status::Ok();
  });
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK(status.message() == "index 7");
  CHECK(started.load() < 1000);
}

}  // namespace
}  // namespace weft
