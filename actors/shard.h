#pragma once
// A device shard as an actor. Detached (its own thread, so its blocking
// compute and collectives never hold CAF's cooperative threads), it works
// through its device's job queue, one job per (run_atom) message.
//
// Supervision: a shard is linked to its replica's worker. The shards of a
// replica hold one KV cache split between them, so a shard that dies takes
// the worker and batcher down with it, and the supervisor restarts the
// replica whole (OTP's one_for_all) while the router resumes its requests.
// A shard that dies mid-step closes its queue first, which aborts its group's
// collectives and abandons its queued jobs, so no peer waits for it.
#include <caf/all.hpp>
#include <latch>
#include <memory>
#include <vector>

#include "actors/protocol.h"
#include "gpu/device_queue.h"

namespace troupe {

// `ended` is counted down by the actor's very last act, once its queue is
// closed and every job it held abandoned: from then on nothing of it touches
// the engine's device state, and its runner may let the engine go.
ShardActor::behavior_type shard(ShardActor::pointer self, std::shared_ptr<DeviceQueue> queue,
                                std::shared_ptr<std::latch> ended, int replica, int stage,
                                int rank);

// A shard actor and the device it runs: (stage, rank) of its replica.
struct PlacedShard {
  ShardActor actor;
  int stage = 0;
  int rank = 0;
};

// Starts each device of a replica as a shard actor spawned by (and linked to)
// `worker`; the handles are appended to *spawned, stage-major.
DeviceLauncher shard_launcher(caf::local_actor* worker, int replica,
                              std::shared_ptr<std::vector<PlacedShard>> spawned);

// The shard running device (stage, rank) among `shards`; null if none does.
ShardActor shard_of(const std::vector<PlacedShard>& shards, int stage, int rank);

}  // namespace troupe
