// Mutex and MutexLock: std::mutex and its scoped lock with clang's thread-safety annotations, so
// that the lock contracts of the classes using them (GUARDED_BY, REQUIRES) are checked when built
// with clang (-Wthread-safety, an error like every warning) rather than written as comments. With
// other compilers the annotations vanish and these are a std::mutex and a std::unique_lock.
//
//   class Queue {
//     void Push(int v) EXCLUDES(mutex_) { MutexLock lock(mutex_); items_.push_back(v); }
//     void PushLocked(int v) REQUIRES(mutex_);
//     Mutex mutex_;
//     std::vector<int> items_ GUARDED_BY(mutex_);
//   };
//
// A condition variable waits on lock.native(); a predicate reading guarded members says so:
// `cv.wait(lock.native(), [&]() REQUIRES(mutex_) { return !items_.empty(); })`.
#pragma once

#include <mutex>

#if defined(__clang__)
#define WEFT_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define WEFT_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) WEFT_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY WEFT_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) WEFT_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) WEFT_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) WEFT_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) WEFT_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) WEFT_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) WEFT_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) WEFT_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) WEFT_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS WEFT_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace weft {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mutex_.lock(); }
  void Unlock() RELEASE() { mutex_.unlock(); }
  // Takes the mutex only if it is free: true when it did.
  bool TryLock() TRY_ACQUIRE(true) { return mutex_.try_lock(); }
  std::mutex& native() RETURN_CAPABILITY(this) { return mutex_; }

 private:
  std::mutex mutex_;
};

// Holds `mutex` from construction to destruction, or between Unlock() and Lock() calls.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : lock_(mutex.native()) {}
  // Takes over `mutex`, held already (after a TryLock that succeeded).
  MutexLock(Mutex& mutex, std::adopt_lock_t) REQUIRES(mutex)
      : lock_(mutex.native(), std::adopt_lock) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }
  // The lock a condition variable waits with: released while it waits, held again after.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace weft
