// The chaos checker: every request sorted into one outcome against the
// fault-free pass, latency by phase, throughput, resume after a fault, the
// verdict and its report.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chaos/checker.h"
#include "chaos/report.h"
#include "chaos/runner.h"
#include "net/link_proxy.h"

namespace troupe::chaos {
namespace {

// A complete 200 stream sent at `sent`, one token every `gap` seconds from
// sent + ttft.
RequestRecord stream(size_t index, std::vector<int> tokens, double sent = 0, double ttft = 0.1,
                     double gap = 0.01) {
  RequestRecord q;
  q.index = index;
  q.stream = true;
  q.sent_s = sent;
  q.first_token_s = sent + ttft;
  for (size_t i = 0; i < tokens.size(); ++i) q.token_times.push_back(sent + ttft + gap * double(i));
  q.end_s = q.token_times.empty() ? sent + ttft : q.token_times.back();
  q.tokens = std::move(tokens);
  q.status = 200;
  q.finish_reason = "stop";
  return q;
}

Outcome judge(const std::vector<int>& want, const RequestRecord& q) {
  Expected e{want, "stop"};
  return classify(q, &e);
}

TEST(ChaosChecker, CompleteAndEqualIsCorrect) {
  EXPECT_EQ(judge({1, 2, 3}, stream(0, {1, 2, 3})), Outcome::Correct);
  // A token legitimately repeated in the expected output is not a duplicate.
  EXPECT_EQ(judge({7, 7, 8}, stream(0, {7, 7, 8})), Outcome::Correct);
  // An unknown finish reason on either side is not held against it.
  auto q = stream(0, {1, 2});
  q.finish_reason.clear();
  EXPECT_EQ(judge({1, 2}, q), Outcome::Correct);
}

TEST(ChaosChecker, AnotherFinishReasonIsWrong) {
  auto q = stream(0, {1, 2});
  q.finish_reason = "length";
  std::string why;
  Expected e{{1, 2}, "stop"};
  EXPECT_EQ(classify(q, &e, &why), Outcome::Wrong);
  EXPECT_NE(why.find("finish_reason"), std::string::npos) << why;
}

TEST(ChaosChecker, RepeatedRunsAreDuplicated) {
  // a b c d received as a b c b c d, a b b c d, a b b.
  EXPECT_EQ(judge({1, 2, 3, 4}, stream(0, {1, 2, 3, 2, 3, 4})), Outcome::Duplicated);
  EXPECT_EQ(judge({1, 2, 3, 4}, stream(0, {1, 2, 2, 3, 4})), Outcome::Duplicated);
  EXPECT_EQ(judge({1, 2}, stream(0, {1, 2, 2})), Outcome::Duplicated);
  // A run delivered three times.
  EXPECT_EQ(judge({1, 2, 3, 4}, stream(0, {1, 2, 3, 2, 3, 2, 3, 4})), Outcome::Duplicated);
  // Expected a a b, one more a.
  EXPECT_EQ(judge({7, 7, 8}, stream(0, {7, 7, 7, 8})), Outcome::Duplicated);

  const RepeatMatch m = match_with_repeats({1, 2, 3, 4}, {1, 2, 3, 2, 3, 4}, false);
  EXPECT_TRUE(m.matched);
  EXPECT_EQ(m.extra, 2u);
}

TEST(ChaosChecker, OtherDifferencesAreWrong) {
  EXPECT_EQ(judge({1, 2, 3}, stream(0, {1, 3})), Outcome::Wrong);        // a token missing
  EXPECT_EQ(judge({1, 2, 3}, stream(0, {1, 2})), Outcome::Wrong);        // too short
  EXPECT_EQ(judge({1, 2, 3}, stream(0, {1, 2, 3, 9})), Outcome::Wrong);  // too long, no repeat
  EXPECT_EQ(judge({1, 2, 3}, stream(0, {1, 2, 4})), Outcome::Wrong);     // another token
  EXPECT_EQ(judge({1, 2, 3, 4}, stream(0, {1, 2, 3, 1, 4})), Outcome::Wrong);  // not the run before
  EXPECT_EQ(judge({1, 2, 3}, stream(0, {1, 1, 3})), Outcome::Wrong);  // repeat replacing a token
  // Nothing precedes the first token, so it cannot be a repeat.
  EXPECT_EQ(judge({1, 2}, stream(0, {9, 1, 2})), Outcome::Wrong);
  RequestRecord q = stream(5, {1});
  EXPECT_EQ(classify(q, nullptr), Outcome::Wrong);  // no expected output
}

TEST(ChaosChecker, CancellationsHonouredOnAPrefix) {
  auto q = stream(0, {1, 2});
  q.transport = Transport::CancelledByUs;
  q.cancel_after = 2;
  q.status = 200;
  EXPECT_EQ(judge({1, 2, 3, 4}, q), Outcome::Cancelled);
  q.tokens = {};
  EXPECT_EQ(judge({1, 2, 3, 4}, q), Outcome::Cancelled);
  q.tokens = {1, 3};
  EXPECT_EQ(judge({1, 2, 3, 4}, q), Outcome::Wrong);
  q.tokens = {1, 2, 3, 4, 5};  // more than was expected
  EXPECT_EQ(judge({1, 2, 3, 4}, q), Outcome::Wrong);
  q.tokens = {1, 2, 2};  // a prefix with a run delivered again
  EXPECT_EQ(judge({1, 2, 3, 4}, q), Outcome::Duplicated);
  // An injected disconnect is the same.
  q = stream(0, {1});
  q.transport = Transport::CancelledByUs;
  q.injected_disconnect = true;
  EXPECT_EQ(judge({1, 2}, q), Outcome::Cancelled);
}

TEST(ChaosChecker, TransportOutcomes) {
  auto q = stream(0, {});
  q.transport = Transport::NoResponse;
  q.status = 0;
  EXPECT_EQ(judge({1}, q), Outcome::Lost);
  q = stream(0, {1});
  q.transport = Transport::Stalled;
  EXPECT_EQ(judge({1, 2}, q), Outcome::Hung);
  q.transport = Transport::Broken;
  EXPECT_EQ(judge({1, 2}, q), Outcome::Broken);
  q = stream(0, {});
  q.status = 503;
  q.error = "No replica is ready to serve.";
  EXPECT_EQ(judge({1}, q), Outcome::FailedStatus);
}

TEST(ChaosChecker, CountsStatusGroupsAndExamples) {
  RunRecords r;
  r.expected = {{{1, 2, 3}, "stop"}, {{1, 2, 3}, "stop"}, {{4, 5}, "stop"}, {{4, 5}, "stop"},
                {{4, 5}, "stop"},    {{6}, "stop"},       {{6}, "stop"}};
  r.requests.push_back(stream(0, {1, 2, 3}));
  r.requests.push_back(stream(1, {1, 2, 2, 3}));
  for (size_t i : {2, 3, 4}) {
    auto q = stream(i, {});
    q.status = 503;
    q.error = i == 4 ? "draining" : "No replica is ready to serve.";
    r.requests.push_back(q);
  }
  auto lost = stream(5, {});
  lost.transport = Transport::NoResponse;
  lost.status = 0;
  lost.error = "connection refused";
  r.requests.push_back(lost);
  r.requests.push_back(stream(6, {7}));

  const ChaosReport rep = check(r);
  EXPECT_EQ(rep.counts.requests, 7u);
  EXPECT_EQ(rep.counts.correct, 1u);
  EXPECT_EQ(rep.counts.duplicated, 1u);
  EXPECT_EQ(rep.counts.duplicated_tokens, 1u);
  EXPECT_EQ(rep.counts.failed_status, 3u);
  EXPECT_EQ(rep.counts.lost, 1u);
  EXPECT_EQ(rep.counts.wrong, 1u);
  ASSERT_EQ(rep.outcomes.size(), 7u);
  EXPECT_EQ(rep.outcomes[1], Outcome::Duplicated);
  ASSERT_EQ(rep.failed_by_status.size(), 1u);
  EXPECT_EQ(rep.failed_by_status[0].status, 503);
  ASSERT_EQ(rep.failed_by_status[0].messages.size(), 2u);
  EXPECT_EQ(rep.failed_by_status[0].messages[0].message, "No replica is ready to serve.");
  EXPECT_EQ(rep.failed_by_status[0].messages[0].count, 2u);
  EXPECT_EQ(rep.failed_by_status[0].messages[0].examples, (std::vector<size_t>{2, 3}));
  ASSERT_EQ(rep.examples.size(), 3u);  // lost, duplicated, wrong
  EXPECT_EQ(rep.examples[0].outcome, Outcome::Lost);
  EXPECT_EQ(rep.examples[0].error, "connection refused");
  EXPECT_EQ(rep.examples[1].outcome, Outcome::Duplicated);
  EXPECT_EQ(rep.examples[1].diverges_at, 2u);
  EXPECT_EQ(rep.examples[1].received_ids, (std::vector<int>{1, 2, 2, 3}));
  EXPECT_EQ(rep.examples[2].outcome, Outcome::Wrong);
  EXPECT_EQ(rep.examples[2].index, 6u);
  EXPECT_FALSE(rep.ok());
  // Failed statuses alone are not fatal.
  r.requests = {r.requests[0], r.requests[2], r.requests[3]};
  EXPECT_TRUE(check(r).ok());
}

TEST(ChaosChecker, ExamplesAreCapped) {
  RunRecords r;
  for (size_t i = 0; i < 25; ++i) {
    r.expected.push_back({{1}, "stop"});
    auto q = stream(i, {});
    q.transport = Transport::NoResponse;
    r.requests.push_back(q);
  }
  const ChaosReport rep = check(r);
  EXPECT_EQ(rep.counts.lost, 25u);
  EXPECT_EQ(rep.examples.size(), kMaxExamplesPerOutcome);
}

// A replica down at the end, not given up on, with every node back: a
// passing fault took capacity for good, and the run fails saying so. With a
// node the plan stopped for good, or given up on, it is only reported.
TEST(ChaosChecker, CapacityNotBackAtTheEndFailsOnlyWhenItCouldHaveComeBack) {
  RunRecords r;
  r.expected.push_back({{1}, "stop"});
  r.requests.push_back(stream(0, {1}));
  r.down_at_end = {1};
  ChaosReport rep = check(r);
  EXPECT_EQ(rep.verdict(), Verdict::Fail);
  ASSERT_EQ(rep.failures().size(), 1u);
  EXPECT_NE(rep.failures()[0].find("replica 1 still down at the end"), std::string::npos)
      << rep.failures()[0];
  EXPECT_EQ(render_json(rep)["capacity_at_end"]["down"], nlohmann::json::array({1}));
  r.every_node_back = false;
  rep = check(r);
  EXPECT_EQ(rep.verdict(), Verdict::Pass);
  EXPECT_NE(render_text(rep).find("capacity at the end: replica 1 down, waiting for a node"),
            std::string::npos)
      << render_text(rep);
  r.every_node_back = true;
  r.down_at_end.clear();
  r.given_up_at_end = {0, 2};
  rep = check(r);
  EXPECT_EQ(rep.verdict(), Verdict::Pass);
  EXPECT_NE(render_text(rep).find("capacity at the end: replicas 0, 2 given up on"),
            std::string::npos)
      << render_text(rep);
}

TEST(ChaosChecker, LatencyPhases) {
  RunRecords r;
  FaultRecord f;
  f.kind = "process_kill";
  f.target = "node-1";
  f.injected_s = 10;
  f.confirmed_s = 10.5;
  f.recovered_s = 14;  // window [10, 14]
  r.faults.push_back(f);
  for (size_t i = 0; i < 4; ++i) r.expected.push_back({{1, 2}, "stop"});
  r.requests.push_back(stream(0, {1, 2}, 1.0, 0.1, 0.05));   // ends 1.15: before
  r.requests.push_back(stream(1, {1, 2}, 9.9, 0.5, 0.05));   // 9.9 .. 10.45: during
  r.requests.push_back(stream(2, {1, 2}, 13.9, 0.2, 0.05));  // 13.9 .. 14.15: during
  r.requests.push_back(stream(3, {1, 2}, 15.0, 0.3, 0.1));   // after
  const ChaosReport rep = check(r);
  EXPECT_DOUBLE_EQ(rep.first_fault_s, 10);
  EXPECT_EQ(rep.latency.before.requests, 1u);
  EXPECT_EQ(rep.latency.during.requests, 2u);
  EXPECT_EQ(rep.latency.after.requests, 1u);
  EXPECT_NEAR(rep.latency.before.ttft.p50, 0.1, 1e-9);
  EXPECT_NEAR(rep.latency.during.ttft.p50, 0.2, 1e-9);  // nearest rank: the lower of two
  EXPECT_NEAR(rep.latency.during.ttft.p99, 0.5, 1e-9);
  EXPECT_NEAR(rep.latency.after.ttft.p50, 0.3, 1e-9);
  EXPECT_NEAR(rep.latency.after.tpot.p50, 0.1, 1e-9);
  EXPECT_NEAR(rep.latency.after.e2e.p50, 0.4, 1e-9);
  EXPECT_EQ(rep.latency.before.tpot.count, 1u);
}

TEST(ChaosChecker, OnlyCorrectRequestsCountForLatency) {
  RunRecords r;
  r.expected = {{{1, 2}, "stop"}, {{1, 2}, "stop"}};
  r.requests.push_back(stream(0, {1, 2}, 0, 0.1));
  r.requests.push_back(stream(1, {1, 3}, 0, 9.0));
  const ChaosReport rep = check(r);
  EXPECT_EQ(rep.latency.before.requests, 1u);  // no faults: everything is before
  EXPECT_EQ(rep.latency.before.ttft.count, 1u);
  EXPECT_NEAR(rep.latency.before.ttft.p99, 0.1, 1e-9);
}

TEST(ChaosChecker, PercentileIsNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(percentile_nearest_rank(v, 50), 50);
  EXPECT_EQ(percentile_nearest_rank(v, 99), 99);
  EXPECT_EQ(percentile_nearest_rank({3, 1, 2}, 50), 2);
  EXPECT_EQ(quantiles({}).count, 0u);
}

TEST(ChaosChecker, ResumeTimeAfterAFault) {
  RunRecords r;
  FaultRecord f;
  f.kind = "link_cut";
  f.target = "node-1";
  f.injected_s = 5;
  f.confirmed_s = 5.1;
  r.faults.push_back(f);
  // Streams with 10 ms gaps; median gap 0.01 -> threshold max(0.25, 0.05) = 0.25.
  auto a = stream(0, {1, 2, 3, 4}, 4.9, 0.05, 0.01);  // 4.95, 4.96, then a stall
  a.token_times = {4.95, 4.96, 5.9, 5.91};
  a.end_s = 5.91;
  auto b = stream(1, {1, 2, 3, 4}, 4.9, 0.05, 0.01);
  b.token_times = {4.95, 4.96, 5.1, 5.11};  // resumed within 0.1 s: not late
  b.end_s = 5.11;
  auto c = stream(2, {1, 2, 3, 4}, 6.0);  // sent after: not in flight
  auto d = stream(3, {1, 2, 3, 4}, 1.0);  // ended before
  auto e = stream(4, {1, 2, 3, 4}, 4.0, 0.05, 0.01);
  e.token_times = {4.05, 4.06, 4.07, 6.2};  // the last token 1.2 s after the fault
  e.end_s = 6.2;
  for (auto* q : {&a, &b, &c, &d, &e}) {
    r.requests.push_back(*q);
    r.expected.push_back({{1, 2, 3, 4}, "stop"});
  }
  // More streams so the median gap is the 10 ms one.
  for (size_t i = 5; i < 10; ++i) {
    r.requests.push_back(stream(i, {1, 2, 3, 4}, 20.0 + double(i)));
    r.expected.push_back({{1, 2, 3, 4}, "stop"});
  }
  const ChaosReport rep = check(r);
  EXPECT_NEAR(rep.median_token_gap_s, 0.01, 1e-9);
  EXPECT_DOUBLE_EQ(rep.resume_threshold_s, 0.25);
  ASSERT_EQ(rep.faults.size(), 1u);
  const FaultReport& fr = rep.faults[0];
  ASSERT_EQ(fr.resumed_late.size(), 2u);
  EXPECT_EQ(fr.resumed_late[0].index, 0u);
  EXPECT_NEAR(fr.resumed_late[0].delay_s, 0.9, 1e-9);
  EXPECT_EQ(fr.resumed_late[1].index, 4u);
  EXPECT_NEAR(fr.resume_max_s, 1.2, 1e-9);
  ASSERT_EQ(rep.fault_kinds.size(), 1u);
  EXPECT_EQ(rep.fault_kinds[0].resume.count, 2u);
  EXPECT_NEAR(rep.fault_kinds[0].resume.p50, 0.9, 1e-9);
  EXPECT_NEAR(rep.fault_kinds[0].resume.p99, 1.2, 1e-9);
  EXPECT_EQ(rep.counts.correct, 10u);
}

TEST(ChaosChecker, PerKindQuantiles) {
  RunRecords r;
  const auto fault = [](const char* kind, double at, double detected, double recovered) {
    FaultRecord f;
    f.kind = kind;
    f.target = "node-1";
    f.injected_s = at;
    f.confirmed_s = at + 0.01;
    f.detected_s = detected < 0 ? -1 : at + detected;
    f.recovered_s = recovered < 0 ? -1 : at + recovered;
    return f;
  };
  r.faults = {fault("process_kill", 10, 0.5, 2.0), fault("link_cut", 20, 1.5, -1),
              fault("process_kill", 30, 0.7, 3.0), fault("process_kill", 40, 0.6, 2.5)};
  r.faults[3].confirmed_s = -1;
  r.faults[3].error = "pid still alive";
  const ChaosReport rep = check(r);
  ASSERT_EQ(rep.fault_kinds.size(), 2u);
  const FaultKindReport& k = rep.fault_kinds[0];
  EXPECT_EQ(k.kind, "process_kill");
  EXPECT_EQ(k.count, 3u);
  EXPECT_EQ(k.confirmed, 2u);
  EXPECT_EQ(k.detection.count, 3u);
  EXPECT_NEAR(k.detection.p50, 0.6, 1e-9);
  EXPECT_NEAR(k.detection.p99, 0.7, 1e-9);
  EXPECT_NEAR(k.capacity_back.p50, 2.5, 1e-9);
  EXPECT_NEAR(k.capacity_back.p99, 3.0, 1e-9);
  EXPECT_EQ(rep.fault_kinds[1].kind, "link_cut");
  EXPECT_EQ(rep.fault_kinds[1].capacity_back.count, 0u);
  EXPECT_NEAR(rep.fault_kinds[1].detection.p50, 1.5, 1e-9);
}

TEST(ChaosChecker, UnconfirmedFaultFailsTheVerdict) {
  RunRecords r;
  r.expected = {{{1}, "stop"}};
  r.requests.push_back(stream(0, {1}));
  FaultRecord ok;
  ok.kind = "process_kill";
  ok.target = "node-2";
  ok.injected_s = 1;
  ok.confirmed_s = 1.2;
  FaultRecord bad;
  bad.kind = "link_cut";
  bad.target = "node-1";
  bad.injected_s = 2;
  bad.error = "no peer saw the link go down";
  r.faults = {ok, ok, ok, bad};
  ChaosReport rep = check(r);
  EXPECT_FALSE(rep.ok());
  ASSERT_EQ(rep.failures().size(), 1u);
  EXPECT_EQ(rep.failures()[0],
            "fault 3 (link_cut node-1) was not confirmed: no peer saw the link go down");
  EXPECT_NE(render_text(rep).find("verdict: FAIL: fault 3 (link_cut node-1) was not confirmed"),
            std::string::npos)
      << render_text(rep);
  // Confirmed but with an error is not good enough either.
  r.faults[3].confirmed_s = 2.5;
  rep = check(r);
  EXPECT_FALSE(rep.ok());
  ASSERT_EQ(rep.failures().size(), 1u);
  EXPECT_NE(rep.failures()[0].find("reported an error"), std::string::npos);
  // All confirmed: pass.
  r.faults[3].error.clear();
  rep = check(r);
  EXPECT_TRUE(rep.ok());
  EXPECT_TRUE(rep.failures().empty());
  EXPECT_NE(render_text(rep).find("verdict: PASS"), std::string::npos);
}

TEST(ChaosChecker, FailuresNameEachFatalCount) {
  RunRecords r;
  r.expected = {{{1, 2}, "stop"}, {{1, 2}, "stop"}, {{1, 2}, "stop"}};
  for (size_t i = 0; i < 2; ++i) {
    auto q = stream(i, {});
    q.transport = Transport::NoResponse;
    r.requests.push_back(q);
  }
  auto h = stream(2, {1});
  h.transport = Transport::Stalled;
  r.requests.push_back(h);
  const auto f = check(r).failures();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0], "2 requests lost");
  EXPECT_EQ(f[1], "1 request hung");
}

TEST(ChaosChecker, ThroughputBinsAndFractions) {
  RunRecords r;
  r.duration_s = 10;
  r.baseline_tokens_per_s = 10;
  FaultRecord f;
  f.kind = "slow";
  f.target = "replica 0 worker";
  f.injected_s = 2;
  f.duration_s = 4;  // window [2, 6]
  f.confirmed_s = 2.1;
  r.faults.push_back(f);
  // 10 tokens per second in [0, 2), 5 per second in [2, 6), 10 per second in [6, 10).
  RequestRecord q;
  q.index = 0;
  q.stream = true;
  q.sent_s = 0;
  for (int s = 0; s < 10; ++s) {
    const int n = (s >= 2 && s < 6) ? 5 : 10;
    for (int i = 0; i < n; ++i) q.token_times.push_back(s + 0.05 + 0.9 * i / n);
  }
  q.first_token_s = q.token_times.front();
  q.end_s = q.token_times.back();
  q.tokens.assign(q.token_times.size(), 1);
  q.status = 200;
  r.requests.push_back(q);
  r.expected.push_back({q.tokens, ""});
  const ChaosReport rep = check(r);
  ASSERT_EQ(rep.throughput.bins.size(), 10u);
  EXPECT_EQ(rep.throughput.bins[0], 10);
  EXPECT_EQ(rep.throughput.bins[3], 5);
  EXPECT_EQ(rep.throughput.bins[9], 10);
  EXPECT_DOUBLE_EQ(rep.throughput.during.window_s, 4);
  ASSERT_TRUE(rep.throughput.during.fraction.has_value());
  EXPECT_NEAR(*rep.throughput.during.fraction, 0.5, 1e-9);
  ASSERT_TRUE(rep.throughput.after.fraction.has_value());
  EXPECT_NEAR(*rep.throughput.after.fraction, 1.0, 1e-9);
  ASSERT_TRUE(rep.throughput.before.fraction.has_value());
  EXPECT_NEAR(*rep.throughput.before.fraction, 1.0, 1e-9);
  EXPECT_NE(render_text(rep).find("(0.50x)"), std::string::npos) << render_text(rep);
  // No baseline: the rates stay, the fractions go.
  r.baseline_tokens_per_s = 0;
  const ChaosReport nb = check(r);
  EXPECT_FALSE(nb.throughput.during.fraction.has_value());
  EXPECT_FALSE(nb.throughput.after.fraction.has_value());
  ASSERT_TRUE(nb.throughput.during.tokens_per_s.has_value());
  EXPECT_NEAR(*nb.throughput.during.tokens_per_s, 5, 1e-9);
  EXPECT_TRUE(render_json(nb)["throughput"]["during_faults"]["fraction_of_baseline"].is_null());
}

// Tokens at `per_s` a second over [from, to), one stream request.
RequestRecord steady(size_t index, double from, double to, double per_s) {
  RequestRecord q;
  q.index = index;
  q.stream = true;
  q.sent_s = from;
  for (double t = from + 0.5 / per_s; t < to; t += 1 / per_s) q.token_times.push_back(t);
  q.first_token_s = q.token_times.front();
  q.end_s = q.token_times.back();
  q.tokens.assign(q.token_times.size(), 1);
  q.status = 200;
  return q;
}

FaultRecord confirmed_fault(const char* kind, double at, double duration, double recovered = -1) {
  FaultRecord f;
  f.kind = kind;
  f.target = "node-2";
  f.planned_s = at;
  f.injected_s = at;
  f.duration_s = duration;
  f.confirmed_s = at + 0.01;
  f.recovered_s = recovered;
  return f;
}

// A node killed and declared dead whose capacity never came back before
// the load ended: the rest of the load ran under the fault, none after it.
TEST(ChaosChecker, ADetectedFaultWithoutRecoveryLastsToTheEndOfTheLoad) {
  RunRecords r;
  r.baseline_tokens_per_s = 10;
  r.load_end_s = 2.6;
  r.duration_s = 3;
  FaultRecord f = confirmed_fault("process_kill", 2.0, 0);
  f.detected_s = 2.2;
  r.faults.push_back(f);
  r.requests.push_back(steady(0, 0, 2.6, 10));
  r.expected.push_back({r.requests[0].tokens, ""});
  const ChaosReport rep = check(r);
  ASSERT_EQ(rep.faults.size(), 1u);
  EXPECT_DOUBLE_EQ(rep.faults[0].window_end_s, 2.6);
  EXPECT_NEAR(rep.throughput.during.window_s, 0.6, 1e-9);
  EXPECT_FALSE(rep.throughput.after.tokens_per_s.has_value());
  // Once capacity was back, the window ends there.
  r.faults[0].recovered_s = 2.4;
  EXPECT_DOUBLE_EQ(check(r).faults[0].window_end_s, 2.4);
}

TEST(ChaosChecker, WindowsAreClippedToTheLoad) {
  // quick.yaml with --requests 300: the process_stop window (8 .. 10.5 s)
  // outlasts the load (8.6 s); the idle time after it is not a slowdown.
  RunRecords r;
  r.baseline_tokens_per_s = 10;
  r.load_end_s = 8.6;
  r.duration_s = 12;  // the waits for late confirmations
  r.faults.push_back(confirmed_fault("process_stop", 8, 2.5));
  r.requests.push_back(steady(0, 0, 8.6, 10));
  r.expected.push_back({r.requests[0].tokens, ""});
  const ChaosReport rep = check(r);
  EXPECT_DOUBLE_EQ(rep.load_s, 8.6);
  ASSERT_EQ(rep.faults.size(), 1u);
  EXPECT_DOUBLE_EQ(rep.faults[0].window_start_s, 8);
  EXPECT_DOUBLE_EQ(rep.faults[0].window_end_s, 8.6);
  EXPECT_NEAR(rep.throughput.during.window_s, 0.6, 1e-9);
  ASSERT_TRUE(rep.throughput.during.fraction.has_value());
  EXPECT_NEAR(*rep.throughput.during.fraction, 1.0, 0.01);
  EXPECT_NEAR(*rep.throughput.before.fraction, 1.0, 0.01);
  // Nothing after the window: no rate rather than a made-up one.
  EXPECT_FALSE(rep.throughput.after.tokens_per_s.has_value());
  const std::string text = render_text(rep);
  EXPECT_NE(text.find("during 10 tok/s (1.00x) over 0.6 s"), std::string::npos) << text;
  EXPECT_NE(text.find("clipped to the load (0-8.6 s)"), std::string::npos) << text;
  EXPECT_NE(text.find("troupe chaos: 1 requests in 8.6 s"), std::string::npos) << text;
}

TEST(ChaosChecker, FaultsThatTookNoEffectOpenNoWindow) {
  RunRecords r;
  r.baseline_tokens_per_s = 10;
  r.load_end_s = 10;
  FaultRecord refused;
  refused.kind = "kill";
  refused.target = "replica 99 worker";
  refused.injected_s = 2;
  refused.error = "POST /admin/faults answered 400: no replica 99";
  r.faults.push_back(refused);
  r.requests.push_back(steady(0, 0, 10, 10));
  r.expected.push_back({r.requests[0].tokens, ""});
  const ChaosReport rep = check(r);
  EXPECT_EQ(rep.faults[0].window_start_s, -1);
  EXPECT_EQ(rep.first_fault_s, -1);
  EXPECT_DOUBLE_EQ(rep.throughput.before.window_s, 10);
  EXPECT_FALSE(rep.throughput.during.tokens_per_s.has_value());
  EXPECT_EQ(rep.latency.before.requests, 1u);
  EXPECT_EQ(rep.latency.during.requests, 0u);
  EXPECT_EQ(rep.verdict(), Verdict::Fail);  // it is still a fault that failed
}

TEST(ChaosChecker, AfterMeansTheSameForLatencyAndThroughput) {
  // Two windows, [2, 3] and [6, 7], in a load of 10 s: "after" is the time
  // outside both once faults began ([3, 6] and [7, 10]), for requests and
  // tokens alike.
  RunRecords r;
  r.baseline_tokens_per_s = 10;
  r.load_end_s = 10;
  r.faults.push_back(confirmed_fault("link_cut", 2, 1));
  r.faults.push_back(confirmed_fault("link_cut", 6, 1));
  r.requests.push_back(steady(0, 0, 1.9, 10));    // before
  r.requests.push_back(steady(1, 2.5, 2.9, 10));  // during
  r.requests.push_back(steady(2, 3.5, 5.5, 10));  // after (between the faults)
  r.requests.push_back(steady(3, 5.8, 6.2, 10));  // during
  r.requests.push_back(steady(4, 7.5, 10, 10));   // after (after the last)
  for (const auto& q : r.requests) r.expected.push_back({q.tokens, ""});
  const ChaosReport rep = check(r);
  EXPECT_EQ(rep.latency.before.requests, 1u);
  EXPECT_EQ(rep.latency.during.requests, 2u);
  EXPECT_EQ(rep.latency.after.requests, 2u);
  EXPECT_NEAR(rep.throughput.before.window_s, 2, 1e-9);
  EXPECT_NEAR(rep.throughput.during.window_s, 2, 1e-9);
  EXPECT_NEAR(rep.throughput.after.window_s, 6, 1e-9);
  // 20 tokens in [3.5, 5.5), 2 in [5.8, 6) and 25 in [7.5, 10): 47 over 6 s.
  ASSERT_TRUE(rep.throughput.after.tokens_per_s.has_value());
  EXPECT_NEAR(*rep.throughput.after.tokens_per_s, 47.0 / 6, 1e-9);
  const nlohmann::json j = render_json(rep);
  EXPECT_NEAR(j["throughput"]["after_faults"]["window_s"].get<double>(), 6, 1e-9);
  EXPECT_TRUE(j["phases"]["after"].is_string());
}

TEST(ChaosChecker, AFaultNeverPlayedIsListedAndTheRunIsIncomplete) {
  RunRecords r;
  r.load_end_s = 8.6;
  r.faults.push_back(confirmed_fault("process_kill", 2, 0, 3.5));
  FaultRecord later;
  later.kind = "link_delay";
  later.target = "node-1";
  later.planned_s = 12;
  later.duration_s = 2;
  later.not_played = "the load ended at 8.6 s";
  r.faults.push_back(later);
  later.kind = "slow";
  later.target = "replica 1";
  later.planned_s = 14;
  r.faults.push_back(later);
  r.requests.push_back(steady(0, 0, 8.6, 10));
  r.expected.push_back({r.requests[0].tokens, ""});
  ChaosReport rep = check(r);
  EXPECT_EQ(rep.played_faults(), 1u);
  EXPECT_EQ(rep.verdict(), Verdict::Incomplete);
  EXPECT_FALSE(rep.ok());
  EXPECT_TRUE(rep.failures().empty());
  ASSERT_EQ(rep.not_played().size(), 2u);
  EXPECT_EQ(rep.not_played()[0],
            "fault 1 (link_delay node-1, at 12.0 s) was not played: the load ended at 8.6 s");
  // Not played is neither a window nor a fault of its kind that was played.
  EXPECT_EQ(rep.faults[1].window_start_s, -1);
  ASSERT_EQ(rep.fault_kinds.size(), 3u);
  EXPECT_EQ(rep.fault_kinds[1].count, 0u);
  EXPECT_EQ(rep.fault_kinds[1].not_played, 1u);
  std::string text = render_text(rep);
  EXPECT_NE(text.find("1 of 3 planned faults played (2 not played)"), std::string::npos) << text;
  EXPECT_NE(text.find("not played\n      planned at 12.0 s; the load ended at 8.6 s"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("verdict: INCOMPLETE: 2 of 3 planned faults were not played (the load "
                      "ended at 8.6 s)"),
            std::string::npos)
      << text;
  nlohmann::json j = render_json(rep);
  EXPECT_EQ(j["verdict"], "INCOMPLETE");
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["faults_planned"], 3);
  EXPECT_EQ(j["faults_played"], 1);
  EXPECT_EQ(j["not_played"].size(), 2u);
  EXPECT_EQ(j["faults"][2]["played"], false);
  EXPECT_TRUE(j["faults"][2]["injected_s"].is_null());
  EXPECT_EQ(j["faults"][2]["planned_s"], 14);
  // Something fatal as well: FAIL, which still says what was not played.
  auto lost = steady(0, 1, 2, 10);
  lost.transport = Transport::NoResponse;
  lost.status = 0;
  r.requests.push_back(lost);
  rep = check(r);
  EXPECT_EQ(rep.verdict(), Verdict::Fail);
  text = render_text(rep);
  EXPECT_NE(text.find("verdict: FAIL: 1 request lost; 2 of 3 planned faults were not played"),
            std::string::npos)
      << text;
  EXPECT_EQ(render_json(rep)["verdict"], "FAIL");
  // Every fault played: PASS.
  r.requests.pop_back();
  r.faults.resize(1);
  EXPECT_EQ(check(r).verdict(), Verdict::Pass);
}

TEST(ChaosChecker, ALinkCutIsTheWallTimeItLasted) {
  // A 2 s cut of both directions was reported as "4016 ms cut".
  LinkCounters before, after;
  before.to_upstream.cut_us = 1'000'000;
  before.to_client.cut_us = 500'000;
  after.to_upstream.cut_us = 3'008'000;
  after.to_client.cut_us = 2'507'000;
  FaultPlan cut;
  cut.kind = "link_cut";
  cut.direction = "both";
  std::string what;
  EXPECT_EQ(link_effect(cut, after, before, &what), 2008u);
  EXPECT_EQ(what, "ms cut (to coordinator 2008 ms, to node 2007 ms)");
  cut.direction = "to_coordinator";
  after.to_client.cut_us = before.to_client.cut_us;
  EXPECT_EQ(link_effect(cut, after, before, &what), 2008u);
  EXPECT_EQ(what, "ms cut");
  FaultPlan drop;
  drop.kind = "link_drop";
  after.to_upstream.frames_dropped = 3;
  after.to_client.frames_dropped = 4;
  EXPECT_EQ(link_effect(drop, after, before, &what), 7u);
  EXPECT_EQ(what, "messages dropped");
}

TEST(ChaosChecker, ResourcesStartAndEnd) {
  RunRecords r;
  r.resources_start = {{"coordinator", 123, 210.2, 40, 12, 0}, {"node-1", 200, 900, 30, 20, -1}};
  r.resources_end = {{"coordinator", 123, 212.4, 41, 12, 0}, {"node-1", 250, 905, 30, 20, -1}};
  const ChaosReport rep = check(r);
  ASSERT_EQ(rep.resources.size(), 2u);
  EXPECT_TRUE(rep.resources[0].at_start && rep.resources[0].at_end);
  EXPECT_EQ(rep.resources[1].end.pid, 250);
  const std::string text = render_text(rep);
  EXPECT_NE(text.find("coordinator pid 123   rss 210 -> 212 MiB (+2)   fds 40 -> 41 (+1)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("node-1 pid 200 -> 250"), std::string::npos) << text;
  const auto j = render_json(rep);
  EXPECT_EQ(j["resources"][0]["delta"]["open_fds"], 1);
  EXPECT_EQ(j["resources"][1]["delta"]["restarted"], true);
}

TEST(ChaosChecker, JsonHasTheCounts) {
  RunRecords r;
  r.duration_s = 3;
  r.expected = {{{1, 2}, "stop"}, {{1, 2}, "stop"}, {{1, 2}, "stop"}};
  r.requests.push_back(stream(0, {1, 2}));
  r.requests.push_back(stream(1, {1, 2, 2}));
  auto s = stream(2, {});
  s.status = 503;
  s.error = "No replica is ready to serve.";
  r.requests.push_back(s);
  FaultRecord f;
  f.kind = "process_kill";
  f.target = "node-1";
  f.injected_s = 1;
  f.confirmed_s = 1.1;
  f.detected_s = 1.6;
  r.faults.push_back(f);
  const ChaosReport rep = check(r);
  const nlohmann::json j = render_json(rep);
  EXPECT_EQ(j["counts"]["requests"], 3);
  EXPECT_EQ(j["counts"]["correct"], 1);
  EXPECT_EQ(j["counts"]["duplicated"], 1);
  EXPECT_EQ(j["counts"]["duplicated_tokens"], 1);
  EXPECT_EQ(j["counts"]["failed_with_status"], 1);
  EXPECT_EQ(j["counts"]["lost"], 0);
  EXPECT_EQ(j["failed_by_status"][0]["status"], 503);
  EXPECT_EQ(j["failed_by_status"][0]["messages"][0]["message"], "No replica is ready to serve.");
  EXPECT_EQ(j["examples"][0]["outcome"], "duplicated");
  EXPECT_EQ(j["faults"][0]["kind"], "process_kill");
  EXPECT_EQ(j["faults"][0]["confirmed"], true);
  EXPECT_TRUE(j["faults"][0]["recovered_s"].is_null());
  EXPECT_NEAR(j["fault_kinds"][0]["detection_s"]["p50"].get<double>(), 0.6, 1e-9);
  EXPECT_EQ(j["latency"]["before"]["requests"], 1);
  EXPECT_TRUE(j["latency"]["during"]["ttft"]["p50"].is_null());
  EXPECT_EQ(j["verdict"], "FAIL");
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["failures"][0], "1 request duplicated (1 token repeated)");
  const std::string text = render_text(rep);
  EXPECT_NE(text.find("troupe chaos: 3 requests in 3.0 s, 1 fault"), std::string::npos) << text;
  EXPECT_NE(text.find("failed with a status 1 (503: 1 \"No replica is ready to serve.\")"),
            std::string::npos)
      << text;
}

TEST(ChaosChecker, RepeatSearchStaysBounded) {
  // Long sequences that do not match end quickly or give up, never hang.
  std::vector<int> want(3000), got(3000);
  for (int i = 0; i < 3000; ++i) {
    want[size_t(i)] = i;
    got[size_t(i)] = i == 1500 ? -1 : i;
  }
  EXPECT_FALSE(match_with_repeats(want, got, false).matched);
  std::vector<int> same(2000, 7);
  std::vector<int> more(2600, 7);
  EXPECT_TRUE(match_with_repeats(same, more, false).matched);
  EXPECT_EQ(match_with_repeats(same, more, false).extra, 600u);
}

}  // namespace
}  // namespace troupe::chaos

namespace troupe::chaos {
namespace {

TEST(LatencySeries, QuantilesPerWindowOfTheRequestsThatEndedThere) {
  std::vector<RequestRecord> rs;
  const auto add = [&](double sent, double first, double end) {
    RequestRecord r;
    r.sent_s = sent;
    r.first_token_s = first;
    r.end_s = end;
    rs.push_back(r);
  };
  add(0, 0.1, 0.5);    // window 0: e2e 0.5
  add(1, 1.2, 2.0);    // window 0: e2e 1.0
  add(9, 9.5, 12);     // window 1: e2e 3
  add(25, -1, 26);     // window 2: e2e 1, no first token
  RequestRecord lost;  // no answer: not in any window
  lost.sent_s = 3;
  rs.push_back(lost);
  const auto s = latency_series(rs, 10);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].start_s, 0);
  EXPECT_EQ(s[0].e2e.count, 2u);
  EXPECT_DOUBLE_EQ(s[0].e2e.p50, 0.5);
  EXPECT_DOUBLE_EQ(s[0].e2e.p99, 1.0);
  EXPECT_DOUBLE_EQ(s[0].ttft.p99, 0.2);
  EXPECT_EQ(s[1].e2e.count, 1u);
  EXPECT_DOUBLE_EQ(s[1].e2e.p50, 3);
  EXPECT_EQ(s[2].start_s, 20);
  EXPECT_EQ(s[2].ttft.count, 0u);
  EXPECT_THROW(latency_series(rs, 0), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::chaos
