// ParallelFor: runs fn(i) for i in [0, count) on up to `threads` threads, including the caller.
//
// Work is handed out one index at a time from a shared counter, so uneven items (chunks with many
// or few changes) balance on their own. fn must be safe to call concurrently for distinct i and
// must not throw. Returns when every call has finished. threads <= 1 runs inline, in order.
#pragma once

#include <cstddef>
#include <functional>

namespace weft {

void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& fn);

// The number of hardware threads, at least 1.
int HardwareThreads();

}  // namespace weft
