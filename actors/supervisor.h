#pragma once
// Supervises the replicas (batcher + linked worker) Erlang-style: a replica
// that dies is restarted, at most max_restarts times within window_s; past
// that it stays down. The router hears of every death (to resume its
// requests) and of every give-up.
#include <caf/all.hpp>
#include <memory>
#include <mutex>
#include <string>

#include "actors/batcher.h"
#include "metrics/metrics.h"

namespace troupe {

struct SupervisorOptions {
  int replicas = 1;
  std::vector<BatcherOptions> batchers;  // one per replica
  int max_restarts = 3;
  double window_s = 10;
};

// Shared with the runtime facade: per replica, restarts so far and whether
// it was given up on (read from other threads).
struct SupervisorShared {
  explicit SupervisorShared(int n)
      : restarts(size_t(n)), failed(size_t(n)), last_death(size_t(n)) {}
  std::vector<std::atomic<int>> restarts;
  std::vector<std::atomic<bool>> failed;
  // Why each replica last died (empty: never); guarded by mu.
  mutable std::mutex mu;
  std::vector<std::string> last_death;
};

// Handles (crash_atom, int replica), (crash_atom, int replica, int device)
// and (slow_atom, int replica, double s): fault injection, forwarded to that
// replica.
caf::behavior supervisor_actor(caf::event_based_actor* self, caf::actor router, ModelConfig model,
                               SupervisorOptions options, std::shared_ptr<SupervisorShared> shared,
                               Metrics* metrics);

}  // namespace troupe
