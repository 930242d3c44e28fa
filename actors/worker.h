#pragma once
// The device worker: a detached actor (its own thread) that owns a replica's
// StepEngine and runs each step's blocking compute off CAF's cooperative
// threads. With a multi-device engine, each device runs as a shard actor
// linked to this worker (actors/shard.h). A step that throws ends the
// worker, and with it (linked) the replica.
#include <caf/all.hpp>

#include "actors/protocol.h"
#include "deploy/engine_builder.h"
#include "metrics/metrics.h"

namespace troupe {

// Every step also publishes per-stage busy time, bubble and communication
// share to `metrics` (may be null); a pipeline's micro-batch count follows
// its measured stage times (scheduler/microbatch_tuner.h).
// A replica spanning nodes has members, its parts elsewhere (`parts`): the
// worker links to them and forwards every step, cut into the micro-batches
// its own part uses, before launching it here. A fault aimed at a device is
// passed to the part that runs it.
WorkerActor::behavior_type worker(WorkerActor::pointer self, EngineFactory factory, int replica,
                                  Metrics* metrics, ReplicaParts parts = {});

}  // namespace troupe
