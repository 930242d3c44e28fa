#pragma once
// The actor runtime behind the HTTP API: one actor system with a router, a
// supervisor and R replicas (batcher + device worker each, and with a
// parallel layout one shard actor per device under the worker), built from
// the one configuration and exposed as a CompletionService.
#include <caf/all.hpp>
#include <memory>
#include <string>
#include <vector>

#include "actors/router.h"
#include "actors/supervisor.h"
#include "deploy/config.h"
#include "deploy/engine_builder.h"
#include "service/completion_service.h"

namespace troupe {

struct ReplicaStatus {
  bool live = false;
  bool failed = false;
  int restarts = 0;
  std::string last_death;  // why it last died, as the supervisor saw it; empty: never
};

class ActorRuntime : public CompletionService {
 public:
  // Starts the replicas the config describes (parallel, devices, kv_cache,
  // batching, routing, admission, supervision); `engines` builds them from
  // the model. Throws ConfigError or std::invalid_argument naming what does
  // not fit (the layout, the KV cache, a memory cap) before anything starts.
  ActorRuntime(const Config& config, std::shared_ptr<EngineBuilder> engines,
               Metrics* metrics = nullptr);
  // The same with engines from elsewhere (tests: scripted engines): replica
  // r's engine is engine_for(r, its spec from the config), which returns the
  // factory and the spec as it resolved it.
  struct ReplicaEngine {
    EngineFactory factory;
    EngineSpec spec;
  };
  using EngineSource = std::function<ReplicaEngine(int replica, const EngineSpec& spec)>;
  ActorRuntime(const Config& config, const ModelConfig& model, EngineSource engine_for,
               Metrics* metrics = nullptr);
  ~ActorRuntime() override;

  void submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) override;
  void cancel(uint64_t request_id) override;
  bool ready() const override { return router_shared_->ready.load(); }

  // Each replica's pipeline stages, [begin, end) layers per stage (empty
  // for a single stage).
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
  int replicas_;
  std::vector<std::vector<std::pair<int, int>>> stage_layers_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<RouterShared> router_shared_;
  std::shared_ptr<SupervisorShared> supervisor_shared_;
  RouterActor router_;
  SupervisorActor supervisor_;
};

}  // namespace troupe
