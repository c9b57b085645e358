// ForEachConcurrently: runs fn(i) for i in [0, count) on up to `concurrency` threads of its own,
// for work that waits (network requests), not for computation (that is ParallelFor's job, on the
// shared pool). Indices are handed out in order from a shared counter. Once a call fails, no new
// index starts; the calls already running finish. Returns the error of the lowest failing index,
// so the same failure is reported whatever the timing.
#pragma once

#include <cstddef>
#include <functional>

#include "common/status.h"

namespace weft {

Status ForEachConcurrently(size_t count, int concurrency, const std::function<Status(size_t)>& fn);

}  // namespace weft
