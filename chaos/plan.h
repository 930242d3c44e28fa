#pragma once
// A chaos run as a file (configs/chaos/*.yaml): the deployment to start,
// the workload, and the faults: listed ones at fixed times and random ones
// drawn from the seed, so that a run repeats exactly. Read with the same
// schema toolkit as the runtime's configuration, so errors name the key and
// the line.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace troupe {
struct Config;
}

namespace troupe::chaos {

struct DeploymentPlan {
  // The coordinator's configuration, relative to the plan's file; its
  // listen addresses and admin keys are set by the harness.
  std::string config = "deployment.yaml";
  int nodes = 2;  // `troupe node` processes, named node-1 .. node-N
  int node_devices = 1;
  int node_threads = 1;
  double ready_timeout_s = 120;
};

struct WorkloadPlan {
  int requests = 300;
  int distinct = 200;   // different requests; the rest repeat them (their expected output too)
  int concurrency = 8;  // closed loop: this many in flight
  double rate = 0;      // > 0: open loop, requests per second (Poisson), concurrency caps
  int min_tokens = 4;   // max_tokens of each request, drawn in [min, max]
  int max_tokens = 48;
  int min_words = 2;  // prompt length in words, drawn in [min, max]
  int max_words = 24;
  double stream = 0.5;     // fractions of the requests: streamed,
  double sampled = 0.5;    // seeded sampling (the rest greedy),
  double cancel = 0.05;    // cancelled by the client on purpose mid-stream (streams only)
  double deadline_s = 60;  // a request with no complete answer by then is lost or hung
};

// One fault. Which keys apply depends on the kind (see kFaultKinds in
// plan.cpp); `node` names a node process ("node-2"), or "any" for one drawn
// from the seed.
struct FaultPlan {
  double at_s = 0;
  std::string kind;
  std::string node = "any";
  int replica = -1;             // runtime faults; -1: drawn from the seed
  std::string role = "worker";  // kill
  int device = -1;
  double duration_s = 0;           // lasting faults
  double factor = 4;               // slow
  double delay_s = 0.05;           // link_delay
  double probability = 1;          // link_drop, link_duplicate, link_reorder
  std::string direction = "both";  // link faults: both, to_coordinator, to_node
  double bytes_per_s = 20000;      // link_bandwidth; client_slow reads this fast
  int count = 1;                   // client_disconnect, client_slow: how many clients
  double restart_after_s = 1;      // process_kill: start it again after this (< 0: never)
};

struct RandomFaults {
  double every_s = 0;  // mean seconds between faults (each gap drawn in [0.5, 1.5] x it); 0: none
  std::vector<std::string> kinds;
  double from_s = 2;      // not before
  double until_s = 0;     // not after (0: until the load ends)
  double duration_s = 2;  // lasting faults' duration
};

struct ChaosPlan {
  uint64_t seed = 1;
  DeploymentPlan deployment;
  WorkloadPlan workload;
  std::vector<FaultPlan> faults;
  RandomFaults random;
  std::filesystem::path source;  // the file it came from (relative paths resolve against it)
};

// Throws ConfigError naming the key (and the line).
ChaosPlan parse_chaos_plan(const std::string& yaml_text, const std::string& source_name);
ChaosPlan load_chaos_plan(const std::filesystem::path& file);
// Overrides "workload.requests=10000" and the like.
void apply_plan_override(ChaosPlan& plan, const std::string& key, const std::string& value);
// Checks that span keys (kinds known, keys that fit the kind, node names
// within deployment.nodes, ranges that constrain each other); run after
// overrides too.
void validate_plan(const ChaosPlan& plan);

// The coordinator's configuration the plan's deployment starts.
std::filesystem::path deployment_config_path(const ChaosPlan& plan);
// What the plan asks of the deployment it starts, before anything starts:
// replica and device indices within its layout, enough node devices for
// every replica, placement that names nodes the harness starts. `name`
// names the deployment's config in messages. Throws ConfigError naming the
// key.
void check_plan_deployment(const ChaosPlan& plan, const Config& deployment,
                           const std::string& name);
// The faults' replica (and device) indices against a deployment of
// `replicas` replicas of `devices_per_replica` devices (0: unknown).
void check_plan_replicas(const ChaosPlan& plan, int replicas, int devices_per_replica,
                         const std::string& deployment);
// --attach: only runtime and HTTP faults (no node processes of ours).
void check_plan_for_attach(const ChaosPlan& plan);
// What the plan will likely not do, in words: faults timed after the load's
// expected end (--duration, or requests / rate for an open loop).
std::vector<std::string> plan_warnings(const ChaosPlan& plan, double duration_s);

// 1 .. nodes for "node-1" .. "node-<nodes>", else 0.
int node_number(const std::string& name, int nodes);

// Every kind a plan may name, and whether it lasts (needs duration_s).
struct FaultKindInfo {
  std::string_view name;
  std::string_view family;  // process, link, runtime, http
  bool lasts;
};
const std::vector<FaultKindInfo>& fault_kinds();
const FaultKindInfo* find_fault_kind(std::string_view name);

}  // namespace troupe::chaos
