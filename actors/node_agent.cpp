#include "actors/node_agent.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <caf/io/all.hpp>
#include <chrono>
#include <map>

#include "actors/batcher.h"

namespace troupe {

ReplicaEngineSource engines_from(std::shared_ptr<EngineBuilder> engines) {
  return [engines](const ReplicaPlan& plan, const std::vector<DeviceSpec>& devices) {
    EngineSpec spec;
    spec.pipeline = plan.pipeline;
    spec.tensor = plan.tensor;
    spec.threads.clear();
    for (const DeviceSpec& d : devices) {
      spec.threads.push_back(d.threads);
      spec.memory_bytes.push_back(d.memory_bytes);
    }
    spec.block_tokens = plan.block_tokens;
    spec.blocks = plan.blocks;
    for (size_t s = 0; s + 1 < plan.stage_bounds.size(); ++s)
      spec.stage_layers.emplace_back(plan.stage_bounds[s], plan.stage_bounds[s + 1]);
    const EngineSpec resolved = engines->resolve(spec);
    return ReplicaEngine{engines->factory(resolved), resolved};
  };
}

namespace {

using Clock = std::chrono::steady_clock;

struct Hosted {
  BatcherActor batcher;
  uint64_t epoch = 0;
  std::vector<int> devices;  // indices into the node's devices
};

struct AgentState {
  NodeAgentOptions opts;
  CoordinatorActor coordinator;
  bool watching = false;  // monitoring the coordinator (once per connection)
  bool joined = false;
  bool joining = false;
  int node = -1;
  uint64_t incarnation = 0;
  std::map<int, Hosted> replicas;  // by replica index
  std::vector<bool> busy;          // per device
  Clock::time_point last_attempt{};
  bool warned_unreachable = false;
};

std::chrono::milliseconds beat_interval(const AgentState& s) {
  return std::chrono::milliseconds(
      std::max<int64_t>(20, int64_t(s.opts.heartbeat_timeout_s * 1000 / 4)));
}

// A join that gets no answer (a connection that died silently) is given up
// after a few heartbeats, and tried again on a fresh connection.
std::chrono::milliseconds join_timeout(const AgentState& s) {
  return std::chrono::milliseconds(
      int64_t(std::clamp(3 * s.opts.heartbeat_timeout_s, 1.0, 10.0) * 1000));
}

void free_devices(AgentState& s, const Hosted& h) {
  for (int d : h.devices) s.busy[size_t(d)] = false;
}

// Stops every replica here: the coordinator that placed them is gone or no
// longer counts this node as a member, so whatever they produce is stale.
void stop_all(NodeActor::pointer self, AgentState& s, const char* why) {
  if (!s.replicas.empty())
    spdlog::warn("node {}: stopping {} replica(s): {}", s.opts.join.name, s.replicas.size(), why);
  for (auto& [r, h] : s.replicas) self->send_exit(h.batcher, caf::exit_reason::user_shutdown);
  s.replicas.clear();
  s.busy.assign(s.opts.devices.size(), false);
}

void join(NodeActor::pointer self, std::shared_ptr<AgentState> st) {
  AgentState& s = *st;
  if (s.joined || s.joining) return;
  if (!s.coordinator) {
    // A remote coordinator: connect (blocking: this actor is detached).
    s.last_attempt = Clock::now();
    auto conn = self->system().middleman().remote_actor<CoordinatorActor>(s.opts.coordinator_host,
                                                                          s.opts.coordinator_port);
    if (!conn) {
      if (!s.warned_unreachable)
        spdlog::warn("node {}: coordinator {}:{} unreachable ({}); retrying", s.opts.join.name,
                     s.opts.coordinator_host, s.opts.coordinator_port,
                     self->system().render(conn.error()));
      s.warned_unreachable = true;
      return;
    }
    s.warned_unreachable = false;
    s.coordinator = *conn;
  }
  // Watching it from the first join on: losing the connection (which fails
  // no request to it: CAF's remote requests only time out) must be heard.
  if (!s.watching) {
    self->monitor(s.coordinator);
    s.watching = true;
  }
  s.joining = true;
  self->request(s.coordinator, join_timeout(s), join_atom::value, s.opts.join,
                caf::actor_cast<NodeActor>(self))
      .then(
          [=](const JoinReply& reply) {
            st->joining = false;
            if (!reply.accepted) {
              spdlog::error("node {}: the coordinator refused it: {}", st->opts.join.name,
                            reply.reason);
              if (st->opts.on_refused) st->opts.on_refused(reply.reason);
              return;
            }
            st->joined = true;
            st->node = reply.node;
            st->incarnation = reply.incarnation;
            spdlog::info("node {}: joined the coordinator as node {} (incarnation {}), {} devices",
                         st->opts.join.name, reply.node, reply.incarnation,
                         st->opts.devices.size());
          },
          [=](caf::error& err) {
            st->joining = false;
            spdlog::warn("node {}: join failed: {}; retrying", st->opts.join.name,
                         self->system().render(err));
            if (!st->opts.coordinator_host.empty()) {
              self->demonitor(st->coordinator.address());
              st->watching = false;
              st->coordinator = CoordinatorActor{};
            }
          });
}

}  // namespace

NodeActor::behavior_type node_agent(NodeActor::pointer self, NodeAgentOptions options,
                                    CoordinatorActor coordinator) {
  auto st = std::make_shared<AgentState>();
  st->opts = std::move(options);
  st->coordinator = std::move(coordinator);
  st->busy.assign(st->opts.devices.size(), false);
  self->set_down_handler([=](caf::down_msg& dm) {
    AgentState& s = *st;
    if (s.coordinator && dm.source == s.coordinator.address()) {
      spdlog::warn("node {}: lost the coordinator ({})", s.opts.join.name,
                   self->system().render(dm.reason));
      stop_all(self, s, "the coordinator is gone");
      s.joined = false;
      s.joining = false;
      s.watching = false;
      if (!s.opts.coordinator_host.empty()) s.coordinator = CoordinatorActor{};
      return;
    }
    for (auto it = s.replicas.begin(); it != s.replicas.end(); ++it)
      if (it->second.batcher.address() == dm.source) {
        free_devices(s, it->second);
        s.replicas.erase(it);
        return;
      }
  });
  // Shutdown: the replicas go down with the node.
  self->set_exit_handler([=](caf::exit_msg& em) {
    stop_all(self, *st, "the node is shutting down");
    self->quit(em.reason);
  });
  self->send(self, ntick_atom::value);
  return {
      [=](start_atom, const ReplicaPlan& plan, RouterActor router) -> caf::result<BatcherActor> {
        AgentState& s = *st;
        // A new placement of a replica replaces any older one here.
        if (auto it = s.replicas.find(plan.replica); it != s.replicas.end()) {
          self->send_exit(it->second.batcher, caf::exit_reason::user_shutdown);
          free_devices(s, it->second);
          s.replicas.erase(it);
        }
        Hosted h;
        h.epoch = plan.epoch;
        std::vector<DeviceSpec> devices;
        for (size_t d = 0; d < s.busy.size() && int(h.devices.size()) < plan.devices(); ++d)
          if (!s.busy[d]) {
            h.devices.push_back(int(d));
            devices.push_back(s.opts.devices[d]);
          }
        if (int(h.devices.size()) < plan.devices())
          return caf::make_error(caf::sec::runtime_error,
                                 "node " + s.opts.join.name + " has " +
                                     std::to_string(h.devices.size()) + " free devices; replica " +
                                     std::to_string(plan.replica) + " needs " +
                                     std::to_string(plan.devices()));
        ReplicaEngine engine;
        try {
          engine = s.opts.engines(plan, devices);
        } catch (const std::exception& e) {
          spdlog::error("node {}: cannot start replica {}: {}", s.opts.join.name, plan.replica,
                        e.what());
          return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
        }
        BatcherOptions b;
        b.scheduler.replica = plan.replica;
        b.scheduler.epoch = plan.epoch;
        b.scheduler.kv_blocks = engine.spec.blocks;
        b.scheduler.block_tokens = engine.spec.block_tokens;
        b.scheduler.limits = {plan.max_batch_sequences, plan.max_batch_tokens,
                              plan.prefill_chunk_tokens};
        b.scheduler.groups = engine.spec.pipeline;  // one step in flight per stage
        b.scheduler.stop = s.opts.stop;
        b.scheduler.bos = s.opts.bos;
        b.engine = std::move(engine.factory);
        b.metrics = s.opts.metrics;
        h.batcher = self->spawn<caf::monitored>(batcher, std::move(router), std::move(b));
        for (int d : h.devices) s.busy[size_t(d)] = true;
        spdlog::info("node {}: replica {} started (placement {}, {} device(s))", s.opts.join.name,
                     plan.replica, plan.epoch, h.devices.size());
        BatcherActor handle = h.batcher;
        s.replicas[plan.replica] = std::move(h);
        return handle;
      },
      [=](stop_atom, int replica, uint64_t epoch) {
        AgentState& s = *st;
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || it->second.epoch != epoch) return;
        self->send_exit(it->second.batcher, caf::exit_reason::user_shutdown);
        free_devices(s, it->second);
        s.replicas.erase(it);
      },
      [=](join_atom) {
        // Declared dead while it was away (a stall, a partition): what runs
        // here was placed again elsewhere.
        AgentState& s = *st;
        spdlog::warn("node {}: the coordinator no longer counts it as a member", s.opts.join.name);
        stop_all(self, s, "declared dead by the coordinator");
        s.joined = false;
        join(self, st);
      },
      [=](ntick_atom) {
        AgentState& s = *st;
        if (s.joined) {
          self->send(s.coordinator, beat_atom::value, s.node, s.incarnation);
        } else if (!s.joining && Clock::now() - s.last_attempt >= std::chrono::milliseconds(500)) {
          join(self, st);
        }
        self->delayed_send(self, beat_interval(s), ntick_atom::value);
      },
  };
}

}  // namespace troupe
