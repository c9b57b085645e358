#include "common/concurrent.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace weft {

Status ForEachConcurrently(size_t count, int concurrency, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::optional<std::pair<size_t, Status>> first_error;
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < count && !failed.load(); i = next.fetch_add(1)) {
      Status status = fn(i);
      if (status.ok()) continue;
      std::lock_guard<std::mutex> lock(mutex);
      if (!first_error || i < first_error->first) first_error.emplace(i, std::move(status));
      failed.store(true);
    }
  };
  const size_t threads = std::min<size_t>(count, static_cast<size_t>(std::max(1, concurrency)));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& thread : helpers) thread.join();
  return first_error ? first_error->second : Status::Ok();
}

}  // namespace weft
