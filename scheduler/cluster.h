#pragma once
// The coordinator's view of its nodes, as a plain class: who may join (the
// token, the protocol version, the same model), who is alive (heard from
// within the heartbeat timeout), which devices each offers and which
// replicas it runs, and where a replica goes next. The coordinator and
// supervisor actors drive it; time comes in as `now` (seconds).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

// What a process presents when it joins the coordinator.
struct JoinRequest {
  std::string name;
  std::string token;
  uint32_t protocol = 0;
  std::string version;  // troupe's version, for the logs
  std::string model;    // the model's identity (deploy/fingerprint.h: model_identity)
  int devices = 0;      // devices it offers
  std::string address;  // where other processes reach it (data plane)
};

struct JoinReply {
  bool accepted = false;
  std::string reason;        // why not, when refused
  int node = -1;             // its id at this coordinator
  uint64_t incarnation = 0;  // bumped every time it (re)joins
  // The coordinator's nodes.heartbeat_timeout_s in milliseconds: a node
  // beats at least four times within it, whatever its own timeout (a node
  // of a longer one, beating at its own pace, was declared dead between
  // every two beats). 0: not said.
  uint32_t heartbeat_timeout_ms = 0;
};

enum class NodeState { Live, Dead };

struct NodeRecord {
  int id = 0;
  std::string name;
  std::string address;
  int devices = 0;
  NodeState state = NodeState::Live;
  uint64_t incarnation = 0;
  double last_heard = 0;
  std::string death;          // why it was declared dead
  std::vector<int> replicas;  // replica slots placed on it
  int used_devices = 0;
  // The coordinator's own node, in its process: it cannot go silent while
  // the coordinator runs, so heartbeats do not expire it (a CPU-starved
  // process must not take down every replica it serves); its agent's exit
  // is what ends it.
  bool in_process = false;
};

struct ClusterOptions {
  uint32_t protocol = 0;
  std::string model;  // identity every node must match (model_identity)
  std::string token;  // empty: none needed
  double heartbeat_timeout_s = 2;
};

// A join under a name: whether a live node holds it, and what that means.
struct NameClaim {
  enum class Holder {
    None,       // no live node has it: join() decides the rest
    InProcess,  // the coordinator's own node: never another process's to take
    Silent,     // not heard from within the heartbeat timeout: it is dead
    Heard,      // heard from lately: ask it whether it is still there before
                // taking its name (a restart whose predecessor's death was not
                // seen yet, or a second process started with the same name)
  };
  Holder holder = Holder::None;
  int node = -1;  // the holder
};

// Why `name` cannot name a node ("" when it can): letters, digits, '.',
// '_' and '-' only (a name is written in logs, metrics' labels and
// placement lists, where ',' separates names and "any" means any node).
std::string node_name_problem(const std::string& name);

// The node names of a placement.replicas entry, in order: "a,b" -> {a, b};
// a name without a comma -> itself; empty names kept ("a," -> {a, ""}).
std::vector<std::string> placement_names(const std::string& where);

class Cluster {
 public:
  explicit Cluster(ClusterOptions options);

  // Admits a node (or a dead one coming back under its name, with a new
  // incarnation), or says why not: a wrong token, another protocol, another
  // model, no devices, or a live node with that name already.
  JoinReply join(const JoinRequest& request, double now, bool in_process = false);
  // The node is heard from; false when it is not a live member (the
  // incarnation it speaks for is over: it must rejoin).
  bool heard_from(int node, uint64_t incarnation, double now);
  // Declares dead every live node not heard from within the timeout
  // (cause "heartbeat"), except one in the coordinator's process; returns
  // them.
  std::vector<int> expire(double now);
  // Declares a live node dead with `cause` (e.g. "connection lost"); false
  // when it was not live.
  bool lost(int node, const std::string& cause);
  // Forgets the dead nodes not heard from for `after_s`; returns their
  // names. Without it every node ever
  // declared dead stayed, in the books and in /metrics, and nodes named by
  // host and pid (the default) add one per restart. One coming back later
  // joins as new.
  std::vector<std::string> forget_dead(double now, double after_s);
  // Who holds `name` now, for a join under it.
  NameClaim claim(const std::string& name, double now) const;
  // Why a join under live node `node`'s name is refused: its name, id,
  // address and when it was last heard from.
  std::string name_taken(int node, double now) const;

  // Where a replica runs: (node, devices of it) per part, in the order of
  // its devices (stage-major): one part, or several for a replica spanning
  // nodes.
  using Parts = std::vector<std::pair<int, int>>;
  // A replica slot runs on these parts (or leaves them). Throws
  // std::logic_error when a node lacks the free devices.
  void place(int replica, const Parts& parts);
  void unplace(int replica);
  // The nodes a replica runs on (empty: not placed).
  std::vector<int> nodes_of(int replica) const;

  // Where a replica of `devices` devices goes. `wanted` names a node, or
  // several separated by commas ("a,b": its devices split over them in
  // that order, as evenly as they go), or is "any" (or empty): the live
  // node with the most free devices that holds it all (ties to the lowest
  // id), else as few live nodes as hold it, the freest first. Nothing when
  // it does not fit. With "any", nodes in `avoid` (where this replica's
  // start failed lately) are used only when the others cannot hold it.
  std::optional<Parts> choose(const std::string& wanted, int devices,
                              const std::set<int>& avoid = {}) const;

  const NodeRecord* node(int id) const;
  std::vector<const NodeRecord*> nodes() const;
  int live_nodes() const;
  // Deaths declared, by cause ("heartbeat", "connection lost", ...).
  const std::map<std::string, uint64_t>& detections() const { return detections_; }

 private:
  NodeRecord* find(int id);
  void declare_dead(NodeRecord& n, const std::string& cause);

  ClusterOptions options_;
  std::map<int, NodeRecord> nodes_;
  std::map<int, Parts> placement_;  // replica -> its parts
  std::map<std::string, uint64_t> detections_;
  int next_id_ = 1;
  uint64_t next_incarnation_ = 1;
};

}  // namespace troupe
