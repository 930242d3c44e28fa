#pragma once
// Cross-process communicators for simulated processes (split_replica.h):
// Gloo over TCP on 127.0.0.1, with a rendezvous store in this process's
// memory. Links troupe_gloo.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "gpu/comm/gloo_communicator.h"
#include "split_replica.h"

namespace troupe::test {

// `timeout` bounds every call and rendezvous (GlooOptions::timeout).
inline CommMaker gloo_comms(std::chrono::milliseconds timeout) {
  static std::atomic<int> makers{0};
  auto store = std::make_shared<InMemoryRendezvousStore>();
  const std::string prefix = std::to_string(getpid()) + "-" + std::to_string(makers++) + "/";
  return [store, timeout, prefix](const std::string& group, int rank,
                                  const std::vector<std::string>& names) {
    GlooOptions o;
    o.group = prefix + group;
    o.timeout = timeout;
    o.peer_names = names;
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(rank, int(names.size()), *store, o));
  };
}

}  // namespace troupe::test
