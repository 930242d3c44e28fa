#include "actors/node_agent.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <caf/io/all.hpp>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "actors/batcher.h"
#include "actors/member.h"
#include "actors/rendezvous.h"
#include "actors/wire_checks.h"
#include "gpu/comm/gloo_communicator.h"

namespace troupe {

namespace {

// "KV cache 4096 blocks x 16 tokens, f16" per device, for the log.
std::string kv_cache_words(const ReplicaPlan& plan) {
  return "KV cache " + std::to_string(plan.blocks) + " blocks x " +
         std::to_string(plan.block_tokens) + " tokens, " + plan.kv_dtype;
}

// Where a spanning replica's parts meet: Gloo groups named after the
// replica's placement (a rebuilt replica never reads an old one's keys),
// one per stage's tensor group and per stage boundary between nodes.
ProcessPlacement placement_for(const ReplicaPlan& plan, const PartLinks& links) {
  ProcessPlacement pp;
  pp.host = plan.hosts;
  pp.this_host = plan.part;
  const std::string prefix =
      "replica" + std::to_string(plan.replica) + "/epoch" + std::to_string(plan.epoch);
  auto options = [links](std::string group, std::vector<std::string> names) {
    GlooOptions o;
    o.group = std::move(group);
    o.timeout = links.timeout;
    o.bind_address = links.address;
    o.peer_names = std::move(names);
    return o;
  };
  pp.tensor_group = [plan, links, prefix, options](int stage, int rank) {
    std::vector<std::string> names;
    for (int t = 0; t < plan.tensor; ++t)
      names.push_back(plan.part_names.at(size_t(plan.hosts.at(size_t(stage * plan.tensor + t)))));
    return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(
        rank, plan.tensor, *links.rendezvous,
        options(prefix + "/tp" + std::to_string(stage), std::move(names))));
  };
  pp.boundary_channel = [plan, links, prefix, options](int stage, int to_host, int rank) {
    const int from = plan.hosts.at(size_t(stage * plan.tensor));
    return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(
        rank, 2, *links.rendezvous,
        options(prefix + "/pp" + std::to_string(stage) + "-" + std::to_string(to_host),
                {plan.part_names.at(size_t(from)), plan.part_names.at(size_t(to_host))})));
  };
  return pp;
}

}  // namespace

ReplicaEngineSource engines_from(std::shared_ptr<EngineBuilder> engines, CudaSection cuda) {
  return [engines, cuda](const ReplicaPlan& plan, const std::vector<DeviceSpec>& devices,
                         const PartLinks& links) {
    EngineSpec spec;
    spec.pipeline = plan.pipeline;
    spec.tensor = plan.tensor;
    spec.threads.clear();
    // This node's devices in the layout's order; the others' threads are
    // theirs to set (1 here is a placeholder the engine never uses).
    // The agent gave each device here its CUDA index (its own when the
    // node's config names none).
    size_t next = 0;
    spec.cuda_devices.clear();
    for (int d = 0; d < plan.devices(); ++d) {
      const bool here = plan.hosts.empty() || plan.hosts[size_t(d)] == plan.part;
      const DeviceSpec& ds = here ? devices.at(next++) : DeviceSpec{DeviceKind::Cpu, 1, 0};
      spec.threads.push_back(ds.threads);
      spec.memory_bytes.push_back(ds.memory_bytes);
      spec.cuda_devices.push_back(here ? ds.index : -1);
    }
    // A replica's devices are of one kind (the coordinator places whole
    // devices; the node's config says what they are).
    const DeviceSpec& first = devices.at(0);
    for (const DeviceSpec& d : devices)
      if (d.kind != first.kind)
        throw std::invalid_argument("replica " + std::to_string(plan.replica) +
                                    " was given devices of different kinds here");
    spec.kind = first.kind;
    spec.cuda = cuda;
    spec.max_batch_tokens = plan.max_batch_tokens;
    spec.max_batch_sequences = plan.max_batch_sequences;
    spec.block_tokens = plan.block_tokens;
    spec.blocks = plan.blocks;
    // Checked when the plan arrived (actors/wire_checks.cpp).
    spec.kv_dtype = parse_dtype(plan.kv_dtype).value_or(DType::F32);
    for (size_t s = 0; s + 1 < plan.stage_bounds.size(); ++s)
      spec.stage_layers.emplace_back(plan.stage_bounds[s], plan.stage_bounds[s + 1]);
    if (plan.spans()) {
      if (!links.rendezvous)
        throw std::logic_error("replica " + std::to_string(plan.replica) +
                               " spans nodes, but this node has no rendezvous");
      spec.placement = placement_for(plan, links);
    }
    const EngineSpec resolved = engines->resolve(spec);
    return ReplicaEngine{engines->factory(resolved), resolved};
  };
}

namespace {

using Clock = std::chrono::steady_clock;

// A replica (its batcher, or a part of it: a member) running here.
struct Hosted {
  BatcherActor batcher;
  MemberActor member;
  uint64_t epoch = 0;
  std::vector<int> devices;  // indices into the node's devices
  caf::actor_addr address() const { return batcher ? batcher.address() : member.address(); }
  void stop(NodeActor::pointer self) const {
    if (batcher) self->send_exit(batcher, caf::exit_reason::user_shutdown);
    if (member) self->send_exit(member, caf::exit_reason::user_shutdown);
  }
};

struct AgentState {
  NodeAgentOptions opts;
  CoordinatorActor coordinator;
  PartLinks links;        // for parts of replicas spanning nodes
  bool watching = false;  // monitoring the coordinator (once per connection)
  bool joined = false;
  uint64_t join_attempt = 0;  // the latest join request's number
  bool joining = false;
  int node = -1;
  uint64_t incarnation = 0;
  // The coordinator's heartbeat timeout, from its answer to the join (0:
  // not known yet): the beats keep its pace when it is the shorter.
  double coordinator_timeout_s = 0;
  uint64_t ticks = 0;              // the tick chain's number: a faster pace starts a new chain
  std::map<int, Hosted> replicas;  // by replica index
  // Shutting down: first `leaving` (the coordinator told, its answer
  // awaited), then `quitting`: the replicas stopped, whose downs it waits
  // for in `draining` (until quit_by at most) before it quits with
  // quit_reason.
  bool leaving = false;
  bool quitting = false;
  std::set<caf::actor_addr> draining;
  caf::error quit_reason;
  Clock::time_point quit_by;
  std::vector<bool> busy;  // per device
  Clock::time_point last_attempt{};
  bool warned_unreachable = false;
};

// Four beats within the shorter of this node's heartbeat timeout and its
// coordinator's: a node configured with a longer one than its coordinator
// would otherwise be declared dead between beats.
std::chrono::milliseconds beat_interval(const AgentState& s) {
  double timeout_s = s.opts.heartbeat_timeout_s;
  if (s.coordinator_timeout_s > 0) timeout_s = std::min(timeout_s, s.coordinator_timeout_s);
  return std::chrono::milliseconds(std::max<int64_t>(20, int64_t(timeout_s * 1000 / 4)));
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
// `expected`: part of an orderly shutdown, not a fault (logged as info).
void stop_all(NodeActor::pointer self, AgentState& s, const char* why, bool expected = false) {
  if (!s.replicas.empty())
    spdlog::log(expected ? spdlog::level::info : spdlog::level::warn,
                "node {}: stopping {} replica(s): {}", s.opts.join.name, s.replicas.size(), why);
  for (auto& [r, h] : s.replicas) h.stop(self);
  s.replicas.clear();
  s.busy.assign(s.opts.devices.size(), false);
}

void join(NodeActor::pointer self, std::shared_ptr<AgentState> st) {
  AgentState& s = *st;
  // Shutting down: told to join again (the coordinator has buried it),
  // it does not.
  if (s.joined || s.joining || s.leaving || s.quitting) return;
  if (!s.coordinator) {
    // A remote coordinator: connect (blocking: this actor is detached).
    s.last_attempt = Clock::now();
    auto conn = self->system().middleman().remote_actor<CoordinatorActor>(s.opts.coordinator_host,
                                                                          s.opts.coordinator_port);
    if (!conn) {
      // Something answered, but not a coordinator's node port: likely the
      // HTTP port, or another service.
      const bool not_troupe = conn.error() == caf::sec::malformed_basp_message;
      if (!s.warned_unreachable)
        spdlog::warn("node {}: coordinator {}:{} unreachable ({}){}; retrying", s.opts.join.name,
                     s.opts.coordinator_host, s.opts.coordinator_port,
                     self->system().render(conn.error()),
                     not_troupe ? ": what answers there is not a coordinator's nodes.listen port "
                                  "(server.listen, the HTTP port, is another)"
                                : "");
      s.warned_unreachable = true;
      return;
    }
    s.warned_unreachable = false;
    s.coordinator = *conn;
  }
  s.links.rendezvous = std::make_shared<CoordinatorRendezvous>(self->system(), s.coordinator);
  // Watching it from the first join on: losing the connection (which fails
  // no request to it: CAF's remote requests only time out) must be heard.
  if (!s.watching) {
    self->monitor(s.coordinator);
    s.watching = true;
  }
  s.joining = true;
  // An attempt overtaken by a later one (its connection was lost and a new
  // one joined) must not touch the state the later one made.
  const uint64_t attempt = ++s.join_attempt;
  self->request(s.coordinator, join_timeout(s), join_atom::value, s.opts.join,
                caf::actor_cast<NodeActor>(self))
      .then(
          [=](const JoinReply& reply) {
            if (attempt != st->join_attempt) return;
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
            const double coordinator_s = reply.heartbeat_timeout_ms / 1000.0;
            const auto pace = beat_interval(*st);
            st->coordinator_timeout_s = coordinator_s;
            if (beat_interval(*st) < pace) {
              // The next tick, due at the old pace, would come too late:
              // a new chain beats now and at the new pace.
              self->send(self, ntick_atom::value, ++st->ticks);
              spdlog::info(
                  "node {}: the coordinator's heartbeat timeout ({} s) is shorter than this "
                  "node's ({} s): it beats every {} ms",
                  st->opts.join.name, coordinator_s, st->opts.heartbeat_timeout_s,
                  beat_interval(*st).count());
            }
            spdlog::info("node {}: joined the coordinator as node {} (incarnation {}), {} devices",
                         st->opts.join.name, reply.node, reply.incarnation,
                         st->opts.devices.size());
          },
          [=](caf::error& err) {
            if (attempt != st->join_attempt) return;
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

// A (part of a) replica placed here: any older placement of it goes, then
// its devices and engine. An error when it does not fit.
std::optional<caf::error> prepare(AgentState& s, const ReplicaPlan& plan, Hosted& h,
                                  ReplicaEngine& engine, NodeActor::pointer self) {
  // From the coordinator's process: checked before any of it is used (the
  // engine source indexes hosts and part_names by it).
  if (const std::string problem = replica_plan_problem(plan); !problem.empty()) {
    spdlog::error("node {}: refused a replica plan: {}", s.opts.join.name, problem);
    return caf::make_error(caf::sec::invalid_argument, "replica plan: " + problem);
  }
  if (auto it = s.replicas.find(plan.replica); it != s.replicas.end()) {
    // A start that arrives after a newer one (delayed on the way) is stale.
    if (it->second.epoch > plan.epoch)
      return caf::make_error(caf::sec::runtime_error,
                             "replica " + std::to_string(plan.replica) + " placement " +
                                 std::to_string(plan.epoch) + " is stale: placement " +
                                 std::to_string(it->second.epoch) + " runs here");
    it->second.stop(self);
    free_devices(s, it->second);
    s.replicas.erase(it);
  }
  h.epoch = plan.epoch;
  const int wanted = plan.devices_of(plan.part);
  std::vector<DeviceSpec> devices;
  for (size_t d = 0; d < s.busy.size() && int(h.devices.size()) < wanted; ++d)
    if (!s.busy[d]) {
      h.devices.push_back(int(d));
      devices.push_back(s.opts.devices[d]);
      // A CUDA device with no index is the node's device d.
      if (devices.back().index < 0) devices.back().index = int(d);
    }
  if (int(h.devices.size()) < wanted)
    return caf::make_error(caf::sec::runtime_error,
                           "node " + s.opts.join.name + " has " + std::to_string(h.devices.size()) +
                               " free devices; replica " + std::to_string(plan.replica) +
                               " needs " + std::to_string(wanted));
  try {
    engine = s.opts.engines(plan, devices, s.links);
  } catch (const std::exception& e) {
    spdlog::error("node {}: cannot start replica {}: {}", s.opts.join.name, plan.replica, e.what());
    return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
  }
  return std::nullopt;
}

void host(AgentState& s, int replica, Hosted h) {
  for (int d : h.devices) s.busy[size_t(d)] = true;
  s.replicas[replica] = std::move(h);
}

}  // namespace

NodeActor::behavior_type node_agent(NodeActor::pointer self, NodeAgentOptions options,
                                    CoordinatorActor coordinator) {
  auto st = std::make_shared<AgentState>();
  st->opts = std::move(options);
  st->coordinator = std::move(coordinator);
  st->busy.assign(st->opts.devices.size(), false);
  st->links.address = st->opts.join.address;
  // A collective or rendezvous waits this long for the other parts: long
  // enough for a part to build its engine, short enough that a lost one is
  // noticed (its connection's loss usually tells sooner).
  st->links.timeout =
      std::chrono::milliseconds(int64_t(std::max(30.0, 5 * st->opts.heartbeat_timeout_s) * 1000));
  self->set_down_handler([=](caf::down_msg& dm) {
    AgentState& s = *st;
    if (s.quitting) {
      s.draining.erase(dm.source);
      if (s.draining.empty()) self->quit(s.quit_reason);
      return;
    }
    if (s.coordinator && dm.source == s.coordinator.address()) {
      // The coordinator of this process shutting down says so; a remote
      // one that goes away is seen as a lost connection.
      const bool orderly = dm.reason == caf::exit_reason::user_shutdown;
      spdlog::log(orderly ? spdlog::level::info : spdlog::level::warn,
                  "node {}: lost the coordinator ({})", s.opts.join.name,
                  self->system().render(dm.reason));
      stop_all(self, s, "the coordinator is gone", orderly);
      s.joined = false;
      s.joining = false;
      ++s.join_attempt;
      s.watching = false;
      if (!s.opts.coordinator_host.empty()) s.coordinator = CoordinatorActor{};
      return;
    }
    for (auto it = s.replicas.begin(); it != s.replicas.end(); ++it)
      if (it->second.address() == dm.source) {
        free_devices(s, it->second);
        s.replicas.erase(it);
        return;
      }
  });
  // Shutdown: the replicas go down with the node, and it quits once they
  // are gone. A part of a replica spanning nodes is known to the connection
  // to the leader's node, which it tells of its end as it goes; had the
  // actor system begun its teardown by then (this actor gone), that message
  // waited in a connection no longer served, holding the part, and CAF
  // 0.17's teardown waited for the part's thread: 10 s, until the stuck-exit
  // guard ended the process.
  const auto drain_and_quit = [=](caf::error reason) {
    AgentState& s = *st;
    for (const auto& [r, h] : s.replicas) s.draining.insert(h.address());
    stop_all(self, s, "the node is shutting down", reason == caf::exit_reason::user_shutdown);
    if (s.draining.empty()) return self->quit(reason);
    constexpr auto kDrainFor = std::chrono::seconds(2);
    s.quitting = true;
    s.quit_reason = std::move(reason);
    s.quit_by = Clock::now() + kDrainFor;
    self->delayed_send(self, kDrainFor, ntick_atom::value, ++s.ticks);
  };
  self->set_exit_handler([=](caf::exit_msg& em) {
    AgentState& s = *st;
    if (s.quitting || s.leaving) return;
    // A remote coordinator is told first, and answers once it has placed
    // this node's replicas elsewhere (their requests resume there): the
    // node reads as gone, not as crashed (bounded: a coordinator that does
    // not answer sees the connection drop instead).
    if (!s.joined || !s.coordinator || s.opts.coordinator_host.empty())
      return drain_and_quit(em.reason);
    s.leaving = true;
    caf::error reason = em.reason;
    self->request(s.coordinator, std::chrono::seconds(2), leave_atom::value, s.node, s.incarnation)
        .then([=](bool) { drain_and_quit(reason); }, [=](caf::error&) { drain_and_quit(reason); });
  });
  self->send(self, ntick_atom::value, st->ticks);
  return {
      [=](start_atom, const ReplicaPlan& plan, RouterActor router,
          std::vector<MemberActor> members) -> caf::result<BatcherActor> {
        AgentState& s = *st;
        ReplicaEngine engine;
        Hosted h;
        if (auto err = prepare(s, plan, h, engine, self)) return *err;
        BatcherOptions b;
        b.scheduler.replica = plan.replica;
        b.scheduler.epoch = plan.epoch;
        b.scheduler.kv_blocks = engine.spec.blocks;
        b.scheduler.block_tokens = engine.spec.block_tokens;
        b.scheduler.limits = {plan.max_batch_sequences, plan.max_batch_tokens,
                              plan.prefill_chunk_tokens};
        b.scheduler.groups = engine.spec.pipeline;  // one step in flight per stage
        b.scheduler.lookahead = plan.schedules_ahead();
        b.scheduler.prefix_caching = plan.prefix_caching;
        b.scheduler.stop = s.opts.stop;
        b.scheduler.bos = s.opts.bos;
        b.engine = std::move(engine.factory);
        b.metrics = s.opts.metrics;
        b.parts = {plan.tensor, plan.hosts, plan.leader(), std::move(members)};
        b.vocab_size = s.opts.vocab_size;
        h.batcher = self->spawn<caf::monitored>(batcher, std::move(router), std::move(b));
        spdlog::info(
            "node {}: replica {} started (placement {}, {} device(s){}, {})", s.opts.join.name,
            plan.replica, plan.epoch, h.devices.size(),
            plan.spans() ? ", leading " + std::to_string(plan.part_names.size()) + " parts" : "",
            kv_cache_words(plan));
        BatcherActor handle = h.batcher;
        host(s, plan.replica, std::move(h));
        return handle;
      },
      [=](part_atom, const ReplicaPlan& plan) -> caf::result<MemberActor> {
        AgentState& s = *st;
        ReplicaEngine engine;
        Hosted h;
        if (auto err = prepare(s, plan, h, engine, self)) return *err;
        const std::string name = "replica " + std::to_string(plan.replica) + " part " +
                                 std::to_string(plan.part) + " (" + s.opts.join.name + ")";
        StepLimits limits;
        limits.max_sequences = plan.max_batch_sequences;
        limits.max_tokens = plan.max_batch_tokens;
        h.member = self->spawn<caf::detached + caf::monitored>(member, std::move(engine.factory),
                                                               plan.replica, name, limits);
        // Built on its own thread, from its first message: the parts meet at
        // the rendezvous only once the leader starts too.
        self->send(h.member, build_atom::value);
        spdlog::info("node {}: replica {} part {} started (placement {}, {} device(s), {})",
                     s.opts.join.name, plan.replica, plan.part, plan.epoch, h.devices.size(),
                     kv_cache_words(plan));
        MemberActor handle = h.member;
        host(s, plan.replica, std::move(h));
        return handle;
      },
      [=](placed_atom, int replica, uint64_t epoch) -> caf::result<BatcherActor> {
        AgentState& s = *st;
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || it->second.epoch != epoch || !it->second.batcher)
          return caf::make_error(caf::sec::runtime_error,
                                 "node " + s.opts.join.name + " does not run replica " +
                                     std::to_string(replica) + " placement " +
                                     std::to_string(epoch));
        return it->second.batcher;
      },
      [=](stop_atom, int replica, uint64_t epoch) {
        AgentState& s = *st;
        auto it = s.replicas.find(replica);
        if (it == s.replicas.end() || it->second.epoch != epoch) return;
        it->second.stop(self);
        free_devices(s, it->second);
        s.replicas.erase(it);
      },
      [=](join_atom) {
        // Declared dead while it was away (a stall, a partition): what runs
        // here was placed again elsewhere.
        AgentState& s = *st;
        if (s.leaving || s.quitting) return;  // it left: that is the answer
        spdlog::warn("node {}: the coordinator no longer counts it as a member", s.opts.join.name);
        stop_all(self, s, "declared dead by the coordinator");
        s.joined = false;
        join(self, st);
      },
      [=](alive_atom) { return st->incarnation; },
      [=](ntick_atom, uint64_t chain) {
        AgentState& s = *st;
        if (chain != s.ticks) return;  // replaced by a faster one
        if (s.quitting) {
          if (Clock::now() >= s.quit_by) self->quit(s.quit_reason);
          return;
        }
        if (s.joined) {
          // The answer is traffic that keeps this end of the connection
          // alive (CAF's connection timeout is this node's heartbeat
          // timeout); a membership that is over is told by a join instead.
          self->request(s.coordinator, join_timeout(s), beat_atom::value, s.node, s.incarnation)
              .then([](bool) {}, [](caf::error&) {});
        } else if (!s.joining && Clock::now() - s.last_attempt >= std::chrono::milliseconds(500)) {
          join(self, st);
        }
        self->delayed_send(self, beat_interval(s), ntick_atom::value, s.ticks);
      },
  };
}

}  // namespace troupe
