#pragma once
// One replica's continuous batcher: the actor around the replica's
// scheduler (scheduler/replica_scheduler.h). It asks the scheduler for
// steps, sends them to its worker (one per free group), and reports tokens
// and completions to the router after every step.
#include <caf/all.hpp>

#include "actors/protocol.h"
#include "deploy/engine_builder.h"
#include "metrics/metrics.h"
#include "scheduler/replica_scheduler.h"

namespace troupe {

struct BatcherOptions {
  ReplicaSchedulerOptions scheduler;
  EngineFactory engine;        // builds the replica's engine on the worker's thread
  Metrics* metrics = nullptr;  // for the worker's per-stage figures
  ReplicaParts parts;          // a replica spanning nodes: its other parts
  int vocab_size = 0;          // the model's: assignments' token ids are checked (0: not)
};

// Spawns its worker (detached, linked: if the worker dies the batcher dies
// with it, and the supervisor sees one replica down). After a probe step
// succeeds it sends (up, replica, self) to the router.
BatcherActor::behavior_type batcher(BatcherActor::pointer self, RouterActor router,
                                    BatcherOptions options);

}  // namespace troupe
