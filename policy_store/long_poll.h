// LongPolls: a store server's long polls on the objects that change (a run's `latest` pointer;
// docs/api.md, "Waiting for a change").
//
// A GET of such an object with `Prefer: wait=N` (and, usually, `If-None-Match` with the ETag of the
// value the client holds) is answered as soon as the object holds another value (200 with it, or
// 404 once it is gone), or after N seconds with 304 Not Modified (404 for an object that is still
// absent), every answer saying `Preference-Applied: wait=N`. For each key with a poll waiting, one
// thread watches the backend (ObjectStore::WaitForChange) for all of them: a relay holds one
// upstream wait however many readers wait on it, and a backend that cannot push (S3) is read once
// per `poll_interval` for all of them, not once per reader. A poll is never answered 304 before
// the key has been read since its watch started. While the backend fails, polls whose wait ends
// are answered with its error. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/http_server.h"
#include "common/mutex.h"
#include "policy_store/object_store.h"

namespace weft::policy_store {

// The wait a request asks for in its Prefer header (RFC 7240: `Prefer: wait=N`, N whole seconds,
// among other preferences separated by commas), at most `longest`; nullopt when it asks none.
// kInvalidArgument for a wait that is not a whole number of seconds.
Result<std::optional<std::chrono::seconds>> PreferredWait(const weft::http::RequestHeader& request,
                                                          std::chrono::seconds longest);

class LongPolls {
 public:
  // Keys watched at once at most (a run's `latest` and its readers' pins).
  static constexpr size_t kMaxWatchedKeys = 64;

  explicit LongPolls(ObjectStore& backend,
                     std::chrono::milliseconds poll_interval = std::chrono::milliseconds(100));
  ~LongPolls();
  LongPolls(const LongPolls&) = delete;
  LongPolls& operator=(const LongPolls&) = delete;

  // Takes a GET of `key` that asked to wait `wait`: it is answered through `respond` at once when
  // the value it holds is not the key's, or when that changes, or when the wait ends. False (the
  // request not taken: the caller serves it as a plain GET) when kMaxWatchedKeys other keys are
  // watched already, so that requests for many keys cannot start a thread each.
  bool Add(const weft::http::RequestHeader& request, const std::string& key,
           std::chrono::seconds wait, const weft::http::Responder& respond) EXCLUDES(mutex_);
  // Answers every poll still waiting with 503 and waits for the watching threads to end (within
  // about a second: a watch of a remote backend is cancelled). Add() afterwards answers 503.
  void Stop() EXCLUDES(mutex_);

  size_t waiting() const EXCLUDES(mutex_);
  // Calls to the backend to read or watch a key (for a relay: requests to its upstream).
  uint64_t backend_calls() const { return backend_calls_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Poll {
    weft::http::RequestHeader request;
    std::optional<std::string> etag;  // of the value the client holds; none: it holds none
    std::chrono::seconds wait;
    Clock::time_point deadline;
    weft::http::Responder respond;
  };
  // A key with polls, watched by a thread (forgotten when its watch ends).
  struct Key {
    bool known = false;  // `value` has been read since the watch started
    std::optional<std::string> value;
    std::string etag;  // of `value`, when it holds one
    Status error;      // of the backend's last answer
    std::vector<Poll> polls;
  };
  // An answer to give once the lock is released.
  struct Answer {
    weft::http::Responder respond;
    weft::http::Response response;
  };

  void Watch(std::string key) EXCLUDES(mutex_);
  void Expire() EXCLUDES(mutex_);
  // Whether `poll` holds something other than the key's value (it is answered at once).
  static bool Differs(const Key& state, const Poll& poll);
  // The answer to `poll` from what the key holds now (`expired`: its wait ended unchanged).
  static weft::http::Response AnswerOf(const Key& state, const std::string& key, const Poll& poll,
                                       bool expired);
  static void Give(std::vector<Answer>& answers);

  ObjectStore& backend_;
  const std::chrono::milliseconds poll_interval_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> backend_calls_{0};
  mutable Mutex mutex_;
  std::condition_variable changed_;  // a poll added, a key read, a watch ended, the stop
  std::map<std::string, Key> keys_ GUARDED_BY(mutex_);
  int watchers_ GUARDED_BY(mutex_) = 0;
  bool stopped_ GUARDED_BY(mutex_) = false;
  std::thread expiry_;
};

}  // namespace weft::policy_store
