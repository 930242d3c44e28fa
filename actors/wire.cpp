#include "actors/wire.h"

#include <caf/io/all.hpp>

#include "actors/protocol.h"

namespace troupe {

void register_wire_types(caf::actor_system_config& cfg) {
  cfg.load<caf::io::middleman>();
  cfg.add_message_type<Assignment>("Assignment");
  cfg.add_message_type<StepEvents>("StepEvents");
  cfg.add_message_type<JoinRequest>("JoinRequest");
  cfg.add_message_type<JoinReply>("JoinReply");
  cfg.add_message_type<ReplicaPlan>("ReplicaPlan");
  cfg.add_message_type<BatcherActor>("BatcherActor");
  cfg.add_message_type<RouterActor>("RouterActor");
  cfg.add_message_type<NodeActor>("NodeActor");
  cfg.add_message_type<CoordinatorActor>("CoordinatorActor");
  // Each also registers std::vector of itself (CAF 0.17).
  cfg.add_message_type<MemberActor>("MemberActor");
  cfg.add_message_type<StepItem>("StepItem");
  cfg.add_message_type<FaultOrder>("FaultOrder");
  cfg.add_message_type<FaultReport>("FaultReport");
  cfg.add_message_type<FaultInjectorActor>("FaultInjectorActor");
}

}  // namespace troupe
