// ParallelFor: runs fn(i) for i in [0, count) on up to `threads` threads, including the caller.
//
// Work is handed out one index at a time from a shared counter, so uneven items (chunks with many
// or few changes) balance on their own. fn must be safe to call concurrently for distinct i and
// must not throw. Returns when every call has finished.
//
// The helper threads belong to a process-wide pool, started on first use and kept, so a call costs
// a wake-up rather than a thread start (models have hundreds of tensors, each processed with its
// own ParallelFor). threads <= 1 runs inline, in order. A ParallelFor issued from inside another
// one's fn, or while another thread's ParallelFor holds the pool, runs inline on its caller:
// correct, never deadlocking, only less parallel.
#pragma once

#include <cstddef>
#include <functional>

namespace weft {

void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& fn);

// The number of hardware threads, at least 1.
int HardwareThreads();

}  // namespace weft
