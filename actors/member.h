#pragma once
// A part of a replica that spans nodes, on a node other than its leader's:
// a detached actor (its own thread) that builds its part of the engine and
// runs every step the leader's worker forwards, cut into the same
// micro-batches. Its devices are shard actors under it, as a worker's are.
// Linked to the leader's worker: a part that fails takes the replica down,
// and supervision rebuilds all of it.
#include <caf/all.hpp>
#include <string>

#include "actors/protocol.h"
#include "actors/wire_checks.h"
#include "deploy/engine_builder.h"

namespace troupe {

// `limits`: the plan's batch limits; the engine, once built, adds the
// model's and the KV cache's. Every step from the leader (another process)
// is checked against them before it reaches the engine.
MemberActor::behavior_type member(MemberActor::pointer self, EngineFactory factory, int replica,
                                  std::string name, StepLimits limits = {});

}  // namespace troupe
