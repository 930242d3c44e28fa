// Chaos plans: the shipped ones parse, and mistakes are named by key.
#include <gtest/gtest.h>

#include <filesystem>

#include "chaos/plan.h"
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
  - {at_s: 4, kind: slow, replica: 0, device: 0, factor: 2.5, duration_s: 2}
random: {every_s: 3, kinds: [process_stop, step_error], from_s: 1, until_s: 60, duration_s: 1}
)",
                                       "plan.yaml");
  EXPECT_EQ(p.seed, 42u);
  EXPECT_EQ(p.deployment.nodes, 2);
  EXPECT_EQ(p.deployment.node_devices, 2);
  EXPECT_EQ(p.workload.rate, 20);
  EXPECT_EQ(p.workload.cancel, 0.1);
  ASSERT_EQ(p.faults.size(), 4u);
  EXPECT_EQ(p.faults[0].restart_after_s, -1);
  EXPECT_EQ(p.faults[1].direction, "to_node");
  EXPECT_EQ(p.faults[1].probability, 0.5);
  EXPECT_EQ(p.faults[2].role, "batcher");
  EXPECT_EQ(p.faults[2].replica, 1);
  EXPECT_EQ(p.faults[3].device, 0);
  EXPECT_EQ(p.faults[3].factor, 2.5);
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

TEST(ChaosPlan, RangesThatConstrainEachOther) {
  EXPECT_NE(error_of("workload: {min_tokens: 9, max_tokens: 3}").find("workload.min_tokens"),
            std::string::npos);
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

}  // namespace
}  // namespace troupe::chaos
