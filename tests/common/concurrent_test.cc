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

TEST_CASE("ForEachConcurrently: nothing new starts after a failure") {
  // One thread takes the indices in order, so the count is exact: 0 to 7, and nothing after 7.
  std::atomic<size_t> started{0};
  Status status = ForEachConcurrently(1000, 1, [&](size_t i) -> Status {
    started.fetch_add(1);
    return i == 7 ? NotFound("index 7") : Status::Ok();
  });
  CHECK(status.message() == "index 7");
  CHECK(started.load() == 8);
}

TEST_CASE("ForEachConcurrently: the lowest failing index's error, whichever fails first") {
  // Index 7 fails only once index 9 has failed, so the later failure in time is the one reported.
  std::atomic<bool> nine_failed{false};
  Status status = ForEachConcurrently(1000, 3, [&](size_t i) -> Status {
    if (i == 9) {
      nine_failed.store(true);
      return NotFound("index 9");
    }
    if (i == 7) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!nine_failed.load() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return NotFound("index 7");
    }
    return Status::Ok();
  });
  CHECK(nine_failed.load());
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK(status.message() == "index 7");
}

}  // namespace
}  // namespace weft
