#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace weft {
namespace {

thread_local bool t_inside_parallel_for = false;

class Pool {
 public:
  // Runs the job on `helpers` pool threads plus the caller. Returns false, without running
  // anything, when another caller holds the pool.
  bool TryRun(size_t count, size_t helpers, const std::function<void(size_t)>& fn)
      EXCLUDES(caller_mutex_, mutex_) {
    if (!caller_mutex_.TryLock()) return false;
    MutexLock caller(caller_mutex_, std::adopt_lock);
    {
      MutexLock lock(mutex_);
      while (threads_.size() < helpers) {
        size_t id = threads_.size();
        threads_.emplace_back([this, id] { WorkerLoop(id); });
      }
      fn_ = &fn;
      count_ = count;
      next_.store(0, std::memory_order_relaxed);
      participants_ = helpers;
      running_.store(helpers, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    work_ready_.notify_all();
    Work();
    // Helpers usually finish within microseconds of the caller: spin briefly before sleeping.
    SpinUntil([this] { return running_.load(std::memory_order_acquire) == 0; });
    MutexLock lock(mutex_);
    work_done_.wait(lock.native(),
                    [this] { return running_.load(std::memory_order_acquire) == 0; });
    fn_ = nullptr;
    return true;
  }

  ~Pool() {
    {
      MutexLock lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

 private:
  void Work() {
    t_inside_parallel_for = true;
    for (size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < count_;
         i = next_.fetch_add(1, std::memory_order_relaxed)) {
      (*fn_)(i);
    }
    t_inside_parallel_for = false;
  }

  // Calls `done` until it returns true or about 20 microseconds have passed.
  template <typename Predicate>
  static void SpinUntil(Predicate done) {
    for (int i = 0; i < 4000 && !done(); ++i) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }

  void WorkerLoop(size_t id) EXCLUDES(mutex_) {
    uint64_t seen = 0;
    while (true) {
      // A job usually follows the previous one closely: spin briefly before sleeping.
      SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; });
      MutexLock lock(mutex_);
      work_ready_.wait(lock.native(), [&]() REQUIRES(mutex_) {
        return stopping_ || generation_.load(std::memory_order_relaxed) != seen;
      });
      if (stopping_) return;
      seen = generation_.load(std::memory_order_relaxed);
      if (id >= participants_) continue;
      lock.Unlock();
      Work();
      lock.Lock();
      if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) work_done_.notify_one();
    }
  }

  Mutex caller_mutex_;  // one job at a time
  Mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  std::vector<std::thread> threads_ GUARDED_BY(mutex_);
  // The job: written under mutex_ before generation_ moves on, read by the helpers that saw the
  // new generation (under mutex_) and by the caller, unlocked, until the job is done.
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t count_ = 0;
  std::atomic<size_t> next_{0};
  size_t participants_ GUARDED_BY(mutex_) = 0;
  std::atomic<size_t> running_{0};       // helpers still working on the current job
  std::atomic<uint64_t> generation_{0};  // written under mutex_, read by spinning helpers too
  bool stopping_ GUARDED_BY(mutex_) = false;
};

Pool& GlobalPool() {
  static Pool pool;
  return pool;
}

void RunInline(size_t count, const std::function<void(size_t)>& fn) {
  for (size_t i = 0; i < count; ++i) fn(i);
}

}  // namespace

void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& fn) {
  size_t workers = std::min<size_t>(threads < 1 ? 1 : static_cast<size_t>(threads), count);
  if (workers <= 1 || t_inside_parallel_for) return RunInline(count, fn);
  if (!GlobalPool().TryRun(count, workers - 1, fn)) RunInline(count, fn);
}

int HardwareThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace weft
