#pragma once
// The router: admission control (bounded priority queue), replica choice
// (routing policy), the table of every accepted request, delivery of tokens
// to clients exactly once, deadlines, and resumption of requests whose
// replica died.
#include <atomic>
#include <caf/all.hpp>
#include <memory>
#include <string>

#include "metrics/metrics.h"
#include "scheduler/admission_queue.h"
#include "scheduler/batch_policy.h"

namespace troupe {

struct RouterOptions {
  int replicas = 1;
  int max_seq_len = 0;
  int max_batch_sequences = 32;
  int max_waiting_per_replica = 256;  // dispatched but not yet running, per replica
  std::string routing_policy = "latency_aware";
  uint64_t routing_seed = 1;
  AdmissionQueueOptions admission;
};

// Shared with the runtime facade (read from HTTP threads).
struct RouterShared {
  std::atomic<bool> ready{false};
  std::atomic<int> live_replicas{0};
};

// Handles (submit_atom, CompletionRequest, shared_ptr<CompletionSink>),
// (cancel_atom, u64), (events_atom, StepEvents) from batchers,
// (up_atom, int replica, actor batcher), (down_atom, int replica, bool permanent)
// from the supervisor.
caf::behavior router_actor(caf::event_based_actor* self, RouterOptions options,
                           std::shared_ptr<RouterShared> shared, Metrics* metrics);

}  // namespace troupe
