// Routing policies with deterministic inputs, and the latency-aware policy in
// a small discrete-event simulation of replicas doing continuous batching.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>
#include <stdexcept>

#include "scheduler/prefix_affinity_policy.h"
#include "scheduler/routing_policy.h"
#include "util/rng.h"

namespace troupe {
namespace {

ReplicaLoad replica(size_t index, size_t outstanding = 0, bool live = true) {
  ReplicaLoad r;
  r.index = index;
  r.live = live;
  r.outstanding = outstanding;
  r.max_batch_sequences = 8;
  return r;
}

const RequestInfo kReq{1, 16, 32};

std::vector<size_t> choose_n(RoutingPolicy& p, const std::vector<ReplicaLoad>& rs, int n) {
  std::vector<size_t> out;
  for (int i = 0; i < n; ++i) out.push_back(p.choose(rs, kReq, 0).value());
  return out;
}

// ---- rng ----

TEST(RoutingRng, SameSeedSameSequenceAndKnownValues) {
  Xoshiro256 a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next(), b.next());
  EXPECT_NE(Xoshiro256(42).next(), c.next());
  // Reference value of splitmix64 from seed 0 (Vigna's splitmix64.c): pins the
  // generator so choices replay identically on every platform.
  EXPECT_EQ(SplitMix64(0).next(), 0xe220a8397b1dcdafull);
}

TEST(RoutingRng, BelowStaysInRangeAndCoversIt) {
  Xoshiro256 r(7);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t v = r.below(5);
    ASSERT_LT(v, 5u);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 5u);
  for (int i = 0; i < 1000; ++i) {
    const double u = r.uniform01();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// ---- round_robin ----

TEST(RoutingRoundRobin, CyclesInIndexOrder) {
  RoundRobinPolicy p;
  std::vector<ReplicaLoad> rs{replica(0), replica(1), replica(2)};
  EXPECT_EQ(choose_n(p, rs, 7), (std::vector<size_t>{0, 1, 2, 0, 1, 2, 0}));
}

TEST(RoutingRoundRobin, SkipsDeadReplicas) {
  RoundRobinPolicy p;
  std::vector<ReplicaLoad> rs{replica(0), replica(1, 0, false), replica(2)};
  EXPECT_EQ(choose_n(p, rs, 4), (std::vector<size_t>{0, 2, 0, 2}));
  rs[1].live = true;  // back after a restart: rejoins the rotation in place
  EXPECT_EQ(choose_n(p, rs, 3), (std::vector<size_t>{0, 1, 2}));
}

TEST(RoutingRoundRobin, IndependentOfListingOrder) {
  RoundRobinPolicy p;
  std::vector<ReplicaLoad> rs{replica(2), replica(0), replica(1)};
  EXPECT_EQ(choose_n(p, rs, 4), (std::vector<size_t>{0, 1, 2, 0}));
}

// ---- least_outstanding ----

TEST(RoutingLeastOutstanding, PicksMinimumTiesToLowestIndex) {
  LeastOutstandingPolicy p;
  EXPECT_EQ(p.choose({replica(0, 3), replica(1, 1), replica(2, 2)}, kReq, 0), 1u);
  EXPECT_EQ(p.choose({replica(2, 1), replica(0, 4), replica(1, 1)}, kReq, 0), 1u);
  // A dead replica is never chosen, however idle it looks.
  EXPECT_EQ(p.choose({replica(0, 0, false), replica(1, 5)}, kReq, 0), 1u);
}

TEST(RoutingLeastOutstanding, QueuedTokensBreakTies) {
  LeastOutstandingPolicy p;
  std::vector<ReplicaLoad> rs{replica(0, 2), replica(1, 2)};
  rs[0].queued_tokens = 900;
  rs[1].queued_tokens = 10;
  EXPECT_EQ(p.choose(rs, kReq, 0), 1u);
}

// ---- power_of_two ----

TEST(RoutingPowerOfTwo, DeterministicBySeed) {
  PowerOfTwoPolicy a(123), b(123), c(999);
  std::vector<ReplicaLoad> rs;
  for (size_t i = 0; i < 8; ++i) rs.push_back(replica(i, 0));  // all tied: the draw decides
  std::vector<size_t> ca, cb, cc;
  for (int i = 0; i < 100; ++i) {
    ca.push_back(a.choose(rs, kReq, 0).value());
    cb.push_back(b.choose(rs, kReq, 0).value());
    cc.push_back(c.choose(rs, kReq, 0).value());
  }
  EXPECT_EQ(ca, cb);
  EXPECT_NE(ca, cc);
}

TEST(RoutingPowerOfTwo, NeverPicksDeadAndPrefersLessLoaded) {
  PowerOfTwoPolicy p(5);
  Xoshiro256 masks(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<ReplicaLoad> rs;
    for (size_t i = 0; i < 6; ++i) rs.push_back(replica(i, masks.below(10), masks.below(2) == 1));
    bool any_live = false;
    for (const auto& r : rs) any_live |= r.live;
    const auto pick = p.choose(rs, kReq, 0);
    ASSERT_EQ(pick.has_value(), any_live);
    if (pick) {
      ASSERT_TRUE(rs[*pick].live) << "trial " << trial;
    }
  }
  // With distinct loads the most loaded replica always loses its comparison.
  std::vector<ReplicaLoad> rs{replica(0, 1), replica(1, 9), replica(2, 2), replica(3, 3)};
  std::map<size_t, int> counts;
  for (int i = 0; i < 400; ++i) ++counts[p.choose(rs, kReq, 0).value()];
  EXPECT_EQ(counts[1], 0);
  EXPECT_GT(counts[0], counts[3]);  // the least loaded wins every draw it is in
  // Two live: always the less loaded; one live: that one.
  EXPECT_EQ(p.choose({replica(0, 4), replica(1, 2, true), replica(2, 0, false)}, kReq, 0), 1u);
  EXPECT_EQ(p.choose({replica(0, 4, false), replica(7, 9)}, kReq, 0), 7u);
}

// ---- latency_aware: direct estimates ----

TEST(RoutingLatencyAware, TransferCostSteersAwayFromRemoteReplica) {
  LatencyAwarePolicy p;
  std::vector<ReplicaLoad> rs{replica(0), replica(1)};
  rs[0].transfer_cost_s = 0.5;  // remote node
  EXPECT_EQ(p.choose(rs, kReq, 0), 1u);
  // ... unless the local one is busy enough that moving the request pays off.
  rs[1].outstanding = 40;
  rs[1].running = 8;
  rs[1].queued_tokens = 32 * 16;
  EXPECT_EQ(p.choose(rs, kReq, 0), 0u);
}

TEST(RoutingLatencyAware, SlowStepTimesShiftTheChoice) {
  LatencyAwarePolicy p;
  std::vector<ReplicaLoad> rs{replica(0, 2), replica(1, 1)};
  rs[0].running = 2;
  rs[1].running = 1;
  double now = 0;
  for (int i = 0; i < 10; ++i) {
    p.on_step(0, 0.01, 1, now);
    p.on_step(1, 0.01, 1, now);
    now += 0.01;
  }
  EXPECT_EQ(p.choose(rs, kReq, now), 1u);  // equal speed: the less loaded one
  for (int i = 0; i < 10; ++i) {
    p.on_step(0, 0.01, 1, now);
    p.on_step(1, 0.10, 1, now);  // 10x slower now
    now += 0.01;
  }
  EXPECT_GT(p.unit_step_s(1, now), 5 * p.unit_step_s(0, now));
  EXPECT_EQ(p.choose(rs, kReq, now), 0u);
}

TEST(RoutingLatencyAware, UnmeasuredReplicaAssumedLikeTheMeasuredOnes) {
  LatencyAwareOptions o;
  o.prior_step_s = 1.0;
  LatencyAwarePolicy p(o);
  EXPECT_DOUBLE_EQ(p.unit_step_s(3, 0), 1.0);  // nothing measured: the option
  p.on_step(0, 0.02, 1, 0);
  p.on_step(1, 0.04, 1, 0);
  EXPECT_NEAR(p.unit_step_s(3, 0), 0.03, 1e-12);
}

TEST(RoutingLatencyAware, StaleSlowMeasurementFadesSoTheReplicaIsRetried) {
  LatencyAwareOptions o;
  o.stale_after_s = 5;
  o.forget_tau_s = 10;
  LatencyAwarePolicy p(o);
  p.on_step(1, 1.0, 1, 0);  // replica 1 was very slow once, then got no traffic
  for (double t = 0; t <= 100; t += 0.5) p.on_step(0, 0.01, 1, t);
  EXPECT_DOUBLE_EQ(p.unit_step_s(1, 3.0), 1.0);  // still fresh
  EXPECT_LT(p.unit_step_s(1, 100.0), 0.011);     // faded to what the others show
}

TEST(RoutingLatencyAware, MeasuredPrefillRateCounts) {
  LatencyAwarePolicy p;
  p.on_step(0, 0.01, 1, 0);
  p.on_step(1, 0.01, 1, 0);
  p.on_prefill(0, 1000, 10.0, 0);  // 100 tokens/s: slow prefill
  p.on_prefill(1, 1000, 0.1, 0);   // 10000 tokens/s
  std::vector<ReplicaLoad> rs{replica(0), replica(1, 1)};
  const RequestInfo long_prompt{2, 2000, 4};
  EXPECT_EQ(p.choose(rs, long_prompt, 0), 1u);
  EXPECT_GT(p.estimate_finish_s(rs[0], long_prompt, 0), 10.0);
}

TEST(RoutingLatencyAware, InvalidOptionsNameTheField) {
  LatencyAwareOptions o;
  o.ema_alpha = 0;
  try {
    LatencyAwarePolicy p(o);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ema_alpha"), std::string::npos);
  }
}

// ---- latency_aware in a simulation ----

// Replicas doing continuous batching, driven by request arrivals; each step
// reports its time to the policy like the batcher actor does.
class BatchingSim {
 public:
  BatchingSim(RoutingPolicy& policy, std::vector<double> unit_step_s, size_t max_batch)
      : policy_(policy), max_batch_(max_batch) {
    for (double s : unit_step_s) {
      replicas_.emplace_back();
      replicas_.back().unit_step_s = s;
    }
  }

  void set_unit_step(size_t replica, double s) { replicas_[replica].unit_step_s = s; }

  // Sends `n` requests, one every `gap_s`; returns how many went to each replica.
  std::vector<int> run(int n, double gap_s) {
    std::vector<int> counts(replicas_.size(), 0);
    for (int i = 0; i < n; ++i) {
      now_ += gap_s;
      for (size_t r = 0; r < replicas_.size(); ++r) advance(r, now_);
      const RequestInfo req{next_id_++, 16, 8};
      const std::optional<size_t> pick = policy_.choose(loads(), req, now_);
      EXPECT_TRUE(pick.has_value());
      if (!pick) continue;
      ++counts[*pick];
      policy_.on_dispatch(*pick, req, now_);
      Replica& rep = replicas_[*pick];
      rep.waiting.push_back({req, req.max_tokens});
      if (!rep.busy) start_step(*pick, now_);
    }
    return counts;
  }

 private:
  struct Seq {
    RequestInfo req;
    size_t remaining;
  };
  struct Replica {
    double unit_step_s = 0;
    bool busy = false;
    double step_end = 0;
    double step_len = 0;
    std::deque<Seq> waiting;
    std::vector<Seq> running;
  };

  std::vector<ReplicaLoad> loads() const {
    std::vector<ReplicaLoad> out;
    for (size_t i = 0; i < replicas_.size(); ++i) {
      const Replica& r = replicas_[i];
      ReplicaLoad l;
      l.index = i;
      l.running = r.running.size();
      l.outstanding = r.running.size() + r.waiting.size();
      for (const Seq& s : r.waiting) l.queued_tokens += s.req.prompt_tokens;
      l.max_batch_sequences = max_batch_;
      out.push_back(l);
    }
    return out;
  }

  void start_step(size_t i, double t) {
    Replica& r = replicas_[i];
    while (r.running.size() < max_batch_ && !r.waiting.empty()) {
      r.running.push_back(r.waiting.front());
      r.waiting.pop_front();
    }
    r.busy = !r.running.empty();
    if (!r.busy) return;
    r.step_len = r.unit_step_s * (1 + 0.05 * double(r.running.size() - 1));
    r.step_end = t + r.step_len;
  }

  void advance(size_t i, double until) {
    Replica& r = replicas_[i];
    while (r.busy && r.step_end <= until) {
      const double t = r.step_end;
      policy_.on_step(i, r.step_len, r.running.size(), t);
      std::vector<Seq> still;
      for (Seq& s : r.running) {
        if (--s.remaining == 0) {
          policy_.on_complete(i, s.req, t);
        } else {
          still.push_back(s);
        }
      }
      r.running = std::move(still);
      start_step(i, t);
    }
  }

  RoutingPolicy& policy_;
  size_t max_batch_;
  std::vector<Replica> replicas_;
  double now_ = 0;
  uint64_t next_id_ = 1;
};

double share(const std::vector<int>& counts, size_t i) {
  int total = 0;
  for (int c : counts) total += c;
  return double(counts[i]) / double(total);
}

TEST(RoutingLatencyAware, ShiftsLoadAwayFromASlowReplicaAndBack) {
  LatencyAwarePolicy p;
  // Replica 1 steps 10x slower. 40 requests/s of 8 tokens: replica 0 alone
  // can carry it, so the slow one should see little of it.
  BatchingSim sim(p, {0.01, 0.10}, 8);
  sim.run(20, 0.025);  // warm-up: both get measured
  const std::vector<int> slow = sim.run(100, 0.025);
  EXPECT_LT(share(slow, 1), 0.2) << slow[0] << " vs " << slow[1];

  // Fast again. Idle, it reports no steps, so only a probe can show it has
  // recovered; after that its share comes back to about half.
  sim.set_unit_step(1, 0.01);
  sim.run(100, 0.025);
  const std::vector<int> fast = sim.run(100, 0.025);
  EXPECT_GT(share(fast, 1), 0.4) << fast[0] << " vs " << fast[1];
}

TEST(RoutingLatencyAware, ProbesOfASlowReplicaStayRare) {
  LatencyAwareOptions o;
  o.probe_every_requests = 20;
  LatencyAwarePolicy p(o);
  // Light traffic (2 requests/s): every replica is idle and stale at every
  // arrival, so only the probe budget limits what the slow one gets.
  BatchingSim sim(p, {0.01, 0.10}, 8);
  sim.run(20, 0.025);  // busy enough that both get measured
  const std::vector<int> counts = sim.run(200, 0.5);
  EXPECT_GT(counts[1], 0);  // still probed now and then
  EXPECT_LE(share(counts, 1), 0.1) << counts[0] << " vs " << counts[1];
}

TEST(RoutingLatencyAware, NoProbesWhenDisabled) {
  LatencyAwareOptions o;
  o.probe_interval_s = 0;
  o.stale_after_s = 1000;
  LatencyAwarePolicy p(o);
  BatchingSim sim(p, {0.01, 0.10}, 8);
  sim.run(20, 0.025);
  EXPECT_EQ(sim.run(200, 0.5)[1], 0);
}

TEST(RoutingLatencyAware, RoundRobinDoesNotAdaptForComparison) {
  RoundRobinPolicy p;
  BatchingSim sim(p, {0.01, 0.10}, 8);
  sim.run(20, 0.025);
  EXPECT_DOUBLE_EQ(share(sim.run(100, 0.025), 1), 0.5);
}

// ---- all policies ----

TEST(RoutingFactory, AllDeadGivesNullopt) {
  for (const std::string& name : routing_policy_names()) {
    auto p = make_routing_policy(name, 1);
    EXPECT_EQ(p->name(), name);
    EXPECT_FALSE(p->choose({replica(0, 0, false), replica(1, 0, false)}, kReq, 0).has_value())
        << name;
    EXPECT_FALSE(p->choose({}, kReq, 0).has_value()) << name;
    EXPECT_EQ(p->choose({replica(0, 0, false), replica(5, 3)}, kReq, 0), 5u) << name;
  }
}

TEST(RoutingFactory, UnknownNameListsKnownOnes) {
  try {
    make_routing_policy("fastest", 1);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fastest"), std::string::npos) << msg;
    for (const char* n : {"round_robin", "least_outstanding", "power_of_two", "latency_aware"}) {
      EXPECT_NE(msg.find(n), std::string::npos) << msg;
    }
  }
}

// ---- prefix_affinity ----

std::vector<int> tokens(int n, int salt) {
  std::vector<int> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 7 + salt * 131) % 1000);
  return t;
}

std::vector<int> joined(const std::vector<int>& head, int extra, int salt) {
  std::vector<int> t = head;
  const std::vector<int> own = tokens(extra, salt);
  t.insert(t.end(), own.begin(), own.end());
  return t;
}

TEST(RoutingPrefixAffinity, APromptFollowsItsStartWhileTheLoadAllows) {
  PrefixAffinityPolicy p;
  // max_batch_sequences 8: affinity holds while the replica has at most 2
  // more outstanding requests than the least loaded.
  std::vector<ReplicaLoad> rs{replica(0, 1), replica(1, 0), replica(2, 0)};
  const std::vector<int> system = tokens(64, 1);
  std::vector<int> first = joined(system, 20, 2);
  RequestInfo r1{1, first.size(), 8, &first};
  ASSERT_EQ(p.choose(rs, r1, 0), 1u);  // nothing remembered: the least loaded
  p.on_dispatch(1, r1, 0);
  EXPECT_EQ(p.chunks_remembered(), 5u);  // 84 tokens: 5 full chunks of 16
  EXPECT_EQ(p.remembered(first), (std::vector<size_t>{1}));

  // The same system prompt, another question: to 1 while it is at most 2
  // requests busier than the least loaded.
  std::vector<int> second = joined(system, 9, 3);
  RequestInfo r2{2, second.size(), 8, &second};
  rs = {replica(0, 0), replica(1, 2), replica(2, 1)};
  EXPECT_EQ(p.choose(rs, r2, 0), 1u);
  rs[1].outstanding = 3;
  EXPECT_EQ(p.choose(rs, r2, 0), 0u);  // too busy: the least loaded
  rs[1].outstanding = 1;
  rs[1].queued_tokens = 65;  // more prefill waiting than the 64 tokens it would save
  EXPECT_EQ(p.choose(rs, r2, 0), 0u);
  rs[1].queued_tokens = 64;
  EXPECT_EQ(p.choose(rs, r2, 0), 1u);
  rs[1].live = false;
  EXPECT_EQ(p.choose(rs, r2, 0), 0u);  // gone: the least loaded

  // A prompt whose first chunk differs follows nothing.
  std::vector<int> other = joined(tokens(64, 9), 9, 3);
  RequestInfo r3{3, other.size(), 8, &other};
  rs = {replica(0, 1), replica(1, 0), replica(2, 1)};
  EXPECT_TRUE(p.remembered(other).empty());
  EXPECT_EQ(p.choose(rs, r3, 0), 1u);
  rs = {replica(0, 1), replica(1, 1), replica(2, 0)};
  EXPECT_EQ(p.choose(rs, r3, 0), 2u);

  // The deepest remembered chunk decides: a conversation's next turn goes
  // where its last turn went, not where only the system prompt did.
  std::vector<int> turn = joined(first, 40, 4);
  p.on_dispatch(0, RequestInfo{4, turn.size(), 8, &turn}, 0);
  std::vector<int> next = joined(turn, 5, 5);
  RequestInfo r5{5, next.size(), 8, &next};
  rs = {replica(0, 1), replica(1, 0), replica(2, 0)};
  EXPECT_EQ(p.choose(rs, r5, 0), 0u);
  // Without its tokens, a request goes to the least loaded.
  EXPECT_EQ(p.choose(rs, RequestInfo{6, 100, 8, nullptr}, 0), 1u);
  auto made = make_routing_policy("prefix_affinity", 1);
  EXPECT_EQ(made->name(), "prefix_affinity");
}

// A prefix every replica got (one system prompt for all) leaves the choice
// to load among them: it does not pile requests on the one that got it last.
TEST(RoutingPrefixAffinity, APrefixEveryReplicaHoldsLeavesTheChoiceToLoad) {
  PrefixAffinityPolicy p;
  constexpr size_t kHolders = PrefixAffinityPolicy::kHolders;
  static_assert(kHolders >= 2);
  const std::vector<int> system = tokens(64, 1);
  auto sent_to = [&](size_t r) {
    std::vector<int> t = joined(system, 8, int(r));
    p.on_dispatch(r, RequestInfo{r + 1, t.size(), 8, &t}, 0);
  };
  for (size_t r = 0; r < kHolders; ++r) sent_to(r);
  std::vector<size_t> want;
  for (size_t r = kHolders; r-- > 0;) want.push_back(r);
  EXPECT_EQ(p.remembered(system), want);  // the most recent first
  std::vector<int> fresh = joined(system, 8, 7);
  RequestInfo req{99, fresh.size(), 8, &fresh};
  for (size_t idle = 0; idle < kHolders; ++idle) {
    std::vector<ReplicaLoad> rs;
    for (size_t r = 0; r < kHolders; ++r) rs.push_back(replica(r, 2));
    rs[idle].outstanding = 1;
    EXPECT_EQ(p.choose(rs, req, 0), idle);
  }
  // A holder sent to again moves first; one more holder than kHolders
  // forgets the oldest.
  sent_to(0);
  sent_to(kHolders);
  want = {kHolders, 0};
  for (size_t r = kHolders - 1; r >= 2; --r) want.push_back(r);  // 1, the oldest, forgotten
  EXPECT_EQ(p.remembered(system), want);
}

}  // namespace
}  // namespace troupe
