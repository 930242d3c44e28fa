#include "deploy/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "deploy/yaml_schema.h"
#include "gpu/model.h"
#include "scheduler/cluster.h"
#include "scheduler/routing_policy.h"
#include "service/allowed_origin.h"

namespace troupe {

std::string routing_policy_problem(const std::string& name) {
  const auto& names = routing_policy_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return std::string();
  const std::vector<std::string_view> known(names.begin(), names.end());
  return "expected one of " + schema::join(known) + ", got '" + name + "'" +
         schema::suggestion(name, known);
}

using schema::Fields;
using schema::Kind;
using schema::Origin;

namespace {

// A layout beyond this is a typo (an extra zero), not a deployment.
constexpr int64_t kMaxDevices = 4096;

// ---------------------------------------------------------------------------
// Value kinds of Troupe's own

Kind<DType> dtype_kind() {
  static const std::vector<std::string_view> kNames{"f32", "bf16", "f16"};
  Kind<DType> k;
  k.read = [](const Origin& o, const YAML::Node& n, const std::string& key) {
    const std::string expected = "one of " + schema::join(kNames);
    if (!n.IsScalar()) schema::fail_expected(o, key, expected, n);
    if (const auto dtype = parse_dtype(n.Scalar())) return *dtype;
    o.fail(key, "expected " + expected + ", got " + schema::describe(n) +
                    schema::suggestion(n.Scalar(), kNames));
  };
  k.problem = [](const DType&) { return std::string(); };
  k.write = [](YAML::Emitter& out, const DType& d) { out << dtype_name(d); };
  return k;
}

Kind<std::string> listen_kind() {
  Kind<std::string> k = schema::text();
  k.problem = [](const std::string& v) {
    try {
      parse_listen(v);
      return std::string();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
  };
  return k;
}

// host:port, or empty (the feature is off).
Kind<std::string> listen_or_empty_kind() {
  Kind<std::string> k = listen_kind();
  k.read = [read = schema::optional_text().read](const Origin& o, const YAML::Node& n,
                                                 const std::string& key) {
    return read(o, n, key);
  };
  const auto check = k.problem;
  k.problem = [check](const std::string& v) { return v.empty() ? std::string() : check(v); };
  return k;
}

Kind<std::vector<std::string>> origin_list_kind() {
  Kind<std::vector<std::string>> k = schema::text_list();
  k.problem = [](const std::vector<std::string>& v) {
    for (const std::string& o : v)
      if (auto why = invalid_origin(o)) return *why;
    return std::string();
  };
  return k;
}

Kind<std::string> routing_policy_kind() {
  Kind<std::string> k = schema::text();
  k.problem = routing_policy_problem;
  return k;
}

// ---------------------------------------------------------------------------
// The schema: every key once

const Fields<Config>& config_fields() {
  static const Fields<Config> root = [] {
    Fields<ModelSection> model;
    model.add("path", &ModelSection::path, schema::non_empty_text())
        .add("tokenizer", &ModelSection::tokenizer, schema::optional_text())
        .add("dtype", &ModelSection::dtype, dtype_kind())
        .add("quantized_products", &ModelSection::quantized_products,
             schema::one_of<QuantProducts>(
                 {{"exact", QuantProducts::Exact}, {"int8", QuantProducts::Int8}}))
        .add("name", &ModelSection::name, schema::optional_text());

    Fields<ServerSection> server;
    server.add("listen", &ServerSection::listen, listen_kind())
        .add("max_body_bytes", &ServerSection::max_body_bytes, schema::byte_count(true))
        .add("request_timeout_s", &ServerSection::request_timeout_s, schema::seconds(true))
        .add("max_tokens_limit", &ServerSection::max_tokens_limit, schema::positive_int())
        .add("io_threads", &ServerSection::io_threads, schema::positive_int())
        .add("shutdown_grace_s", &ServerSection::shutdown_grace_s, schema::number_in(0, 3600))
        .add("chat_template", &ServerSection::chat_template,
             schema::one_of<ChatTemplate>({kChatTemplates.begin(), kChatTemplates.end()}))
        .add("chat_template_file", &ServerSection::chat_template_file, schema::optional_text())
        .add("reasoning_parser", &ServerSection::reasoning_parser,
             schema::one_of<ReasoningParser>({kReasoningParsers.begin(), kReasoningParsers.end()}))
        .add("api_key", &ServerSection::api_key, schema::optional_text())
        .add("allowed_origins", &ServerSection::allowed_origins, origin_list_kind())
        .add("access_log", &ServerSection::access_log, schema::boolean());

    Fields<ParallelLayout> parallel;
    parallel.flow()
        .add("replicas", &ParallelLayout::replicas, schema::positive_int())
        .add("pipeline", &ParallelLayout::pipeline, schema::positive_int())
        .add("tensor", &ParallelLayout::tensor, schema::positive_int());

    Fields<DeviceSpec> device;
    device.flow()
        .add(
            "kind", &DeviceSpec::kind,
            schema::one_of<DeviceKind>(
                {{"cpu", DeviceKind::Cpu}, {"cuda", DeviceKind::Cuda}, {"auto", DeviceKind::Auto}}))
        .add("threads", &DeviceSpec::threads, schema::positive_int())
        .add("memory", &DeviceSpec::memory_bytes, schema::byte_count(false), /*omit_zero=*/true)
        .add("index", &DeviceSpec::index, schema::optional_index());

    Fields<BatchingSection> batching;
    batching
        .add("max_batch_sequences", &BatchingSection::max_batch_sequences, schema::positive_int())
        .add("max_batch_tokens", &BatchingSection::max_batch_tokens, schema::positive_int())
        .add("prefill_chunk_tokens", &BatchingSection::prefill_chunk_tokens, schema::positive_int())
        .add("max_waiting", &BatchingSection::max_waiting, schema::non_negative_int())
        .add("async_scheduling", &BatchingSection::async_scheduling, schema::boolean());

    Fields<KvCacheSection> kv;
    kv.flow()
        .add("block_tokens", &KvCacheSection::block_tokens, schema::positive_int())
        .add("blocks", &KvCacheSection::blocks, schema::non_negative_int64(), /*omit_zero=*/true)
        .add("bytes", &KvCacheSection::bytes, schema::byte_count(false), /*omit_zero=*/true)
        .add("dtype", &KvCacheSection::dtype, dtype_kind())
        .add("prefix_caching", &KvCacheSection::prefix_caching, schema::boolean())
        // The sizing given replaces any earlier one (the defaults, or the
        // file when this is an override), so only giving both in one place
        // is an error.
        .after_read([](const Origin& o, const std::string& path, KvCacheSection& s,
                       const std::set<std::string>& given) {
          const bool blocks = given.count("blocks") != 0, bytes = given.count("bytes") != 0;
          if (blocks && bytes)
            o.fail(path,
                   "blocks and bytes are both set; give one of them (with bytes, the block count "
                   "follows from the model's KV size per token)");
          if (bytes) s.blocks = 0;
          if (blocks) s.bytes = 0;
        });

    Fields<LatencyAwareOptions> latency_aware;
    latency_aware.flow()
        .add("ema_alpha", &LatencyAwareOptions::ema_alpha, schema::number_in(0, 1))
        .add("prior_step_s", &LatencyAwareOptions::prior_step_s, schema::seconds(false))
        .add("prior_prefill_tokens_per_s", &LatencyAwareOptions::prior_prefill_tokens_per_s,
             schema::number_in(0, 1e12))
        .add("batch_cost_per_seq", &LatencyAwareOptions::batch_cost_per_seq,
             schema::number_in(0, 1e6))
        .add("stale_after_s", &LatencyAwareOptions::stale_after_s,
             schema::non_negative_seconds("fading at once"))
        .add("forget_tau_s", &LatencyAwareOptions::forget_tau_s, schema::seconds(false))
        .add("probe_interval_s", &LatencyAwareOptions::probe_interval_s,
             schema::non_negative_seconds("no probes"))
        .add("probe_every_requests", &LatencyAwareOptions::probe_every_requests,
             schema::unsigned_int());

    Fields<RoutingSection> routing;
    routing.add("policy", &RoutingSection::policy, routing_policy_kind())
        .add("seed", &RoutingSection::seed, schema::unsigned_int())
        .section("latency_aware", &RoutingSection::latency_aware, latency_aware);

    Fields<AdmissionSection> admission;
    admission.flow()
        .add("max_queue", &AdmissionSection::max_queue, schema::positive_int())
        .add("priority_levels", &AdmissionSection::priority_levels, schema::positive_int())
        .add("queue_timeout_s", &AdmissionSection::queue_timeout_s, schema::seconds(true))
        .add("on_timeout", &AdmissionSection::on_timeout,
             schema::one_of<TimeoutAction>(
                 {{"reject", TimeoutAction::Reject}, {"keep", TimeoutAction::Keep}}));

    Fields<SupervisionSection> supervision;
    supervision.flow()
        .add("max_restarts", &SupervisionSection::max_restarts, schema::non_negative_int())
        .add("within_s", &SupervisionSection::within_s, schema::seconds(false));

    Fields<NodesSection> nodes;
    nodes.add("listen", &NodesSection::listen, listen_or_empty_kind())
        .add("local", &NodesSection::local, schema::boolean())
        .add("token", &NodesSection::token, schema::optional_text())
        .add("heartbeat_timeout_s", &NodesSection::heartbeat_timeout_s,
             schema::seconds_at_least(
                 0.2,
                 "a node beats four times within it, and a shorter one declares live "
                 "nodes dead whenever a beat is late"))
        .add("name", &NodesSection::name, schema::optional_text())
        .add("address", &NodesSection::address, schema::non_empty_text());

    Fields<PlacementSection> placement;
    placement.flow().add("replicas", &PlacementSection::replicas, schema::text_list());

    Fields<CudaSection> cuda;
    cuda.flow()
        .add("deterministic", &CudaSection::deterministic, schema::boolean())
        .add("graphs", &CudaSection::graphs, schema::boolean())
        .add("reserve", &CudaSection::reserve_bytes, schema::byte_count(false));

    Fields<AdminSection> admin;
    admin.flow()
        .add("faults", &AdminSection::faults, schema::boolean())
        .add("token", &AdminSection::token, schema::optional_text());

    Fields<LoggingSection> logging;
    logging.flow().add(
        "level", &LoggingSection::level,
        schema::one_of<spdlog::level::level_enum>({{"trace", spdlog::level::trace},
                                                   {"debug", spdlog::level::debug},
                                                   {"info", spdlog::level::info},
                                                   {"warn", spdlog::level::warn},
                                                   {"error", spdlog::level::err},
                                                   {"critical", spdlog::level::critical},
                                                   {"off", spdlog::level::off}}));

    Fields<Config> c;
    c.section("model", &Config::model, model)
        .section("server", &Config::server, server)
        .section("parallel", &Config::parallel, parallel)
        .list("devices", &Config::devices, device,
              "a list of devices such as [{kind: cpu, threads: 2}]",
              "a device such as {kind: cpu, threads: 2}")
        .section("batching", &Config::batching, batching)
        .section("kv_cache", &Config::kv_cache, kv)
        .section("routing", &Config::routing, routing)
        .section("admission", &Config::admission, admission)
        .section("supervision", &Config::supervision, supervision)
        .section("nodes", &Config::nodes, nodes)
        .section("placement", &Config::placement, placement)
        .section("admin", &Config::admin, admin)
        .section("cuda", &Config::cuda, cuda)
        .section("logging", &Config::logging, logging);
    return c;
  }();
  return root;
}

// ---------------------------------------------------------------------------
// Checks that span keys

std::string layout_text(const ParallelLayout& p) {
  return "{replicas: " + std::to_string(p.replicas) + ", pipeline: " + std::to_string(p.pipeline) +
         ", tensor: " + std::to_string(p.tensor) + "}";
}

// One placement.replicas entry: "any", a node's name, or names split by
// commas (one replica over those nodes, each at least one of its devices):
// one that no node could ever match is refused now, not waited for.
void check_placement_entry(const Origin& o, const std::string& at, const std::string& where,
                           int replica_devices) {
  if (where.find(',') == std::string::npos) {
    if (where == "any" || where.empty()) return;
    if (const std::string why = node_name_problem(where); !why.empty())
      o.fail(at, "\"" + where + "\" names no node that could join: " + why);
    return;
  }
  std::set<std::string> seen;
  const std::vector<std::string> names = placement_names(where);
  for (const std::string& name : names) {
    if (name.empty())
      o.fail(at, "\"" + where + "\" has an empty name between its commas");
    else if (name == "any")
      o.fail(at, "\"" + where + "\" lists \"any\": a split names its nodes");
    else if (const std::string why = node_name_problem(name); !why.empty())
      o.fail(at, "\"" + where + "\" names \"" + name + "\", which no node could be called: " + why);
    else if (!seen.insert(name).second)
      o.fail(at, "\"" + where + "\" names node \"" + name +
                     "\" twice: a node holds one share of the replica (name it once)");
  }
  if (int(names.size()) > replica_devices)
    o.fail(at, "splits a replica of " + std::to_string(replica_devices) + " device(s) over " +
                   std::to_string(names.size()) +
                   " nodes: each node holds at least one device of it");
}

void validate(const Origin& o, const Config& c, ConfigRole role) {
  config_fields().check(o, "", c);
  // What the key kinds leave open (a weight of 0, a probe every 0 requests);
  // the message names the key.
  if (const auto p = c.routing.latency_aware.problem())
    o.fail(std::string("routing.latency_aware.") + p->field, std::string("must be ") + p->rule);
  const ParallelLayout& p = c.parallel;
  const int64_t devices = int64_t(p.replicas) * p.pipeline * p.tensor;
  if (devices > kMaxDevices)
    o.fail("parallel", layout_text(p) + " needs " + std::to_string(devices) + " devices; at most " +
                           std::to_string(kMaxDevices) + " are supported");
  const size_t n = c.devices.size();
  const auto needed = size_t(p.device_count());
  // A node's entries are the devices it offers, however many: the
  // coordinator's layout decides what runs on them.
  if (role == ConfigRole::Node && n == 0)
    o.fail("devices", "is empty: give one entry per device the node offers, or one for all");
  if (role == ConfigRole::Deployment && n != 1 && n != needed)
    o.fail("devices", "has " + std::to_string(n) + " entries, but parallel " + layout_text(p) +
                          " needs " + std::to_string(needed) +
                          " (one per device) or 1 (applied to every device)");
  const BatchingSection& b = c.batching;
  if (b.prefill_chunk_tokens > b.max_batch_tokens)
    o.fail("batching.prefill_chunk_tokens",
           std::to_string(b.prefill_chunk_tokens) + " is more than batching.max_batch_tokens (" +
               std::to_string(b.max_batch_tokens) + "): a prefill chunk must fit in one batch");
  for (size_t r = 0; r < c.placement.replicas.size(); ++r) {
    const std::string& where = c.placement.replicas[r];
    if (int(r) >= p.replicas)
      o.fail("placement.replicas", "names " + std::to_string(c.placement.replicas.size()) +
                                       " replicas, but parallel.replicas is " +
                                       std::to_string(p.replicas));
    if (where.empty())
      o.fail("placement.replicas[" + std::to_string(r) + "]",
             "expected a node name, \"local\" or \"any\"");
    if (where == "local" && !c.nodes.local)
      o.fail("placement.replicas[" + std::to_string(r) + "]",
             "is \"local\", but nodes.local is false: the coordinator runs no replica itself");
    check_placement_entry(o, "placement.replicas[" + std::to_string(r) + "]", where,
                          p.pipeline * p.tensor);
  }
  if (c.nodes.listen.empty() && !c.nodes.local)
    o.fail("nodes.local", "is false and nodes.listen is empty: no device would ever join");
  if (role != ConfigRole::Node && c.nodes.listen == c.server.listen &&
      !c.nodes.listen.ends_with(":0"))
    o.fail("nodes.listen", "is " + c.nodes.listen +
                               ", server.listen's address too: the HTTP API and the node port "
                               "need a port each");
  if (c.admin.faults && c.admin.token.empty())
    o.fail("admin.token",
           "is empty, but admin.faults is on: fault injection is served only to a client that "
           "presents a token");
  const KvCacheSection& kv = c.kv_cache;
  if (kv.blocks > 0 && kv.bytes > 0)
    o.fail("kv_cache", "blocks and bytes are both set; give one of them");
  if (kv.blocks == 0 && kv.bytes == 0)
    o.fail("kv_cache.blocks", "expected a positive integer, got 0 (or give kv_cache.bytes)");
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API

const char* device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::Cpu:
      return "cpu";
    case DeviceKind::Cuda:
      return "cuda";
    case DeviceKind::Auto:
      return "auto";
  }
  return "?";
}

Config default_config() {
  return Config{};
}

Config parse_config(const std::string& yaml_text, const std::string& source_name, ConfigRole role) {
  Origin origin(source_name);
  Config config;
  schema::guarded(source_name, [&] {
    config_fields().read(origin, schema::load_document(yaml_text, source_name), "", config);
    validate(origin, config, role);
  });
  return config;
}

Config load_config(const std::filesystem::path& file, ConfigRole role) {
  const std::string source = file.string();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    throw schema::key_error(source, "", "cannot read the config file: it does not exist", 0);
  }
  if (std::filesystem::is_directory(file, ec)) {
    throw schema::key_error(source, "", "cannot read the config file: it is a directory", 0);
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  if (!(in && text << in.rdbuf())) {
    throw schema::key_error(source, "", "cannot read the config file", 0);
  }
  return parse_config(text.str(), source, role);
}

void apply_overrides(Config& config,
                     const std::vector<std::pair<std::string, std::string>>& key_values,
                     const std::string& source_name, ConfigRole role) {
  Origin origin(source_name);
  Config updated = config;  // untouched when any override fails
  schema::guarded(source_name, [&] {
    for (const auto& [key, value] : key_values)
      config_fields().override_key(origin, key, schema::override_value(origin, key, value),
                                   updated);
    validate(origin, updated, role);
  });
  config = std::move(updated);
}

void apply_override(Config& config, const std::string& dotted_key, const std::string& value,
                    const std::string& source_name) {
  apply_overrides(config, {{dotted_key, value}}, source_name);
}

void validate_config(const Config& config, const std::string& source_name, ConfigRole role) {
  validate(Origin(source_name), config, role);
}

std::vector<DeviceSpec> node_devices(const Config& c, int count) {
  if (count < 0) throw std::invalid_argument("a node offers at least 1 device");
  const size_t entries = c.devices.size();
  if (entries == 0) throw std::invalid_argument("devices is empty");
  const int n = count > 0 ? count : entries > 1 ? int(entries) : c.parallel.device_count();
  if (entries != 1 && int(entries) != n)
    throw std::invalid_argument(
        std::to_string(n) + " device(s) need one devices entry (for all), or " + std::to_string(n) +
        " (one each); the config lists " + std::to_string(entries));
  std::vector<DeviceSpec> out;
  for (int d = 0; d < n; ++d) out.push_back(entries == 1 ? c.devices[0] : c.devices[size_t(d)]);
  return out;
}

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  config_fields().write(out, c);
  return std::string(out.c_str()) + "\n";
}

std::pair<std::string, uint16_t> parse_listen(const std::string& listen) {
  const std::string usage =
      "expected host:port (e.g. 127.0.0.1:8080, or [::1]:8080 for IPv6), got '" + listen + "'";
  std::string host;
  std::string port;
  if (!listen.empty() && listen.front() == '[') {
    // Brackets keep an IPv6 address's colons apart from the port's.
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      throw std::invalid_argument(usage);
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument(usage);
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      throw std::invalid_argument(usage + "; an IPv6 address needs brackets");
    }
  }
  const bool host_ok =
      !host.empty() && std::none_of(host.begin(), host.end(), [](unsigned char ch) {
        return std::isspace(ch) || ch == '/' || ch == '[' || ch == ']';
      });
  if (!host_ok) throw std::invalid_argument(usage);
  unsigned long value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || !std::isdigit(static_cast<unsigned char>(port.front())) ||
      ec == std::errc::invalid_argument || end != port.data() + port.size()) {
    throw std::invalid_argument(usage);
  }
  if (ec == std::errc::result_out_of_range || value > 65535) {
    throw std::invalid_argument("port " + port + " is out of range (0-65535; 0 = any free port)");
  }
  return {host, uint16_t(value)};
}

int device_index(const ParallelLayout& parallel, int replica, int stage, int shard) {
  if (replica < 0 || replica >= parallel.replicas || stage < 0 || stage >= parallel.pipeline ||
      shard < 0 || shard >= parallel.tensor) {
    throw std::out_of_range("device_index: (replica " + std::to_string(replica) + ", stage " +
                            std::to_string(stage) + ", shard " + std::to_string(shard) +
                            ") is outside the layout " + layout_text(parallel));
  }
  return (replica * parallel.pipeline + stage) * parallel.tensor + shard;
}

const DeviceSpec& device_spec(const Config& config, int device_index) {
  if (device_index < 0 || device_index >= config.parallel.device_count() ||
      config.devices.empty()) {
    throw std::out_of_range("device " + std::to_string(device_index) + " is outside the layout " +
                            layout_text(config.parallel));
  }
  if (config.devices.size() == 1) return config.devices.front();
  return config.devices.at(size_t(device_index));
}

int threads_for_device(const Config& config, int device_index) {
  return device_spec(config, device_index).threads;
}

std::string served_model_name(const Config& config) {
  if (!config.model.name.empty()) return config.model.name;
  std::filesystem::path p = std::filesystem::path(config.model.path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "models/fortune/"
  // Only weight-file extensions go: a directory such as "llama-3.2-1b" has a
  // "." in its name that is not an extension.
  const std::string ext = p.extension().string();
  const std::string name = ext == ".bin" || ext == ".safetensors" || ext == ".gguf"
                               ? p.stem().string()
                               : p.filename().string();
  return name.empty() || name == "." || name == ".." ? "model" : name;
}

std::filesystem::path tokenizer_path(const Config& config,
                                     const std::filesystem::path& beside_weights) {
  return config.model.tokenizer.empty() ? beside_weights
                                        : std::filesystem::path(config.model.tokenizer);
}

AdmissionQueueOptions admission_queue_options(const Config& config) {
  AdmissionQueueOptions options;
  options.max_size = size_t(config.admission.max_queue);
  options.priority_levels = size_t(config.admission.priority_levels);
  options.max_wait_s = config.admission.queue_timeout_s;
  options.on_timeout = config.admission.on_timeout;
  return options;
}

void validate_layout_for_model(const Config& config, const ModelConfig& model) {
  try {
    check_layout_fits(model, config.parallel.pipeline, config.parallel.tensor);
  } catch (const LayoutMisfit& e) {
    const std::string key =
        e.axis() == LayoutMisfit::Axis::Tensor ? "parallel.tensor" : "parallel.pipeline";
    throw ConfigError(std::string(e.what()) + " (model " + config.model.path + ")",
                      config.model.path, key);
  }
}

}  // namespace troupe
