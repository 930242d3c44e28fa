#pragma once
// Which fault of a chaos run an effect seen on the coordinator belongs to:
// a node declared dead, a replica restarted or down, an orphaned request
// resumed. The metrics say which node died, not why, and faults overlap, so
// the harness decides here. Plain functions, no I/O.
#include <set>
#include <string>
#include <vector>

namespace troupe::chaos {

// A fault as attribution sees it (times in seconds of the run).
struct FaultWindow {
  enum class Aim { Node, Runtime, Client };  // process/link, a replica's actors, HTTP
  Aim aim = Aim::Node;
  std::string node;        // its node process ("node-2"), when aimed at a node
  double injected_s = -1;  // < 0: not injected (refused, not played)
  double end_s = -1;       // its window's end: injection + duration + slack
  double seen_s = -1;      // when its effect was first seen (< 0: not yet)
};

// The faults a node death or a replica's loss seen at `t` belongs to, of
// the node faults (process, link) whose window holds `t`. Nodes seen dead
// since the last look (`died`): for each, the latest fault aimed at it.
// Otherwise the latest node fault in window, unless a runtime fault's
// window holds `t` too (a replica it killed: the coordinator's fault book
// credits that one). Empty: none.
std::vector<int> owners_of_node_effect(const std::vector<FaultWindow>& faults, double t,
                                       const std::set<std::string>& died);

// The fault an orphaned request's resume belongs to, from its replica's
// death at `down`: the fault whose effect was first seen within `seen_within`
// after it (a node's death is its replicas'), else the latest fault injected
// by then whose window holds it. -1: none.
int owner_of_resume(const std::vector<FaultWindow>& faults, double down, double seen_within);

}  // namespace troupe::chaos
