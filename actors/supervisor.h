#pragma once
// The coordinator's supervisor: the nodes that joined (scheduler/cluster.h:
// who may join, who is alive, which devices are free), where each replica
// runs, and its restarts. Erlang-style: a replica that dies is restarted
// whole (one_for_all: its shards share one KV cache) within its restart
// intensity (scheduler/restart_intensity.h), past which it stays down; a
// node that dies (its connection drops, or its heartbeats stop) takes its
// replicas with it, and they are placed again on free devices elsewhere,
// or when a node joins. Every placement has an epoch, so that a replica
// that outlives its placement (a node declared dead that comes back) is
// fenced: the router ignores it. The router hears of every replica that
// goes down, to resume its requests.
#include <atomic>
#include <caf/all.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/protocol.h"
#include "faults/fault_book.h"
#include "metrics/metrics.h"
#include "scheduler/cluster.h"

namespace troupe {

struct SupervisorOptions {
  int replicas = 1;
  ReplicaPlan plan;  // every replica's plan (replica and epoch filled in per placement)
  std::vector<std::string> placement;  // per replica: node name, "local" or "any"
  int max_restarts = 3;
  double window_s = 10;
  ClusterOptions cluster;
  int layers = 1;  // the model's: a replica spanning nodes gets its stages split evenly
  std::shared_ptr<FaultBook> faults;  // told of every replica's death (confirms kills)
};

// Shared with the runtime facade (read from other threads).
struct SupervisorShared {
  explicit SupervisorShared(int n)
      : restarts(size_t(n)), failed(size_t(n)), last_death(size_t(n)) {}
  std::vector<std::atomic<int>> restarts;
  std::vector<std::atomic<bool>> failed;
  mutable std::mutex mu;                // guards what follows
  std::vector<std::string> last_death;  // empty: never died
  std::vector<NodeRecord> nodes;        // the cluster as last seen
};

SupervisorActor::behavior_type supervisor(SupervisorActor::pointer self, RouterActor router,
                                          SupervisorOptions options,
                                          std::shared_ptr<SupervisorShared> shared,
                                          Metrics* metrics);

}  // namespace troupe
