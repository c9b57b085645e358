// Work that waits (network requests), not computation (that is ParallelFor's job, on the shared
// pool):
//
// ForEachConcurrently runs fn(i) for i in [0, count) on up to `concurrency` threads of its own.
// Indices are handed out in order from a shared counter. Once a call fails, no new index starts;
// the calls already running finish. Returns the error of the lowest failing index, so the same
// failure is reported whatever the timing.
//
// RunBlocking runs a task that may block (a call to a remote store) on the process's blocking
// pool, so that the thread asking (a server's I/O thread) never waits: threads are started as
// tasks need them, up to kMaxBlockingThreads, and end after a few seconds without work; tasks
// beyond that wait in order. A task must not throw. Tasks still queued or running when the process
// exits are abandoned.
#pragma once

#include <cstddef>
#include <functional>

#include "common/status.h"

namespace weft {

Status ForEachConcurrently(size_t count, int concurrency, const std::function<Status(size_t)>& fn);

inline constexpr int kMaxBlockingThreads = 256;
void RunBlocking(std::function<void()> task);

}  // namespace weft
