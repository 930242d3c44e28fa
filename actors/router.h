#pragma once
// The router: the actor around the request table (scheduler/request_table.h)
// that holds every accepted request. It turns messages into table calls,
// sends the table's placements and cancellations to the replicas' batchers,
// ticks the table's deadlines, and publishes its state to metrics and to
// the runtime facade.
#include <atomic>
#include <caf/all.hpp>
#include <memory>
#include <string>

#include "actors/protocol.h"
#include "faults/fault_book.h"
#include "metrics/metrics.h"
#include "scheduler/replica_link.h"
#include "scheduler/request_table.h"

namespace troupe {

struct RouterOptions {
  RequestTableOptions table;
  std::string routing_policy = "latency_aware";
  uint64_t routing_seed = 1;
  LatencyAwareOptions latency_aware;  // the latency-aware policy's constants
  std::shared_ptr<FaultBook> faults;  // told when a replica serves again
  ReplicaLinkOptions link;            // probing and timeout of each replica's channel
};

// Shared with the runtime facade (read from HTTP threads).
struct RouterShared {
  std::atomic<bool> ready{false};
  std::atomic<int> live_replicas{0};
};

RouterActor::behavior_type router(RouterActor::pointer self, RouterOptions options,
                                  std::shared_ptr<RouterShared> shared, Metrics* metrics);

}  // namespace troupe
