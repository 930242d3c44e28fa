#include "scheduler/cluster.h"

#include <stdexcept>

namespace troupe {

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  if (!(options_.heartbeat_timeout_s > 0))
    throw std::invalid_argument("nodes.heartbeat_timeout_s must be positive");
}

NodeRecord* Cluster::find(int id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

const NodeRecord* Cluster::node(int id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<const NodeRecord*> Cluster::nodes() const {
  std::vector<const NodeRecord*> out;
  for (const auto& [id, n] : nodes_) out.push_back(&n);
  return out;
}

int Cluster::live_nodes() const {
  int n = 0;
  for (const auto& [id, rec] : nodes_) n += rec.state == NodeState::Live ? 1 : 0;
  return n;
}

JoinReply Cluster::join(const JoinRequest& r, double now) {
  JoinReply reply;
  auto refuse = [&](std::string why) {
    reply.reason = std::move(why);
    return reply;
  };
  if (!options_.token.empty() && r.token != options_.token)
    return refuse("wrong or missing token (nodes.token)");
  if (r.protocol != options_.protocol)
    return refuse("protocol " + std::to_string(r.protocol) + " (troupe " + r.version +
                  "), the coordinator speaks " + std::to_string(options_.protocol));
  if (r.model != options_.model)
    return refuse("another model: its fingerprint is " + r.model + ", the coordinator serves " +
                  options_.model);
  if (r.devices < 1) return refuse("it offers no devices");
  if (r.name.empty()) return refuse("it has no name");
  NodeRecord* same = nullptr;
  for (auto& [id, n] : nodes_)
    if (n.name == r.name) same = &n;
  if (same && same->state == NodeState::Live)
    return refuse("a live node is already called '" + r.name + "'");
  NodeRecord& n = same ? *same : nodes_[next_id_];
  if (!same) n.id = next_id_++;
  n.name = r.name;
  n.address = r.address;
  n.devices = r.devices;
  n.state = NodeState::Live;
  n.incarnation = next_incarnation_++;
  n.last_heard = now;
  n.death.clear();
  n.replicas.clear();
  n.used_devices = 0;
  reply.accepted = true;
  reply.node = n.id;
  reply.incarnation = n.incarnation;
  return reply;
}

bool Cluster::heard_from(int id, uint64_t incarnation, double now) {
  NodeRecord* n = find(id);
  if (!n || n->state != NodeState::Live || n->incarnation != incarnation) return false;
  n->last_heard = now;
  return true;
}

void Cluster::declare_dead(NodeRecord& n, const std::string& cause) {
  n.state = NodeState::Dead;
  n.death = cause;
  ++detections_[cause];
  for (int r : n.replicas) {
    placement_.erase(r);
    devices_of_.erase(r);
  }
  n.replicas.clear();
  n.used_devices = 0;
}

std::vector<int> Cluster::expire(double now) {
  std::vector<int> dead;
  for (auto& [id, n] : nodes_)
    if (n.state == NodeState::Live && now - n.last_heard > options_.heartbeat_timeout_s) {
      declare_dead(n, "heartbeat");
      dead.push_back(id);
    }
  return dead;
}

bool Cluster::lost(int id, const std::string& cause) {
  NodeRecord* n = find(id);
  if (!n || n->state != NodeState::Live) return false;
  declare_dead(*n, cause);
  return true;
}

void Cluster::place(int replica, int node, int devices) {
  NodeRecord* n = find(node);
  if (!n || n->state != NodeState::Live)
    throw std::logic_error("replica " + std::to_string(replica) +
                           " placed on a node that is not live");
  unplace(replica);
  if (n->devices - n->used_devices < devices)
    throw std::logic_error(
        "node '" + n->name + "' has " + std::to_string(n->devices - n->used_devices) +
        " free devices, replica " + std::to_string(replica) + " needs " + std::to_string(devices));
  n->replicas.push_back(replica);
  n->used_devices += devices;
  placement_[replica] = node;
  devices_of_[replica] = devices;
}

void Cluster::unplace(int replica) {
  auto it = placement_.find(replica);
  if (it == placement_.end()) return;
  if (NodeRecord* n = find(it->second)) {
    std::erase(n->replicas, replica);
    n->used_devices -= devices_of_[replica];
  }
  placement_.erase(it);
  devices_of_.erase(replica);
}

std::optional<int> Cluster::node_of(int replica) const {
  auto it = placement_.find(replica);
  if (it == placement_.end()) return std::nullopt;
  return it->second;
}

std::optional<int> Cluster::choose(const std::string& wanted, int devices) const {
  std::optional<int> best;
  int best_free = -1;
  for (const auto& [id, n] : nodes_) {
    if (n.state != NodeState::Live) continue;
    if (!wanted.empty() && wanted != "any" && wanted != n.name) continue;
    const int free = n.devices - n.used_devices;
    if (free < devices) continue;
    if (free > best_free) {
      best = id;
      best_free = free;
    }
  }
  return best;
}

}  // namespace troupe
