// The coordinator's view of its nodes: who may join, who is alive, and
// where replicas go.
#include <gtest/gtest.h>

#include <stdexcept>

#include "scheduler/cluster.h"

namespace troupe {
namespace {

ClusterOptions options() {
  return {3, "abc", "t", 2};  // protocol, model, token, heartbeat timeout
}

JoinRequest node(const std::string& name, int devices) {
  return {name, "t", 3, "0.x", "abc", devices, "127.0.0.1"};
}

TEST(Cluster, JoinsAreCheckedAndRefusedWithAReason) {
  Cluster c(options());
  const JoinReply a = c.join(node("a", 2), 0);
  ASSERT_TRUE(a.accepted) << a.reason;
  // The node is told the coordinator's heartbeat timeout, to beat at its pace.
  EXPECT_EQ(a.heartbeat_timeout_ms, 2000u);
  EXPECT_EQ(Cluster({3, "abc", "t", 0.4}).join(node("b", 1), 0).heartbeat_timeout_ms, 400u);
  auto bad = node("x", 2);
  bad.token = "wrong";
  EXPECT_NE(c.join(bad, 0).reason.find("token"), std::string::npos);
  bad = node("x", 2);
  bad.protocol = 2;
  EXPECT_NE(c.join(bad, 0).reason.find("protocol 2"), std::string::npos);
  bad = node("x", 2);
  bad.model = "other";
  EXPECT_NE(c.join(bad, 0).reason.find("another model"), std::string::npos);
  EXPECT_NE(c.join(node("x", 0), 0).reason.find("no devices"), std::string::npos);
  EXPECT_NE(c.join(node("a", 1), 0).reason.find("already called 'a'"), std::string::npos);
  EXPECT_FALSE(c.join(node("", 1), 0).accepted);
  EXPECT_EQ(c.live_nodes(), 1);
  EXPECT_THROW(Cluster({3, "abc", "", 0}), std::invalid_argument);
}

// A name is written in logs, metrics and placement lists: one that would
// break them (a newline, a comma, "any") is refused with the reason.
TEST(Cluster, NamesThatWouldBreakLogsOrPlacementAreRefused) {
  Cluster c(options());
  for (const std::string bad : {"a,b", "any", "evil\nname", " ", "a b", "x/y"}) {
    const JoinReply r = c.join(node(bad, 1), 0);
    EXPECT_FALSE(r.accepted) << bad;
    EXPECT_NE(r.reason.find("name"), std::string::npos) << r.reason;
  }
  for (const std::string good : {"a", "vm-27572", "gpu_3.rack-2", "Node7"})
    EXPECT_TRUE(c.join(node(good, 1), 0).accepted) << good;
  EXPECT_EQ(node_name_problem("host-123"), "");
}

// One reading of a placement entry for the cluster, the config's check and
// troupe chaos's.
TEST(Cluster, PlacementNamesSplitAtCommasKeepingEmptyOnes) {
  using V = std::vector<std::string>;
  EXPECT_EQ(placement_names("a"), V{"a"});
  EXPECT_EQ(placement_names("a,b,c"), (V{"a", "b", "c"}));
  EXPECT_EQ(placement_names("a,"), (V{"a", ""}));
  EXPECT_EQ(placement_names(",a"), (V{"", "a"}));
  EXPECT_EQ(placement_names(""), V{""});
}

TEST(Cluster, SilentNodesExpireAndADeadNodeRejoinsAsANewIncarnation) {
  Cluster c(options());
  const JoinReply a = c.join(node("a", 1), 0), b = c.join(node("b", 1), 0);
  EXPECT_TRUE(c.heard_from(a.node, a.incarnation, 1.5));
  EXPECT_TRUE(c.expire(2.0).empty());
  EXPECT_EQ(c.expire(2.1), std::vector<int>{b.node});  // a was heard at 1.5
  EXPECT_EQ(c.node(b.node)->death, "heartbeat");
  EXPECT_FALSE(c.heard_from(b.node, b.incarnation, 2.2));  // its membership is over
  EXPECT_TRUE(c.lost(a.node, "connection lost"));
  EXPECT_FALSE(c.lost(a.node, "connection lost"));  // once
  EXPECT_EQ(c.detections().at("heartbeat"), 1u);
  EXPECT_EQ(c.detections().at("connection lost"), 1u);
  const JoinReply back = c.join(node("b", 1), 3);
  ASSERT_TRUE(back.accepted);
  EXPECT_EQ(back.node, b.node);
  EXPECT_GT(back.incarnation, b.incarnation);
  EXPECT_FALSE(c.heard_from(b.node, b.incarnation, 3.1));  // the old incarnation
  EXPECT_TRUE(c.heard_from(b.node, back.incarnation, 3.1));
}

// A join under a live node's name: refused naming the holder, unless the
// holder is silent past the heartbeat timeout (it is dead); one heard from
// lately is to be asked first (the supervisor does), and the coordinator's
// own node is never another process's to replace.
// A dead node is forgotten once long silent; live ones never are. One
// coming back joins as new.
TEST(Cluster, DeadNodesAreForgottenOnceLongSilent) {
  Cluster c(options());
  const int a = c.join(node("a", 1), 0).node;
  const int b = c.join(node("b", 1), 0).node;
  c.place(0, {{a, 1}});
  ASSERT_TRUE(c.lost(a, "connection lost"));
  EXPECT_TRUE(c.nodes_of(0).empty()) << "its replicas were unplaced";
  EXPECT_TRUE(c.forget_dead(100, 600).empty());
  EXPECT_EQ(c.forget_dead(700, 600), std::vector<std::string>{"a"});
  EXPECT_EQ(c.node(a), nullptr);
  ASSERT_NE(c.node(b), nullptr) << "a live node stays, however long";
  EXPECT_EQ(c.nodes().size(), 1u);
  const JoinReply again = c.join(node("a", 1), 800);
  ASSERT_TRUE(again.accepted) << again.reason;
  EXPECT_NE(again.node, a) << "a new id: the old one is not reused";
}

TEST(Cluster, ANameHeldByALiveNodeIsClaimedOnlyFromASilentOne) {
  Cluster c(options());
  EXPECT_EQ(c.claim("a", 0).holder, NameClaim::Holder::None);
  const JoinReply a = c.join(node("a", 1), 0);
  const JoinReply local = c.join(node("local", 1), 0, true);
  const JoinReply refused = c.join(node("a", 1), 1.25);
  EXPECT_FALSE(refused.accepted);
  EXPECT_EQ(refused.reason, c.name_taken(a.node, 1.25));
  EXPECT_NE(refused.reason.find("already called 'a'"), std::string::npos) << refused.reason;
  EXPECT_NE(refused.reason.find("127.0.0.1"), std::string::npos) << refused.reason;
  EXPECT_NE(refused.reason.find("heard from 1.2 s ago"), std::string::npos) << refused.reason;
  EXPECT_NE(refused.reason.find("--name"), std::string::npos) << refused.reason;
  EXPECT_EQ(c.claim("a", 1.0).holder, NameClaim::Holder::Heard);
  EXPECT_EQ(c.claim("a", 1.0).node, a.node);
  EXPECT_EQ(c.claim("a", 2.5).holder, NameClaim::Holder::Silent);
  EXPECT_TRUE(c.heard_from(a.node, a.incarnation, 2.4));
  EXPECT_EQ(c.claim("a", 2.5).holder, NameClaim::Holder::Heard);
  EXPECT_EQ(c.claim("local", 100).holder, NameClaim::Holder::InProcess);
  EXPECT_EQ(c.claim("local", 100).node, local.node);
  // Once the holder is dead, its name is free for its restart.
  EXPECT_TRUE(c.lost(a.node, "joined again"));
  EXPECT_EQ(c.claim("a", 3).holder, NameClaim::Holder::None);
  EXPECT_TRUE(c.join(node("a", 1), 3).accepted);
}

// The coordinator's own node shares its process: a starved process (no
// heartbeat for a while) must not declare it dead; it still ends when lost.
TEST(Cluster, TheCoordinatorsOwnNodeDoesNotExpire) {
  Cluster c(options());
  const JoinReply local = c.join(node("local", 2), 0, true), remote = c.join(node("r", 1), 0);
  EXPECT_EQ(c.expire(10.0), std::vector<int>{remote.node});
  EXPECT_EQ(c.live_nodes(), 1);
  EXPECT_TRUE(c.lost(local.node, "its agent exited"));
  EXPECT_EQ(c.live_nodes(), 0);
}

// Where a replica's start failed lately is passed over while other nodes
// can hold it, and used again when they cannot; named nodes are kept.
TEST(Cluster, NodesToAvoidAreUsedOnlyWhenNoOtherHoldsTheReplica) {
  Cluster c(options());
  const int a = c.join(node("a", 2), 0).node, b = c.join(node("b", 1), 0).node,
            d = c.join(node("d", 1), 0).node;
  EXPECT_EQ(*c.choose("any", 1), (Cluster::Parts{{a, 1}}));
  EXPECT_EQ(*c.choose("any", 1, {a}), (Cluster::Parts{{b, 1}}));
  EXPECT_EQ(*c.choose("any", 1, {a, b}), (Cluster::Parts{{d, 1}}));
  EXPECT_EQ(*c.choose("any", 1, {a, b, d}), (Cluster::Parts{{a, 1}}));
  // Two devices without a: spread over b and d rather than back on a.
  EXPECT_EQ(*c.choose("any", 2, {a}), (Cluster::Parts{{b, 1}, {d, 1}}));
  EXPECT_EQ(*c.choose("", 3, {a}), (Cluster::Parts{{a, 2}, {b, 1}}));
  EXPECT_EQ(*c.choose("a", 1, {a}), (Cluster::Parts{{a, 1}}));
}

TEST(Cluster, ReplicasGoToTheFreestNodeOrSpanAsFewNodesAsHoldThem) {
  Cluster c(options());
  const int a = c.join(node("a", 2), 0).node, b = c.join(node("b", 3), 0).node,
            d = c.join(node("d", 3), 0).node;
  auto p = c.choose("any", 2);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, (Cluster::Parts{{b, 2}}));  // the freest, ties to the lowest id
  c.place(0, *p);
  EXPECT_EQ(c.node(b)->used_devices, 2);
  EXPECT_EQ(c.nodes_of(0), std::vector<int>{b});
  p = c.choose("", 2);
  EXPECT_EQ(*p, (Cluster::Parts{{d, 2}}));
  c.place(1, *p);
  // Four devices: no node holds them; the freest first (a: 2, then b or d: 1).
  p = c.choose("any", 4);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, (Cluster::Parts{{a, 2}, {b, 1}, {d, 1}}));
  EXPECT_FALSE(c.choose("any", 5));
  // Named nodes.
  EXPECT_EQ(*c.choose("a", 2), (Cluster::Parts{{a, 2}}));
  EXPECT_FALSE(c.choose("b", 2));
  EXPECT_FALSE(c.choose("nobody", 1));
  EXPECT_EQ(*c.choose("a,b", 2), (Cluster::Parts{{a, 1}, {b, 1}}));
  EXPECT_EQ(*c.choose("a,d", 3), (Cluster::Parts{{a, 2}, {d, 1}}));
  EXPECT_FALSE(c.choose("a,b", 4));    // b has 1 free
  EXPECT_FALSE(c.choose("a,b,d", 2));  // more nodes than devices
  // Too many devices for a node is a bug of the caller, not a silent overbook.
  EXPECT_THROW(c.place(2, {{a, 3}}), std::logic_error);
  EXPECT_EQ(c.node(a)->used_devices, 0);
}

TEST(Cluster, ANodesDeathEndsTheReplicasOnItEverywhere) {
  Cluster c(options());
  const int a = c.join(node("a", 2), 0).node, b = c.join(node("b", 2), 0).node;
  c.place(0, {{a, 1}, {b, 1}});  // one replica spanning both
  c.place(1, {{b, 1}});
  EXPECT_EQ(c.node(b)->used_devices, 2);
  ASSERT_TRUE(c.lost(a, "connection lost"));
  EXPECT_TRUE(c.nodes_of(0).empty());
  EXPECT_EQ(c.node(b)->used_devices, 1);  // replica 0's part on b is free again
  EXPECT_EQ(c.nodes_of(1), std::vector<int>{b});
  EXPECT_FALSE(c.choose("a", 1));
  c.unplace(1);
  EXPECT_EQ(c.node(b)->used_devices, 0);
  EXPECT_THROW(c.place(2, {{a, 1}}), std::logic_error);  // a is dead
}

}  // namespace
}  // namespace troupe
