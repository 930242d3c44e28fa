#include "scheduler/cluster.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
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

JoinReply Cluster::join(const JoinRequest& r, double now, bool in_process) {
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
    return refuse("another model: it serves " + r.model + ", the coordinator " + options_.model +
                  " (the same file, dtype and config on both sides)");
  if (r.devices < 1) return refuse("it offers no devices");
  if (const std::string problem = node_name_problem(r.name); !problem.empty())
    return refuse(problem);
  NodeRecord* same = nullptr;
  for (auto& [id, n] : nodes_)
    if (n.name == r.name) same = &n;
  if (same && same->state == NodeState::Live) return refuse(name_taken(same->id, now));
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
  n.in_process = in_process;
  reply.accepted = true;
  reply.node = n.id;
  reply.incarnation = n.incarnation;
  reply.heartbeat_timeout_ms =
      uint32_t(std::clamp(std::ceil(options_.heartbeat_timeout_s * 1000), 1.0, double(UINT32_MAX)));
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
  // Its replicas are over on every node they spanned.
  const std::vector<int> replicas = n.replicas;
  for (int r : replicas) unplace(r);
  n.replicas.clear();
  n.used_devices = 0;
}

std::vector<int> Cluster::expire(double now) {
  std::vector<int> dead;
  for (auto& [id, n] : nodes_)
    if (n.state == NodeState::Live && !n.in_process &&
        now - n.last_heard > options_.heartbeat_timeout_s) {
      declare_dead(n, "heartbeat");
      dead.push_back(id);
    }
  return dead;
}

std::string node_name_problem(const std::string& name) {
  if (name.empty()) return "it has no name";
  if (name == "any") return "its name 'any' means any node in placement.replicas; give it another";
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return "its name has a character other than letters, digits, '.', '_' and '-' (names "
             "are written in logs, metrics and placement lists, where ',' separates them)";
  return {};
}

std::vector<std::string> Cluster::forget_dead(double now, double after_s) {
  std::vector<std::string> names;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const NodeRecord& n = it->second;
    if (n.state == NodeState::Dead && now - n.last_heard > after_s) {
      names.push_back(n.name);
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
  return names;
}

bool Cluster::lost(int id, const std::string& cause) {
  NodeRecord* n = find(id);
  if (!n || n->state != NodeState::Live) return false;
  declare_dead(*n, cause);
  return true;
}

NameClaim Cluster::claim(const std::string& name, double now) const {
  for (const auto& [id, n] : nodes_) {
    if (n.name != name || n.state != NodeState::Live) continue;
    if (n.in_process) return {NameClaim::Holder::InProcess, id};
    if (now - n.last_heard > options_.heartbeat_timeout_s) return {NameClaim::Holder::Silent, id};
    return {NameClaim::Holder::Heard, id};
  }
  return {};
}

std::string Cluster::name_taken(int id, double now) const {
  const NodeRecord* n = node(id);
  if (!n) return "a live node has that name";
  char heard[32];
  std::snprintf(heard, sizeof heard, "%.1f", std::max(0.0, now - n->last_heard));
  return "a live node is already called '" + n->name + "' (node " + std::to_string(n->id) +
         (n->in_process ? ", the coordinator's own" : ", at " + n->address) + ", heard from " +
         heard + " s ago): stop that one first, or give this one another name (--name)";
}

void Cluster::place(int replica, const Parts& parts) {
  unplace(replica);
  for (const auto& [id, devices] : parts) {
    const NodeRecord* n = node(id);
    if (!n || n->state != NodeState::Live)
      throw std::logic_error("replica " + std::to_string(replica) +
                             " placed on a node that is not live");
    if (n->devices - n->used_devices < devices)
      throw std::logic_error("node '" + n->name + "' has " +
                             std::to_string(n->devices - n->used_devices) +
                             " free devices, replica " + std::to_string(replica) + " needs " +
                             std::to_string(devices));
  }
  for (const auto& [id, devices] : parts) {
    NodeRecord* n = find(id);
    n->replicas.push_back(replica);
    n->used_devices += devices;
  }
  placement_[replica] = parts;
}

void Cluster::unplace(int replica) {
  auto it = placement_.find(replica);
  if (it == placement_.end()) return;
  for (const auto& [id, devices] : it->second)
    if (NodeRecord* n = find(id)) {
      std::erase(n->replicas, replica);
      n->used_devices -= devices;
    }
  placement_.erase(it);
}

std::vector<int> Cluster::nodes_of(int replica) const {
  std::vector<int> out;
  auto it = placement_.find(replica);
  if (it != placement_.end())
    for (const auto& [id, devices] : it->second) out.push_back(id);
  return out;
}

std::vector<std::string> placement_names(const std::string& where) {
  std::vector<std::string> names;
  for (size_t start = 0;;) {
    const size_t comma = where.find(',', start);
    names.push_back(where.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) return names;
    start = comma + 1;
  }
}

std::optional<Cluster::Parts> Cluster::choose(const std::string& wanted, int devices,
                                              const std::set<int>& avoid) const {
  auto free_of = [](const NodeRecord& n) { return n.devices - n.used_devices; };
  if (wanted.find(',') != std::string::npos) {
    // Named nodes, in order, each with its share.
    const std::vector<std::string> names = placement_names(wanted);
    const int k = int(names.size());
    if (k > devices) return std::nullopt;
    Parts parts;
    for (int i = 0; i < k; ++i) {
      const int share = devices / k + (i < devices % k ? 1 : 0);
      const NodeRecord* found = nullptr;
      for (const auto& [id, n] : nodes_)
        if (n.name == names[size_t(i)] && n.state == NodeState::Live) found = &n;
      if (!found || free_of(*found) < share) return std::nullopt;
      parts.emplace_back(found->id, share);
    }
    return parts;
  }
  const bool any = wanted.empty() || wanted == "any";
  // Live nodes outside `skip`, the freest first.
  const auto pick = [&](const std::set<int>& skip) -> std::optional<Parts> {
    std::vector<const NodeRecord*> live;
    for (const auto& [id, n] : nodes_)
      if (n.state == NodeState::Live && (any || n.name == wanted) && free_of(n) > 0 &&
          !skip.contains(id))
        live.push_back(&n);
    // Ties to the lowest id (stable over the id order).
    std::stable_sort(live.begin(), live.end(), [&](const NodeRecord* a, const NodeRecord* b) {
      return free_of(*a) > free_of(*b);
    });
    if (!live.empty() && free_of(*live.front()) >= devices)
      return Parts{{live.front()->id, devices}};
    if (!any) return std::nullopt;
    Parts parts;
    int left = devices;
    for (const NodeRecord* n : live) {
      if (left == 0) break;
      const int take = std::min(left, free_of(*n));
      parts.emplace_back(n->id, take);
      left -= take;
    }
    if (left > 0) return std::nullopt;
    return parts;
  };
  if (any && !avoid.empty())
    if (auto elsewhere = pick(avoid)) return elsewhere;
  return pick({});
}

}  // namespace troupe
