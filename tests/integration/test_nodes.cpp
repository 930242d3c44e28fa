// A deployment over several processes on 127.0.0.1, as a user runs it: a
// coordinator (`troupe serve` with nodes.listen) and `troupe node`
// processes. Every answer must equal the fault-free one through a node's
// SIGKILL, a SIGSTOP (and the SIGCONT after it), and a coordinator restart.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "support/serving_support.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using test::json;
using test::Server;

const std::vector<std::string> kPrompts{
    "The meaning of life", "A fool",           "Never trust",      "Love is",
    "The computer",        "In the beginning", "Once upon a time", "Beware of"};

// Request i of a workload: greedy or seeded sampling, mixed lengths.
json request_body(int i) {
  json b = {{"prompt", kPrompts[size_t(i) % kPrompts.size()]},
            {"max_tokens", 120 + 20 * (i % 5)},
            {"stream", true},
            {"ignore_eos", true}};
  if (i % 2) {
    b["temperature"] = 0.8;
    b["top_p"] = 0.95;
    b["seed"] = 100 + i;
  } else {
    b["temperature"] = 0;
  }
  return b;
}

// Runs n concurrent streaming requests; returns each one's text ("" and a
// failure when it did not end with 200 and [DONE]). `during` runs once the
// first tokens flow.
std::vector<std::string> run_load(Server& s, int n, const std::function<void()>& during = {}) {
  std::vector<std::string> text(static_cast<size_t>(n));
  std::vector<std::thread> clients;
  std::atomic<int> started{0};
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      ++started;
      auto r = s.complete(request_body(i), 120);
      EXPECT_EQ(r.status, 200) << "request " << i << ": " << r.body;
      if (r.status == 200) text[size_t(i)] = test::sse_text(r.body);
    });
  while (started < n) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (during) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    during();
  }
  for (auto& c : clients) c.join();
  return text;
}

std::vector<std::string> coordinator_sets(int replicas, double heartbeat_s = 1.0) {
  return {"nodes.listen=127.0.0.1:0",
          "nodes.local=false",
          "parallel.replicas=" + std::to_string(replicas),
          "devices=[{kind: cpu, threads: 1}]",
          "nodes.heartbeat_timeout_s=" + std::to_string(heartbeat_s),
          "routing.policy=round_robin"};
}

// Requests the coordinator resumed elsewhere so far, from its log.
int resumed(Server& s) {
  const std::string log = s.process().stderr_so_far();
  int n = 0;
  for (size_t at = 0; (at = log.find(" requests to resume", at)) != std::string::npos; ++at) {
    size_t b = log.rfind(' ', at - 1);
    n += std::stoi(log.substr(b + 1, at - b - 1));
  }
  return n;
}

std::string node_replicas(const std::string& node) {
  return "troupe_node_replicas{node=\"" + node + "\"}";
}

TEST(Nodes, ThreeProcessesServeTheOneProcessAnswerAndSurviveANodeKill) {
  Server s(coordinator_sets(2), /*wait_ready=*/false);
  ASSERT_GT(s.nodes_port(), 0) << s.process().stderr_so_far();
  auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric(node_replicas("b"), "1", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60));
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  // Greedy answers equal one process's.
  for (const std::string& p : {kPrompts[0], kPrompts[3]}) {
    auto r = s.complete({{"prompt", p}, {"max_tokens", 30}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(p, 30));
  }
  const auto want = run_load(s, 32);
  // SIGKILL of a node under load: nothing lost, duplicated or different.
  const auto got = run_load(s, 32, [&] { a->signal(SIGKILL); });
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_TRUE(s.wait_metric("troupe_node_detections_total{cause=\"connection lost\"}", "1", 10))
      << s.metrics();
  EXPECT_GT(resumed(s), 0) << "the kill landed after the load: nothing was resumed";
  // The node restarted is used again.
  a = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric("troupe_nodes{state=\"live\"}", "2", 10));
  const auto after = run_load(s, 8);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], want[i]) << "request " << i;
}

// A node stopped with SIGTERM under load says it leaves: the coordinator
// places its replica elsewhere and resumes its requests before the
// connection drops, logs it as gone, not dead, and the answers are the same.
TEST(Nodes, ANodeStoppedWithSigtermLeavesAndNothingIsLost) {
  Server s(coordinator_sets(2), /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60));
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  // As many requests as the kill's test: sixteen could end before the stop
  // landed, leaving nothing to resume.
  const auto want = run_load(s, 32);
  int code = -1;
  const auto got = run_load(s, 32, [&] { code = a->stop(20); });
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_EQ(code, 0) << a->stderr_so_far();
  EXPECT_GT(resumed(s), 0) << "the stop landed after the load: nothing was resumed";
  const std::string log = s.process().stderr_so_far();
  EXPECT_NE(log.find("node a left (it is shutting down)"), std::string::npos) << log;
  EXPECT_EQ(log.find("node a is dead"), std::string::npos) << log;
  EXPECT_TRUE(s.wait_metric("troupe_node_detections_total{cause=\"left\"}", "1", 10))
      << s.metrics();
  EXPECT_EQ(a->stderr_so_far().find("no longer counts it as a member"), std::string::npos)
      << a->stderr_so_far();
}

// configs/node.yaml's way to offer more devices: one entry each (here with
// different thread counts), no --devices. It was refused because the
// node's own (unused) parallel layout has one device.
// The join address is the coordinator's: said so, not as a port to listen on.
TEST(Nodes, ABadJoinAddressIsAUsageErrorNamingIt) {
  for (const std::string bad : {"127.0.0.1:99999", "nohost", "127.0.0.1:0"}) {
    const test::CommandResult r =
        test::run_command({test::troupe_binary(), "node", "--join", bad}, 30);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--join"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("any free port"), std::string::npos) << r.err;
  }
}

TEST(Nodes, ANodeListingTwoDevicesOffersBoth) {
  auto sets = coordinator_sets(2);
  sets.push_back("kv_cache.dtype=f16");  // the plan carries it to the node
  Server s(sets, /*wait_ready=*/false);
  ASSERT_GT(s.nodes_port(), 0) << s.process().stderr_so_far();
  ChildProcess node({test::troupe_binary(), "node", "--join",
                     "127.0.0.1:" + std::to_string(s.nodes_port()), "--name", "a", "--config",
                     (test::source_dir() / "configs" / "node.yaml").string(), "--set",
                     "model.path=" + test::model_path("fortune").string(), "--set",
                     "devices=[{kind: cpu, threads: 1}, {kind: cpu, threads: 2}]"});
  EXPECT_NE(node.wait_for_line("offering 2 device(s)", 60), "") << node.stderr_so_far();
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "2", 60)) << s.metrics() << "\n"
                                                          << node.stderr_so_far();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60));
  EXPECT_NE(node.stderr_so_far().find("tokens, f16)"), std::string::npos) << node.stderr_so_far();
  auto r = s.complete({{"prompt", kPrompts[0]}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"],
            test::generate_text(kPrompts[0], 12, {"--temperature", "0", "--kv-dtype", "f16"}));
  // --devices that disagrees with a list of two is refused, naming the flag.
  const auto refused = test::run_command(
      {test::troupe_binary(), "node", "--join", "127.0.0.1:" + std::to_string(s.nodes_port()),
       "--devices", "3", "--config", (test::source_dir() / "configs" / "node.yaml").string(),
       "--set", "devices=[{kind: cpu, threads: 1}, {kind: cpu, threads: 1}]"});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("--devices"), std::string::npos) << refused.err;
}

TEST(Nodes, AStoppedNodeIsDetectedAndDeliversNothingStaleWhenItWakes) {
  Server s(coordinator_sets(2, 1.0), /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 60));
  ASSERT_TRUE(s.wait_metric(node_replicas("b"), "1", 60));
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60));
  const auto want = run_load(s, 16);
  std::chrono::steady_clock::time_point stopped;
  const auto got = run_load(s, 16, [&] {
    stopped = std::chrono::steady_clock::now();
    b->signal(SIGSTOP);
  });
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_GT(resumed(s), 0) << "the stop landed after the load: nothing was resumed";
  // Detected within the heartbeat timeout (1 s here) plus the checks' pace,
  // by the heartbeats or by CAF's connection timeout (the same 1 s),
  // whichever runs out first.
  ASSERT_TRUE(s.wait_metric("troupe_nodes{state=\"dead\"}", "1", 5)) << s.metrics();
  const double detected =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_LT(detected, 5.0);
  // Woken up, it is fenced (told to stop and join again); the answers stay
  // the fault-free ones while it comes back.
  b->signal(SIGCONT);
  const auto woken = run_load(s, 16);
  for (size_t i = 0; i < woken.size(); ++i) EXPECT_EQ(woken[i], want[i]) << "request " << i;
  ASSERT_TRUE(s.wait_metric(node_replicas("b"), "1", 30)) << s.metrics();
  const auto back = run_load(s, 8);
  for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i], want[i]) << "request " << i;
}

TEST(Nodes, ANodeWithAnotherModelOrTheWrongTokenIsRefusedWithAReason) {
  Server s({"nodes.listen=127.0.0.1:0", "nodes.token=s3cret"}, /*wait_ready=*/true);
  auto other = test::start_node(
      s.nodes_port(), "other",
      {"model.path=" + (test::model_path("stories260K") / "stories260K.bin").string(),
       "nodes.token=s3cret"});
  EXPECT_EQ(other->wait_exit(20), 1);
  EXPECT_NE(other->stderr_so_far().find("another model"), std::string::npos)
      << other->stderr_so_far();
  // Both sides said in words, not only as fingerprints.
  EXPECT_NE(other->stderr_so_far().find("vocabulary 512"), std::string::npos)
      << other->stderr_so_far();
  EXPECT_NE(other->stderr_so_far().find("vocabulary 2000"), std::string::npos)
      << other->stderr_so_far();
  // What only the coordinator sets is said to have no effect on a node.
  auto sized = test::start_node(
      s.nodes_port(), "sized",
      {"nodes.token=s3cret", "kv_cache.blocks=100", "batching.max_batch_sequences=4"});
  EXPECT_NE(sized->wait_for_line("have no effect on a node", 20), "") << sized->stderr_so_far();
  EXPECT_NE(sized->stderr_so_far().find("batching, kv_cache"), std::string::npos)
      << sized->stderr_so_far();
  auto tokenless = test::start_node(s.nodes_port(), "tokenless");
  EXPECT_EQ(tokenless->wait_exit(20), 1);
  EXPECT_NE(tokenless->stderr_so_far().find("token"), std::string::npos)
      << tokenless->stderr_so_far();
  EXPECT_NE(s.process().stderr_so_far().find("refused"), std::string::npos);
  // The coordinator keeps serving.
  auto r = s.complete({{"prompt", "A fool"}, {"max_tokens", 5}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.body;
}

// A coordinator whose node port is taken (the old one still running, say)
// exits 1 naming it, at once: it used to hang, its error unsaid.
TEST(Nodes, ACoordinatorWhoseNodePortIsTakenExitsNamingIt) {
  Server s({"nodes.listen=127.0.0.1:0"}, /*wait_ready=*/true);
  const auto second = test::run_command(
      {test::troupe_binary(), "serve", "--config",
       (test::source_dir() / "configs" / "default.yaml").string(), "--listen", "127.0.0.1:0",
       "--set", "nodes.listen=127.0.0.1:" + std::to_string(s.nodes_port())},
      30);
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_NE(second.err.find("nodes.listen: cannot listen on"), std::string::npos) << second.err;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = 0; (at = text.find(needle, at)) != std::string::npos; at += needle.size()) ++n;
  return n;
}

// Two live processes under one name: the second is refused, naming the
// conflict, and exits 1, while the first keeps its membership and its
// replica. A genuine restart is taken: the old process killed (its
// connection gone), or stopped (silent, its connection still open: it
// does not answer); and that old one, woken, is the one refused then.
TEST(Nodes, ASecondLiveNodeWithTheSameNameIsRefusedButARestartIsTaken) {
  Server s(coordinator_sets(1, 1.0), /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  auto twin = test::start_node(s.nodes_port(), "a");
  EXPECT_EQ(twin->wait_exit(30), 1) << twin->stderr_so_far();
  EXPECT_NE(twin->stderr_so_far().find("already called 'a'"), std::string::npos)
      << twin->stderr_so_far();
  // The first was never evicted: no death, its replica started once, serving.
  std::string m = s.metrics();
  EXPECT_EQ(test::prometheus_sample(m, "troupe_nodes{state=\"dead\"}"), "0") << m;
  EXPECT_EQ(m.find("troupe_node_detections_total{"), std::string::npos) << m;
  EXPECT_TRUE(a->running());
  EXPECT_EQ(count(a->stderr_so_far(), "replica 0 started"), 1) << a->stderr_so_far();
  EXPECT_EQ(count(a->stderr_so_far(), "stopping"), 0) << a->stderr_so_far();
  auto r = s.complete({{"prompt", "A fool"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.body;

  // Killed and started again at once: the new process is the node now.
  a->signal(SIGKILL);
  EXPECT_GT(a->wait_exit(10), 128);
  a = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  EXPECT_TRUE(a->running()) << a->stderr_so_far();

  // Stopped, and another process started under its name: taken too.
  a->signal(SIGSTOP);
  auto again = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(again->wait_for_line("joined the coordinator", 60) != "") << again->stderr_so_far();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  r = s.complete({{"prompt", "A fool"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.body;
  // Woken, the old one learns it is no longer a member, tries to join
  // again, and is refused: the name is the live new one's.
  a->signal(SIGCONT);
  EXPECT_EQ(a->wait_exit(30), 1) << a->stderr_so_far();
  EXPECT_NE(a->stderr_so_far().find("already called 'a'"), std::string::npos) << a->stderr_so_far();
  EXPECT_TRUE(again->running()) << again->stderr_so_far();
  m = s.metrics();
  EXPECT_EQ(test::prometheus_sample(m, "troupe_nodes{state=\"live\"}"), "1") << m;
  r = s.complete({{"prompt", "A fool"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.body;
}

const HttpHeaders kAdmin{{"Authorization", "Bearer T"}};

json admin_faults(Server& s) {
  const HttpResponse r = test::http_request(s.port(), "GET", "/admin/faults", "", 10, kAdmin);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body)["faults"] : json::array();
}

int add_fault(Server& s, const json& fault) {
  const HttpResponse r =
      test::http_request(s.port(), "POST", "/admin/faults", fault.dump(), 10, kAdmin);
  EXPECT_EQ(r.status, 201) << r.body;
  return r.status == 201 ? json::parse(r.body)["id"].get<int>() : -1;
}

// Step errors no step met within 15 s fail, and are withdrawn wherever
// they wait: in a node's worker (another process), and in the
// coordinator's list for a replica not running yet. Neither fires later.
TEST(Nodes, AFaultGivenUpOnIsWithdrawnWhereverItWaits) {
  auto sets = coordinator_sets(2);
  sets.insert(sets.end(), {"admin.faults=true", "admin.token=T"});
  Server s(sets, /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  // Replica 0 runs on node a; replica 1 waits for a node.
  const int on_node = add_fault(s, {{"kind", "step_error"}, {"replica", 0}});
  const int waiting = add_fault(s, {{"kind", "step_error"}, {"replica", 1}});
  json faults;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  for (;;) {
    faults = admin_faults(s);
    int withdrawn = 0;
    for (const json& f : faults) withdrawn += f.contains("withdrawn_s") ? 1 : 0;
    if (withdrawn == 2 || std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (const json& f : faults) {
    EXPECT_EQ(f["state"], "failed") << f.dump();
    EXPECT_TRUE(f.contains("withdrawn_s")) << f.dump();
    const std::string error = f.value("error", "");
    EXPECT_NE(error.find("no effect seen within 15 s"), std::string::npos) << error;
    if (f["id"] == on_node) {
      EXPECT_NE(error.find("will not fail"), std::string::npos) << error;
    }
    if (f["id"] == waiting) {
      EXPECT_NE(error.find("not running"), std::string::npos) << error;
    }
  }
  auto b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60)) << s.metrics();
  // Both replicas serve (round robin), and neither dies.
  for (int i = 0; i < 6; ++i) {
    const std::string& p = kPrompts[size_t(i) % 3];
    auto r = s.complete({{"prompt", p}, {"max_tokens", 20}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(p, 20));
  }
  const std::string m = s.metrics();
  EXPECT_EQ(m.find("troupe_replica_restarts_total{"), std::string::npos) << m;
  EXPECT_EQ(a->stderr_so_far().find("injected fault"), std::string::npos) << a->stderr_so_far();
  EXPECT_EQ(b->stderr_so_far().find("injected fault"), std::string::npos) << b->stderr_so_far();
  for (const json& f : admin_faults(s)) EXPECT_FALSE(f.contains("died_late_s")) << f.dump();
}

// A part of an idle replica spanning nodes killed by a fault: the replica
// is down at once and placed again, and the fault is confirmed. Its leader
// was never told (CAF 0.17 did not route the part's exit back through the
// coordinator), so it ran on without the part until its next step failed,
// long after the fault had been given up as having no effect. A device of
// it on another node can be killed by its number in the replica (only the
// leader's were reachable, numbered from 0 there).
TEST(Nodes, AKilledPartOrDeviceOfAReplicaSpanningNodesTakesItDown) {
  auto sets = coordinator_sets(1);
  sets.insert(sets.end(), {"admin.faults=true", "admin.token=T", "parallel.pipeline=2",
                           "placement.replicas=[\"a,b\"]"});
  Server s(sets, /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  const int id =
      add_fault(s, {{"kind", "kill"}, {"role", "member"}, {"replica", 0}, {"device", 0}});
  json fault;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    for (const json& f : admin_faults(s))
      if (f["id"] == id) fault = f;
    if (fault.value("state", "") == "confirmed" || std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(fault.value("state", ""), "confirmed") << fault.dump() << s.process().stderr_so_far();
  EXPECT_NE(s.process().stderr_so_far().find("its part 0 on node a died"), std::string::npos)
      << s.process().stderr_so_far();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  // A shard's device is the replica's: device 0 (stage 0) runs on a, not on
  // the leader's node. It dies in the next step, and the request resumes.
  const int shard =
      add_fault(s, {{"kind", "kill"}, {"role", "shard"}, {"replica", 0}, {"device", 0}});
  auto r = s.complete({{"prompt", kPrompts[1]}, {"max_tokens", 20}, {"temperature", 0}}, 60);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(kPrompts[1], 20));
  EXPECT_NE(a->stderr_so_far().find("shard (stage 0, rank 0): armed"), std::string::npos)
      << a->stderr_so_far();
  for (const json& f : admin_faults(s)) {
    EXPECT_FALSE(f.contains("died_late_s")) << f.dump();
    if (f["id"] == shard) {
      EXPECT_EQ(f.value("state", ""), "confirmed") << f.dump();
    }
  }
  // Past the replica's devices: refused up front.
  const json past{{"kind", "kill"}, {"role", "shard"}, {"replica", 0}, {"device", 2}};
  auto bad = test::http_request(s.port(), "POST", "/admin/faults", past.dump(), 10, kAdmin);
  EXPECT_EQ(bad.status, 400) << bad.body;
}

double sample(Server& s, const std::string& series) {
  const std::string v = test::prometheus_sample(s.metrics(), series);
  return v.empty() ? -1 : std::stod(v);
}

// What /metrics says of a dead node's replica and of the node: the
// replica holds no KV blocks while it is down (its placement's cache died
// with it) and starts from its own when placed again; the node's
// heartbeat age keeps growing.
TEST(Nodes, ADeadNodesReplicaShowsNoKvBlocksAndItsHeartbeatAgeGrows) {
  auto sets = coordinator_sets(2);
  sets.insert(sets.end(),
              {"admin.faults=true", "admin.token=T", "placement.replicas=[\"a\", \"b\"]"});
  Server s(sets, /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60)) << s.metrics();
  const std::string live_a = "troupe_node_live{node=\"a\"}";
  EXPECT_EQ(sample(s, live_a), 1) << s.metrics();
  // Replica 0 (on a) slowed, so that its requests hold blocks a while.
  add_fault(s, {{"kind", "slow"}, {"replica", 0}, {"factor", 20}, {"duration_s", 60}});
  const std::string used0 = "troupe_kv_blocks{replica=\"0\",state=\"used\"}";
  const std::string free0 = "troupe_kv_blocks{replica=\"0\",state=\"free\"}";
  const std::string age = "troupe_node_heartbeat_age_seconds{node=\"a\"}";
  run_load(s, 8, [&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (sample(s, used0) <= 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_GT(sample(s, used0), 0) << s.metrics();
    a->signal(SIGKILL);
    EXPECT_TRUE(s.wait_metric("troupe_nodes{state=\"dead\"}", "1", 10)) << s.metrics();
    EXPECT_TRUE(s.wait_metric(used0, "0", 10)) << s.metrics();
    EXPECT_EQ(sample(s, free0), 0) << s.metrics();
  });
  const double age1 = sample(s, age);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double age2 = sample(s, age);
  EXPECT_GT(age2, age1 + 1) << age1 << " then " << age2;
  EXPECT_EQ(sample(s, live_a), 0) << s.metrics();
  EXPECT_EQ(sample(s, "troupe_node_live{node=\"b\"}"), 1) << s.metrics();
  EXPECT_EQ(sample(s, used0), 0);
  // Pinned to the dead node: it waits for it, placed nowhere, so down.
  EXPECT_EQ(sample(s, "troupe_replica_state{replica=\"0\"}"), 0) << s.metrics();
  // Placed again (on a new "a"), ready and idle: its own empty cache.
  a = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  EXPECT_EQ(sample(s, used0), 0) << s.metrics();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sample(s, free0) <= 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(sample(s, free0), 0) << s.metrics();
  EXPECT_EQ(sample(s, used0), 0) << s.metrics();
  EXPECT_LT(sample(s, age), 2) << s.metrics();
  EXPECT_EQ(sample(s, live_a), 1) << s.metrics();
}

// A replica whose tensor shards, or pipeline stages, are on two node
// processes (Gloo between them, meeting through the coordinator) answers as
// one device does; when one of its nodes dies, its requests wait and resume
// once the node is back, token-exact.
TEST(Nodes, AReplicaAcrossTwoProcessesGivesTheOneDeviceAnswer) {
  // Log-probabilities cross from the node with the tokens; a part on
  // another node sends its whole rows for them, greedy items' too.
  const json ask{{"prompt", kPrompts[2]}, {"max_tokens", 16}, {"temperature", 0}, {"logprobs", 2}};
  json want_lp;
  {
    Server one({"devices=[{kind: cpu, threads: 1}]"});
    auto r = one.complete(ask);
    ASSERT_EQ(r.status, 200) << r.body;
    want_lp = json::parse(r.body)["choices"][0]["logprobs"];
  }
  for (const char* layout : {"parallel.tensor=2", "parallel.pipeline=2"}) {
    SCOPED_TRACE(layout);
    auto sets = coordinator_sets(1);
    sets.push_back(layout);
    sets.push_back("placement.replicas=[\"a,b\"]");
    Server s(sets, /*wait_ready=*/false);
    auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
    ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60))
        << s.process().stderr_so_far() << a->stderr_so_far() << b->stderr_so_far();
    // The coordinator's cache settings reach the nodes' parts.
    EXPECT_NE((a->stderr_so_far() + b->stderr_so_far()).find("tokens, f32)"), std::string::npos)
        << a->stderr_so_far();
    EXPECT_EQ(s.metrics().find(node_replicas("a") + " 1") != std::string::npos, true);
    EXPECT_EQ(s.metrics().find(node_replicas("b") + " 1") != std::string::npos, true);
    for (const std::string& p : {kPrompts[0], kPrompts[1], kPrompts[4]}) {
      auto r = s.complete({{"prompt", p}, {"max_tokens", 40}, {"temperature", 0}});
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(p, 40)) << p;
    }
    {
      auto r = s.complete(ask);
      ASSERT_EQ(r.status, 200) << r.body;
      const json lp = json::parse(r.body)["choices"][0]["logprobs"];
      ASSERT_EQ(lp["tokens"], want_lp["tokens"]);
      for (size_t k = 0; k < lp["tokens"].size(); ++k) {
        EXPECT_NEAR(lp["token_logprobs"][k].get<double>(),
                    want_lp["token_logprobs"][k].get<double>(), 1e-4);
        for (const auto& [tok, v] : want_lp["top_logprobs"][k].items())
          EXPECT_NEAR(lp["top_logprobs"][k].value(tok, 1.0), v.get<double>(), 1e-4) << tok;
      }
    }
    const auto want = run_load(s, 6);
    // One of its nodes dies: the replica is down until the node is back,
    // and what was running resumes then, token-exact.
    std::unique_ptr<test::ChildProcess> again;
    const auto got = run_load(s, 6, [&] {
      b->signal(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      again = test::start_node(s.nodes_port(), "b");
    });
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  }
}

// A replica spanning nodes whose other part's node dies is over on every
// node, its leader's included: a live leader left running (idle, or stuck
// in a collective with the dead part) kept its node's device while the
// coordinator counted it free, so the next replica placed there was
// refused ("node a has 0 free devices") until its restart limit, and stayed
// down for good although the devices were there.
TEST(Nodes, AReplicaWhosePartsNodeDiedFreesItsLeadersDevices) {
  auto sets = coordinator_sets(2);
  sets.push_back("parallel.tensor=2");
  Server s(sets, /*wait_ready=*/false);
  const std::string two = "devices=[{kind: cpu, threads: 1}, {kind: cpu, threads: 1}]";
  // Replica 0 on c (two devices), replica 1 split over a and b.
  auto c = test::start_node(s.nodes_port(), "c", {two});
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  auto a = test::start_node(s.nodes_port(), "a"), b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 10)) << s.metrics();
  // b hangs: replica 1 is over (its leader on a must let go of a's device).
  // Silence is seen by the coordinator's heartbeats or by CAF's connection
  // timeout, whichever runs out first (both are nodes.heartbeat_timeout_s):
  // either cause will do here.
  b->signal(SIGSTOP);
  ASSERT_TRUE(s.wait_metric("troupe_nodes{state=\"dead\"}", "1", 30)) << s.metrics();
  // c dies; d joins: replica 0 goes to a and d.
  c->signal(SIGKILL);
  ASSERT_TRUE(s.wait_metric("troupe_nodes{state=\"dead\"}", "2", 30)) << s.metrics();
  auto d = test::start_node(s.nodes_port(), "d");
  EXPECT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60))
      << s.metrics() << s.process().stderr_so_far() << a->stderr_so_far();
  EXPECT_EQ(s.metrics().find("troupe_replica_state{replica=\"1\"} 3"), std::string::npos)
      << s.process().stderr_so_far();
  auto r = s.complete({{"prompt", kPrompts[0]}, {"max_tokens", 20}, {"temperature", 0}}, 60);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(kPrompts[0], 20));
  // b wakes (fenced, it joins again) and e joins: replica 1 runs again.
  b->signal(SIGCONT);
  auto e = test::start_node(s.nodes_port(), "e");
  EXPECT_TRUE(s.wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60))
      << s.metrics() << s.process().stderr_so_far();
}

// A node that cannot build the replica (its device's memory cap is too
// small) is passed over for another that can, and the retries wait a
// little: they were immediate, on the same node (the freest), and used up
// the restart limit within milliseconds, so the replica stayed down for
// good although another node could hold it.
// Start failures do not count against the restart limit (3 in 10 s by
// default): four on the too-small node, then a good node joins and takes it.
TEST(Nodes, AReplicaThatCannotStartOnANodeGoesToAnotherAfterAPause) {
  Server s(coordinator_sets(1), /*wait_ready=*/false);
  auto a =
      test::start_node(s.nodes_port(), "a", {"devices=[{kind: cpu, threads: 1, memory: 1MiB}]"});
  for (int i = 0; i < 4; ++i)
    ASSERT_NE(s.process().wait_for_line("could not start on node a", 30), "")
        << s.process().stderr_so_far();
  auto b = test::start_node(s.nodes_port(), "b");
  ASSERT_TRUE(s.wait_metric(node_replicas("b"), "1", 60))
      << s.metrics() << s.process().stderr_so_far();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  auto r = s.complete({{"prompt", kPrompts[1]}, {"max_tokens", 20}, {"temperature", 0}}, 60);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(kPrompts[1], 20));
  // The refusal names what did not fit; the tries on a were spaced out.
  const std::string log = s.process().stderr_so_far();
  EXPECT_NE(log.find("has a memory cap of 1.0 MiB"), std::string::npos) << log;
  int failures = 0;
  for (size_t at = 0; (at = log.find("could not start", at)) != std::string::npos; ++at) ++failures;
  EXPECT_LT(failures, 12) << log;
}

// A node beats at the coordinator's pace when the coordinator's heartbeat
// timeout is the shorter: a node left at its default (2 s, a beat every
// 0.5 s) under a coordinator of 0.4 s was declared dead every half second,
// and its replica restarted with it (15 times in 8 s). Here a node of 8 s
// (a beat every 2 s) under a coordinator of 1 s.
TEST(Nodes, ANodeWithALongerHeartbeatTimeoutBeatsAtTheCoordinatorsPace) {
  Server s(coordinator_sets(1, 1.0), /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a", {"nodes.heartbeat_timeout_s=8"});
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const std::string m = s.metrics();
  // No node was declared dead, either way.
  EXPECT_EQ(m.find("troupe_node_detections_total{"), std::string::npos)
      << m << s.process().stderr_so_far();
  auto r = s.complete({{"prompt", kPrompts[1]}, {"max_tokens", 16}, {"temperature", 0}}, 60);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(kPrompts[1], 16));
}

// And the other way round: a node of a shorter heartbeat timeout than its
// coordinator's heard from the coordinator only at the coordinator's CAF
// heartbeat pace (a quarter of its timeout), so its connection timed out
// and it dropped its replica and joined again every few seconds (a node of
// 2 s under a coordinator of 10 s). The coordinator answers every beat.
TEST(Nodes, ANodeWithAShorterHeartbeatTimeoutKeepsItsCoordinator) {
  Server s(coordinator_sets(1, 8.0), /*wait_ready=*/false);
  auto a = test::start_node(s.nodes_port(), "a", {"nodes.heartbeat_timeout_s=1"});
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60)) << s.metrics();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const std::string m = s.metrics();
  EXPECT_EQ(m.find("troupe_node_detections_total{"), std::string::npos)
      << m << s.process().stderr_so_far();
  EXPECT_EQ(a->stderr_so_far().find("lost the coordinator"), std::string::npos)
      << a->stderr_so_far();
  auto r = s.complete({{"prompt", kPrompts[2]}, {"max_tokens", 16}, {"temperature", 0}}, 60);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], test::generate_text(kPrompts[2], 16));
}

// Garbage and truncated messages on the node port close that connection;
// the coordinator keeps serving and nodes still join.
TEST(Nodes, GarbageOnTheNodePortNeverTakesTheCoordinatorDown) {
  Server s(coordinator_sets(1), /*wait_ready=*/false);
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::string junk(size_t(1 + rng() % 4096), '\0');
    for (char& ch : junk) ch = char(rng());
    if (round % 4 == 0) junk = junk.substr(0, 3);  // a truncated header
    if (round % 4 == 1) junk.assign(64, '\xff');   // absurd lengths
    test::send_raw(s.nodes_port(), junk);
  }
  auto a = test::start_node(s.nodes_port(), "a");
  ASSERT_TRUE(s.wait_metric(node_replicas("a"), "1", 60)) << s.metrics();
  ASSERT_TRUE(s.wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  auto r = s.complete({{"prompt", "A fool"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(Nodes, ARestartedCoordinatorReadoptsTheNodes) {
  const int nodes_port = test::free_port();
  auto sets = coordinator_sets(2);
  sets[0] = "nodes.listen=127.0.0.1:" + std::to_string(nodes_port);
  auto s = std::make_unique<Server>(sets, /*wait_ready=*/false);
  auto a = test::start_node(nodes_port, "a"), b = test::start_node(nodes_port, "b");
  ASSERT_TRUE(s->wait_metric(node_replicas("a"), "1", 60));
  ASSERT_TRUE(s->wait_metric(node_replicas("b"), "1", 60));
  ASSERT_TRUE(s->wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60));
  const auto want = run_load(*s, 8);
  s->process().signal(SIGKILL);
  s.reset();
  s = std::make_unique<Server>(sets, /*wait_ready=*/false);
  // The same node processes (their models still loaded) join the new one.
  ASSERT_TRUE(s->wait_metric(node_replicas("a"), "1", 60)) << s->metrics();
  ASSERT_TRUE(s->wait_metric(node_replicas("b"), "1", 60)) << s->metrics();
  ASSERT_TRUE(s->wait_metric("troupe_replica_state{replica=\"0\"}", "2", 60));
  ASSERT_TRUE(s->wait_metric("troupe_replica_state{replica=\"1\"}", "2", 60));
  const auto got = run_load(*s, 8);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_NE(a->stderr_so_far().find("lost the coordinator"), std::string::npos);
}

}  // namespace
}  // namespace troupe
