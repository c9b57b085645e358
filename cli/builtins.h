// The engines and tasks built into the weft binary, registered in one place: the engines "sglang"
// and "vllm" (rollout_worker/http_engine.h: serving engines behind HTTP, set by the run's `engine`
// section), the embedded engine
// (examples/embedded_engine.h, the example policy on the CPU; it serves the run's `model` section)
// as "embedded", and the tasks the run's `task` section chooses by `kind`: the addition task
// (examples/arithmetic_task.h) as "arithmetic", and the text-level tasks of
// rollout_worker/http_task.h as "http" (rewards from a reward service) and "trainer" (rewards from
// the trainer).
#pragma once

#include "rollout_worker/registry.h"

namespace weft::cli {

// The registry of `weft worker` and `weft run`, with the built-in engine and task.
const rollout_worker::Registry& Builtins();

}  // namespace weft::cli
