#pragma once
// Supervises the replicas (batcher + linked worker + linked shards)
// Erlang-style: a replica that dies is restarted whole (one_for_all: its
// shards share one KV cache), within its restart intensity
// (scheduler/restart_intensity.h); past that it stays down. The router hears
// of every death (to resume its requests) and of every give-up.
#include <atomic>
#include <caf/all.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/batcher.h"
#include "metrics/metrics.h"

namespace troupe {

struct SupervisorOptions {
  std::vector<BatcherOptions> batchers;  // one per replica
  int max_restarts = 3;
  double window_s = 10;
};

// Shared with the runtime facade: per replica, restarts so far, whether it
// was given up on, and why it last died (read from other threads).
struct SupervisorShared {
  explicit SupervisorShared(int n)
      : restarts(size_t(n)), failed(size_t(n)), last_death(size_t(n)) {}
  std::vector<std::atomic<int>> restarts;
  std::vector<std::atomic<bool>> failed;
  mutable std::mutex mu;                // guards last_death
  std::vector<std::string> last_death;  // empty: never died
};

SupervisorActor::behavior_type supervisor(SupervisorActor::pointer self, RouterActor router,
                                          SupervisorOptions options,
                                          std::shared_ptr<SupervisorShared> shared,
                                          Metrics* metrics);

}  // namespace troupe
