#include "common/concurrent.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace weft {

Status ForEachConcurrently(size_t count, int concurrency, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Mutex mutex;
  std::optional<std::pair<size_t, Status>> first_error;  // under `mutex` while helpers run
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < count && !failed.load(); i = next.fetch_add(1)) {
      Status status = fn(i);
      if (status.ok()) continue;
      MutexLock lock(mutex);
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

namespace {

// The blocking pool: threads that take tasks from one queue and end once idle for a while.
class BlockingPool {
 public:
  void Run(std::function<void()> task) EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    tasks_.push_back(std::move(task));
    // Every queued task needs a thread of its own: an idle one, or a new one.
    if (tasks_.size() <= static_cast<size_t>(idle_)) {
      wake_.notify_one();
    } else if (threads_ < kMaxBlockingThreads) {
      ++threads_;
      std::thread([this] { Work(); }).detach();
    }
  }

 private:
  void Work() EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    while (true) {
      ++idle_;
      const bool woken = wake_.wait_for(lock.native(), std::chrono::seconds(10),
                                        [this]() REQUIRES(mutex_) { return !tasks_.empty(); });
      --idle_;
      if (!woken) break;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.Unlock();
      task();
      task = nullptr;  // what it held goes before the thread waits again
      lock.Lock();
    }
    --threads_;
  }

  Mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mutex_);
  int threads_ GUARDED_BY(mutex_) = 0;
  int idle_ GUARDED_BY(mutex_) = 0;
};

}  // namespace

void RunBlocking(std::function<void()> task) {
  // Never destroyed: detached threads may still use it while the process exits.
  static BlockingPool* pool = new BlockingPool;
  pool->Run(std::move(task));
}

}  // namespace weft
