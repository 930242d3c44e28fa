#include "chaos/plan.h"

#include <fstream>
#include <sstream>

#include "deploy/yaml_schema.h"

namespace troupe::chaos {

namespace {

using schema::Fields;
using schema::Origin;

// An index that is unset (-1) until a plan names one.
schema::Kind<int> optional_index() {
  schema::Kind<int> k = schema::non_negative_int();
  k.problem = [](const int& v) {
    return v >= -1 ? std::string() : "expected a non-negative integer, got " + std::to_string(v);
  };
  return k;
}

const Fields<ChaosPlan>& plan_fields() {
  static const Fields<ChaosPlan> root = [] {
    Fields<DeploymentPlan> deployment;
    deployment.add("config", &DeploymentPlan::config, schema::non_empty_text())
        .add("nodes", &DeploymentPlan::nodes, schema::non_negative_int())
        .add("node_devices", &DeploymentPlan::node_devices, schema::positive_int())
        .add("node_threads", &DeploymentPlan::node_threads, schema::positive_int())
        .add("ready_timeout_s", &DeploymentPlan::ready_timeout_s, schema::seconds(false));

    Fields<WorkloadPlan> workload;
    workload.add("requests", &WorkloadPlan::requests, schema::positive_int())
        .add("distinct", &WorkloadPlan::distinct, schema::positive_int())
        .add("concurrency", &WorkloadPlan::concurrency, schema::positive_int())
        .add("rate", &WorkloadPlan::rate, schema::number_in(0, 1e6))
        .add("min_tokens", &WorkloadPlan::min_tokens, schema::positive_int())
        .add("max_tokens", &WorkloadPlan::max_tokens, schema::positive_int())
        .add("min_words", &WorkloadPlan::min_words, schema::positive_int())
        .add("max_words", &WorkloadPlan::max_words, schema::positive_int())
        .add("stream", &WorkloadPlan::stream, schema::number_in(0, 1))
        .add("sampled", &WorkloadPlan::sampled, schema::number_in(0, 1))
        .add("cancel", &WorkloadPlan::cancel, schema::number_in(0, 1))
        .add("deadline_s", &WorkloadPlan::deadline_s, schema::seconds(false));

    Fields<FaultPlan> fault;
    fault.flow()
        .add("at_s", &FaultPlan::at_s, schema::seconds(true))
        .add("kind", &FaultPlan::kind, schema::non_empty_text())
        .add("node", &FaultPlan::node, schema::non_empty_text())
        .add("replica", &FaultPlan::replica, optional_index())
        .add("role", &FaultPlan::role, schema::non_empty_text())
        .add("device", &FaultPlan::device, optional_index())
        .add("duration_s", &FaultPlan::duration_s, schema::seconds(true))
        .add("factor", &FaultPlan::factor, schema::number_in(1.01, 1000))
        .add("delay_s", &FaultPlan::delay_s, schema::number_in(0, 60))
        .add("probability", &FaultPlan::probability, schema::number_in(0, 1))
        .add("direction", &FaultPlan::direction, schema::non_empty_text())
        .add("bytes_per_s", &FaultPlan::bytes_per_s, schema::number_in(1, 1e12))
        .add("count", &FaultPlan::count, schema::positive_int())
        .add("restart_after_s", &FaultPlan::restart_after_s, schema::number_in(-1, 3600));

    Fields<RandomFaults> random;
    random.add("every_s", &RandomFaults::every_s, schema::seconds(true))
        .add("kinds", &RandomFaults::kinds, schema::text_list())
        .add("from_s", &RandomFaults::from_s, schema::seconds(true))
        .add("until_s", &RandomFaults::until_s, schema::seconds(true))
        .add("duration_s", &RandomFaults::duration_s, schema::seconds(false));

    Fields<ChaosPlan> p;
    p.add("seed", &ChaosPlan::seed, schema::unsigned_int())
        .section("deployment", &ChaosPlan::deployment, deployment)
        .section("workload", &ChaosPlan::workload, workload)
        .list("faults", &ChaosPlan::faults, fault,
              "a list of faults such as [{at_s: 5, kind: process_kill, node: node-1}]",
              "a fault such as {at_s: 5, kind: process_kill, node: node-1}")
        .section("random", &ChaosPlan::random, random);
    return p;
  }();
  return root;
}

std::string kind_names() {
  std::string s;
  for (const auto& k : fault_kinds()) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

void validate(const Origin& o, const ChaosPlan& p) {
  plan_fields().check(o, "", p);
  const WorkloadPlan& w = p.workload;
  if (w.min_tokens > w.max_tokens)
    o.fail("workload.min_tokens", std::to_string(w.min_tokens) + " is more than max_tokens (" +
                                      std::to_string(w.max_tokens) + ")");
  if (w.min_words > w.max_words)
    o.fail("workload.min_words", std::to_string(w.min_words) + " is more than max_words (" +
                                     std::to_string(w.max_words) + ")");
  if (w.distinct > w.requests)
    o.fail("workload.distinct", std::to_string(w.distinct) + " is more than workload.requests (" +
                                    std::to_string(w.requests) + ")");
  for (size_t i = 0; i < p.faults.size(); ++i) {
    const FaultPlan& f = p.faults[i];
    const std::string key = "faults[" + std::to_string(i) + "]";
    const FaultKindInfo* k = find_fault_kind(f.kind);
    if (!k)
      o.fail(key + ".kind", "unknown '" + f.kind + "'; one of " + kind_names() +
                                schema::suggestion(f.kind, [] {
                                  std::vector<std::string_view> v;
                                  for (const auto& k : fault_kinds()) v.push_back(k.name);
                                  return v;
                                }()));
    if (k->lasts && f.duration_s <= 0)
      o.fail(key + ".duration_s", "a " + f.kind + " fault lasts: give it a positive duration_s");
    if (!k->lasts && f.duration_s > 0 && f.kind != "process_stop")
      o.fail(key + ".duration_s", "a " + f.kind + " fault happens once; it has no duration");
    if (k->family == "link" && f.direction != "both" && f.direction != "to_coordinator" &&
        f.direction != "to_node")
      o.fail(key + ".direction",
             "expected one of both, to_coordinator, to_node, got '" + f.direction + "'");
    if (f.kind == "kill" && f.role != "worker" && f.role != "batcher" && f.role != "shard" &&
        f.role != "member")
      o.fail(key + ".role", "expected one of worker, batcher, shard, member, got '" + f.role +
                                "' (the router and supervisor are the coordinator itself)");
    if ((k->family == "process" || k->family == "link") && f.node != "any" &&
        f.node.rfind("node-", 0) != 0)
      o.fail(key + ".node", "expected node-1 .. node-" + std::to_string(p.deployment.nodes) +
                                " or any, got '" + f.node + "'");
    if ((k->family == "process" || k->family == "link") && p.deployment.nodes == 0)
      o.fail(key + ".kind", "a " + f.kind + " fault needs node processes (deployment.nodes is 0)");
  }
  for (size_t i = 0; i < p.random.kinds.size(); ++i)
    if (!find_fault_kind(p.random.kinds[i]))
      o.fail("random.kinds[" + std::to_string(i) + "]",
             "unknown '" + p.random.kinds[i] + "'; one of " + kind_names());
  if (p.random.every_s > 0 && p.random.kinds.empty())
    o.fail("random.kinds", "is empty, but random.every_s is set: name the kinds to draw from");
}

}  // namespace

const std::vector<FaultKindInfo>& fault_kinds() {
  static const std::vector<FaultKindInfo> kinds = {
      {"process_kill", "process", false},   {"process_stop", "process", true},
      {"process_restart", "process", false}, {"link_delay", "link", true},
      {"link_drop", "link", true},           {"link_duplicate", "link", true},
      {"link_reorder", "link", true},        {"link_cut", "link", true},
      {"link_bandwidth", "link", true},      {"link_reset", "link", false},
      {"kill", "runtime", false},            {"step_error", "runtime", false},
      {"slow", "runtime", true},             {"kv_alloc_fail", "runtime", true},
      {"client_disconnect", "http", false},  {"client_slow", "http", false},
  };
  return kinds;
}

const FaultKindInfo* find_fault_kind(std::string_view name) {
  for (const auto& k : fault_kinds())
    if (k.name == name) return &k;
  return nullptr;
}

ChaosPlan parse_chaos_plan(const std::string& yaml_text, const std::string& source_name) {
  Origin origin(source_name);
  ChaosPlan plan;
  schema::guarded(source_name, [&] {
    plan_fields().read(origin, schema::load_document(yaml_text, source_name), "", plan);
    validate(origin, plan);
  });
  plan.source = source_name;
  return plan;
}

ChaosPlan load_chaos_plan(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot read the file", file.string(), "");
  std::stringstream text;
  text << in.rdbuf();
  return parse_chaos_plan(text.str(), file.string());
}

void apply_plan_override(ChaosPlan& plan, const std::string& key, const std::string& value) {
  Origin origin("--set " + key);
  schema::guarded(origin.source(), [&] {
    plan_fields().override_key(origin, key, schema::override_value(origin, key, value), plan);
  });
}

void validate_plan(const ChaosPlan& plan) {
  Origin origin(plan.source.string());
  schema::guarded(origin.source(), [&] { validate(origin, plan); });
}

}  // namespace troupe::chaos
