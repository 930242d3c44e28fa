// The simulator on hand-checkable cases: exact waiting times, M/D/1, every
// request ending once, determinism, failures, pipelines, and the router's
// decisions replayed from a log.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "scheduler/router_log.h"
#include "scheduler/sim/router_replay.h"
#include "scheduler/sim/simulator.h"
#include "scheduler/sim/sweep.h"
#include "support/error_messages.h"
#include "support/test_support.h"

namespace troupe::sim {
namespace {

// Every step takes `seconds` on each of `stages` stages, whatever it holds.
StepCostModel constant_model(double seconds, int stages = 1) {
  ProfileGrid g;
  g.pipeline = stages;
  g.batch = {0, 1, 64};
  g.context = {1, 4096};
  g.prefill = {0, 1, 4096};
  g.stage_seconds.assign(size_t(stages), std::vector<double>(g.points(), seconds));
  return StepCostModel(g);
}

SimOptions options(int replicas, int max_batch, const std::string& policy = "round_robin") {
  SimOptions o;
  o.replicas = replicas;
  o.policy = policy;
  o.table.max_seq_len = 2048;
  o.table.max_batch_sequences = max_batch;
  o.table.max_waiting_per_replica = 100000;
  o.table.admission.max_size = 100000;
  o.table.admission.max_wait_s = 0;
  o.scheduler.kv_blocks = 4096;
  o.scheduler.block_tokens = 16;
  o.scheduler.limits = {max_batch, 4096, 512};
  o.scheduler.stop = StopRule{{2}, 2048};
  o.sample_s = 0;
  return o;
}

// A fixed list of arrivals.
class ListWorkload : public Workload {
 public:
  explicit ListWorkload(std::vector<Arrival> a) : a_(std::move(a)) {}
  std::optional<Arrival> next() override {
    if (i_ >= a_.size()) return std::nullopt;
    return a_[i_++];
  }

 private:
  std::vector<Arrival> a_;
  size_t i_ = 0;
};

class Records : public SimObserver {
 public:
  void on_request_end(const RequestRecord& r) override {
    ++ends[r.id];
    by_id[r.id] = r;
    summary.add(r);
  }
  std::map<uint64_t, int> ends;
  std::map<uint64_t, RequestRecord> by_id;
  RunSummary summary;
};

// Serves a fixed list of arrivals; the totals go to `totals` when given.
Records run_list(const SimOptions& o, std::vector<Arrival> arrivals, const StepCostModel& model,
                 SimTotals* totals = nullptr) {
  ListWorkload w(std::move(arrivals));
  Records rec;
  Simulator sim(o, {model}, w, &rec);
  sim.run();
  if (totals) *totals = sim.totals();
  return rec;
}

TEST(Simulator, OneReplicaConstantStepsGiveExactWaits) {
  // Service = k steps of T (a one-token prompt's prefill gives the first
  // token); arrivals every g < k T queue up: the i-th waits i (k T - g).
  const double T = 0.01, g = 0.025;
  const int k = 4;
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 20; ++i) arrivals.push_back({i * g, 1, k});
  const Records rec = run_list(options(1, 1), arrivals, constant_model(T));
  ASSERT_EQ(rec.by_id.size(), 20u);
  for (const auto& [id, r] : rec.by_id) {
    const double i = double(id - 1);
    EXPECT_EQ(r.outcome, Outcome::Completed);
    EXPECT_EQ(r.output_tokens, k);
    EXPECT_NEAR(r.queue_delay(), i * (k * T - g), 1e-9) << "request " << id;
    EXPECT_NEAR(r.ttft(), i * (k * T - g) + T, 1e-9);
    EXPECT_NEAR(r.latency(), i * (k * T - g) + k * T, 1e-9);
    EXPECT_NEAR(r.tpot(), T, 1e-9);
  }
}

// A prompt of 600 tokens prefills in two chunks of at most 512; with its
// first 592 (37 blocks of 16) found cached, in one step: the simulator's
// replicas keep a prefix cache as the runtime's do, over prompts that share
// exactly the prefix the workload gives them.
TEST(Simulator, ASharedPrefixIsFoundInThePrefixCache) {
  const double T = 0.01;
  for (bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "none");
    SimOptions o = options(1, 4);
    o.scheduler.prefix_caching = caching;
    std::vector<Arrival> own;
    for (int i = 0; i < 10; ++i) own.push_back({i * 1.0, 8, 2});
    SharedPrefixWorkload w(std::make_unique<ListWorkload>(own), 592, 1, 1);
    Records rec;
    Simulator sim(o, {constant_model(T)}, w, &rec);
    sim.run();
    ASSERT_EQ(rec.by_id.size(), 10u);
    for (const auto& [id, r] : rec.by_id) {
      EXPECT_EQ(r.prompt_tokens, 600);
      EXPECT_NEAR(r.ttft(), caching && id > 1 ? T : 2 * T, 1e-9) << "request " << id;
    }
    EXPECT_EQ(sim.totals().prefix_queried, caching ? 6000u : 0u);
    EXPECT_EQ(sim.totals().prefix_hits, caching ? 9u * 592u : 0u);
  }
  // Prompts of their own share nothing.
  SimOptions o = options(1, 4);
  o.scheduler.prefix_caching = true;
  std::vector<Arrival> own;
  for (int i = 0; i < 10; ++i) own.push_back({i * 1.0, 600, 2});
  SimTotals totals;
  run_list(o, own, constant_model(T), &totals);
  EXPECT_EQ(totals.prefix_hits, 0u);
  EXPECT_EQ(totals.prefix_queried, 6000u);
}

// With four replicas and eight shared prefixes, routing by prefix finds
// more of each prompt cached than routing by load alone, which spreads a
// prefix over every replica's cache.
TEST(Simulator, RoutingByPrefixFindsMoreCached) {
  std::map<std::string, uint64_t> hits;
  for (const std::string policy : {"least_outstanding", "prefix_affinity"}) {
    SimOptions o = options(4, 8, policy);
    o.scheduler.prefix_caching = true;
    o.scheduler.kv_blocks = 160;  // 2560 positions: about two prefixes' worth per request
    SyntheticOptions so;
    so.requests = 400;
    so.rate_per_s = 20;
    so.prompt = "32";
    so.output = "8";
    SharedPrefixWorkload w(std::make_unique<SyntheticWorkload>(so), 480, 8, 3);
    Records rec;
    Simulator sim(o, {constant_model(0.01)}, w, &rec);
    sim.run();
    EXPECT_EQ(rec.by_id.size(), 400u);
    hits[policy] = sim.totals().prefix_hits;
  }
  EXPECT_GT(hits["prefix_affinity"], hits["least_outstanding"] + 400 * 16)
      << hits["prefix_affinity"] << " vs " << hits["least_outstanding"];
}

// A Mooncake trace's hash_ids (blocks of 512 tokens) say which prompts share
// what: the second row repeats the first's two first blocks (1024 tokens,
// 64 blocks of 16 found cached), the third shares nothing.
TEST(Simulator, ATracesHashIdsAreThePromptsSharedBlocks) {
  test::TempDir dir;
  const auto path = dir / "trace.jsonl";
  {
    std::ofstream f(path);
    f << "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 2, \"hash_ids\": [7, 8, "
         "9]}\n"
      << "{\"timestamp\": 1000, \"input_length\": 1100, \"output_length\": 2, \"hash_ids\": [7, 8, "
         "4]}\n"
      << "{\"timestamp\": 2000, \"input_length\": 1100, \"output_length\": 2, \"hash_ids\": [5, 8, "
         "4]}\n";
  }
  SimOptions o = options(1, 4);
  o.scheduler.prefix_caching = true;
  TraceWorkload w(path, {});
  Records rec;
  Simulator sim(o, {constant_model(0.01)}, w, &rec);
  sim.run();
  EXPECT_EQ(rec.by_id.size(), 3u);
  EXPECT_EQ(sim.totals().prefix_queried, 3300u);
  EXPECT_EQ(sim.totals().prefix_hits, 1024u);
}

TEST(Simulator, PoissonArrivalsMatchMD1MeanWait) {
  // M/D/1: Wq = rho S / (2 (1 - rho)). rho = 0.6, S = 0.1 s: Wq = 0.075 s.
  // 60000 requests keep the sample mean within a few percent; the check
  // allows 6%.
  const double S = 0.1, lambda = 6;
  SyntheticOptions so;
  so.requests = 60000;
  so.rate_per_s = lambda;
  so.prompt = "1";
  so.output = "1";
  so.seed = 11;
  SyntheticWorkload w(so);
  Records rec;
  Simulator sim(options(1, 1), {constant_model(S)}, w, &rec);
  sim.run();
  const double rho = lambda * S, expected = rho * S / (2 * (1 - rho));
  double sum = 0;
  for (const auto& [id, r] : rec.by_id) sum += r.queue_delay();
  const double mean = sum / double(rec.by_id.size());
  EXPECT_NEAR(mean, expected, 0.06 * expected);
}

// A busy mixed run: cancellations, deadlines, a small admission queue,
// random replica deaths, chunked prefill and preemption.
SimOptions busy_options(const std::string& policy) {
  SimOptions o = options(3, 4, policy);
  o.table.admission.max_size = 40;
  o.table.max_waiting_per_replica = 8;
  o.request_timeout_s = 2.0;
  o.scheduler.kv_blocks = 160;
  o.scheduler.limits = {4, 256, 64};
  o.mtbf_s = 3;
  o.restart_s = 0.5;
  o.sample_s = 0.5;
  o.seed = 5;
  return o;
}

SyntheticOptions busy_workload(uint64_t seed) {
  SyntheticOptions so;
  so.requests = 3000;
  so.rate_per_s = 120;
  so.process = "gamma:3";
  so.prompt = "uniform:1:300";
  so.output = "exp:40";
  so.cancel_fraction = 0.1;
  so.cancel_after_s = 0.5;
  so.high_priority_fraction = 0.2;
  so.seed = seed;
  return so;
}

TEST(Simulator, EveryRequestEndsExactlyOnce) {
  for (const std::string& policy : routing_policy_names()) {
    SyntheticWorkload w(busy_workload(3));
    Records rec;
    Simulator sim(busy_options(policy), {constant_model(0.004)}, w, &rec);
    sim.run();
    EXPECT_EQ(rec.ends.size(), 3000u) << policy;
    for (const auto& [id, n] : rec.ends) ASSERT_EQ(n, 1) << policy << " request " << id;
    std::set<Outcome> seen;
    for (const auto& [id, r] : rec.by_id) {
      seen.insert(r.outcome);
      if (r.outcome == Outcome::Completed) {
        EXPECT_GE(r.output_tokens, 1) << policy;  // lengths come from the workload
      }
    }
    // The run exercised the paths it claims to.
    EXPECT_TRUE(seen.count(Outcome::Completed)) << policy;
    EXPECT_TRUE(seen.count(Outcome::Cancelled)) << policy;
    EXPECT_GT(sim.totals().failures, 0u) << policy;
    EXPECT_GT(sim.totals().resumed, 0u) << policy;
  }
}

TEST(Simulator, TheSummarySaysHowManyClientsWereToLeaveAndHowManyDid) {
  // 100 tokens at 10 ms a step: two clients leave mid-answer, two long after
  // theirs ended (a cancel that finds nothing), two stay.
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 6; ++i) {
    Arrival a{0.001 * i, 10, 100};
    a.cancel_after_s = i < 2 ? 0.05 : i < 4 ? 10.0 : -1.0;
    arrivals.push_back(a);
  }
  const Records rec = run_list(options(1, 8), arrivals, constant_model(0.01));
  EXPECT_EQ(rec.summary.leaving(), 4u);
  EXPECT_EQ(rec.summary.count(Outcome::Cancelled), 2u);
  EXPECT_EQ(rec.summary.count(Outcome::Completed), 4u);
  EXPECT_NE(rec.summary.table().find("4 clients were to go away before their answer; 2 did"),
            std::string::npos)
      << rec.summary.table();
  EXPECT_EQ(rec.summary.to_json()["clients_leaving"], 4);
}

TEST(Simulator, CompletedRequestsGetEveryTokenOnceAcrossResumption) {
  // Replica 0 dies mid-run; its requests finish on replica 1 with exactly
  // the tokens asked for.
  SimOptions o = options(2, 8);
  o.failures = {{0.35, 0, -1}};
  o.restart_s = 100;
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 16; ++i) arrivals.push_back({0.01 * i, 20, 50});
  SimTotals totals;
  const Records rec = run_list(o, arrivals, constant_model(0.01), &totals);
  EXPECT_EQ(totals.failures, 1u);
  EXPECT_GT(totals.resumed, 0u);
  ASSERT_EQ(rec.by_id.size(), 16u);
  for (const auto& [id, r] : rec.by_id) {
    EXPECT_EQ(r.outcome, Outcome::Completed);
    EXPECT_EQ(r.output_tokens, 50) << "request " << id;
  }
}

TEST(Simulator, RestartIntensityGivesUpLikeTheSupervisor) {
  // One replica dying four times in a second with max_restarts 3 stays down;
  // everything left ends as unavailable.
  SimOptions o = options(1, 4);
  o.max_restarts = 3;
  o.restart_window_s = 10;
  o.restart_s = 0.01;
  o.failures = {{0.1, 0, -1}, {0.2, 0, -1}, {0.3, 0, -1}, {0.4, 0, -1}};
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 10; ++i) arrivals.push_back({0.05 * i, 10, 200});
  SimTotals totals;
  const Records rec = run_list(o, arrivals, constant_model(0.01), &totals);
  EXPECT_EQ(totals.restarts, 3u);
  EXPECT_EQ(totals.given_up, 1u);
  EXPECT_EQ(rec.ends.size(), 10u);
  EXPECT_GT(rec.summary.count(Outcome::Unavailable), 0u);
}

TEST(Simulator, ANodeDeathTakesAllItsReplicas) {
  SimOptions o = options(4, 4);
  o.replicas_per_node = 2;
  o.failures = {{0.2, -1, 1}};  // node 1: replicas 2 and 3
  o.restart_s = 0.5;
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 40; ++i) arrivals.push_back({0.01 * i, 8, 60});
  SimTotals totals;
  const Records rec = run_list(o, arrivals, constant_model(0.01), &totals);
  EXPECT_EQ(totals.failures, 2u);
  EXPECT_EQ(totals.restarts, 2u);
  EXPECT_GT(totals.resumed, 0u);
  for (const auto& [id, r] : rec.by_id) EXPECT_EQ(r.output_tokens, 60) << "request " << id;
}

// A node's death is the node's: its replicas are placed anew without
// counting against their restart intensity, as the supervisor does.
TEST(Simulator, NodeDeathsDoNotCountAgainstTheRestartIntensity) {
  SimOptions o = options(2, 4);
  o.max_restarts = 1;
  o.restart_window_s = 100;
  o.restart_s = 0.01;
  o.replicas_per_node = 2;
  o.failures = {{0.1, -1, 0}, {0.2, -1, 0}, {0.3, -1, 0}, {0.4, -1, 0}};
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 10; ++i) arrivals.push_back({0.05 * i, 10, 100});
  SimTotals totals;
  const Records rec = run_list(o, arrivals, constant_model(0.01), &totals);
  EXPECT_EQ(totals.failures, 8u);
  EXPECT_EQ(totals.restarts, 8u);
  EXPECT_EQ(totals.given_up, 0u);
  for (const auto& [id, r] : rec.by_id) EXPECT_EQ(r.outcome, Outcome::Completed) << id;
}

// Scheduling ahead (async_scheduling) plans the next step while one runs,
// as the batcher does; the serving around a step (its overhead) still takes
// the replica's cores, so a sequence decodes a token per engine step plus
// overhead either way.
TEST(Simulator, TheServingOverheadTakesTheReplicasTimeAheadOrNot) {
  const double T = 0.0004;  // short: the batcher keeps scheduling ahead
  ProfileGrid g;
  g.batch = {0, 1, 64};
  g.context = {1, 4096};
  g.prefill = {0, 1, 4096};
  g.stage_seconds.assign(1, std::vector<double>(g.points(), T));
  g.overhead_s = T;
  const StepCostModel model(g);
  auto tpot = [&](bool ahead) {
    SimOptions o = options(1, 4);
    o.scheduler.lookahead = ahead;
    return run_list(o, {{0, 1, 200}}, model).summary.tpot().percentile(50);
  };
  EXPECT_NEAR(tpot(false), 2 * T, 0.1 * T);
  EXPECT_NEAR(tpot(true), 2 * T, 0.1 * T);
}

// Priority acts on a replica's waiting list too: with one replica taking
// one sequence at a time, a burst's priority-1 requests start before the
// priority-0 ones that arrived first; the summary says how each level fared.
TEST(Simulator, HigherPriorityWaitsLessAndTheSummarySaysSoPerLevel) {
  SimOptions o = options(1, 1);
  o.table.max_waiting_per_replica = 100;  // all of them wait on the replica
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 20; ++i) arrivals.push_back({0.001 * i, 4, 4, i % 4 == 3 ? 1 : 0});
  const Records rec = run_list(o, arrivals, constant_model(0.01));
  const nlohmann::json j = rec.summary.to_json();
  ASSERT_TRUE(j.contains("by_priority")) << j.dump();
  EXPECT_EQ(j["by_priority"]["1"]["requests"], 5);
  EXPECT_EQ(j["by_priority"]["0"]["requests"], 15);
  EXPECT_LT(j["by_priority"]["1"]["ttft_s"]["p50"].get<double>(),
            0.5 * j["by_priority"]["0"]["ttft_s"]["p50"].get<double>());
  EXPECT_NE(rec.summary.table().find("priority 1: 5 requests"), std::string::npos);
}

std::string run_json(uint64_t seed, const std::string& policy) {
  SyntheticWorkload w(busy_workload(seed));
  RunSummary summary;
  struct Obs : SimObserver {
    RunSummary* s;
    void on_request_end(const RequestRecord& r) override { s->add(r); }
  } obs;
  obs.s = &summary;
  SimOptions o = busy_options(policy);
  o.seed = seed;
  Simulator sim(o, {constant_model(0.004)}, w, &obs);
  sim.run();
  summary.set_replicas(sim.replica_figures());
  return summary.to_json().dump() + std::to_string(sim.totals().events);
}

TEST(Simulator, SameSeedSameOutput) {
  EXPECT_EQ(run_json(7, "power_of_two"), run_json(7, "power_of_two"));
  EXPECT_EQ(run_json(7, "latency_aware"), run_json(7, "latency_aware"));
  EXPECT_NE(run_json(7, "power_of_two"), run_json(8, "power_of_two"));
}

TEST(Simulator, PipelineStepsOverlapAcrossGroups) {
  // Two stages of T each: one sequence decodes a token per 2 T; two
  // sequences keep a step per stage in flight and decode twice as fast.
  const double T = 0.01;
  auto run = [&](int sequences) {
    std::vector<Arrival> arrivals;
    for (int i = 0; i < sequences; ++i) arrivals.push_back({0, 1, 100});
    return run_list(options(1, 8), arrivals, constant_model(T, 2)).summary.output_tokens_per_s();
  };
  const double one = run(1), two = run(2);
  EXPECT_NEAR(one, 1 / (2 * T), 1.0);
  EXPECT_NEAR(two, 2 * one, 2.0);
}

TEST(Simulator, SlowReplicaIsSlower) {
  SimOptions o = options(2, 1);
  o.slowdown = {1, 3};
  const Records rec = run_list(o, {{0, 1, 10}, {0, 1, 10}}, constant_model(0.01));
  EXPECT_NEAR(rec.by_id.at(1).latency(), 0.1, 1e-9);
  EXPECT_NEAR(rec.by_id.at(2).latency(), 0.3, 1e-9);
}

TEST(Simulator, DecisionsReplayIdenticallyFromTheRouterLog) {
  // The simulator drives the table as the router actor does; a fresh table
  // with a fresh policy, fed the logged calls, decides the same.
  // The latency-aware policy's constants travel in the log too: with
  // others than the defaults, a replay with the defaults would differ.
  LatencyAwareOptions tuned;
  tuned.ema_alpha = 0.9;
  tuned.prior_step_s = 0.001;
  tuned.probe_interval_s = 0.01;
  tuned.probe_every_requests = 2;
  for (const std::string& policy : routing_policy_names()) {
    test::TempDir dir;
    const auto path = dir / "router.jsonl";
    {
      // Shared prefixes, for a policy that routes by them.
      SharedPrefixWorkload w(std::make_unique<SyntheticWorkload>(busy_workload(4)), 48, 3, 1);
      SimOptions o = busy_options(policy);
      o.scheduler.prefix_caching = true;
      o.latency_aware = tuned;
      Simulator sim(o, {constant_model(0.004)}, w, nullptr,
                    std::make_unique<RouterLog>(path.string()));
      sim.run();
    }
    const ReplayResult r = replay_router_log(path);
    EXPECT_TRUE(r.identical()) << policy << ": " << r.first_mismatch;
    EXPECT_EQ(r.policy, policy);
    EXPECT_GT(r.recorded, 1000u) << policy;
  }
}

TEST(Simulator, ReplayNoticesADifferentDecision) {
  test::TempDir dir;
  const auto path = dir / "router.jsonl";
  {
    SyntheticWorkload w(busy_workload(4));
    Simulator sim(busy_options("round_robin"), {constant_model(0.004)}, w, nullptr,
                  std::make_unique<RouterLog>(path.string()));
    sim.run();
  }
  // Moving one placement to another replica must show.
  std::string text = test::read_file(path);
  const size_t at = text.find("{\"op\":\"assign\",\"replica\":0,");
  ASSERT_NE(at, std::string::npos);
  text[at + std::string("{\"op\":\"assign\",\"replica\":").size()] = '1';
  test::write_file(path, text);
  const ReplayResult r = replay_router_log(path);
  EXPECT_FALSE(r.identical());
  EXPECT_NE(r.first_mismatch.find("recorded assign"), std::string::npos) << r.first_mismatch;
}

// Idle time is not a stall: a cluster with nothing in flight waits for the
// next arrival however far off it is.
TEST(Simulator, IdleGapsAreNotAStall) {
  // Open loop (or a trace's rows) ten minutes apart.
  SimTotals totals;
  const Records open = run_list(options(1, 4), {{0, 8, 4}, {600, 8, 4}, {1300, 8, 4}},
                                constant_model(0.01), &totals);
  ASSERT_EQ(open.by_id.size(), 3u);
  for (const auto& [id, r] : open.by_id) EXPECT_EQ(r.outcome, Outcome::Completed) << id;
  EXPECT_NEAR(totals.end_time_s, 1300.04, 1e-6);
  // An idle cluster does not tick: 26,000 ticks of 50 ms would span the gaps.
  EXPECT_LT(totals.events, 200u);
  // A closed loop whose client thinks for five minutes between requests.
  ClosedLoopOptions co;
  co.clients = 1;
  co.requests = 3;
  co.think_s = 300;
  co.prompt = "8";
  co.output = "4";
  ClosedLoopWorkload w(co);
  Records closed;
  Simulator sim(options(1, 4), {constant_model(0.01)}, w, &closed);
  ASSERT_NO_THROW(sim.run());
  EXPECT_EQ(closed.summary.completed(), 3u);
  EXPECT_GT(sim.totals().end_time_s, 600);
}

TEST(Simulator, WorkInFlightWithoutProgressIsAStallNamingTheRequest) {
  // A prompt no replica can hold: without a context limit the front end
  // lets it through, and 16 blocks of 16 tokens can never take 2000.
  SimOptions o = options(1, 4);
  o.scheduler.stop.context_length = 0;
  o.scheduler.kv_blocks = 16;
  ListWorkload w({{0, 8, 4}, {5, 2000, 4}});
  Simulator sim(o, {constant_model(0.01)}, w);
  try {
    sim.run();
    FAIL() << "no stall";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("stalled"), std::string::npos) << m;
    EXPECT_NE(m.find("1 request(s) in flight"), std::string::npos) << m;
    EXPECT_NE(m.find("request 2 (2000 prompt + 4 output tokens)"), std::string::npos) << m;
    EXPECT_NE(m.find("126 KV blocks"), std::string::npos) << m;
  }
}

TEST(Simulator, AReplicaThatNeverComesBackIsAStall) {
  // Its requests wait for a replica (no queue timeout, no deadline).
  SimOptions o = options(1, 4);
  o.failures = {{0.05, 0, -1}};
  o.restart_s = 1e6;
  ListWorkload w({{0, 8, 100}});
  Simulator sim(o, {constant_model(0.01)}, w);
  try {
    sim.run();
    FAIL() << "no stall";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("0 of 1 replicas up"), std::string::npos) << m;
    EXPECT_NE(m.find("request 1 "), std::string::npos) << m;
  }
}

// Every sample the simulator reports.
struct Samples : SimObserver {
  void on_sample(const ClusterSample& c, const std::vector<ReplicaSample>& r) override {
    times.push_back(c.time_s);
    replicas.push_back(r);
  }
  std::vector<double> times;
  std::vector<std::vector<ReplicaSample>> replicas;
};

TEST(Simulator, SampledUtilisationIsTheShareOfEachWindowSpentBusy) {
  // One sequence decoding back to back in steps of 0.3 s, sampled every
  // 0.5 s: busy all the time, so every full window is 1 (a window that
  // launched two steps is not 1.2, one that launched one not 0.6). On two
  // stages of 0.3 s each a step's stages alternate: half of each window.
  for (int stages : {1, 2}) {
    SimOptions o = options(1, 1);
    o.sample_s = 0.5;
    ListWorkload w({{0, 1, 20}});
    Samples samples;
    Simulator sim(o, {constant_model(0.3, stages)}, w, &samples);
    sim.run();
    const double end = sim.totals().end_time_s;
    EXPECT_NEAR(end, 20 * 0.3 * stages, 1e-9);
    // The last window closes as the last step ends.
    EXPECT_NEAR(samples.times.back(), end, 1e-9);
    ASSERT_GE(samples.times.size(), size_t(std::lround(end / o.sample_s)) - 1);
    double busy = 0;
    for (size_t i = 0; i < samples.times.size(); ++i) {
      const double u = samples.replicas[i][0].utilisation;
      // The last window ends with the run, however short that makes it.
      const double span = samples.times[i] - (i > 0 ? samples.times[i - 1] : 0.0);
      busy += u * span * stages;
      EXPECT_NEAR(u, 1.0 / stages, 1e-9) << stages << " stage(s), at " << samples.times[i];
    }
    // The windows add up to the busy time: every stage-second, once (the
    // replica computed all along).
    EXPECT_NEAR(busy, samples.times.back(), 1e-9);
  }
}

TEST(Simulator, TheTimeSeriesAddsUpToTheRunUpToItsEnd) {
  // Steps of 0.3 s, windows of 1 s: the run ends mid-window (5 requests of
  // 4 tokens back to back on one slot: 6 s of steps, then 0.3 s more). The
  // samples' arrivals, completions and tokens are the run's, and the last
  // window is cut at the run's end, its utilisation over its own length.
  SimOptions o = options(1, 1);
  o.sample_s = 1.0;
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 5; ++i) arrivals.push_back({0.1 * i, 1, 4});
  arrivals.push_back({5.0, 1, 1});
  ListWorkload w(arrivals);
  struct Totals : SimObserver {
    void on_request_end(const RequestRecord& r) override {
      ++ended;
      tokens += uint64_t(r.output_tokens);
    }
    void on_sample(const ClusterSample& c, const std::vector<ReplicaSample>& r) override {
      times.push_back(c.time_s);
      arrivals += c.arrivals;
      completed += c.completed;
      sampled_tokens += c.output_tokens;
      last_utilisation = r[0].utilisation;
    }
    size_t ended = 0, arrivals = 0, completed = 0;
    uint64_t tokens = 0, sampled_tokens = 0;
    double last_utilisation = -1;
    std::vector<double> times;
  } t;
  Simulator sim(o, {constant_model(0.3)}, w, &t);
  sim.run();
  const double end = sim.totals().end_time_s;
  EXPECT_NEAR(end, 6.3, 1e-9);
  ASSERT_FALSE(t.times.empty());
  EXPECT_NEAR(t.times.back(), end, 1e-9);
  EXPECT_EQ(t.arrivals, 6u);
  EXPECT_EQ(t.completed, t.ended);
  EXPECT_EQ(t.sampled_tokens, t.tokens);
  EXPECT_EQ(t.tokens, 21u);
  // Busy all of [6, 6.3): 1, not 0.3.
  EXPECT_NEAR(t.last_utilisation, 1.0, 1e-9);
}

TEST(Simulator, SampledUtilisationNeverExceedsOne) {
  // Long prefills and short decodes, several replicas, windows shorter
  // than a step: however a step straddles windows, each gets its part.
  ProfileGrid g;
  g.batch = {0, 1, 64};
  g.context = {1, 4096};
  g.prefill = {0, 1, 4096};
  g.stage_seconds.assign(1, std::vector<double>(g.points()));
  for (size_t b = 0; b < g.batch.size(); ++b)
    for (size_t c = 0; c < g.context.size(); ++c)
      for (size_t p = 0; p < g.prefill.size(); ++p)
        g.stage_seconds[0][g.at(b, c, p)] = 0.002 + 0.001 * g.batch[b] + 0.0015 * g.prefill[p];
  SimOptions o = options(3, 8);
  o.sample_s = 0.25;
  o.failures = {{0.6, 1, -1}, {1.7, 2, -1}};  // deaths mid-step, restarts within one
  o.restart_s = 0;
  SyntheticOptions so;
  so.requests = 300;
  so.rate_per_s = 30;
  so.prompt = "uniform:16:600";
  so.output = "uniform:4:64";
  SyntheticWorkload w(so);
  Samples samples;
  Simulator sim(o, {StepCostModel(g)}, w, &samples);
  sim.run();
  ASSERT_GT(samples.times.size(), 10u);
  double highest = 0;
  for (const auto& window : samples.replicas)
    for (const ReplicaSample& r : window) {
      highest = std::max(highest, r.utilisation);
      EXPECT_GE(r.utilisation, -1e-9);
      EXPECT_LE(r.kv_occupancy, 1.0);
    }
  EXPECT_LE(highest, 1.0 + 1e-9);
  EXPECT_GT(highest, 0.9);  // the run was busy: the bound is not met by idling
  // The summary's busy time is the windows' (steps cut short by a death
  // count up to the death in both).
  const auto figures = sim.replica_figures();
  for (size_t i = 0; i < figures.size(); ++i) {
    double from_windows = 0, previous = 0;
    for (size_t k = 0; k < samples.times.size(); ++k) {
      from_windows += samples.replicas[k][i].utilisation * (samples.times[k] - previous);
      previous = samples.times[k];
    }
    EXPECT_NEAR(figures[i].busy_s, from_windows, 1e-6 * std::max(1.0, from_windows))
        << "replica " << i << ", failures " << figures[i].failures;
  }
}

// A step still computing when the last request ends (it timed out) is busy
// only up to the run's end: utilisation is a share of the run.
TEST(Simulator, AStepRunningPastTheEndIsBusyOnlyUntilTheEnd) {
  SimOptions o = options(1, 4);
  o.request_timeout_s = 5;
  o.sample_s = 1;
  Samples samples;
  ListWorkload w({{0, 8, 4}});
  Simulator sim(o, {constant_model(1000)}, w, &samples);
  sim.run();
  const double end = sim.totals().end_time_s;
  EXPECT_NEAR(end, 5, 0.2);
  EXPECT_NEAR(sim.replica_figures()[0].busy_s, end, 1e-9);
  ASSERT_FALSE(samples.replicas.empty());
  for (const auto& window : samples.replicas) EXPECT_LE(window[0].utilisation, 1.0 + 1e-9);
}

// A gap of millions of empty sample windows is refused, not run for hours.
TEST(Simulator, AnArrivalMillionsOfWindowsAwayIsRefused) {
  SimOptions o = options(1, 4);
  o.sample_s = 1;
  ListWorkload w({{0, 8, 4}, {1e12, 8, 4}});
  Records rec;
  Simulator sim(o, {constant_model(0.01)}, w, &rec);
  const std::string m = test::message_of<std::invalid_argument>([&] { sim.run(); });
  EXPECT_NE(m.find("--sample-s"), std::string::npos) << m;
  o.sample_s = 0;
  ListWorkload again({{0, 8, 4}, {1e12, 8, 4}});
  Records done;
  Simulator without(o, {constant_model(0.01)}, again, &done);
  EXPECT_NO_THROW(without.run());
  EXPECT_EQ(done.summary.completed(), 2u);
}

TEST(Simulator, ScriptedFailuresNameWhatDoesNotExist) {
  EXPECT_EQ(failure_problem({10, 3, -1}, 4, 1), "");
  EXPECT_EQ(failure_problem({10, -1, 1}, 4, 2), "");
  EXPECT_EQ(failure_problem({10, 4, -1}, 4, 1),
            "replica 4 does not exist: there are replicas 0..3");
  EXPECT_EQ(failure_problem({10, -1, 5}, 4, 2),
            "node 5 does not exist: with 2 replicas per node, there are nodes 0..1");
  EXPECT_EQ(failure_problem({10, -1, 1}, 3, 4),
            "node 1 does not exist: with 4 replicas per node, there is one node, 0");
  EXPECT_NE(failure_problem({-5, 0, -1}, 4, 1).find(">= 0"), std::string::npos);
  EXPECT_NE(failure_problem({NAN, 0, -1}, 4, 1), "");
  EXPECT_NE(failure_problem({1, -1, -1}, 4, 1), "");
  SimOptions o = options(4, 4);
  o.replicas_per_node = 2;
  o.failures = {{10, -1, 5}};
  ListWorkload w({});
  try {
    Simulator sim(o, {constant_model(0.01)}, w);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("node 5 does not exist"), std::string::npos) << e.what();
  }
  o.failures = {{-5, 0, -1}};
  EXPECT_THROW(Simulator(o, {constant_model(0.01)}, w), std::invalid_argument);
  o.failures.clear();
  for (double SimOptions::*field : {&SimOptions::mtbf_s, &SimOptions::node_mtbf_s,
                                    &SimOptions::sample_s, &SimOptions::restart_s}) {
    SimOptions bad = o;
    bad.*field = -1;
    EXPECT_THROW(Simulator(bad, {constant_model(0.01)}, w), std::invalid_argument);
    bad.*field = NAN;
    EXPECT_THROW(Simulator(bad, {constant_model(0.01)}, w), std::invalid_argument);
  }
}

TEST(Simulator, RequestsTooLongSayWhichLimit) {
  SimOptions o = options(1, 4);
  o.max_tokens_limit = 100;
  const Records rec = run_list(o, {{0, 2000, 60}, {0, 10, 150}, {0, 10, 10}}, constant_model(0.01));
  EXPECT_EQ(rec.by_id.at(1).outcome, Outcome::BadRequest);
  EXPECT_EQ(rec.by_id.at(1).too_long, RequestRecord::TooLong::Context);
  EXPECT_EQ(rec.by_id.at(2).too_long, RequestRecord::TooLong::MaxTokens);
  EXPECT_EQ(rec.by_id.at(3).outcome, Outcome::Completed);
  RunSummary summary = rec.summary;
  summary.set_limits(2048, 100);
  const std::string t = summary.table();
  EXPECT_NE(t.find("2 refused as too long (HTTP 400)"), std::string::npos) << t;
  EXPECT_NE(t.find("1 with prompt + output over the model's context length of 2048 tokens (the "
                   "server answers 400 context_length_exceeded"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("1 asking for more output than server.max_tokens_limit"), std::string::npos)
      << t;
}

TEST(MaxRate, SweepSaysWhenTheBoundIsTheRangeSwept) {
  const auto never = [](double) -> double { throw std::logic_error("no refinement expected"); };
  MaxRate m = max_rate_within_slo({{1, 1.0}, {2, 0.95}, {4, 0.91}}, 0.9, 3, never);
  EXPECT_EQ(m.bound, MaxRate::Bound::MetAtHighest);
  EXPECT_EQ(m.rate, 4);
  m = max_rate_within_slo({{1, 0.5}, {2, 0.2}}, 0.9, 3, never);
  EXPECT_EQ(m.bound, MaxRate::Bound::MissedAtLowest);
  EXPECT_EQ(m.rate, 0);
  m = max_rate_within_slo({{1, 1.0}, {2, 0.5}}, 0.9, 3, [](double r) { return r <= 1.3 ? 1 : 0; });
  EXPECT_EQ(m.bound, MaxRate::Bound::Found);
  EXPECT_DOUBLE_EQ(m.rate, 1.25);
  const std::string t =
      sweep_table({SweepPoint{"a", "1x1x1", 1, RunSummary{}, 0}},
                  {{"a", "1x1x1", MaxRate{4, MaxRate::Bound::MetAtHighest, 1, 4}},
                   {"b", "1x1x1", MaxRate{0, MaxRate::Bound::MissedAtLowest, 1, 4}},
                   {"c", "1x1x1", MaxRate{2, MaxRate::Bound::Found, 1, 4}}});
  EXPECT_NE(t.find("4.00 requests/s (met even at the highest rate"), std::string::npos) << t;
  EXPECT_NE(t.find("0.00 requests/s (missed even at the lowest rate)"), std::string::npos) << t;
  EXPECT_NE(t.find("2.00 requests/s\n"), std::string::npos) << t;
}

TEST(MaxRate, SearchSaysWhenItStoppedAtItsCapOrFoundNothing) {
  std::vector<double> tried;
  const auto at_most = [&](double limit) {
    return [&tried, limit](double rate) {
      tried.push_back(rate);
      return rate <= limit ? 1.0 : 0.0;
    };
  };
  MaxRate m = search_max_rate(at_most(37), 2, 0.9);
  EXPECT_EQ(m.bound, MaxRate::Bound::Found);
  EXPECT_LE(m.rate, 37);
  EXPECT_GT(m.rate, 37 - 32.0 / 256);  // 8 bisections between 32 and 64
  tried.clear();
  m = search_max_rate(at_most(1e9), 2, 0.9);
  EXPECT_EQ(m.bound, MaxRate::Bound::MetAtHighest);
  EXPECT_EQ(m.rate, 2048);
  EXPECT_EQ(*std::max_element(tried.begin(), tried.end()), 2048);
  tried.clear();
  m = search_max_rate(at_most(-1), 2, 0.9);
  EXPECT_EQ(m.bound, MaxRate::Bound::MissedAtLowest);
  EXPECT_EQ(m.rate, 0);
  EXPECT_DOUBLE_EQ(m.lowest, 2.0 / (1 << 20));
  EXPECT_DOUBLE_EQ(*std::min_element(tried.begin(), tried.end()), 2.0 / (1 << 20));
}

// A start above the answer halves down to it, then bisects as finely as a
// start below it does: the answer does not depend on the start.
TEST(MaxRate, SearchFromAboveFindsWhatASearchFromBelowFinds) {
  const auto at_most = [](double limit) {
    return [limit](double rate) { return rate <= limit ? 1.0 : 0.0; };
  };
  for (const double start : {0.01, 3.0, 7.0, 100.0, 10000.0}) {
    const MaxRate m = search_max_rate(at_most(5.33), start, 0.9);
    EXPECT_EQ(m.bound, MaxRate::Bound::Found) << start;
    EXPECT_LE(m.rate, 5.33) << start;
    EXPECT_GT(m.rate, 5.33 * (1 - 1.0 / 256)) << start;
  }
}

TEST(Simulator, RejectsTooFewKvBlocks) {
  SimOptions o = options(1, 4);
  o.scheduler.kv_blocks = 10;  // a 2048-token context needs 128
  ListWorkload w({});
  EXPECT_THROW(Simulator(o, {constant_model(0.01)}, w), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::sim
