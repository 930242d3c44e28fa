// Routing policies by name (one registry for serve, simulate and the config)
// and the load view the request table keeps for them.
#include <gtest/gtest.h>

#include "deploy/config.h"
#include "scheduler/request_table.h"
#include "scheduler/routing_policy.h"

namespace troupe {
namespace {

// Always the highest-indexed live replica; records what it was shown.
class LastLivePolicy : public RoutingPolicy {
 public:
  std::string_view name() const override { return "last_live"; }
  std::optional<size_t> choose(const std::vector<ReplicaLoad>& replicas, const RequestInfo&,
                               double) override {
    seen = replicas;
    std::optional<size_t> pick;
    for (const auto& r : replicas)
      if (r.live) pick = r.index;
    return pick;
  }
  std::vector<ReplicaLoad> seen;
};

TEST(PolicyRegistry, ARegisteredPolicyIsBuiltByNameAndAcceptedByTheConfig) {
  const size_t before = routing_policy_names().size();
  register_routing_policy("last_live", [](uint64_t, const LatencyAwareOptions&) {
    return std::make_unique<LastLivePolicy>();
  });
  EXPECT_EQ(routing_policy_names().size(), before + 1);
  EXPECT_EQ(routing_policy_names().back(), "last_live");
  EXPECT_EQ(make_routing_policy("last_live", 1)->name(), "last_live");
  Config c = default_config();
  EXPECT_NO_THROW(apply_override(c, "routing.policy", "last_live"));
  EXPECT_THROW(register_routing_policy("last_live",
                                       [](uint64_t, const LatencyAwareOptions&) {
                                         return std::make_unique<LastLivePolicy>();
                                       }),
               std::invalid_argument);
  EXPECT_THROW(register_routing_policy("", nullptr), std::invalid_argument);
  // The built-ins keep their place.
  EXPECT_EQ(routing_policy_names().front(), "round_robin");
}

class NullChannel : public ReplicaChannel {
 public:
  void assign(int replica, Assignment a) override { placed.emplace_back(replica, a.id); }
  void cancel(int, uint64_t) override {}
  std::vector<std::pair<int, uint64_t>> placed;
};

class Sink : public CompletionSink {
 public:
  void on_token(int, const TokenLogprobs*) override {}
  void on_done(FinishReason, int, int, int) override { ++ended; }
  void on_error(const ServiceError& e) override {
    ++ended;
    last_error = e.kind;
  }
  int ended = 0;
  std::optional<ServiceErrorKind> last_error;
};

CompletionRequest request(uint64_t id, int prompt, double timeout_s = 0) {
  CompletionRequest r;
  r.id = id;
  r.prompt.assign(size_t(prompt), 5);
  r.max_tokens = 4;
  r.timeout_s = timeout_s;
  return r;
}

TEST(RequestTableView, ThePolicySeesEveryReplicaUpToDate) {
  auto owned = std::make_unique<LastLivePolicy>();
  LastLivePolicy& policy = *owned;
  NullChannel ch;
  RequestTableOptions o;
  o.replicas = 3;
  o.max_seq_len = 64;
  o.max_batch_sequences = 1;
  o.max_waiting_per_replica = 1;
  RequestTable t(o, std::move(owned), ch);
  t.replica_up(0, 0);
  t.replica_up(2, 0);
  auto sink = std::make_shared<Sink>();
  t.submit(request(1, 7), sink, 0);
  ASSERT_EQ(ch.placed.back(), std::make_pair(2, uint64_t(1)));
  t.submit(request(2, 5), sink, 0);
  // Replica 2 held one request when the policy chose again.
  ASSERT_EQ(policy.seen.size(), 3u);
  EXPECT_EQ(policy.seen[2].outstanding, 1u);
  EXPECT_EQ(policy.seen[2].queued_tokens, 7u);
  EXPECT_FALSE(policy.seen[1].live);  // never came up
  EXPECT_EQ(ch.placed.back(), std::make_pair(2, uint64_t(2)));
  // Replica 2 is full now (1 running + 1 waiting): the next goes to 0.
  t.submit(request(3, 3), sink, 0);
  EXPECT_FALSE(policy.seen[2].live);
  EXPECT_EQ(ch.placed.back(), std::make_pair(0, uint64_t(3)));
  // A step report updates the view.
  StepEvents ev;
  ev.replica = 2;
  ev.running = 1;
  ev.queued_tokens = 0;
  ev.done.push_back({1, FinishReason::Length, 0});
  t.on_events(ev, 1);
  EXPECT_EQ(sink->ended, 1);
  t.submit(request(4, 3), sink, 1);
  EXPECT_EQ(policy.seen[2].outstanding, 1u);
  EXPECT_EQ(policy.seen[2].running, 1u);
  EXPECT_EQ(policy.seen[2].queued_tokens, 0u);
  EXPECT_TRUE(policy.seen[2].live);
}

TEST(RequestTableView, DeadlinesEndRequestsWhereverTheyWait) {
  NullChannel ch;
  RequestTableOptions o;
  o.replicas = 1;
  o.max_seq_len = 64;
  RequestTable t(o, make_routing_policy("round_robin", 1), ch);
  auto sink = std::make_shared<Sink>();
  t.submit(request(1, 4, 2.0), sink, 0);  // queued: no replica up yet
  t.submit(request(2, 4, 1.0), sink, 0.5);
  t.submit(request(3, 4), sink, 0.5);  // no deadline
  t.tick(1.4);
  EXPECT_EQ(sink->ended, 0);
  t.tick(1.5);  // request 2's deadline
  EXPECT_EQ(sink->ended, 1);
  EXPECT_EQ(sink->last_error, ServiceErrorKind::Timeout);
  t.replica_up(0, 1.6);
  EXPECT_EQ(ch.placed.size(), 2u);  // 1 and 3
  t.tick(2.0);                      // request 1's, now running on replica 0
  EXPECT_EQ(sink->ended, 2);
  EXPECT_EQ(t.size(), 1u);
  t.tick(100);
  EXPECT_EQ(t.size(), 1u);
}

TEST(RequestTableView, AllReplicasGivenUpMeansUnavailable) {
  NullChannel ch;
  RequestTableOptions o;
  o.replicas = 2;
  o.max_seq_len = 64;
  RequestTable t(o, make_routing_policy("least_outstanding", 1), ch);
  auto sink = std::make_shared<Sink>();
  t.replica_up(0, 0);
  t.replica_up(1, 0);
  t.replica_down(0, true, 1);
  t.submit(request(1, 4), sink, 1);
  EXPECT_EQ(ch.placed.back().first, 1);
  t.replica_down(1, true, 2);  // the last one: everything ends
  EXPECT_EQ(sink->last_error, ServiceErrorKind::Unavailable);
  t.submit(request(2, 4), sink, 3);
  EXPECT_EQ(sink->ended, 2);
  t.replica_up(1, 4);  // back after all: accepted again
  t.submit(request(3, 4), sink, 5);
  EXPECT_EQ(ch.placed.back(), std::make_pair(1, uint64_t(3)));
}

}  // namespace
}  // namespace troupe
