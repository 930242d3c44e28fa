#pragma once
// The device worker: a detached actor (its own thread) that owns an Engine
// and runs each step's blocking compute off CAF's cooperative threads.
#include <caf/all.hpp>
#include <memory>

#include "metrics/metrics.h"
#include "gpu/engine.h"

namespace troupe {

// With a multi-device engine, each device runs as a shard actor linked to
// this worker (actors/shard.h).
// Handles (step_atom, vector<EngineItem>) -> vector<int>, (release_atom, u64),
// (crash_atom): throws, so supervision sees a worker die mid-generation,
// (crash_atom, int device): that shard (stage-major index) dies mid-step, and
// (slow_atom, double seconds): adds that delay to every later step (fault
// injection for latency-aware routing).
// With a ParallelEngine, every step also publishes per-stage busy time,
// bubble and communication share to `metrics` (may be null).
caf::behavior worker_actor(caf::event_based_actor* self, EngineFactory factory, int replica,
                           Metrics* metrics);

}  // namespace troupe
