// The simulator's inputs: step profiles and their interpolation, trace
// readers and writers, length distributions and arrival processes.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "scheduler/sim/run.h"
#include "scheduler/sim/step_profile.h"
#include "scheduler/sim/workload.h"
#include "support/test_support.h"

namespace troupe::sim {
namespace {

// t = 0.001 * b + 0.0001 * p + 0.00001 * c * b: linear in each axis, so
// interpolation is exact everywhere.
ProfileGrid linear_grid() {
  ProfileGrid g;
  g.threads = 2;
  g.batch = {0, 1, 4, 16};
  g.context = {16, 256};
  g.prefill = {0, 64, 512};
  g.stage_seconds.assign(1, std::vector<double>(g.points()));
  for (size_t b = 0; b < g.batch.size(); ++b)
    for (size_t c = 0; c < g.context.size(); ++c)
      for (size_t p = 0; p < g.prefill.size(); ++p)
        g.stage_seconds[0][g.at(b, c, p)] =
            0.001 * g.batch[b] + 0.0001 * g.prefill[p] + 0.00001 * g.context[c] * g.batch[b];
  return g;
}

double linear(double b, double c, double p) {
  return 0.001 * b + 0.0001 * p + 0.00001 * c * b;
}

TEST(StepCostModel, ExactOnTheGridLinearBetweenAndBeyond) {
  const StepCostModel m(linear_grid());
  EXPECT_DOUBLE_EQ(m.step_s({4, 256, 64}), linear(4, 256, 64));
  EXPECT_NEAR(m.step_s({2, 100, 300}), linear(2, 100, 300), 1e-12);
  // Past the largest batch and prefill: continued linearly.
  EXPECT_NEAR(m.step_s({32, 16, 1024}), linear(32, 16, 1024), 1e-12);
  // Context is held within what was measured.
  EXPECT_NEAR(m.step_s({1, 1000, 0}), linear(1, 256, 0), 1e-12);
}

TEST(StepProfile, JsonRoundTripAndLayoutLookup) {
  StepProfile p;
  p.model = {"fortune", 256, 2000, 2560, 1, {1, 2}};
  p.dtype = "f32";
  p.put(linear_grid());
  ProfileGrid g4 = linear_grid();
  g4.threads = 4;
  p.put(g4);
  p.put(linear_grid());  // same layout and threads: replaced, not added
  EXPECT_EQ(p.layouts.size(), 2u);
  test::TempDir dir;
  p.kv_dtype = "f16";
  p.save(dir / "p.json");
  const StepProfile q = StepProfile::load(dir / "p.json");
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(q.kv_dtype, "f16");
  // Profiles written before the field was: measured with an f32 cache.
  auto old_file = p.to_json();
  old_file.erase("kv_dtype");
  EXPECT_EQ(StepProfile::from_json(old_file, "old.json").kv_dtype, "f32");
  EXPECT_EQ(q.find(1, 1, 3).threads, 2);
  EXPECT_EQ(q.find(1, 1, 5).threads, 4);
  try {
    q.find(2, 1, 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("troupe bench --profile --pipeline 2"), std::string::npos)
        << e.what();
  }
}

TEST(StepProfile, BadFilesNameTheProblem) {
  auto j = StepProfile{{"m", 64, 100, 8, 1, {2}}, "", "", "", {linear_grid()}}.to_json();
  j["layouts"][0]["batch"] = {4, 1};
  EXPECT_THROW(StepProfile::from_json(j, "x.json"), std::invalid_argument);
  j = StepProfile{{"m", 64, 100, 8, 1, {2}}, "", "", "", {linear_grid()}}.to_json();
  j["format"] = "other";
  try {
    StepProfile::from_json(j, "x.json");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos);
  }
}

TEST(Workload, AzureTraceReadsDatesAndScales) {
  test::TempDir dir;
  test::write_file(dir / "t.csv",
                   "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.5000000,100,20\n"
                   "2023-11-16 18:15:47.0000000,3000,0\n"
                   "2023-11-16 18:15:48.5000000,50,7\n");
  TraceOptions o;
  o.time_scale = 2;
  o.max_context = 1024;
  TraceWorkload w(dir / "t.csv", o);
  auto a = w.next();
  ASSERT_TRUE(a);
  EXPECT_DOUBLE_EQ(a->time_s, 0);
  EXPECT_EQ(a->prompt_tokens, 100);
  EXPECT_EQ(a->output_tokens, 20);
  a = w.next();
  EXPECT_DOUBLE_EQ(a->time_s, 0.25);
  EXPECT_EQ(a->prompt_tokens, 1023);  // clipped to the context, one token left to generate
  EXPECT_EQ(a->output_tokens, 1);
  a = w.next();
  EXPECT_DOUBLE_EQ(a->time_s, 1.0);
  EXPECT_FALSE(w.next());
  const TraceCuts& c = w.cuts();
  EXPECT_EQ(c.rows, 3u);
  EXPECT_EQ(c.cut, 1u);
  EXPECT_DOUBLE_EQ(c.asked_prompt, 3150);
  EXPECT_DOUBLE_EQ(c.kept_prompt, 1173);
  EXPECT_DOUBLE_EQ(c.asked_output, 28);  // a row of 0 asks for 1
  EXPECT_DOUBLE_EQ(c.kept_output, 28);
  EXPECT_NEAR(c.scale_to_fit(), 1024 / (3178 / 3.0), 1e-12);
  const TraceStats s = trace_stats(dir / "t.csv");
  EXPECT_EQ(s.rows, 3u);
  EXPECT_DOUBLE_EQ(s.span_s, 2.0);
}

// Every request gets one of the groups' prefixes before its own prompt;
// closed-loop clients' later requests too.
TEST(Workload, SharedPrefixesGoBeforeEveryPrompt) {
  WorkloadSpec spec;
  spec.clients = 3;
  spec.requests = 60;
  spec.prompt = "10";
  spec.prefix_len = 32;
  spec.prefix_groups = 4;
  auto w = spec.make(256);
  std::set<int> groups;
  int n = 0;
  for (auto a = w->next(); a; a = w->next(), ++n) {
    EXPECT_EQ(a->prompt_tokens, 42);
    EXPECT_EQ(a->prefix_tokens, 32);
    groups.insert(a->prefix_group);
  }
  EXPECT_EQ(n, 3);  // one per client, the rest as they are answered
  for (int i = 0; i < 30; ++i) {
    const auto a = w->on_end(i % 3, double(i));
    ASSERT_TRUE(a);
    EXPECT_EQ(a->prompt_tokens, 42);
    groups.insert(a->prefix_group);
  }
  EXPECT_EQ(groups, (std::set<int>{0, 1, 2, 3}));
  EXPECT_NE(spec.describe().find("shared prefix of 32 tokens (4 different ones)"),
            std::string::npos)
      << spec.describe();
  EXPECT_THROW(SharedPrefixWorkload(spec.make(256), 0, 1, 1), std::invalid_argument);
  EXPECT_THROW(SharedPrefixWorkload(spec.make(256), 8, 0, 1), std::invalid_argument);
}

TEST(Workload, MooncakeJsonlInMilliseconds) {
  test::TempDir dir;
  test::write_file(dir / "t.jsonl",
                   "{\"timestamp\": 0, \"input_length\": 6955, \"output_length\": 52, "
                   "\"hash_ids\": [1, 2]}\n"
                   "{\"timestamp\": 1500, \"input_length\": 10, \"output_length\": 3}\n");
  TraceWorkload w(dir / "t.jsonl", {});
  const auto first = w.next();
  EXPECT_EQ(first->prompt_tokens, 6955);
  EXPECT_EQ(first->block_ids, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(first->block_id_tokens, 512);
  const auto second = w.next();
  EXPECT_DOUBLE_EQ(second->time_s, 1.5);
  EXPECT_TRUE(second->block_ids.empty());
  EXPECT_FALSE(w.next());
  // Scaled lengths scale the blocks the ids name.
  TraceOptions half;
  half.length_scale = 0.5;
  EXPECT_EQ(TraceWorkload(dir / "t.jsonl", half).next()->block_id_tokens, 256);
  test::write_file(dir / "bad.jsonl",
                   "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
                   "\"hash_ids\": [1, -2]}\n");
  EXPECT_THROW(TraceWorkload(dir / "bad.jsonl", {}).next(), std::invalid_argument);
}

TEST(Workload, ATraceRescaledToARateHasThatRateOverTheRowsReplayed) {
  // 20 rows 10 ms apart, then 20 rows 1 s apart: the first 20 alone are at
  // 100/s, the whole trace at about 2/s. --rate 5 --requests 20 replays
  // those 20 rows at 5/s.
  test::TempDir dir;
  std::string text;
  double t = 0;
  for (int i = 0; i < 40; ++i) {
    text += "{\"timestamp\": " + std::to_string(int(t)) +
            ", \"input_length\": 10, \"output_length\": 2}\n";
    t += i < 19 ? 10 : 1000;
  }
  test::write_file(dir / "t.jsonl", text);
  WorkloadSpec spec;
  spec.trace = (dir / "t.jsonl").string();
  spec.rate = 5;
  spec.requests = 20;
  const auto w = spec.make(256);
  size_t rows = 0;
  double last = 0;
  while (const auto a = w->next()) {
    ++rows;
    last = a->time_s;
  }
  EXPECT_EQ(rows, 20u);
  EXPECT_NEAR(double(rows - 1) / last, 5.0, 1e-9);
  EXPECT_EQ(trace_stats(dir / "t.jsonl", 20).rows, 20u);
  EXPECT_EQ(trace_stats(dir / "t.jsonl").rows, 40u);
}

TEST(Workload, BadTracesNameFileAndLine) {
  test::TempDir dir;
  test::write_file(dir / "a.csv", "time,in,out\n1,2,3\n");
  EXPECT_THROW(TraceWorkload(dir / "a.csv", {}), std::invalid_argument);
  test::write_file(dir / "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,1\n4,10,1\n");
  TraceWorkload w(dir / "b.csv", {});
  w.next();
  try {
    w.next();
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("b.csv:3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TraceWorkload(dir / "c.txt", {}), std::invalid_argument);
}

TEST(Workload, MooncakeRowsAreCheckedAsAzureRowsAre) {
  // Lengths as the Azure reader takes them: a prompt of 1 token or more,
  // an output of 0 or more; each refusal names the line and the field.
  test::TempDir dir;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"timestamp": 0, "input_length": -5, "output_length": 3})", "input_length"},
      {R"({"timestamp": 0, "input_length": 0, "output_length": 3})", "input_length"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": -3})", "output_length"},
      {R"({"timestamp": 0, "input_length": "abc", "output_length": 3})", "input_length"},
      {R"({"timestamp": "x", "input_length": 10, "output_length": 3})", "timestamp"},
      {R"({"input_length": 10, "output_length": 3})", "timestamp"},
  };
  for (const auto& [row, field] : cases) {
    test::write_file(dir / "m.jsonl",
                     std::string(R"({"timestamp": 0, "input_length": 10, "output_length": 3})") +
                         "\n" + row + "\n");
    TraceWorkload w(dir / "m.jsonl", {});
    ASSERT_TRUE(w.next());
    try {
      w.next();
      ADD_FAILURE() << row << ": accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("m.jsonl:2"), std::string::npos) << row << ": " << m;
      EXPECT_NE(m.find(field), std::string::npos) << row << ": " << m;
    }
  }
}

TEST(Workload, WrittenTracesReadBack) {
  SyntheticOptions so;
  so.requests = 50;
  so.rate_per_s = 3;
  so.prompt = "lognormal:200:1";
  so.output = "exp:50";
  test::TempDir dir;
  for (const char* name : {"t.csv", "t.jsonl"}) {
    SyntheticWorkload gen(so), ref(so);
    write_trace(gen, 50, dir / name);
    TraceWorkload back(dir / name, {});
    for (int i = 0; i < 50; ++i) {
      const auto a = back.next(), b = ref.next();
      ASSERT_TRUE(a && b);
      EXPECT_NEAR(a->time_s, b->time_s, 1e-3) << name;
      EXPECT_EQ(a->prompt_tokens, b->prompt_tokens);
      EXPECT_EQ(a->output_tokens, b->output_tokens);
    }
    EXPECT_FALSE(back.next());
  }
}

TEST(Workload, DistributionsHaveTheirMeans) {
  Xoshiro256 rng(1);
  const int n = 200000;
  auto mean_of = [&](const LengthDist& d) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += d.sample(rng);
    return s / n;
  };
  EXPECT_DOUBLE_EQ(mean_of(LengthDist::parse("64")), 64);
  EXPECT_NEAR(mean_of(LengthDist::parse("uniform:10:30")), 20, 0.1);
  EXPECT_NEAR(mean_of(LengthDist::parse("exp:100")), 100, 1.5);
  EXPECT_NEAR(mean_of(LengthDist::parse("lognormal:100:0.5")), 100 * std::exp(0.125), 1.5);
  EXPECT_THROW(LengthDist::parse("normal:3"), std::invalid_argument);
  EXPECT_THROW(LengthDist::parse("uniform:30:10"), std::invalid_argument);
  // Bursty arrivals: the gaps' coefficient of variation is the one asked for.
  for (double cv : {0.5, 1.0, 3.0}) {
    const ArrivalProcess p = ArrivalProcess::parse("gamma:" + std::to_string(cv), 10);
    double s = 0, ss = 0;
    for (int i = 0; i < n; ++i) {
      const double g = p.next_gap_s(rng);
      s += g;
      ss += g * g;
    }
    const double mean = s / n, sd = std::sqrt(ss / n - mean * mean);
    EXPECT_NEAR(mean, 0.1, 0.003) << cv;
    EXPECT_NEAR(sd / mean, cv, 0.05 * cv) << cv;
  }
}

TEST(Workload, ClosedLoopSendsOnlyAfterAnEnd) {
  ClosedLoopOptions o;
  o.clients = 2;
  o.requests = 3;
  o.think_s = 0.5;
  ClosedLoopWorkload w(o);
  EXPECT_EQ(w.next()->client, 0);
  EXPECT_EQ(w.next()->client, 1);
  EXPECT_FALSE(w.next());
  const auto a = w.on_end(1, 2.0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->client, 1);
  EXPECT_DOUBLE_EQ(a->time_s, 2.5);
  EXPECT_FALSE(w.on_end(0, 3.0));  // three sent
}

// The message of what `f` throws as std::invalid_argument ("" if nothing).
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLine, FailuresParseStrictly) {
  Failure f = parse_failure("10:2");
  EXPECT_DOUBLE_EQ(f.time_s, 10);
  EXPECT_EQ(f.replica, 2);
  EXPECT_EQ(f.node, -1);
  f = parse_failure("2.5:node:5");
  EXPECT_DOUBLE_EQ(f.time_s, 2.5);
  EXPECT_EQ(f.replica, -1);
  EXPECT_EQ(f.node, 5);
  const std::string before = refusal([] { parse_failure("-5:0"); });
  EXPECT_NE(before.find("--fail: '-5:0'"), std::string::npos) << before;
  EXPECT_NE(before.find(">= 0"), std::string::npos) << before;
  for (const char* bad : {"10", "10:", ":1", "10:2abc", "10:-1", "10:+1", "10:node:-1", "nan:1",
                          "inf:1", "10:rack:1", "10:node:1:2", "x:1", "10:1.5"}) {
    const std::string m = refusal([&] { parse_failure(bad); });
    EXPECT_NE(m.find("--fail: '" + std::string(bad) + "'"), std::string::npos) << bad << ": " << m;
  }
}

TEST(CommandLine, SlowdownsParseStrictly) {
  EXPECT_EQ(parse_slowdown("1:3"), std::make_pair(1, 3.0));
  EXPECT_EQ(parse_slowdown("0:0.5"), std::make_pair(0, 0.5));
  for (const char* bad : {"1", "1:0", "1:-2", "x:2", "1x:2", "-1:2", "1:nan", "1:inf", "1:2:3"}) {
    const std::string m = refusal([&] { parse_slowdown(bad); });
    EXPECT_NE(m.find("--slow: '" + std::string(bad) + "'"), std::string::npos) << bad << ": " << m;
    EXPECT_NE(m.find("a factor > 0"), std::string::npos) << m;
  }
}

TEST(CommandLine, WorkloadValuesNameTheirFlagAndRange) {
  WorkloadSpec ok;
  ok.rate = 5;
  EXPECT_EQ(refusal([&] { ok.check(); }), "");
  struct Case {
    void (*set)(WorkloadSpec&);
    const char* flag;
    const char* range;
  };
  const Case cases[] = {
      {[](WorkloadSpec& w) { w.rate = -5; }, "--rate: -5", "> 0"},
      {[](WorkloadSpec& w) { w.rate = NAN; }, "--rate: nan", "> 0"},
      {[](WorkloadSpec& w) { w.clients = -3; }, "--clients: -3", "1 or more"},
      {[](WorkloadSpec& w) { w.requests = 0; }, "--requests: 0", "1 or more"},
      {[](WorkloadSpec& w) { w.think_s = -1; }, "--think-s: -1", ">= 0"},
      {[](WorkloadSpec& w) { w.think_s = INFINITY; }, "--think-s: inf", ">= 0"},
      {[](WorkloadSpec& w) { w.cancel_fraction = 1.5; }, "--cancel-fraction: 1.5", "[0, 1]"},
      {[](WorkloadSpec& w) { w.cancel_fraction = NAN; }, "--cancel-fraction: nan", "[0, 1]"},
      {[](WorkloadSpec& w) { w.cancel_after_s = -2; }, "--cancel-after-s: -2", ">= 0"},
      {[](WorkloadSpec& w) { w.priority_fraction = -0.1; }, "--priority-fraction: -0.1", "[0, 1]"},
      {[](WorkloadSpec& w) { w.length_scale = 0; }, "--length-scale: 0", "> 0"},
      {[](WorkloadSpec& w) { w.prompt = "normal:4"; }, "--prompt: length distribution 'normal:4'",
       "uniform:MIN:MAX"},
      {[](WorkloadSpec& w) { w.output = "exp:-1"; }, "--output: length distribution 'exp:-1'",
       "positive"},
      {[](WorkloadSpec& w) { w.arrivals = "gamma:0"; }, "--arrivals: arrival process 'gamma:0'",
       "positive"},
      {[](WorkloadSpec& w) { w.prefix_len = -1; }, "--prefix-len: -1", ">= 1"},
      {[](WorkloadSpec& w) {
         w.prefix_len = 8;
         w.prefix_groups = 0;
       },
       "--prefix-groups: 0", "1 or more"},
      {[](WorkloadSpec& w) { w.prefix_groups = 3; }, "--prefix-groups: there is no shared prefix",
       "--prefix-len"},
  };
  for (const Case& c : cases) {
    WorkloadSpec w = ok;
    c.set(w);
    const std::string m = refusal([&] { w.check(); });
    EXPECT_EQ(m.rfind(c.flag, 0), 0u) << c.flag << ": " << m;
    EXPECT_NE(m.find(c.range), std::string::npos) << c.flag << ": " << m;
    // make() refuses the same, before reading or drawing anything.
    EXPECT_EQ(refusal([&] { w.make(256); }), m);
  }
  // A prefix the model's context cannot hold with a prompt and an output.
  WorkloadSpec big = ok;
  big.prefix_len = 300;
  EXPECT_EQ(refusal([&] { big.check(); }), "");
  EXPECT_EQ(refusal([&] { big.make(302); }), "");
  EXPECT_NE(refusal([&] { big.make(256); }).find("--prefix-len: 300 leaves no room"),
            std::string::npos);
  // A trace's 0 requests is all of its rows.
  WorkloadSpec trace = ok;
  trace.trace = "t.csv";
  trace.requests = 0;
  EXPECT_EQ(refusal([&] { trace.check(); }), "");
}

// A flag the chosen workload would ignore is refused, naming it.
TEST(CommandLine, FlagsTheWorkloadWouldIgnoreAreRefused) {
  struct Case {
    void (*set)(WorkloadSpec&);
    const char* flag;
  };
  const Case cases[] = {
      {[](WorkloadSpec& w) { w.clients = 3; }, "--rate: "},
      {[](WorkloadSpec& w) { w.trace = "t.csv", w.clients = 3; }, "--clients: "},
      {[](WorkloadSpec& w) { w.trace = "t.csv", w.prompt = "64"; }, "--prompt: "},
      {[](WorkloadSpec& w) { w.trace = "t.csv", w.arrivals = "constant"; }, "--arrivals: "},
      {[](WorkloadSpec& w) { w.rate = 0, w.clients = 3, w.arrivals = "constant"; }, "--arrivals: "},
      {[](WorkloadSpec& w) { w.rate = 0, w.clients = 3, w.cancel_fraction = 0.5; },
       "--cancel-fraction: "},
      {[](WorkloadSpec& w) { w.think_s = 2; }, "--think-s: "},
      {[](WorkloadSpec& w) { w.length_scale = 2; }, "--length-scale: "},
      {[](WorkloadSpec& w) { w.cancel_after_s = 0; }, "--cancel-after-s: "},
  };
  for (const Case& c : cases) {
    WorkloadSpec w;
    w.rate = 5;
    c.set(w);
    const std::string m = refusal([&] { w.check(); });
    EXPECT_EQ(m.rfind(c.flag, 0), 0u) << c.flag << ": " << m;
    EXPECT_NE(m.find("drop"), std::string::npos) << m;
  }
  // What each workload does use is accepted.
  WorkloadSpec closed;
  closed.clients = 3, closed.think_s = 2, closed.prompt = "64";
  EXPECT_EQ(refusal([&] { closed.check(); }), "");
  WorkloadSpec trace;
  trace.trace = "t.csv", trace.rate = 4, trace.length_scale = 0.5;
  EXPECT_EQ(refusal([&] { trace.check(); }), "");
  WorkloadSpec open;
  open.rate = 4, open.cancel_fraction = 0.2, open.cancel_after_s = 0.5;
  open.arrivals = "constant", open.priority_fraction = 0.1;
  EXPECT_EQ(refusal([&] { open.check(); }), "");
}

TEST(Workload, SharesAndTimesOutsideTheirRangeAreRefused) {
  for (double share : {-0.1, 1.1, double(NAN)}) {
    SyntheticOptions so;
    so.cancel_fraction = share;
    EXPECT_THROW(SyntheticWorkload{so}, std::invalid_argument) << share;
    so = {};
    so.high_priority_fraction = share;
    EXPECT_THROW(SyntheticWorkload{so}, std::invalid_argument) << share;
  }
  SyntheticOptions so;
  so.cancel_after_s = -1;
  EXPECT_THROW(SyntheticWorkload{so}, std::invalid_argument);
  ClosedLoopOptions co;
  co.think_s = INFINITY;
  EXPECT_THROW(ClosedLoopWorkload{co}, std::invalid_argument);
  co.think_s = 0;
  co.clients = -3;
  EXPECT_THROW(ClosedLoopWorkload{co}, std::invalid_argument);
}

}  // namespace
}  // namespace troupe::sim
