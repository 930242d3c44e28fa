#pragma once
// The actor runtime behind the HTTP API: one actor system with a router, a
// supervisor and R replicas (batcher + device worker each, and with a
// parallel layout one shard actor per device under the worker), exposed as a
// CompletionService.
#include <caf/all.hpp>
#include <memory>
#include <string>
#include <vector>

#include "service/completion_service.h"
#include "actors/router.h"
#include "actors/supervisor.h"
#include "gpu/layer_profile.h"

namespace troupe {

struct ServingOptions {
  int replicas = 1;
  int pipeline = 1;          // stages per replica
  int tensor = 1;            // shards per stage
  std::vector<int> threads;  // per device, replica-major (size 1: the same for all)
  std::vector<std::pair<int, int>> stage_layers;  // per stage; empty: from measured layer times
  std::vector<int64_t> device_memory_bytes;       // per device, as threads; 0: no cap
  int pipeline_credits = 2;
  int block_tokens = 16;
  int kv_blocks = 4096;  // per replica
  BatchLimits batching;
  int max_waiting_per_replica = 256;
  std::string routing_policy = "latency_aware";
  uint64_t routing_seed = 1;
  AdmissionQueueOptions admission;
  int max_restarts = 3;
  double restart_window_s = 10;
  int scheduler_threads = 2;  // CAF's cooperative threads (routing, batching: light work)
};

struct ReplicaStatus {
  bool live = false;
  bool failed = false;
  int restarts = 0;
  std::string last_death;  // why it last died, as the supervisor saw it; empty: never
};

// What a stage may hold: a cap per stage (bytes of weights and KV cache,
// max for none) and the KV bytes each layer adds. Empty caps: no limit.
struct StageMemory {
  uint64_t kv_bytes_per_layer = 0;
  std::vector<uint64_t> stage_cap_bytes;
};

// Contiguous layer ranges for `stages` pipeline stages, balanced by the
// partitioner on measured per-layer decode times (gpu/layer_profile.h)
// within the memory caps; logs the ranges and their costs. Empty for one
// stage. Throws std::invalid_argument when no split fits the caps.
std::vector<std::pair<int, int>> balanced_stages(const LayerProfile& profile, int stages,
                                                 const StageMemory& memory = {});

class ActorRuntime : public CompletionService {
 public:
  // Replicas share one whole model (pipeline = tensor = 1 only).
  ActorRuntime(std::shared_ptr<const Model> model, ServingOptions options,
               Metrics* metrics = nullptr);
  // Each replica builds its devices' shards from the checkpoint (any layout).
  ActorRuntime(std::shared_ptr<const Checkpoint> checkpoint, DType dtype, ServingOptions options,
               Metrics* metrics = nullptr);
  ~ActorRuntime() override;

  void submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) override;
  void cancel(uint64_t request_id) override;
  bool ready() const override { return router_shared_->ready.load(); }

  // Each replica's pipeline stages, [begin, end) layers per stage (empty
  // for a single stage or a shared whole model).
  const std::vector<std::vector<std::pair<int, int>>>& stage_layers() const {
    return stage_layers_;
  }
  int live_replicas() const { return router_shared_->live_replicas.load(); }
  std::vector<ReplicaStatus> replica_status() const;
  // Fault injection: the replica's worker throws at its next message.
  void inject_crash(int replica);
  // Fault injection: shard `device` (stage-major) of the replica dies when
  // its next step reaches it, while the rest of its group is mid-step.
  void inject_shard_crash(int replica, int device);
  // Fault injection: every later step of the replica takes `seconds` longer.
  void inject_slowness(int replica, double seconds);
  // Blocks until `n` replicas are live or the timeout passes; true if reached.
  bool wait_live(int n, double timeout_s) const;

 private:
  void start(const ModelConfig& config, std::vector<EngineFactory> factories, Metrics* metrics);
  int threads_of(int device) const;
  StageMemory stage_memory(const Checkpoint& ckpt, int replica) const;

  ServingOptions options_;
  std::vector<std::vector<std::pair<int, int>>> stage_layers_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<RouterShared> router_shared_;
  std::shared_ptr<SupervisorShared> supervisor_shared_;
  caf::actor router_;
  caf::actor supervisor_;
};

}  // namespace troupe
