#pragma once
// One replica's continuous batcher: owns the replica's sequences, asks the
// batch policy what runs next, sends one step at a time to its worker, and
// reports tokens and completions to the router after every step.
#include <caf/all.hpp>
#include <memory>

#include "metrics/metrics.h"
#include "gpu/engine.h"
#include "scheduler/batch_policy.h"

namespace troupe {

struct BatcherOptions {
  int replica = 0;
  EngineFactory engine;  // builds the replica's engine on the worker's thread
  int kv_blocks = 0;     // per device: the batcher mirrors the block accounting
  int block_tokens = 16;
  BatchLimits limits;
  Metrics* metrics = nullptr;  // for the worker's per-stage figures
  // Steps in flight at once, each over its own group of sequences: a
  // pipeline of P stages runs P, so that no stage waits for the tokens of
  // the step ahead of it. 1: one step at a time.
  int groups = 1;
};

// Spawns its worker (detached, linked: if the worker dies the batcher dies
// with it, and the supervisor sees one replica down). After a probe step
// succeeds it sends (up_atom, replica, self) to the router.
// Handles (assign_atom, Assignment), (cancel_atom, u64 id), (crash_atom),
// (crash_atom, int device), (slow_atom, double).
caf::behavior batcher_actor(caf::event_based_actor* self, caf::actor router, ModelConfig model,
                            BatcherOptions options);

}  // namespace troupe
