// Chaos plans: the shipped ones parse, and mistakes are named by key.
#include <gtest/gtest.h>

#include <filesystem>

#include "chaos/plan.h"
#include "deploy/config.h"
#include "deploy/yaml_schema.h"
#include "support/test_support.h"

namespace troupe::chaos {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_chaos_plan(yaml, "plan.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ChaosPlan, EveryShippedPlanParsesAndItsDeploymentExists) {
  int plans = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(test::source_dir() / "configs" / "chaos")) {
    if (e.path().filename() == "deployment.yaml") continue;
    SCOPED_TRACE(e.path().string());
    const ChaosPlan p = load_chaos_plan(e.path());
    EXPECT_TRUE(std::filesystem::exists(e.path().parent_path() / p.deployment.config));
    EXPECT_FALSE(p.faults.empty() && p.random.every_s == 0) << "a plan without faults";
    ++plans;
  }
  EXPECT_GE(plans, 2);
}

TEST(ChaosPlan, ReadsEveryKey) {
  const ChaosPlan p = parse_chaos_plan(R"(
seed: 42
deployment: {config: d.yaml, nodes: 2, node_devices: 2, node_threads: 1, ready_timeout_s: 30}
workload: {requests: 100, distinct: 10, concurrency: 4, rate: 20, min_tokens: 2, max_tokens: 8,
           min_words: 1, max_words: 5, stream: 1, sampled: 0, cancel: 0.1, deadline_s: 20}
faults:
  - {at_s: 1, kind: process_kill, node: node-2, restart_after_s: -1}
  - {at_s: 2, kind: link_drop, node: any, probability: 0.5, duration_s: 1, direction: to_node}
  - {at_s: 3, kind: kill, role: batcher, replica: 1}
  - {at_s: 4, kind: slow, replica: 0, factor: 2.5, duration_s: 2}
  - {at_s: 5, kind: step_error, replica: 0, device: 1}
random: {every_s: 3, kinds: [process_stop, step_error], from_s: 1, until_s: 60, duration_s: 1}
)",
                                       "plan.yaml");
  EXPECT_EQ(p.seed, 42u);
  EXPECT_EQ(p.deployment.nodes, 2);
  EXPECT_EQ(p.deployment.node_devices, 2);
  EXPECT_EQ(p.workload.rate, 20);
  EXPECT_EQ(p.workload.cancel, 0.1);
  ASSERT_EQ(p.faults.size(), 5u);
  EXPECT_EQ(p.faults[0].restart_after_s, -1);
  EXPECT_EQ(p.faults[1].direction, "to_node");
  EXPECT_EQ(p.faults[1].probability, 0.5);
  EXPECT_EQ(p.faults[2].role, "batcher");
  EXPECT_EQ(p.faults[2].replica, 1);
  EXPECT_EQ(p.faults[3].factor, 2.5);
  EXPECT_EQ(p.faults[4].device, 1);
  EXPECT_EQ(p.random.kinds, (std::vector<std::string>{"process_stop", "step_error"}));
  EXPECT_EQ(p.random.until_s, 60);
}

TEST(ChaosPlan, UnknownKindsAreNamedWithASuggestion) {
  const std::string e = error_of("faults: [{at_s: 1, kind: proces_kill}]");
  EXPECT_NE(e.find("faults[0].kind"), std::string::npos) << e;
  EXPECT_NE(e.find("process_kill"), std::string::npos) << e;
}

TEST(ChaosPlan, LastingFaultsNeedADurationAndOneShotsHaveNone) {
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: link_cut, node: node-1}]").find("duration_s"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: step_error, duration_s: 2}]").find("happens once"),
            std::string::npos);
}

TEST(ChaosPlan, TheRouterCannotBeKilledAndSaysWhy) {
  const std::string e = error_of("faults: [{at_s: 1, kind: kill, role: router}]");
  EXPECT_NE(e.find("faults[0].role"), std::string::npos) << e;
  EXPECT_NE(e.find("coordinator"), std::string::npos) << e;
}

// A device only for faults that act on one; it was taken and ignored.
TEST(ChaosPlan, ADeviceIsNamedOnlyWhereTheFaultActsOnOne) {
  std::string e =
      error_of("faults: [{at_s: 1, kind: slow, factor: 2, duration_s: 1, replica: 0, device: 1}]");
  EXPECT_NE(e.find("faults[0].device"), std::string::npos) << e;
  EXPECT_NE(e.find("acts on the whole replica"), std::string::npos) << e;
  e = error_of("faults: [{at_s: 1, kind: kill, role: batcher, replica: 0, device: 0}]");
  EXPECT_NE(e.find("a kill of a batcher acts on the whole replica"), std::string::npos) << e;
  EXPECT_EQ(error_of("faults: [{at_s: 1, kind: step_error, replica: 0, device: 0}]"), "");
}

TEST(ChaosPlan, RangesThatConstrainEachOther) {
  EXPECT_NE(error_of("workload: {min_tokens: 9, max_tokens: 3}").find("workload.min_tokens"),
            std::string::npos);
  // Without `distinct`, a short load repeats nothing (the default, 200, is
  // not held against it).
  EXPECT_EQ(parse_chaos_plan("workload: {requests: 10, rate: 10}", "plan.yaml").workload.distinct,
            10);
  EXPECT_NE(error_of("workload: {requests: 5, distinct: 10}").find("workload.distinct"),
            std::string::npos);
  EXPECT_NE(error_of("workload: {stream: 1.5}").find("workload.stream"), std::string::npos);
  EXPECT_NE(error_of("random: {every_s: 2}").find("random.kinds"), std::string::npos);
  EXPECT_NE(error_of("deployment: {nodes: 0}\nfaults: [{at_s: 1, kind: process_kill}]")
                .find("node processes"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: link_cut, node: n1, duration_s: 1}]")
                .find("faults[0].node"),
            std::string::npos);
  EXPECT_NE(error_of("seed: 1\nworkloads: {}").find("workloads"), std::string::npos);
}

TEST(ChaosPlan, OverridesAreCheckedToo) {
  ChaosPlan p = parse_chaos_plan("workload: {requests: 10, distinct: 5}", "plan.yaml");
  apply_plan_override(p, "workload.requests", "10000");
  EXPECT_EQ(p.workload.requests, 10000);
  EXPECT_THROW(apply_plan_override(p, "workload.request", "3"), ConfigError);
  EXPECT_THROW(apply_plan_override(p, "workload.requests", "many"), ConfigError);
  ChaosPlan negative = p;
  apply_plan_override(negative, "workload.requests", "-3");
  EXPECT_THROW(validate_plan(negative), ConfigError);
  apply_plan_override(p, "workload.distinct", "20000");
  EXPECT_THROW(validate_plan(p), ConfigError);
}

TEST(ChaosPlan, NodeNamesAreWithinTheDeployment) {
  // node-9 of three was accepted, and crashed the harness after the
  // fault-free pass.
  std::string e =
      error_of("deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: process_kill, node: node-9}]");
  EXPECT_NE(e.find("faults[0].node"), std::string::npos) << e;
  EXPECT_NE(e.find("node-1 .. node-3"), std::string::npos) << e;
  EXPECT_NE(e.find("deployment.nodes is 3"), std::string::npos) << e;
  for (const char* bad : {"node-0", "node-01", "node-", "node-x", "node-4", "node-1x"})
    EXPECT_NE(error_of(std::string("deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: link_reset, "
                                   "node: ") +
                       bad + "}]")
                  .find("faults[0].node"),
              std::string::npos)
        << bad;
  EXPECT_EQ(error_of("deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: link_reset, node: node-3}]"),
            "");
  EXPECT_EQ(node_number("node-3", 3), 3);
  EXPECT_EQ(node_number("node-3", 2), 0);
  EXPECT_EQ(node_number("node-12", 12), 12);
  EXPECT_EQ(node_number("any", 3), 0);
}

TEST(ChaosPlan, AStartTimeIsNotALimit) {
  const std::string e = error_of("faults: [{at_s: -1, kind: step_error}]");
  EXPECT_NE(e.find("faults[0].at_s"), std::string::npos) << e;
  EXPECT_EQ(e.find("no limit"), std::string::npos) << e;
  EXPECT_NE(e.find("the start of the load"), std::string::npos) << e;
  const std::string d = error_of("faults: [{at_s: 1, kind: slow, duration_s: -2}]");
  EXPECT_NE(d.find("faults[0].duration_s"), std::string::npos) << d;
  EXPECT_EQ(d.find("no limit"), std::string::npos) << d;
}

TEST(ChaosPlan, RandomFaultsThatCouldNeverPlayAreRefused) {
  // every_s 0 with kinds ran no fault and passed.
  const std::string e = error_of("random: {every_s: 0, kinds: [process_kill]}");
  EXPECT_NE(e.find("random.every_s"), std::string::npos) << e;
  const std::string u = error_of("random: {every_s: 2, from_s: 10, until_s: 5, kinds: [slow]}");
  EXPECT_NE(u.find("random.until_s"), std::string::npos) << u;
  const std::string n =
      error_of("deployment: {nodes: 0}\nrandom: {every_s: 2, kinds: [step_error, link_cut]}");
  EXPECT_NE(n.find("random.kinds[1]"), std::string::npos) << n;
  EXPECT_EQ(error_of("random: {every_s: 2, kinds: [step_error]}"), "");
}

TEST(ChaosPlan, KeysThatDoNotFitTheKindAreRefused) {
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: process_kill, node: node-1, replica: 0}]")
                .find("faults[0].replica"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: slow, node: node-1, factor: 2, duration_s: 1}]")
                .find("faults[0].node"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: client_slow, device: 0}]").find("faults[0].device"),
            std::string::npos);
  // Keys of another kind were ignored: a slow fault ran with the default
  // factor, a link delay with the default delay, a kill "restarted".
  const std::string slow =
      error_of("faults: [{at_s: 1, kind: slow, replica: 0, duration_s: 1, delay_s: 3}]");
  EXPECT_NE(slow.find("faults[0].delay_s: a slow fault has no delay_s (it takes at_s, "
                      "duration_s, factor)"),
            std::string::npos)
      << slow;
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: link_delay, node: node-1, duration_s: 1, "
                     "factor: 3}]")
                .find("faults[0].factor"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: kill, replica: 0, restart_after_s: 2}]")
                .find("faults[0].restart_after_s"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: process_stop, node: node-1, duration_s: 1, "
                     "probability: 0.5}]")
                .find("faults[0].probability"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: step_error, role: shard}]").find("faults[0].role"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: client_disconnect, bytes_per_s: 10}]")
                .find("faults[0].bytes_per_s"),
            std::string::npos);
  EXPECT_NE(error_of("faults: [{at_s: 1, kind: link_reset, node: node-1, direction: to_node}]")
                .find("faults[0].direction"),
            std::string::npos);
  // Overrides too.
  ChaosPlan p =
      parse_chaos_plan("faults: [{at_s: 1, kind: slow, replica: 0, duration_s: 1}]", "plan.yaml");
  EXPECT_THROW(apply_plan_override(p, "faults[0].count", "2"), ConfigError);
  // A kill of a shard or a remote part names which one: the admin endpoint
  // refused it only during the run, failing the verdict.
  for (const char* role : {"shard", "member"}) {
    const std::string e =
        error_of(std::string("faults: [{at_s: 1, kind: kill, role: ") + role + ", replica: 0}]");
    EXPECT_NE(e.find("faults[0].device: a kill of a " + std::string(role) + " names which one"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(error_of("faults: [{at_s: 1, kind: kill, role: shard, replica: 0, device: 1}]"), "");
}

Config deployment_of(int replicas, bool local = false) {
  Config c;
  c.parallel.replicas = replicas;
  c.nodes.local = local;
  c.nodes.listen = "127.0.0.1:0";
  return c;
}

std::string deployment_error(const std::string& plan_yaml, const Config& c) {
  try {
    check_plan_deployment(parse_chaos_plan(plan_yaml, "plan.yaml"), c, "d.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ChaosPlan, CheckedAgainstItsDeploymentBeforeAnythingStarts) {
  // replica 99 was refused only at injection, after the fault-free pass.
  std::string e =
      deployment_error("deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: step_error, replica: 99}]",
                       deployment_of(3));
  EXPECT_NE(e.find("faults[0].replica"), std::string::npos) << e;
  EXPECT_NE(e.find("d.yaml has 3 replica(s) (0 .. 2)"), std::string::npos) << e;
  e = deployment_error("deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: step_error, device: 1}]",
                       deployment_of(3));
  EXPECT_NE(e.find("faults[0].device"), std::string::npos) << e;
  // A one-device replica has no shard actors and no remote parts: the
  // fault failed only at injection, failing the run.
  e = deployment_error(
      "deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: kill, role: shard, device: 0}]",
      deployment_of(3));
  EXPECT_NE(e.find("faults[0].role: a kill of a shard, but a replica of d.yaml has one device"),
            std::string::npos)
      << e;
  e = deployment_error(
      "deployment: {nodes: 3}\nfaults: [{at_s: 1, kind: kill, role: member, device: 0}]",
      deployment_of(3));
  EXPECT_NE(e.find("faults[0].role"), std::string::npos) << e;
  Config split = deployment_of(1);
  split.parallel.tensor = 2;
  EXPECT_EQ(
      deployment_error(
          "deployment: {nodes: 2}\nfaults: [{at_s: 1, kind: kill, role: shard, device: 1}]", split),
      "");
  // Two nodes of one device cannot hold three replicas: the run waited
  // ready_timeout_s (120 s) to say so.
  e = deployment_error("deployment: {nodes: 2}\nfaults: [{at_s: 1, kind: step_error}]",
                       deployment_of(3));
  EXPECT_NE(e.find("deployment.nodes"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 3"), std::string::npos) << e;
  EXPECT_EQ(deployment_error("deployment: {nodes: 2, node_devices: 2}", deployment_of(3)), "");
  // The coordinator's own devices hold the layout.
  EXPECT_EQ(deployment_error("deployment: {nodes: 1}", deployment_of(3, true)), "");
  // Placement that names a node the harness never starts.
  Config pinned = deployment_of(2);
  pinned.placement.replicas = {"node-1", "a"};
  e = deployment_error("deployment: {nodes: 2}", pinned);
  EXPECT_NE(e.find("placement.replicas[1]"), std::string::npos) << e;
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  pinned.placement.replicas = {"node-1", "any"};
  EXPECT_EQ(deployment_error("deployment: {nodes: 2}", pinned), "");
  // Replicas pinned together to more devices than a node has: the run
  // waited ready_timeout_s to say so.
  Config crowded = deployment_of(3);
  crowded.placement.replicas = {"node-1", "node-1", "node-2"};
  e = deployment_error("deployment: {nodes: 3}", crowded);
  EXPECT_NE(e.find("placement.replicas[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("pins 2 device(s) of replicas to node 'node-1'"), std::string::npos) << e;
  EXPECT_EQ(deployment_error("deployment: {nodes: 3, node_devices: 2}", crowded), "");
  Config spread = deployment_of(2);
  spread.parallel.pipeline = 2;
  spread.placement.replicas = {"node-1,node-2", "node-1"};
  e = deployment_error("deployment: {nodes: 2, node_devices: 2}", spread);
  EXPECT_NE(e.find("pins 3 device(s) of replicas to node 'node-1'"), std::string::npos) << e;
  // A replica of two devices pinned to one node of one device.
  Config wide = deployment_of(1);
  wide.parallel.tensor = 2;
  wide.placement.replicas = {"node-1"};
  e = deployment_error("deployment: {nodes: 2}", wide);
  EXPECT_NE(e.find("placement.replicas[0]"), std::string::npos) << e;
}

TEST(ChaosPlan, EveryShippedPlanFitsItsDeployment) {
  for (const auto& e :
       std::filesystem::directory_iterator(test::source_dir() / "configs" / "chaos")) {
    if (e.path().filename() == "deployment.yaml") continue;
    SCOPED_TRACE(e.path().string());
    const ChaosPlan p = load_chaos_plan(e.path());
    EXPECT_NO_THROW(check_plan_deployment(p, load_config(deployment_config_path(p)),
                                          deployment_config_path(p).string()));
  }
}

TEST(ChaosPlan, AttachTakesOnlyRuntimeAndHttpFaults) {
  EXPECT_NO_THROW(check_plan_for_attach(parse_chaos_plan(
      "faults: [{at_s: 1, kind: step_error}, {at_s: 2, kind: client_slow}]", "plan.yaml")));
  try {
    check_plan_for_attach(parse_chaos_plan(
        "faults: [{at_s: 1, kind: step_error}, {at_s: 2, kind: link_cut, duration_s: 1}]",
        "plan.yaml"));
    ADD_FAILURE() << "a link fault was accepted with --attach";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("faults[1].kind"), std::string::npos) << e.what();
  }
  const ChaosPlan p = parse_chaos_plan("faults: [{at_s: 1, kind: kill, replica: 2}]", "plan.yaml");
  EXPECT_THROW(check_plan_replicas(p, 2, 0, "the deployment at http://x"), ConfigError);
  EXPECT_NO_THROW(check_plan_replicas(p, 3, 0, "the deployment at http://x"));
}

TEST(ChaosPlan, WarnsOfFaultsAfterTheLoadsExpectedEnd) {
  const ChaosPlan p = parse_chaos_plan(R"(
workload: {requests: 300, distinct: 100, rate: 30}
faults:
  - {at_s: 2, kind: step_error}
  - {at_s: 12, kind: step_error}
  - {at_s: 20, kind: client_slow}
)",
                                       "plan.yaml");
  // 300 requests at 30 per second: about 10 s.
  std::vector<std::string> w = plan_warnings(p, 0);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("10.0 s"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("faults[1] (step_error at 12 s), faults[2] (client_slow at 20 s)"),
            std::string::npos)
      << w[0];
  EXPECT_NE(w[0].find("INCOMPLETE"), std::string::npos) << w[0];
  EXPECT_EQ(plan_warnings(p, 1).size(), 1u);  // --duration 1: all three
  EXPECT_NE(plan_warnings(p, 1)[0].find("faults[0]"), std::string::npos);
  EXPECT_TRUE(plan_warnings(p, 30).empty());
  ChaosPlan closed = p;
  closed.workload.rate = 0;  // a closed loop's end is not known
  EXPECT_TRUE(plan_warnings(closed, 0).empty());
}

}  // namespace
}  // namespace troupe::chaos
