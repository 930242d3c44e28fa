#pragma once
// The coordinator's fault injector: starts each fault the admin endpoint
// (or a test) recorded in the fault book at its time, passes it through the
// supervisor to the replica it aims at, in whatever process that runs,
// ends lasting ones after their duration, and records what the actors that
// applied them report. The book fails a fault whose effect never came.
#include <caf/all.hpp>
#include <memory>

#include "actors/protocol.h"
#include "faults/fault_book.h"

namespace troupe {

FaultInjectorActor::behavior_type fault_injector(FaultInjectorActor::pointer self,
                                                 std::shared_ptr<FaultBook> book,
                                                 SupervisorActor supervisor);

}  // namespace troupe
