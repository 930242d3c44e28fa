#include "actors/supervisor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "deploy/yaml_schema.h"
#include "scheduler/partitioner.h"
#include "scheduler/restart_intensity.h"
#include "scheduler/start_failures.h"

namespace troupe {

namespace {

// Heartbeat expiry and waiting placements are looked at this often.
constexpr auto kTick = std::chrono::milliseconds(100);
// A node has this long to build a replica's engine and answer.
constexpr auto kStartTimeout = std::chrono::seconds(120);
// A start unanswered this long: ask the node whether it runs it (the start
// or its answer may have been lost on the way); it has this long to answer.
constexpr double kStartProbeS = 3;
constexpr auto kProbeTimeout = std::chrono::seconds(2);
// A part of a replica spanning nodes is answered once its node has spawned
// it (it builds its engine after, meeting the leader): an answer this late
// was lost on the way, and the replica is placed again.
constexpr auto kPartTimeout = std::chrono::seconds(15);
// A dead node is forgotten (its /metrics series too) after this long.
constexpr double kForgetDeadNodeS = 600;

struct Slot {
  explicit Slot(RestartIntensity i) : intensity(std::move(i)) {}
  uint64_t epoch = 0;                // its current (or last) placement
  BatcherActor batcher;              // while it runs
  bool starting = false;             // its nodes are building it
  int leader_node = -1;              // while starting: where its leader is built
  double start_sent = -1;            // when the leader's start was sent
  double start_probed = -1;          // when the node was last asked about it
  std::vector<int> nodes;            // its parts' nodes, the leader's among them
  std::vector<MemberActor> members;  // a replica spanning nodes: its other parts
  RestartIntensity intensity;
  StartFailures start_failures;  // when to try again, and where not
  bool failed = false;
  bool waiting_logged = false;
  // Faults aimed at it while it was not running: passed on once it runs.
  std::vector<std::pair<FaultOrder, FaultInjectorActor>> faults;
  // Lasting faults in force (slow, KV refusals): a placement after a death
  // gets them too, so that a fault lasts its duration across restarts, as
  // the fault list says it does.
  std::vector<std::pair<FaultOrder, FaultInjectorActor>> lasting;
};

// A join under the name of a live node, from another process: it waits
// for that node to say whether it is still there.
struct PendingJoin {
  uint64_t ticket = 0;
  int holder = -1;  // the live node of that name
  uint64_t incarnation = 0;
  JoinRequest request;
  NodeActor agent;
  caf::typed_response_promise<JoinReply> promise;
};

struct SupervisorState {
  SupervisorOptions opts;
  RouterActor router;
  std::shared_ptr<SupervisorShared> shared;
  Metrics* metrics = nullptr;
  Cluster cluster;
  std::map<int, NodeActor> nodes;                 // live nodes' agents, by node id
  std::map<std::string, std::string> rendezvous;  // spanning replicas' parts meet here
  std::vector<Slot> slots;
  uint64_t next_epoch = 1;
  std::map<std::string, PendingJoin> pending_joins;  // by name
  uint64_t next_ticket = 1;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  explicit SupervisorState(const SupervisorOptions& o) : opts(o), cluster(o.cluster) {}
  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

std::string wanted_node(const SupervisorState& s, size_t replica) {
  return replica < s.opts.placement.size() ? s.opts.placement[replica] : "any";
}

void publish(SupervisorState& s) {
  std::vector<NodeRecord> nodes;
  for (const NodeRecord* n : s.cluster.nodes()) nodes.push_back(*n);
  if (s.metrics) {
    int live = 0;
    for (const auto& n : nodes) {
      live += n.state == NodeState::Live ? 1 : 0;
      // A dead node's age keeps growing: it has not been heard from since.
      s.metrics->set_node(n.name, n.state == NodeState::Live, n.devices, int(n.replicas.size()),
                          std::max(0.0, s.now() - n.last_heard));
    }
    s.metrics->set_nodes(live, int(nodes.size()) - live);
  }
  std::lock_guard<std::mutex> l(s.shared->mu);
  s.shared->nodes = std::move(nodes);
}

void place_waiting(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st);

// The replica's placement is over: the router resumes its requests (or,
// with `give_up`, fails them for good), and its devices are free again.
std::string rendezvous_prefix(size_t replica, uint64_t epoch) {
  return "replica" + std::to_string(replica) + "/epoch" + std::to_string(epoch) + "/";
}

void end_placement(SupervisorActor::pointer self, SupervisorState& s, size_t r, bool give_up) {
  Slot& slot = s.slots[r];
  if (slot.batcher) self->demonitor(slot.batcher.address());
  for (const MemberActor& m : slot.members) {
    if (!m) continue;
    self->demonitor(m.address());
    self->send_exit(m, caf::exit_reason::user_shutdown);
  }
  // Every live node it was placed on stops what it runs of this placement
  // and frees those devices in its own books at once, before any later
  // start from here reaches it (same sender, same order). Without it, a
  // leader on a live node whose part's node died ran on (idle, or waiting
  // in a collective) holding devices the cluster counts free, and the next
  // start placed there was refused for want of them.
  for (int node : slot.nodes)
    if (auto agent = s.nodes.find(node); agent != s.nodes.end())
      self->send(agent->second, stop_atom::value, int(r), slot.epoch);
  self->send(s.router, down_atom::value, int(r), slot.epoch, give_up);
  slot.batcher = BatcherActor{};
  slot.members.clear();
  slot.starting = false;
  slot.nodes.clear();
  s.cluster.unplace(int(r));
  if (s.metrics) s.metrics->set_replica_placed(int(r), false);
  const std::string prefix = rendezvous_prefix(r, slot.epoch);
  for (auto it = s.rendezvous.lower_bound(prefix);
       it != s.rendezvous.end() && it->first.starts_with(prefix);)
    it = s.rendezvous.erase(it);
}

void replica_died(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, size_t r,
                  const std::string& why) {
  SupervisorState& s = *st;
  Slot& slot = s.slots[r];
  const bool restart = slot.intensity.allow_restart(s.now());
  spdlog::warn("replica {} died ({}); {}", r, why,
               restart ? "restarting" : "restart limit reached, it stays down");
  {
    std::lock_guard<std::mutex> l(s.shared->mu);
    s.shared->last_death[r] = why;
  }
  if (s.opts.faults) s.opts.faults->replica_died(int(r), why, s.opts.faults->now());
  end_placement(self, s, r, !restart);
  if (!restart) {
    slot.failed = true;
    s.shared->failed[r] = true;
    return;
  }
  ++s.shared->restarts[r];
  if (s.metrics) s.metrics->replica_restarted(int(r));
  place_waiting(self, st);
}

void admit_pending(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, int node);

// A node the cluster has declared dead: its agent is forgotten (and told,
// if it can still hear, that its membership is over: that fences whatever
// it runs), and its replicas are placed anew. A node's death is not its
// replicas' fault: it does not count against their restart intensity.
void bury(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, int node,
          const std::string& cause) {
  SupervisorState& s = *st;
  const NodeRecord* rec = s.cluster.node(node);
  auto agent = s.nodes.find(node);
  if (agent != s.nodes.end()) {
    self->demonitor(agent->second.address());
    self->send(agent->second, join_atom::value);
    s.nodes.erase(agent);
  }
  int moved = 0;
  for (size_t r = 0; r < s.slots.size(); ++r)
    if (std::find(s.slots[r].nodes.begin(), s.slots[r].nodes.end(), node) !=
        s.slots[r].nodes.end()) {
      end_placement(self, s, r, false);
      ++moved;
    }
  if (cause == "left")
    spdlog::info("node {} left (it is shutting down); {} replica(s) to place again",
                 rec ? rec->name : std::to_string(node), moved);
  else
    spdlog::warn("node {} is dead ({}{}); {} replica(s) to place again",
                 rec ? rec->name : std::to_string(node), cause,
                 cause == "heartbeat"
                     ? ": silent for over " +
                           schema::format_number(s.opts.cluster.heartbeat_timeout_s) + " s"
                     : "",
                 moved);
  if (s.metrics) s.metrics->node_dead(cause);
  publish(s);
  place_waiting(self, st);
  // A process waiting to take its name (its restart) joins now.
  admit_pending(self, st, node);
}

void node_lost(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, int node,
               const std::string& cause) {
  if (st->cluster.lost(node, cause)) bury(self, st, node, cause);
}

// Admits a node (Cluster::join decides), or says why not.
JoinReply admit(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st,
                const JoinRequest& req, const NodeActor& agent) {
  SupervisorState& s = *st;
  // Same CAF node: the agent runs in this process (nodes.local).
  const bool in_process = agent.node() == self->node();
  const JoinReply reply = s.cluster.join(req, s.now(), in_process);
  if (!reply.accepted) {
    spdlog::warn("node {} refused: {}", req.name, reply.reason);
    return reply;
  }
  spdlog::info("node {} joined ({} device(s), {})", req.name, req.devices, req.address);
  s.nodes[reply.node] = agent;
  self->monitor(agent);
  // A new node has failed no start: a replica waiting out its backoff
  // (its starts failed on nodes too small for it) is tried there now.
  for (Slot& slot : s.slots) slot.start_failures.node_joined();
  place_waiting(self, st);
  return reply;
}

void admit_pending(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, int node) {
  for (auto it = st->pending_joins.begin(); it != st->pending_joins.end(); ++it)
    if (it->second.holder == node) {
      PendingJoin p = std::move(it->second);
      st->pending_joins.erase(it);
      p.promise.deliver(admit(self, st, p.request, p.agent));
      return;
    }
}

// A join under the name of a live node. The same process joining again
// (the answer to its join was lost) ends its old membership; another
// process takes the name only from a node that is dead: silent past the
// heartbeat timeout, or not answering when asked (a restart whose
// predecessor's death was not seen yet). A holder that answers keeps its
// name, and the newcomer is refused naming it: two live nodes with one
// name would otherwise evict each other for ever.
caf::typed_response_promise<JoinReply> join_named(SupervisorActor::pointer self,
                                                  std::shared_ptr<SupervisorState> st,
                                                  const JoinRequest& req, const NodeActor& agent) {
  SupervisorState& s = *st;
  auto promise = self->make_response_promise<JoinReply>();
  const NameClaim claim = s.cluster.claim(req.name, s.now());
  const auto holder = s.nodes.find(claim.node);
  if (claim.holder == NameClaim::Holder::None || claim.holder == NameClaim::Holder::InProcess) {
    promise.deliver(admit(self, st, req, agent));  // free, or refused by the cluster
    return promise;
  }
  if (holder == s.nodes.end() || holder->second.address() == agent.address()) {
    node_lost(self, st, claim.node, "joined again");
    promise.deliver(admit(self, st, req, agent));
    return promise;
  }
  if (claim.holder == NameClaim::Holder::Silent) {
    node_lost(self, st, claim.node, "heartbeat");
    promise.deliver(admit(self, st, req, agent));
    return promise;
  }
  if (auto waiting = s.pending_joins.find(req.name); waiting != s.pending_joins.end()) {
    if (waiting->second.agent.address() == agent.address()) {
      // The same process asking again (its first join timed out there,
      // e.g. with a shorter heartbeat timeout than ours): this one is
      // answered when the holder is.
      waiting->second.request = req;
      waiting->second.promise = promise;
      return promise;
    }
    JoinReply busy;
    busy.reason = "another process is joining as '" + req.name +
                  "' already, waiting for the live node of that name to answer";
    spdlog::warn("node {} refused: {}", req.name, busy.reason);
    promise.deliver(busy);
    return promise;
  }
  const uint64_t ticket = s.next_ticket++;
  PendingJoin& p = s.pending_joins[req.name];
  p = {ticket, claim.node, s.cluster.node(claim.node)->incarnation, req, agent, promise};
  spdlog::info("node {}: another process joins under its name; asking it whether it is alive",
               req.name);
  // A live agent answers at once (it beats every quarter of the timeout).
  const auto wait = std::chrono::milliseconds(
      int64_t(std::clamp(s.opts.cluster.heartbeat_timeout_s, 0.5, 5.0) * 1000));
  const std::string name = req.name;
  self->request(holder->second, wait, alive_atom::value)
      .then(
          [=](uint64_t) {
            auto it = st->pending_joins.find(name);
            if (it == st->pending_joins.end() || it->second.ticket != ticket) return;
            PendingJoin q = std::move(it->second);
            st->pending_joins.erase(it);
            JoinReply refused;
            refused.reason = st->cluster.name_taken(q.holder, st->now());
            spdlog::warn("node {} refused: {}", name, refused.reason);
            q.promise.deliver(refused);
          },
          [=](caf::error& err) {
            auto it = st->pending_joins.find(name);
            if (it == st->pending_joins.end() || it->second.ticket != ticket) return;
            PendingJoin q = std::move(it->second);
            st->pending_joins.erase(it);
            spdlog::warn("node {}: its old process does not answer ({}); the new one replaces it",
                         name, self->system().render(err));
            const NodeRecord* h = st->cluster.node(q.holder);
            if (h && h->state == NodeState::Live && h->incarnation == q.incarnation)
              node_lost(self, st, q.holder, "joined again");
            q.promise.deliver(admit(self, st, q.request, q.agent));
          });
  return promise;
}

ReplicaPlan plan_for(const SupervisorState& s, size_t r, uint64_t epoch) {
  ReplicaPlan p = s.opts.plan;
  p.replica = int(r);
  p.epoch = epoch;
  return p;
}

// A node answered that placement `epoch` of replica r runs there.
void adopt(SupervisorActor::pointer self, SupervisorState& s, size_t r, uint64_t epoch,
           const BatcherActor& b) {
  Slot& sl = s.slots[r];
  if (sl.epoch != epoch || !sl.starting) {
    // Placed anew meanwhile (a node died), or adopted already.
    if (sl.batcher != b) self->send_exit(b, caf::exit_reason::user_shutdown);
    return;
  }
  sl.starting = false;
  sl.start_sent = -1;
  sl.start_failures.started();
  sl.batcher = b;
  self->monitor(b);
  for (auto& [order, reporter] : sl.faults) self->send(b, fault_atom::value, order, reporter);
  for (auto& [order, reporter] : sl.lasting) {
    const auto id = order.id;  // (clang 14 cannot capture a structured binding)
    if (std::none_of(sl.faults.begin(), sl.faults.end(),
                     [id](const auto& f) { return f.first.id == id; }))
      self->send(b, fault_atom::value, order, reporter);
  }
  sl.faults.clear();
  publish(s);
}

// A node could not build the replica (it does not fit there, or refused).
// That is the node's shortcoming, not a crash of the replica: it does not
// count against the restart intensity (which a node too small for it would
// use up in a second, leaving the replica down for good however many good
// nodes joined later). The next try waits, longer after each failure in a
// row, and passes that node over for a while (StartFailures).
void start_failed(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, size_t r,
                  int node, const std::string& why) {
  SupervisorState& s = *st;
  Slot& slot = s.slots[r];
  slot.start_failures.failed(node, s.now());
  const NodeRecord* rec = s.cluster.node(node);
  spdlog::warn(
      "replica {} could not start on node {}: {}; trying again in {:.1f} s, elsewhere "
      "if another node can hold it",
      r, rec ? rec->name : std::to_string(node), why,
      std::max(0.0, slot.start_failures.next_try() - s.now()));
  {
    std::lock_guard<std::mutex> l(s.shared->mu);
    s.shared->last_death[r] = "could not start: " + why;
  }
  end_placement(self, s, r, false);
  place_waiting(self, st);
}

// The replica's leader starts once its other parts are up (each builds its
// engine when the leader's meets it at the rendezvous).
void start_leader(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, size_t r,
                  uint64_t epoch, ReplicaPlan plan, int leader_node) {
  SupervisorState& s = *st;
  Slot& slot = s.slots[r];
  plan.part = plan.leader();
  slot.leader_node = leader_node;
  slot.start_sent = s.now();
  slot.start_probed = -1;
  self->request(s.nodes.at(leader_node), kStartTimeout, start_atom::value, plan, s.router,
                slot.members)
      .then([=](BatcherActor b) { adopt(self, *st, r, epoch, b); },
            [=](caf::error& err) {
              Slot& sl = st->slots[r];
              if (sl.epoch != epoch || !sl.starting) return;
              start_failed(self, st, r, leader_node, self->system().render(err));
            });
}

// A part of a replica spanning nodes (not its leader) ended while placed.
// Its node's lost connection is the node's death, handled as such when the
// node's agent is seen gone; a part its node stopped (shutting down) is not
// the replica's fault either. Anything else is the replica's death.
void part_down(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st, size_t r,
               size_t member, const caf::down_msg& dm) {
  if (dm.reason == caf::exit_reason::remote_link_unreachable) return;
  SupervisorState& s = *st;
  Slot& slot = s.slots[r];
  const auto lead = std::find(slot.nodes.begin(), slot.nodes.end(), slot.leader_node);
  const size_t part = size_t(part_of_member(int(member), int(lead - slot.nodes.begin())));
  const int node = part < slot.nodes.size() ? slot.nodes[part] : -1;
  const NodeRecord* rec = s.cluster.node(node);
  const std::string where =
      "its part " + std::to_string(part) + " on node " + (rec ? rec->name : std::to_string(node));
  const std::string why = self->system().render(dm.reason);
  if (slot.starting) return start_failed(self, st, r, node, where + " ended: " + why);
  if (dm.reason == caf::exit_reason::user_shutdown) {
    spdlog::warn("replica {}: {} was stopped by its node; placing it again", r, where);
    end_placement(self, s, r, false);
    return place_waiting(self, st);
  }
  replica_died(self, st, r, where + " died: " + why);
}

// Starts whose answer is late: the node says whether it runs them. One it
// does not run was lost on the way, and is placed again (not the replica's
// fault: it does not count against its restart intensity). A node busy
// building an engine answers after it, which is the start's answer anyway.
void probe_starts(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st) {
  SupervisorState& s = *st;
  const double now = s.now();
  for (size_t r = 0; r < s.slots.size(); ++r) {
    Slot& slot = s.slots[r];
    if (!slot.starting || slot.start_sent < 0 || now - slot.start_sent < kStartProbeS ||
        now - slot.start_probed < kStartProbeS)
      continue;
    auto node = s.nodes.find(slot.leader_node);
    if (node == s.nodes.end()) continue;
    slot.start_probed = now;
    const uint64_t epoch = slot.epoch;
    self->request(node->second, kProbeTimeout, placed_atom::value, int(r), epoch)
        .then([=](BatcherActor b) { adopt(self, *st, r, epoch, b); },
              [=](caf::error& err) {
                Slot& sl = st->slots[r];
                if (sl.epoch != epoch || !sl.starting || err == caf::sec::request_timeout) return;
                spdlog::warn(
                    "replica {}: its start (placement {}) was lost on the way ({}); "
                    "placing it again",
                    r, epoch, self->system().render(err));
                end_placement(self, *st, r, false);
                place_waiting(self, st);
              });
  }
}

void place_waiting(SupervisorActor::pointer self, std::shared_ptr<SupervisorState> st) {
  SupervisorState& s = *st;
  for (size_t r = 0; r < s.slots.size(); ++r) {
    Slot& slot = s.slots[r];
    if (slot.failed || slot.batcher || slot.starting) continue;
    if (!slot.start_failures.may_try(s.now())) continue;  // the tick comes back to it
    const std::string wanted = wanted_node(s, r);
    const auto parts =
        s.cluster.choose(wanted, s.opts.plan.devices(), slot.start_failures.avoid(s.now()));
    if (!parts) {
      // Before its first placement this is start-up (the nodes, this
      // process's own too, join after the coordinator); after, a loss.
      if (!slot.waiting_logged)
        spdlog::log(slot.epoch == 0 ? spdlog::level::info : spdlog::level::warn,
                    "replica {} waits for a node ({}) with {} free device(s)", r, wanted,
                    s.opts.plan.devices());
      slot.waiting_logged = true;
      continue;
    }
    slot.waiting_logged = false;
    s.cluster.place(int(r), *parts);
    const uint64_t epoch = s.next_epoch++;
    slot.epoch = epoch;
    slot.starting = true;
    if (s.metrics) s.metrics->set_replica_placed(int(r), true);
    slot.nodes.clear();
    for (const auto& [node, devices] : *parts) slot.nodes.push_back(node);
    ReplicaPlan plan = plan_for(s, r, epoch);
    if (parts->size() > 1) {
      // Devices stage-major, each part a contiguous run of them; the parts
      // must agree on the stages, so they are split evenly here.
      for (size_t p = 0; p < parts->size(); ++p) {
        plan.hosts.insert(plan.hosts.end(), size_t((*parts)[p].second), int(p));
        plan.part_names.push_back(s.cluster.node((*parts)[p].first)->name);
      }
      if (plan.stage_bounds.empty() && plan.pipeline > 1) {
        const StagePartition even = equal_partition(s.opts.layers, plan.pipeline);
        plan.stage_bounds = even.boundaries;
      }
    }
    const int leader_node = slot.nodes[size_t(plan.leader())];
    slot.leader_node = leader_node;
    if (!plan.spans()) {
      start_leader(self, st, r, epoch, plan, leader_node);
      continue;
    }
    auto waiting = std::make_shared<int>(int(parts->size()) - 1);
    slot.members.assign(parts->size() - 1, MemberActor{});
    for (size_t p = 0, m = 0; p < parts->size(); ++p) {
      if (int(p) == plan.leader()) continue;
      ReplicaPlan part = plan;
      part.part = int(p);
      const size_t index = m++;
      self->request(s.nodes.at(slot.nodes[p]), kPartTimeout, part_atom::value, part)
          .then(
              [=](MemberActor member) {
                Slot& sl = st->slots[r];
                if (sl.epoch != epoch || !sl.starting) {
                  self->send_exit(member, caf::exit_reason::user_shutdown);
                  return;
                }
                sl.members[index] = member;
                // Watched from here, where its node's connection is: the
                // leader's link to it crosses two connections, and CAF
                // 0.17 never told the leader of a part that exited while
                // its process lived on (an idle replica ran on without it).
                self->monitor(member);
                if (--*waiting == 0) start_leader(self, st, r, epoch, plan, leader_node);
              },
              [=](caf::error& err) {
                Slot& sl = st->slots[r];
                if (sl.epoch != epoch || !sl.starting) return;
                start_failed(self, st, r, sl.nodes[p],
                             "its part " + std::to_string(p) + ": " + self->system().render(err));
              });
    }
  }
  publish(s);
}

}  // namespace

SupervisorActor::behavior_type supervisor(SupervisorActor::pointer self, RouterActor router,
                                          SupervisorOptions options,
                                          std::shared_ptr<SupervisorShared> shared,
                                          Metrics* metrics) {
  auto st = std::make_shared<SupervisorState>(options);
  st->router = std::move(router);
  st->shared = std::move(shared);
  st->metrics = metrics;
  for (int i = 0; i < st->opts.replicas; ++i)
    st->slots.emplace_back(RestartIntensity(st->opts.max_restarts, st->opts.window_s));
  // Down until first placed (it waits for a node meanwhile).
  if (st->metrics)
    for (size_t r = 0; r < st->slots.size(); ++r) st->metrics->set_replica_placed(int(r), false);
  self->set_down_handler([=](caf::down_msg& dm) {
    SupervisorState& s = *st;
    for (const auto& [id, agent] : s.nodes)
      if (agent.address() == dm.source) {
        node_lost(self, st, id, "connection lost");
        return;
      }
    for (size_t r = 0; r < s.slots.size(); ++r) {
      if (s.slots[r].batcher && s.slots[r].batcher.address() == dm.source) {
        replica_died(self, st, r, self->system().render(dm.reason));
        return;
      }
      const auto& members = s.slots[r].members;
      for (size_t m = 0; m < members.size(); ++m)
        if (members[m] && members[m].address() == dm.source) return part_down(self, st, r, m, dm);
    }
  });
  // Shutdown: take the replicas down with us.
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto& slot : st->slots)
      if (slot.batcher) self->send_exit(slot.batcher, em.reason);
    self->quit(em.reason);
  });
  self->send(self, stick_atom::value);
  return {
      [=](join_atom, const JoinRequest& req, NodeActor agent)
          -> caf::typed_response_promise<JoinReply> { return join_named(self, st, req, agent); },
      // Answered, so that a node hears from us at its own beat's pace: with
      // only our CAF heartbeats (a quarter of our timeout), a node of a
      // shorter timeout saw its connection time out between them.
      [=](beat_atom, int node, uint64_t incarnation) -> bool {
        SupervisorState& s = *st;
        if (s.cluster.heard_from(node, incarnation, s.now())) return true;
        // It speaks for a membership that is over (declared dead while it
        // was away): it must stop what it runs and join again.
        self->send(caf::actor_cast<NodeActor>(self->current_sender()), join_atom::value);
        return false;
      },
      [=](leave_atom, int node, uint64_t incarnation) {
        // A node shutting down (SIGTERM): its replicas are placed again and
        // their requests resumed at once, before its connection drops, and
        // it reads as gone, not as a crash.
        const NodeRecord* n = st->cluster.node(node);
        if (!n || n->incarnation != incarnation || n->state != NodeState::Live) return false;
        node_lost(self, st, node, "left");
        return true;
      },
      [=](stick_atom) {
        SupervisorState& s = *st;
        for (int node : s.cluster.expire(s.now())) bury(self, st, node, "heartbeat");
        const auto forgotten = s.cluster.forget_dead(s.now(), kForgetDeadNodeS);
        for (const std::string& name : forgotten) {
          spdlog::info("node {}: forgotten, dead for over {:.0f} s", name, kForgetDeadNodeS);
          if (s.metrics) s.metrics->forget_node(name);
        }
        if (!forgotten.empty()) publish(s);
        probe_starts(self, st);
        place_waiting(self, st);
        self->delayed_send(self, kTick, stick_atom::value);
      },
      [=](rdvset_atom, const std::string& key, const std::string& value) {
        st->rendezvous[key] = value;
        return true;
      },
      [=](rdvget_atom, const std::string& key) {
        auto it = st->rendezvous.find(key);
        return it == st->rendezvous.end() ? std::string() : it->second;
      },
      [=](broken_atom, int replica, uint64_t epoch, const std::string& why) {
        SupervisorState& s = *st;
        if (replica < 0 || size_t(replica) >= s.slots.size()) return;
        Slot& slot = s.slots[size_t(replica)];
        // Already over, or placed anew. A placement still starting counts:
        // its node's answer may have been lost while its batcher reported
        // up to the router directly, and dropping the report would leave it
        // adopted later (probe_starts) while the router ignores it for good.
        if (slot.epoch != epoch || (!slot.batcher && !slot.starting)) return;
        // It may still run, deaf or mute: its nodes are told to stop it
        // (end_placement, from replica_died; the router ignores it from now
        // on either way, by its epoch).
        if (slot.batcher) self->send_exit(slot.batcher, caf::exit_reason::user_shutdown);
        replica_died(self, st, size_t(replica), why);
      },
      [=](fault_atom a, const FaultOrder& o, const FaultInjectorActor& reporter) {
        if (o.replica < 0 || size_t(o.replica) >= st->slots.size()) {
          self->send(reporter, a,
                     FaultReport{o.id, FaultOutcome::Refused,
                                 "no replica " + std::to_string(o.replica) + " (there are " +
                                     std::to_string(st->slots.size()) + ")"});
          return;
        }
        Slot& slot = st->slots[size_t(o.replica)];
        if (fault_lasts(o.kind)) {
          std::erase_if(slot.lasting, [&](const auto& f) { return f.first.id == o.id; });
          if (!o.end && !slot.failed) slot.lasting.emplace_back(o, reporter);
        }
        if (slot.failed && o.end) {
          // Nothing runs there to end or withdraw it from.
        } else if (slot.failed) {
          self->send(reporter, a,
                     FaultReport{o.id, FaultOutcome::Refused,
                                 "replica " + std::to_string(o.replica) +
                                     " stays down (its restart limit was reached)"});
        } else if (slot.batcher) {
          self->send(slot.batcher, a, o, reporter);
        } else if (o.end) {
          // Not yet passed on (the replica was down all along): it never
          // starts. A one-shot fault given up on is withdrawn here.
          const size_t dropped =
              std::erase_if(slot.faults, [&](const auto& f) { return f.first.id == o.id; });
          if (dropped > 0 && !fault_lasts(o.kind))
            self->send(reporter, a,
                       FaultReport{o.id, FaultOutcome::Withdrawn,
                                   "replica " + std::to_string(o.replica) +
                                       " was not running; it will not be passed on"});
        } else {
          slot.faults.emplace_back(o, reporter);
        }
      },
  };
}

}  // namespace troupe
