// `troupe simulate` and `troupe bench --profile` as a user runs them, and the
// real router's decisions replayed into the simulator's table.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "scheduler/sim/router_replay.h"
#include "scheduler/sim/step_profile.h"
#include "support/process_support.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using json = nlohmann::json;

std::string profile() {
  return (test::source_dir() / "benchmarks" / "profiles" / "fortune.json").string();
}

std::string two_replicas() {
  return (test::source_dir() / "configs" / "two-replicas.yaml").string();
}

test::CommandResult simulate(std::vector<std::string> args, int timeout_s = 120) {
  args.insert(args.begin(), {test::troupe_binary(), "simulate", "--set",
                             "model.path=" + test::model_path("fortune").string()});
  return test::run_command(args, timeout_s);
}

TEST(Simulate, OneRunPrintsItsFiguresAsJson) {
  test::TempDir dir;
  const auto r = simulate({"--config",
                           two_replicas(),
                           "--profile",
                           profile(),
                           "--rate",
                           "20",
                           "--requests",
                           "200",
                           "--prompt",
                           "uniform:8:64",
                           "--output",
                           "exp:30",
                           "--cancel-fraction",
                           "0.3",
                           "--cancel-after-s",
                           "0.01",
                           "--fail",
                           "2:1",
                           "--json",
                           "--csv",
                           (dir / "ts").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json::parse(r.out);
  EXPECT_EQ(j["requests"], 200);
  EXPECT_GT(j["outcomes"]["completed"].get<int>(), 150);
  EXPECT_GT(j["outcomes"]["cancelled"].get<int>(), 0);
  EXPECT_EQ(j["simulation"]["replica_failures"], 1);
  for (const char* k : {"ttft_s", "tpot_s", "latency_s", "queue_delay_s"})
    EXPECT_TRUE(j[k].contains("p99")) << k;
  EXPECT_TRUE(j["slo"].contains("goodput_share"));
  EXPECT_EQ(j["replicas"].size(), 2u);
  EXPECT_NE(test::read_file(dir / "ts" / "replicas.csv").find("kv_occupancy"), std::string::npos);
  EXPECT_NE(test::read_file(dir / "ts" / "cluster.csv").find("queue_depth"), std::string::npos);
}

TEST(Simulate, EmittedTraceReplays) {
  test::TempDir dir;
  const auto trace = (dir / "t.csv").string();
  auto r = simulate({"--rate", "5", "--requests", "50", "--emit-trace", trace});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::read_file(trace).rfind("TIMESTAMP,ContextTokens,GeneratedTokens\n", 0), 0u);
  r = simulate({"--profile", profile(), "--trace", trace, "--rate", "10", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["requests"], 50);
}

TEST(Simulate, SweepWritesTableCsvAndPlotScript) {
  test::TempDir dir;
  const auto r = simulate({"--config", two_replicas(), "--profile", profile(), "--sweep",
                           "--policies", "round_robin,least_outstanding", "--rates", "50,400",
                           "--requests", "300", "--slow", "1:4", "--out", dir.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("least_outstanding"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("highest rate with 90%"), std::string::npos) << r.out;
  const std::string csv = test::read_file(dir / "sweep.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);  // header + 2 policies x 2 rates
  EXPECT_NE(test::read_file(dir / "sweep.gp").find("plot"), std::string::npos);
}

TEST(Simulate, BadInputsNameTheProblem) {
  auto r = simulate({"--profile", profile(), "--set", "parallel.tensor=2", "--rate", "5"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no layout 1x2"), std::string::npos) << r.err;
  r = simulate({"--profile", profile(), "--rate", "5", "--prompt", "normal:4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("normal:4"), std::string::npos) << r.err;
  r = simulate({"--profile", profile()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("give a workload"), std::string::npos) << r.err;
}

// Each bad value is refused before anything runs, naming its flag and the
// values it takes.
TEST(Simulate, BadValuesNameTheirFlagAndRange) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases{
      {{"--rate", "5", "--fail", "-5:0"}, {"--fail: '-5:0'", ">= 0"}},
      {{"--set", "parallel.replicas=4", "--rate", "5", "--fail", "10:node:5", "--replicas-per-node",
        "2"},
       {"--fail: '10:node:5'", "node 5 does not exist",
        "with 2 replicas per node, there are nodes 0..1"}},
      {{"--set", "parallel.replicas=2", "--rate", "5", "--fail", "10:2"},
       {"replica 2 does not exist: there are replicas 0..1"}},
      {{"--rate", "5", "--fail", "10:1x"}, {"--fail: '10:1x' is not TIME:REPLICA"}},
      {{"--clients", "-3"}, {"--clients: -3", "1 or more"}},
      {{"--rate", "-5"}, {"--rate: -5", "> 0"}},
      {{"--rate", "0"}, {"--rate: 0", "> 0"}},
      {{"--rate", "nan"}, {"--rate: nan", "> 0"}},
      {{"--rate", "5", "--requests", "0"}, {"--requests: 0", "1 or more"}},
      {{"--rate", "5", "--requests", "-5"}, {"--requests: -5", "1 or more"}},  // not 2^64 - 5
      {{"--rate", "5", "--cancel-fraction", "1.5"}, {"--cancel-fraction: 1.5", "[0, 1]"}},
      {{"--rate", "5", "--priority-fraction", "-1"}, {"--priority-fraction: -1", "[0, 1]"}},
      {{"--clients", "2", "--think-s", "-1"}, {"--think-s: -1", ">= 0"}},
      {{"--rate", "5", "--sample-s", "-1"}, {"--sample-s: -1", ">= 0"}},
      {{"--rate", "5", "--mtbf-s", "-10"}, {"--mtbf-s: -10", ">= 0"}},
      {{"--rate", "5", "--restart-s", "nan"}, {"--restart-s: nan", ">= 0"}},
      {{"--rate", "5", "--replicas-per-node", "0"}, {"--replicas-per-node: 0", "1 or more"}},
      {{"--rate", "5", "--slo-ttft-s", "0"}, {"--slo-ttft-s: 0", "> 0"}},
      {{"--rate", "5", "--slow", "0:0"}, {"--slow: '0:0'", "a factor > 0"}},
      {{"--rate", "5", "--slow", "2:3"}, {"--slow: '2:3'", "replica 2 does not exist"}},
      {{"--validate", "--repeats", "0"}, {"--repeats: 0", "1 or more"}},
      {{"--clients", "2", "--find-max-rate"}, {"--find-max-rate needs open-loop arrivals"}},
      {{"--rate", "5", "--prefix-len", "100000"}, {"--prefix-len: 100000 leaves no room"}},
      {{"--rate", "5", "--prefix-groups", "3"}, {"--prefix-groups", "without --prefix-len"}},
      // What one side of a comparison or a sweep would ignore.
      {{"--sweep", "--rates", "1,2", "--clients", "4"}, {"--sweep", "--clients", "--rates"}},
      {{"--validate", "--fail", "1:0"}, {"--validate", "--fail", "real server"}},
      // What another mode takes, refused rather than ignored.
      {{"--rate", "5", "--policies", "round_robin"}, {"--policies applies to --sweep"}},
      {{"--rate", "5", "--rates", "1,2"}, {"--rates applies to --sweep"}},
      {{"--rate", "5", "--refine", "3"}, {"--refine applies to --sweep"}},
      {{"--sweep", "--rates", "1", "--json"}, {"--json prints one run"}},
      {{"--sweep", "--rates", "1", "--rate", "3"}, {"--sweep runs the rates of --rates"}},
      {{"--sweep", "--rates", "1", "--policies", "round_robin,lest_outstanding"},
       {"--policies: 'lest_outstanding' is not a routing policy"}},
      {{"--validate", "--mtbf-s", "30"}, {"--validate", "--mtbf-s", "real server"}},
      {{"--validate", "--prefix-len", "32"}, {"--validate", "--prefix-len", "serving bench"}},
      {{"--rate", "5", "--prefix-len", "32", "--emit-trace", "/tmp/never-written.jsonl"},
       {"--emit-trace", "--prefix-len"}},
      {{"--calibrate", "--node-mtbf-s", "30"}, {"--calibrate", "--node-mtbf-s", "real server"}},
      {{"--calibrate", "--slow", "0:2"}, {"--calibrate", "--slow", "real server"}},
      // Its overhead would be written into the 2-thread grid (the nearest).
      {{"--calibrate", "--set", "devices=[{kind: cpu, threads: 4}]"},
       {"--calibrate", "no grid of 4 thread(s)", "troupe bench --threads 4"}},
  };
  for (const auto& [args, expected] : cases) {
    std::vector<std::string> all{"--profile", profile()};
    all.insert(all.end(), args.begin(), args.end());
    const auto r = simulate(all);
    std::string cmd;
    for (const auto& a : args) cmd += a + " ";
    EXPECT_EQ(r.exit_code, 2) << cmd << r.err;
    for (const std::string& e : expected)
      EXPECT_NE(r.err.find(e), std::string::npos) << cmd << r.err;
  }
}

// An idle cluster is not a stalled one: arrivals far apart (a low rate, a
// thinking client, a sparse trace) run to the end.
TEST(Simulate, IdleTimeIsNotAStall) {
  test::TempDir dir;
  const auto trace = dir / "sparse.csv";
  test::write_file(trace,
                   "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:00:00.0000000,20,10\n"
                   "2023-11-16 18:10:00.0000000,20,10\n");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--rate", "0.003", "--requests", "10"},
        {"--clients", "1", "--think-s", "300", "--requests", "3"},
        {"--trace", trace.string()}}) {
    std::vector<std::string> all{"--profile", profile(), "--json"};
    all.insert(all.end(), args.begin(), args.end());
    const auto r = simulate(all);
    ASSERT_EQ(r.exit_code, 0) << args[0] << ": " << r.err;
    const auto j = json::parse(r.out);
    EXPECT_EQ(j["outcomes"]["completed"], j["requests"]) << args[0];
    EXPECT_GT(j["simulation"]["simulated_s"].get<double>(), 590) << args[0];
  }
}

TEST(Simulate, UtilisationSamplesStayWithinOne) {
  test::TempDir dir;
  const auto r = simulate({"--config", two_replicas(), "--profile", profile(), "--rate", "200",
                           "--requests", "600", "--prompt", "uniform:16:200", "--output",
                           "uniform:8:48", "--sample-s", "0.01", "--csv", dir.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream csv(test::read_file(dir / "replicas.csv"));
  std::string line;
  std::getline(csv, line);
  size_t rows = 0;
  double highest = 0;
  while (std::getline(csv, line)) {
    // time_s,replica,live,utilisation,kv_occupancy,running,waiting
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string c; std::getline(row, c, ',');) cells.push_back(c);
    ASSERT_EQ(cells.size(), 7u) << line;
    highest = std::max(highest, std::stod(cells[3]));
    EXPECT_LE(std::stod(cells[4]), 1.0) << line;
    ++rows;
  }
  EXPECT_GT(rows, 100u);
  EXPECT_LE(highest, 1.0);
  EXPECT_GT(highest, 0.5);
}

// A bound of the search is said to be one.
TEST(Simulate, MaxRateSearchAndSweepSayWhenTheyHitTheirBounds) {
  // A trace of 20 rows replays those rows at every rate: fast enough, they
  // all wait in the queue and all meet a loose SLO.
  test::TempDir trace_dir;
  std::string rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  for (int i = 0; i < 20; ++i)
    rows += "2023-11-16 18:00:" + std::string(i < 10 ? "0" : "") + std::to_string(i) +
            ".0000000,20,10\n";
  test::write_file(trace_dir / "t.csv", rows);
  auto r = simulate({"--profile", profile(), "--trace", (trace_dir / "t.csv").string(), "--rate",
                     "20", "--slo-ttft-s", "1000", "--slo-tpot-s", "1000", "--find-max-rate"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("90% within the SLO even at 20480.000 requests/s, the highest rate tried"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("a lower bound, not the maximum"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("highest rate with 90% within the SLO"), std::string::npos) << r.out;
  // With --json the search is part of the one JSON object.
  r = simulate(
      {"--profile", profile(), "--rate", "20", "--requests", "20", "--find-max-rate", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json found = json::parse(r.out);
  EXPECT_EQ(found["max_rate"]["bound"], "found") << r.out;
  EXPECT_GT(found["max_rate"]["rate"].get<double>(), 0) << r.out;
  EXPECT_EQ(found["max_rate"]["min_seconds_per_rate"], 60) << r.out;
  // The lowest rates tried leave the cluster idle for days between requests.
  r = simulate({"--profile", profile(), "--rate", "1", "--requests", "10", "--slo-ttft-s",
                "0.000001", "--find-max-rate"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no rate tried keeps 90% within the SLO: missed even at 9.537e-07 "
                       "requests/s, the lowest tried"),
            std::string::npos)
      << r.out;
  test::TempDir dir;
  r = simulate({"--profile", profile(), "--sweep", "--policies", "round_robin", "--rates", "2,4",
                "--requests", "20", "--slo-ttft-s", "1000", "--slo-tpot-s", "1000", "--out",
                dir.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("4.00 requests/s (met even at the highest rate"), std::string::npos)
      << r.out;
}

// A profile measures one model: the simulation is of it, said when the
// config names another.
TEST(Simulate, AProfileOfAnotherModelIsSaidToBeWhatIsSimulated) {
  const auto r = simulate({"--profile",
                           (test::source_dir() / "benchmarks" / "profiles" / "110m.json").string(),
                           "--rate", "5", "--requests", "5"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("simulating preset:110m (context 1024 tokens)"), std::string::npos) << r.err;
  const auto same = simulate({"--profile", profile(), "--rate", "5", "--requests", "5"});
  EXPECT_EQ(same.err.find("simulating"), std::string::npos) << same.err;
}

TEST(Simulate, TooLongRequestsAreExplained) {
  // The bundled model's context is 256 tokens.
  const auto r = simulate({"--profile", profile(), "--rate", "20", "--requests", "50", "--prompt",
                           "uniform:100:200", "--output", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("refused as too long (HTTP 400)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("with prompt + output over the model's context length of 256 tokens (the "
                       "server answers 400 context_length_exceeded"),
            std::string::npos)
      << r.out;
}

TEST(BenchProfile, WritesAGridTheSimulatorReads) {
  test::TempDir dir;
  const auto file = dir / "p.json";
  const auto r = test::run_command(
      {test::troupe_binary(), "bench", "--model", test::model_path("fortune").string(), "--threads",
       "1", "--profile", file.string(), "--grid-batch", "0,1,4", "--grid-context", "16,128",
       "--grid-prefill", "0,32", "--repeats", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const sim::StepProfile p = sim::StepProfile::load(file);
  EXPECT_EQ(p.model.max_seq_len, 256);
  const sim::ProfileGrid& g = p.find(1, 1, 1);
  EXPECT_EQ(g.points(), 3u * 2u * 2u);
  EXPECT_GT(g.stage_seconds[0][g.at(2, 1, 1)], 0.0);
}

// The real router, recorded (TROUPE_ROUTER_LOG) under concurrent load on two
// replicas, replayed into a fresh table: every decision the same.
TEST(RouterLog, RealRouterDecisionsReplayIdentically) {
  for (const std::string policy : {"power_of_two", "latency_aware"}) {
    test::TempDir dir;
    const auto log = dir / "router.jsonl";
    setenv("TROUPE_ROUTER_LOG", log.c_str(), 1);
    auto server = std::make_unique<test::ChildProcess>(std::vector<std::string>{
        test::troupe_binary(), "serve", "--config", two_replicas(), "--listen", "127.0.0.1:0",
        "--set", "model.path=" + test::model_path("fortune").string(), "--set",
        "routing.policy=" + policy});
    unsetenv("TROUPE_ROUTER_LOG");
    const std::string line = server->wait_for_line("listening on http://", 60);
    ASSERT_FALSE(line.empty()) << server->stderr_so_far();
    const int port = std::stoi(line.substr(line.rfind(':') + 1));
    for (int i = 0; i < 600 && test::http_request(port, "GET", "/ready").status != 200; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<std::thread> clients;
    for (int c = 0; c < 6; ++c)
      clients.emplace_back([&, c] {
        for (int i = 0; i < 5; ++i) {
          const json body = {{"prompt", std::vector<int>(size_t(8 + 7 * c), 5 + i)},
                             {"max_tokens", 12 + 3 * i},
                             {"temperature", 0},
                             {"ignore_eos", true}};
          test::http_request(port, "POST", "/v1/completions", body.dump());
        }
      });
    for (auto& t : clients) t.join();
    server->stop();
    const sim::ReplayResult r = sim::replay_router_log(log);
    EXPECT_TRUE(r.identical()) << policy << ": " << r.first_mismatch;
    EXPECT_EQ(r.policy, policy);
    EXPECT_GE(r.recorded, 30u) << policy;  // every request placed, at least
  }
}

// Bounded: a calibration and two policies at one rate, two real runs each.
TEST(Simulate, ValidateAgainstARealServer) {
  test::TempDir dir;
  const auto copy = dir / "fortune.json";
  test::write_file(copy, test::read_file(profile()));
  auto r = simulate({"--config", two_replicas(), "--profile", copy.string(), "--calibrate",
                     "--prompt-len", "16", "--output-len", "16"},
                    60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("serving overhead"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("open loop at"), std::string::npos) << r.out;  // the per-request part
  const json calibrated = json::parse(test::read_file(copy));
  for (const auto& layout : calibrated["layouts"]) {
    if (layout["threads"] != 1) continue;
    EXPECT_GE(layout["request_overhead_s"].get<double>(), 0);
  }
  r = simulate({"--config", two_replicas(), "--profile", copy.string(), "--validate", "--policies",
                "round_robin,least_outstanding", "--rates", "40", "--requests", "24",
                "--prompt-len", "16", "--output-len", "16", "--repeats", "2", "--json"},
               60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ranking by latency p50"), std::string::npos) << r.out;
  const auto j = json::parse(r.out.substr(r.out.find("\n[")));
  EXPECT_EQ(j.size(), 2u * 6u);  // 2 policies x 6 metrics
  for (const auto& row : j) {
    EXPECT_GT(row["measured"].get<double>(), 0) << row;
    EXPECT_GT(row["simulated"].get<double>(), 0) << row;
  }
}

// Heterogeneous replicas: --slow slows the simulated replica and, through
// the real server's fault injection, the real one (a refused fault fails the
// run); the policies are then ranked on both sides.
TEST(Simulate, ValidateWithASlowReplicaSlowsTheRealOneToo) {
  auto r = simulate({"--config",
                     two_replicas(),
                     "--profile",
                     profile(),
                     "--validate",
                     "--slow",
                     "1:4",
                     "--policies",
                     "round_robin,least_outstanding",
                     "--rates",
                     "30",
                     "--requests",
                     "24",
                     "--prompt-len",
                     "16",
                     "--output-len",
                     "16",
                     "--repeats",
                     "1",
                     "--json"},
                    60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json::parse(r.out.substr(r.out.find("\n[")));
  EXPECT_EQ(j.size(), 2u * 6u);
  // One real run per point has no spread: none is claimed, nor any pair
  // told apart beyond it.
  EXPECT_TRUE(j[0]["spread"].is_null()) << j[0];
  EXPECT_EQ(r.out.find("within spread"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("beyond the spread"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no pair is counted"), std::string::npos) << r.out;
  r = simulate({"--config", two_replicas(), "--profile", profile(), "--validate", "--slow", "1:0.5",
                "--policies", "round_robin", "--rates", "30", "--requests", "8"},
               60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("slow"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace troupe
