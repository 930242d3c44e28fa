#pragma once
// The actor runtime behind the HTTP API: the coordinator's actor system,
// with the router, the supervisor (membership, placement, restarts) and,
// unless nodes.local is off, this process's own devices as a node; with
// nodes.listen set, other processes (`troupe node`) join it and run
// replicas too. Built from the one configuration and exposed as a
// CompletionService.
#include <atomic>
#include <caf/all.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/node_agent.h"
#include "actors/router.h"
#include "actors/supervisor.h"
#include "deploy/config.h"
#include "deploy/engine_builder.h"
#include "faults/fault_json.h"
#include "net/fault_admin.h"
#include "service/completion_service.h"

namespace troupe {

class LinkProxy;

struct ReplicaStatus {
  bool failed = false;
  int restarts = 0;
  std::string last_death;  // why it last died, as the supervisor saw it; empty: never
};

// caf::actor_system_config for a process that speaks to others: the wire
// types, CAF's middleman, and heartbeats on every connection so that a peer
// that hangs is noticed within `heartbeat_timeout_s` (both ends must have
// them).
void configure_distribution(caf::actor_system_config& cfg, double heartbeat_timeout_s);

class ActorRuntime : public CompletionService, public FaultAdmin {
 public:
  // Starts what the config describes; `engines` builds replicas on this
  // process's devices. Throws ConfigError or std::invalid_argument naming
  // what does not fit (the layout, the KV cache, a memory cap, the node
  // port) before anything starts.
  ActorRuntime(const Config& config, std::shared_ptr<EngineBuilder> engines,
               Metrics* metrics = nullptr);
  // The same with this process's replicas from elsewhere (tests: scripted
  // engines): replica r's engine is engine_for(r, its spec from the config).
  // Nodes that join must present `model_fingerprint`.
  using EngineSource = std::function<ReplicaEngine(int replica, const EngineSpec& spec)>;
  ActorRuntime(const Config& config, const ModelConfig& model, EngineSource engine_for,
               Metrics* metrics = nullptr, std::string model_fingerprint = "local");
  ~ActorRuntime() override;

  // Ends every request still open with 503 ("the server is shutting
  // down": the router's exit) and returns once it has; what is submitted
  // afterwards ends the same way at once. The rest of the runtime stops in
  // the destructor. Idempotent.
  void shutdown();

  void submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) override;
  void cancel(uint64_t request_id) override;
  bool ready() const override { return router_shared_->ready.load(); }

  // This process's replicas' pipeline stages, [begin, end) layers per stage
  // (empty for a single stage).
  const std::vector<std::vector<std::pair<int, int>>>& stage_layers() const {
    return stage_layers_;
  }
  int live_replicas() const { return router_shared_->live_replicas.load(); }
  std::vector<ReplicaStatus> replica_status() const;
  // The nodes as the supervisor last saw them (this process's own devices
  // are the node "local").
  std::vector<NodeRecord> nodes() const;
  // The port nodes join on (nodes.listen; the chosen one when it named port
  // 0); 0 when nodes cannot join.
  uint16_t nodes_port() const { return nodes_port_; }
  // Fault injection (tests, the admin endpoint): the fault is recorded in
  // the fault book and started at its time; returns its entry.
  FaultEntry inject(const FaultRequest& request);
  std::variant<FaultEntry, std::string> inject_json(std::string_view body) override;
  std::vector<FaultEntry> faults() const override { return faults_->list(); }
  std::vector<FaultBook::Resume> resumes() const override { return faults_->resumes(); }
  double now() const override { return faults_->now(); }
  // Shorthands: the replica's worker dies; shard `device` (stage-major) of
  // the replica dies in its next step, mid-step for the rest of its group.
  void inject_crash(int replica);
  void inject_shard_crash(int replica, int device);
  // Blocks until `n` replicas are live or the timeout passes; true if reached.
  bool wait_live(int n, double timeout_s) const;

 private:
  int replicas_;
  int replica_devices_;  // pipeline x tensor
  std::vector<std::vector<std::pair<int, int>>> stage_layers_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<RouterShared> router_shared_;
  std::shared_ptr<SupervisorShared> supervisor_shared_;
  RouterActor router_;
  SupervisorActor supervisor_;
  std::shared_ptr<FaultBook> faults_ = std::make_shared<FaultBook>();
  FaultInjectorActor injector_;
  NodeActor local_node_;
  uint16_t nodes_port_ = 0;
  std::unique_ptr<LinkProxy> node_port_guard_;  // nodes.listen, in front of the middleman
  std::atomic<bool> shut_down_{false};
};

}  // namespace troupe
