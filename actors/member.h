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
#include "deploy/engine_builder.h"

namespace troupe {

MemberActor::behavior_type member(MemberActor::pointer self, EngineFactory factory, int replica,
                                  std::string name);

}  // namespace troupe
