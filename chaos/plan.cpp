#include "chaos/plan.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "deploy/config.h"
#include "deploy/yaml_schema.h"
#include "faults/fault_order.h"
#include "scheduler/cluster.h"

namespace troupe::chaos {

namespace {

using schema::Fields;
using schema::Origin;

// The keys a fault of `kind` takes beyond at_s and kind, and besides node,
// replica, device and duration_s (checked by value in validate_fault, each
// with its own reason); null for an unknown kind (validate_fault names it).
const std::vector<std::string_view>* fault_keys(std::string_view kind) {
  using Keys = std::vector<std::string_view>;
  static const std::vector<std::pair<std::string_view, Keys>> table = {
      {"process_kill", {"restart_after_s"}},
      {"process_stop", {"duration_s"}},
      {"process_restart", {}},
      {"link_delay", {"duration_s", "direction", "delay_s"}},
      {"link_drop", {"duration_s", "direction", "probability"}},
      {"link_duplicate", {"duration_s", "direction", "probability"}},
      {"link_reorder", {"duration_s", "direction", "probability"}},
      {"link_cut", {"duration_s", "direction"}},
      {"link_bandwidth", {"duration_s", "direction", "bytes_per_s"}},
      {"link_reset", {}},
      {"kill", {"role"}},
      {"step_error", {}},
      {"slow", {"duration_s", "factor"}},
      {"kv_alloc_fail", {"duration_s"}},
      {"client_disconnect", {"count"}},
      {"client_slow", {"count", "bytes_per_s"}},
  };
  for (const auto& [k, keys] : table)
    if (k == kind) return &keys;
  return nullptr;
}

// A key given that the fault's kind does not use was ignored: a plan with
// {kind: slow, delay_s: 3} ran a slow fault of the default factor, and one
// with {kind: link_delay, factor: 3} the default delay, without a word.
void check_fault_keys(const Origin& o, const std::string& path, FaultPlan& f,
                      const std::set<std::string>& given) {
  const std::vector<std::string_view>* keys = fault_keys(f.kind);
  if (!keys) return;
  for (const std::string& key : given) {
    if (key == "at_s" || key == "kind" || key == "node" || key == "replica" || key == "device" ||
        key == "duration_s")
      continue;
    if (std::find(keys->begin(), keys->end(), key) != keys->end()) continue;
    std::vector<std::string_view> takes{"at_s"};
    takes.insert(takes.end(), keys->begin(), keys->end());
    o.fail(schema::child_key(path, key),
           "a " + f.kind + " fault has no " + key + " (it takes " + schema::join(takes) + ")");
  }
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
        .add("deadline_s", &WorkloadPlan::deadline_s, schema::seconds(false))
        // A short load without `distinct` repeats nothing rather than
        // failing on a default it never set; one given is checked as given.
        .after_read([](const schema::Origin&, const std::string&, WorkloadPlan& w,
                       const std::set<std::string>& given) {
          if (given.count("requests") && !given.count("distinct"))
            w.distinct = std::min(w.distinct, w.requests);
        });

    Fields<FaultPlan> fault;
    fault.flow()
        .add("at_s", &FaultPlan::at_s, schema::non_negative_seconds("the start of the load"))
        .add("kind", &FaultPlan::kind, schema::non_empty_text())
        .add("node", &FaultPlan::node, schema::non_empty_text())
        .add("replica", &FaultPlan::replica, schema::optional_index())
        .add("role", &FaultPlan::role, schema::non_empty_text())
        .add("device", &FaultPlan::device, schema::optional_index())
        .add("duration_s", &FaultPlan::duration_s, schema::non_negative_seconds(""))
        .add("factor", &FaultPlan::factor, schema::number_in(1.01, 1000))
        .add("delay_s", &FaultPlan::delay_s, schema::number_in(0, 60))
        .add("probability", &FaultPlan::probability, schema::number_in(0, 1))
        .add("direction", &FaultPlan::direction, schema::non_empty_text())
        .add("bytes_per_s", &FaultPlan::bytes_per_s, schema::number_in(1, 1e12))
        .add("count", &FaultPlan::count, schema::positive_int())
        .add("restart_after_s", &FaultPlan::restart_after_s, schema::number_in(-1, 3600))
        .after_read(check_fault_keys);

    Fields<RandomFaults> random;
    random.add("every_s", &RandomFaults::every_s, schema::non_negative_seconds("no random faults"))
        .add("kinds", &RandomFaults::kinds, schema::text_list())
        .add("from_s", &RandomFaults::from_s, schema::non_negative_seconds("the start of the load"))
        .add("until_s", &RandomFaults::until_s, schema::non_negative_seconds("until the load ends"))
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

}  // namespace

int node_number(const std::string& name, int nodes) {
  if (name.rfind("node-", 0) != 0 || name.size() == 5 || name.size() > 12) return 0;
  int n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    n = n * 10 + (name[i] - '0');
  }
  if (name[5] == '0') return 0;  // "node-01" is not a name the harness gives
  return n >= 1 && n <= nodes ? n : 0;
}

namespace {

std::string kind_names() {
  std::string s;
  for (const auto& k : fault_kinds()) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

std::vector<std::string_view> kind_list() {
  std::vector<std::string_view> v;
  for (const auto& k : fault_kinds()) v.push_back(k.name);
  return v;
}

std::string number_text(double v) {
  return schema::format_number(v);
}

// "node-1 .. node-3 or any" for the deployment's node processes.
std::string node_choices(int nodes) {
  if (nodes == 0) return "no node processes (deployment.nodes is 0)";
  return (nodes == 1 ? std::string("node-1") : "node-1 .. node-" + std::to_string(nodes)) +
         " or any";
}

void validate_fault(const Origin& o, const ChaosPlan& p, const FaultPlan& f,
                    const std::string& key) {
  const FaultKindInfo* k = find_fault_kind(f.kind);
  if (!k)
    o.fail(key + ".kind", "unknown '" + f.kind + "'; one of " + kind_names() +
                              schema::suggestion(f.kind, kind_list()));
  const bool on_node = k->family == "process" || k->family == "link";
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
  if (f.kind == "kill" && (f.role == "shard" || f.role == "member") && f.device < 0)
    o.fail(key + ".device", "a kill of a " + f.role + " names which one (device: 0 for the " +
                                (f.role == "shard" ? "replica's first shard" : "first other part") +
                                ")");
  if (on_node && p.deployment.nodes == 0)
    o.fail(key + ".kind", "a " + f.kind + " fault needs node processes (deployment.nodes is 0)");
  if (on_node && f.node != "any" && node_number(f.node, p.deployment.nodes) == 0)
    o.fail(key + ".node",
           "expected " + node_choices(p.deployment.nodes) + ", got '" + f.node + "'" +
               (node_number(f.node, 1 << 20) > 0
                    ? " (deployment.nodes is " + std::to_string(p.deployment.nodes) + ")"
                    : std::string()));
  if (!on_node && f.node != "any")
    o.fail(key + ".node", "a " + f.kind + " fault acts on " +
                              (k->family == "runtime" ? "a replica (give replica)" : "clients") +
                              ", not on a node process; remove node '" + f.node + "'");
  if (k->family != "runtime" && f.replica >= 0)
    o.fail(key + ".replica", "a " + f.kind + " fault does not act on a replica" +
                                 (on_node ? " (it names a node: give node)" : std::string()));
  if (k->family != "runtime" && f.device >= 0)
    o.fail(key + ".device", "a " + f.kind + " fault does not act on a device");
  const auto kind = parse_fault_kind(f.kind);
  const auto role = parse_fault_role(f.role);
  if (k->family == "runtime" && f.device >= 0 && kind &&
      !fault_names_device(*kind, role.value_or(FaultRole::Worker)))
    o.fail(key + ".device", "a " + f.kind +
                                (f.kind == "kill" ? " of a " + f.role : std::string(" fault")) +
                                " acts on the whole replica; it names no device");
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
  for (size_t i = 0; i < p.faults.size(); ++i)
    validate_fault(o, p, p.faults[i], "faults[" + std::to_string(i) + "]");
  const RandomFaults& r = p.random;
  for (size_t i = 0; i < r.kinds.size(); ++i) {
    const std::string key = "random.kinds[" + std::to_string(i) + "]";
    const FaultKindInfo* k = find_fault_kind(r.kinds[i]);
    if (!k)
      o.fail(key, "unknown '" + r.kinds[i] + "'; one of " + kind_names() +
                      schema::suggestion(r.kinds[i], kind_list()));
    if ((k->family == "process" || k->family == "link") && p.deployment.nodes == 0)
      o.fail(key, "a " + r.kinds[i] + " fault needs node processes (deployment.nodes is 0)");
  }
  if (r.every_s > 0 && r.kinds.empty())
    o.fail("random.kinds", "is empty, but random.every_s is set: name the kinds to draw from");
  if (r.every_s == 0 && !r.kinds.empty())
    o.fail("random.every_s",
           "is 0 (no random faults), but random.kinds names " + std::to_string(r.kinds.size()) +
               " kind(s): give the mean seconds between random faults, or remove random.kinds");
  if (r.every_s > 0 && r.until_s > 0 && r.until_s <= r.from_s)
    o.fail("random.until_s", number_text(r.until_s) + " is not after random.from_s (" +
                                 number_text(r.from_s) + "): no random fault could play");
}

}  // namespace

const std::vector<FaultKindInfo>& fault_kinds() {
  static const std::vector<FaultKindInfo> kinds = {
      {"process_kill", "process", false},
      {"process_stop", "process", true},
      {"process_restart", "process", false},
      {"link_delay", "link", true},
      {"link_drop", "link", true},
      {"link_duplicate", "link", true},
      {"link_reorder", "link", true},
      {"link_cut", "link", true},
      {"link_bandwidth", "link", true},
      {"link_reset", "link", false},
      {"kill", "runtime", false},
      {"step_error", "runtime", false},
      {"slow", "runtime", true},
      {"kv_alloc_fail", "runtime", true},
      {"client_disconnect", "http", false},
      {"client_slow", "http", false},
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

std::filesystem::path deployment_config_path(const ChaosPlan& plan) {
  return plan.source.parent_path() / plan.deployment.config;
}

void check_plan_replicas(const ChaosPlan& plan, int replicas, int devices_per_replica,
                         const std::string& deployment) {
  Origin o(plan.source.string());
  for (size_t i = 0; i < plan.faults.size(); ++i) {
    const FaultPlan& f = plan.faults[i];
    const std::string key = "faults[" + std::to_string(i) + "]";
    if (f.replica >= replicas)
      o.fail(key + ".replica",
             std::to_string(f.replica) + ", but " + deployment + " has " +
                 std::to_string(replicas) + " replica(s)" +
                 (replicas > 0 ? " (0 .. " + std::to_string(replicas - 1) + ")" : std::string()));
    if (f.kind == "kill" && (f.role == "shard" || f.role == "member") && devices_per_replica == 1)
      o.fail(key + ".role",
             "a kill of a " + f.role + ", but a replica of " + deployment + " has one device: " +
                 (f.role == "shard" ? "it runs no shard actors"
                                    : "it never spans nodes, so it has no remote parts") +
                 " (kill its worker instead)");
    if (f.device >= 0 && devices_per_replica > 0 && f.device >= devices_per_replica)
      o.fail(key + ".device", std::to_string(f.device) + ", but a replica of " + deployment +
                                  " has " + std::to_string(devices_per_replica) +
                                  " device(s) (0 .. " + std::to_string(devices_per_replica - 1) +
                                  ")");
  }
}

void check_plan_deployment(const ChaosPlan& plan, const Config& c, const std::string& name) {
  const ParallelLayout& l = c.parallel;
  const int per_replica = l.pipeline * l.tensor;
  check_plan_replicas(plan, l.replicas, per_replica, name);
  const DeploymentPlan& d = plan.deployment;
  const std::string layout = "{replicas: " + std::to_string(l.replicas) +
                             ", pipeline: " + std::to_string(l.pipeline) +
                             ", tensor: " + std::to_string(l.tensor) + "}";
  Origin o(plan.source.string());
  const long offered = long(d.nodes) * d.node_devices;
  if (!c.nodes.local && offered < l.device_count())
    o.fail("deployment.nodes",
           std::to_string(d.nodes) + " node process(es) of " + std::to_string(d.node_devices) +
               " device(s) each (deployment.node_devices) offer " + std::to_string(offered) +
               ", but the layout of " + name + ", parallel " + layout + ", needs " +
               std::to_string(l.device_count()) +
               " (nodes.local is false: the coordinator holds none): not every replica could "
               "start");
  Origin in_config(name);
  // Devices the pinned replicas take of each node, with the first entry
  // that pins it: together they may ask a node for more than it has.
  std::map<std::string, std::pair<int, std::string>> demand;
  for (size_t r = 0; r < c.placement.replicas.size(); ++r) {
    const std::string key = "placement.replicas[" + std::to_string(r) + "]";
    const std::string& where = c.placement.replicas[r];
    int named = 0;
    bool any = false;
    std::vector<std::string> names;
    for (const std::string& n : placement_names(where)) {
      if (n == "any" || n == "local") {
        any = any || n == "any";
        continue;
      }
      if (node_number(n, d.nodes) == 0)
        in_config.fail(key, "names node '" + n + "', but troupe chaos starts " +
                                (d.nodes == 0 ? std::string("no node processes")
                                              : "nodes named " + node_choices(d.nodes)) +
                                ": the replica would wait for it forever");
      ++named;
      names.push_back(n);
    }
    // A split gives each node its share, as the cluster does (the first
    // ones one more where the devices do not divide evenly).
    if (!any)
      for (size_t i = 0; i < names.size(); ++i) {
        const int k = int(names.size());
        auto& [devices, first] = demand[names[i]];
        if (first.empty()) first = key;
        devices += per_replica / k + (int(i) < per_replica % k ? 1 : 0);
      }
    if (!any && named > 0 && per_replica > named * d.node_devices)
      in_config.fail(key, "pins replica " + std::to_string(r) + " (" + std::to_string(per_replica) +
                              " devices) to " + std::to_string(named) + " node(s) of " +
                              std::to_string(d.node_devices) +
                              " device(s) (the plan's deployment.node_devices): it cannot start");
  }
  for (const auto& [node, need] : demand)
    if (need.first > d.node_devices)
      in_config.fail(need.second,
                     "pins " + std::to_string(need.first) + " device(s) of replicas to node '" +
                         node + "', which has " + std::to_string(d.node_devices) +
                         " (the plan's deployment.node_devices): they cannot all start");
}

void check_plan_for_attach(const ChaosPlan& plan) {
  Origin o(plan.source.string());
  const auto on_node = [](const std::string& kind) {
    const FaultKindInfo* k = find_fault_kind(kind);
    return k && (k->family == "process" || k->family == "link");
  };
  for (size_t i = 0; i < plan.faults.size(); ++i)
    if (on_node(plan.faults[i].kind))
      o.fail("faults[" + std::to_string(i) + "].kind",
             "a " + plan.faults[i].kind +
                 " fault needs the node processes troupe chaos starts; with --attach only "
                 "runtime and HTTP faults can be injected");
  for (size_t i = 0; i < plan.random.kinds.size(); ++i)
    if (on_node(plan.random.kinds[i]))
      o.fail("random.kinds[" + std::to_string(i) + "]",
             "a " + plan.random.kinds[i] +
                 " fault needs the node processes troupe chaos starts; with --attach only "
                 "runtime and HTTP faults can be injected");
}

std::vector<std::string> plan_warnings(const ChaosPlan& plan, double duration_s) {
  std::vector<std::string> out;
  // When the load will end, as far as the plan tells: --duration exactly,
  // an open loop roughly (requests / rate); a closed loop's is unknown.
  double end = 0;
  std::string basis;
  if (duration_s > 0) {
    end = duration_s;
    basis = "the load runs " + number_text(duration_s) + " s (--duration)";
  } else if (plan.workload.rate > 0) {
    end = plan.workload.requests / plan.workload.rate;
    char text[160];
    std::snprintf(text, sizeof text, "the load should end near %.1f s (%d requests at %s/s)", end,
                  plan.workload.requests, number_text(plan.workload.rate).c_str());
    basis = text;
  } else {
    return out;
  }
  std::string late;
  size_t n = 0;
  for (size_t i = 0; i < plan.faults.size(); ++i) {
    if (plan.faults[i].at_s < end) continue;
    ++n;
    if (n <= 8)
      late += (late.empty() ? "" : ", ") +
              ("faults[" + std::to_string(i) + "] (" + plan.faults[i].kind + " at " +
               number_text(plan.faults[i].at_s) + " s)");
  }
  if (n > 8) late += " and " + std::to_string(n - 8) + " more";
  if (n > 0)
    out.push_back(basis + ", before " + late + ": a fault the load does not reach is not played, " +
                  "and the verdict is then INCOMPLETE");
  if (plan.random.every_s > 0 && plan.random.until_s > 0 && plan.random.from_s >= end)
    out.push_back(basis + ", before random.from_s (" + number_text(plan.random.from_s) +
                  " s): no random fault would play");
  return out;
}

}  // namespace troupe::chaos
