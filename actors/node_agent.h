#pragma once
// The actor of a process that hosts devices: it joins the coordinator's
// supervisor, beats to it, and starts (and stops) the replicas the
// supervisor places on its devices, each as a batcher with its worker and
// shards next to it. The coordinator's own devices have one too ("local",
// joined in-process); `troupe node` runs one that joins over the network,
// and when the coordinator goes away it stops its replicas, keeps its
// loaded model, and joins again until a coordinator answers.
#include <caf/all.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/protocol.h"
#include "deploy/config.h"
#include "deploy/engine_builder.h"
#include "gpu/comm/rendezvous_store.h"
#include "metrics/metrics.h"
#include "service/stop_rule.h"

namespace troupe {

// A replica's engine as the node builds it: the factory the worker calls,
// and the spec it resolved (the layer ranges of its stages).
struct ReplicaEngine {
  EngineFactory factory;
  EngineSpec spec;
};
// How a part of a replica spanning nodes reaches the other parts: the
// coordinator's rendezvous, this node's address, the bound on every
// collective and rendezvous.
struct PartLinks {
  std::shared_ptr<RendezvousStore> rendezvous;
  std::string address = "127.0.0.1";
  std::chrono::milliseconds timeout{30000};
};

// Builds replica plan.replica's engine (or, for a replica spanning nodes,
// part plan.part of it) on `devices` (the node's devices it got, in
// stage-major order). Throws what does not fit.
using ReplicaEngineSource = std::function<ReplicaEngine(
    const ReplicaPlan& plan, const std::vector<DeviceSpec>& devices, const PartLinks& links)>;

// The engines of a node holding `engines`' model: each plan's layout on the
// node's devices (threads and memory caps per device), stages balanced on
// this node's measured layer times unless the plan gives them.
ReplicaEngineSource engines_from(std::shared_ptr<EngineBuilder> engines, CudaSection cuda = {});

struct NodeAgentOptions {
  JoinRequest join;                 // name, token, model fingerprint, devices, ...
  std::vector<DeviceSpec> devices;  // what it offers, in order (join.devices of them)
  ReplicaEngineSource engines;
  StopRule stop;  // the model's
  int bos = 1;
  int vocab_size = 0;  // the model's: requests' token ids are checked against it (0: not)
  double heartbeat_timeout_s = 2;
  // Where the coordinator listens; empty host: `coordinator` below is given
  // (the coordinator's own devices, in its process).
  std::string coordinator_host;
  uint16_t coordinator_port = 0;
  // A join the coordinator refused (another model, a bad token): the node
  // cannot serve, so whoever runs it should stop with this reason.
  std::function<void(const std::string& reason)> on_refused;
  Metrics* metrics = nullptr;
};

// Spawn it detached: connecting, and resolving a replica's engine (which may
// time layers), block its thread.
NodeActor::behavior_type node_agent(NodeActor::pointer self, NodeAgentOptions options,
                                    CoordinatorActor coordinator);

}  // namespace troupe
