// Which fault an effect seen on the coordinator belongs to, when faults
// overlap (chaos/attribution.h).
#include <gtest/gtest.h>

#include "chaos/attribution.h"

namespace troupe::chaos {
namespace {

using Aim = FaultWindow::Aim;
using Owners = std::vector<int>;

FaultWindow on(const std::string& node, double injected, double end, double seen = -1) {
  return {Aim::Node, node, injected, end, seen};
}

TEST(ChaosAttribution, ANodesDeathGoesToTheFaultOnThatNodeNotTheLatest) {
  // Link cuts on node-1 at 2 s and node-2 at 2.6 s; node-1 is declared
  // dead at 3.1 s, inside both windows.
  const std::vector<FaultWindow> f{on("node-1", 2, 10), on("node-2", 2.6, 10.6)};
  EXPECT_EQ(owners_of_node_effect(f, 3.1, {"node-1"}), Owners{0});
  EXPECT_EQ(owners_of_node_effect(f, 3.6, {"node-2"}), Owners{1});
  // Both seen dead by one look: each fault gets its node's death.
  EXPECT_EQ(owners_of_node_effect(f, 3.6, {"node-1", "node-2"}), (Owners{0, 1}));
  // Nothing said which node (a replica restarted, capacity lost): the
  // latest fault whose window holds it.
  EXPECT_EQ(owners_of_node_effect(f, 3.1, {}), Owners{1});
  // A node dead that no fault aimed at: none of them.
  EXPECT_EQ(owners_of_node_effect(f, 3.1, {"node-3"}), Owners{});
}

TEST(ChaosAttribution, OnlyNodeFaultsInTheirWindowOwnANodesEffect) {
  std::vector<FaultWindow> f{on("node-1", 2, 5), on("node-1", 20, 25)};
  EXPECT_EQ(owners_of_node_effect(f, 4, {"node-1"}), Owners{0});
  EXPECT_EQ(owners_of_node_effect(f, 5.5, {"node-1"}), Owners{});  // past the first window
  EXPECT_EQ(owners_of_node_effect(f, 1, {"node-1"}), Owners{});    // before any injection
  EXPECT_EQ(owners_of_node_effect(f, 21, {"node-1"}), Owners{1});
  f[1].injected_s = -1;  // not injected (refused or not played)
  EXPECT_EQ(owners_of_node_effect(f, 21, {"node-1"}), Owners{});
}

TEST(ChaosAttribution, ARestartDuringARuntimeFaultIsNotANodeFaults) {
  // A node stopped at 20 s (declared dead about 1 s later) and a replica's
  // part killed at 20.3 s: the restart seen at 20.4 s is the kill's (the
  // fault book credits it), the node's death at 21.05 s the stop's.
  std::vector<FaultWindow> f{on("node-1", 20, 26)};
  f.push_back({Aim::Runtime, "", 20.3, 23.3, -1});
  EXPECT_EQ(owners_of_node_effect(f, 20.4, {}), Owners{});
  EXPECT_EQ(owners_of_node_effect(f, 21.05, {"node-1"}), Owners{0});
  // An HTTP fault explains no restart.
  f[1].aim = Aim::Client;
  EXPECT_EQ(owners_of_node_effect(f, 20.4, {}), Owners{0});
}

TEST(ChaosAttribution, AResumeGoesToTheFaultSeenRightAfterItsReplicasDeath) {
  // node-1 seen dead at 3.15 s, node-2 at 3.65 s; replicas went down at
  // 3.1 and 3.6 s (the coordinator's book), inside both windows.
  const std::vector<FaultWindow> f{on("node-1", 2, 10, 3.15), on("node-2", 2.6, 10.6, 3.65)};
  EXPECT_EQ(owner_of_resume(f, 3.1, 0.5), 0);
  EXPECT_EQ(owner_of_resume(f, 3.6, 0.5), 1);
  // No effect seen near it: the latest fault injected whose window holds it.
  EXPECT_EQ(owner_of_resume(f, 5, 0.5), 1);
  EXPECT_EQ(owner_of_resume(f, 2.3, 0.5), 0);
  EXPECT_EQ(owner_of_resume(f, 1, 0.5), -1);
  EXPECT_EQ(owner_of_resume(f, 11, 0.5), -1);
}

}  // namespace
}  // namespace troupe::chaos
