#pragma once
// The rendezvous of a replica's parts on different nodes, served by the
// coordinator (its supervisor keeps the keys): a RendezvousStore for the
// Gloo communicators that makes blocking requests to it. Used from engine
// construction, on a worker's or member's own thread, never on CAF's.
#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "actors/protocol.h"
#include "gpu/comm/rendezvous_store.h"

namespace troupe {

class CoordinatorRendezvous final : public RendezvousStore {
 public:
  CoordinatorRendezvous(caf::actor_system& system, CoordinatorActor coordinator);
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  caf::actor_system& system_;
  CoordinatorActor coordinator_;
};

}  // namespace troupe
