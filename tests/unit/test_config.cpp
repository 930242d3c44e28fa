// The configuration schema: defaults, the shipped files, every class of bad
// input with a message naming the key, overrides, round trips, and layout
// checks against model dimensions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "deploy/config.h"
#include "gpu/model_config.h"  // must coexist: troupe::ModelConfig is the model's shape
#include "support/test_support.h"

namespace troupe {
namespace {

using ::testing::HasSubstr;

const char* const kSource = "configs/x.yaml";

Config parse(const std::string& yaml) {
  return parse_config(yaml, kSource);
}

// Parses `yaml`, expecting a ConfigError about `key` whose message contains
// `fragment`; returns the message for further checks.
std::string expect_error(const std::string& yaml, const std::string& key,
                         const std::string& fragment) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.key(), key) << message;
    EXPECT_EQ(e.source(), kSource) << message;
    EXPECT_THAT(message, HasSubstr(std::string(kSource) + ": ")) << message;
    if (!key.empty()) {
      EXPECT_THAT(message, HasSubstr(key + ": ")) << message;
    }
    EXPECT_THAT(message, HasSubstr(fragment));
    return message;
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return {};
}

std::string override_error(Config& config, const std::string& key, const std::string& value) {
  try {
    apply_override(config, key, value);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for " << key << "=" << value;
  return {};
}

std::filesystem::path shipped(const std::string& name) {
  return troupe::test::source_dir() / "configs" / name;
}

// ---- defaults and shipped files ----

TEST(RuntimeConfigTest, DefaultsMatchTheSchema) {
  const Config c = default_config();
  EXPECT_EQ(c.model.path, "models/fortune");
  EXPECT_EQ(c.model.tokenizer, "");
  EXPECT_EQ(c.model.dtype, DType::F32);
  EXPECT_EQ(served_model_name(c), "fortune");
  EXPECT_EQ(c.server.listen, "127.0.0.1:8080");
  EXPECT_EQ(c.server.max_body_bytes, 1048576);
  EXPECT_EQ(c.server.request_timeout_s, 120);
  EXPECT_EQ(c.server.max_tokens_limit, 4096);
  EXPECT_EQ(c.server.io_threads, 1);
  EXPECT_EQ(c.server.shutdown_grace_s, 5);
  EXPECT_EQ(c.server.chat_template, ChatTemplate::Auto);
  EXPECT_EQ(c.parallel.device_count(), 1);
  ASSERT_EQ(c.devices.size(), 1u);
  EXPECT_EQ(c.devices[0].kind, DeviceKind::Cpu);
  EXPECT_EQ(c.devices[0].threads, 2);
  EXPECT_EQ(c.batching.max_batch_sequences, 32);
  EXPECT_EQ(c.batching.max_batch_tokens, 2048);
  EXPECT_EQ(c.batching.prefill_chunk_tokens, 512);
  EXPECT_EQ(c.batching.max_waiting, 256);
  EXPECT_EQ(c.kv_cache.block_tokens, 16);
  EXPECT_EQ(c.kv_cache.blocks, 4096);
  EXPECT_EQ(c.kv_cache.bytes, 0);
  EXPECT_EQ(c.routing.policy, "latency_aware");
  EXPECT_EQ(c.routing.seed, 1u);
  EXPECT_EQ(c.admission.max_queue, 256);
  EXPECT_EQ(c.admission.priority_levels, 2);
  EXPECT_EQ(c.admission.queue_timeout_s, 30);
  EXPECT_EQ(c.admission.on_timeout, TimeoutAction::Reject);
  EXPECT_EQ(c.supervision.max_restarts, 3);
  EXPECT_EQ(c.supervision.within_s, 10);
  EXPECT_EQ(c.logging.level, spdlog::level::info);
  EXPECT_NO_THROW(validate_config(c));
}

TEST(RuntimeConfigTest, EveryKeyIsOptional) {
  EXPECT_EQ(parse(""), default_config());
  EXPECT_EQ(parse("{}"), default_config());
  EXPECT_EQ(parse("# only a comment\n"), default_config());
  EXPECT_EQ(parse("model:\nbatching:\n"), default_config());
  const Config c = parse("batching: {max_batch_tokens: 4096}\n");
  EXPECT_EQ(c.batching.max_batch_tokens, 4096);
  EXPECT_EQ(c.batching.max_batch_sequences, 32);
}

TEST(RuntimeConfigTest, ShippedDefaultIsTheDefault) {
  const Config c = load_config(shipped("default.yaml"));
  EXPECT_EQ(c, default_config());
  EXPECT_EQ(parse_listen(c.server.listen),
            std::make_pair(std::string("127.0.0.1"), uint16_t(8080)));
  EXPECT_EQ(threads_for_device(c, 0), 2);
}

TEST(RuntimeConfigTest, ShippedTwoReplicas) {
  const Config c = load_config(shipped("two-replicas.yaml"));
  EXPECT_EQ(c.model.path, "models/fortune");
  EXPECT_EQ(c.parallel.replicas, 2);
  EXPECT_EQ(c.parallel.device_count(), 2);
  EXPECT_EQ(threads_for_device(c, 0), 1);
  EXPECT_EQ(threads_for_device(c, 1), 1);
  EXPECT_THROW(threads_for_device(c, 2), std::out_of_range);
}

// ---- unknown keys ----

TEST(RuntimeConfigTest, UnknownKeySuggestsTheClosestKnownOne) {
  std::string m = expect_error("batching:\n  max_batch_token: 10\n", "batching.max_batch_token",
                               "unknown key; did you mean 'max_batch_tokens'?");
  EXPECT_EQ(m,
            "configs/x.yaml: batching.max_batch_token: unknown key; did you mean "
            "'max_batch_tokens'? (line 2)");
  expect_error("batchng: {}\n", "batchng", "did you mean 'batching'?");
  expect_error("parallel: {replica: 2}\n", "parallel.replica", "did you mean 'replicas'?");
  expect_error("routing: {polcy: round_robin}\n", "routing.polcy", "did you mean 'policy'?");
  expect_error("server: {listen_address: 1.2.3.4:80}\n", "server.listen_address",
               "did you mean 'listen'?");
  expect_error("batching: {max-batch-tokens: 10}\n", "batching.max-batch-tokens",
               "did you mean 'max_batch_tokens'?");
  expect_error("devices:\n  - {kind: cpu, thread: 1}\n", "devices[0].thread",
               "did you mean 'threads'?");
}

TEST(RuntimeConfigTest, UnknownKeyFarFromAnyListsTheKnownKeys) {
  const std::string m =
      expect_error("kv_cache: {zzz: 1}\n", "kv_cache.zzz", "unknown key; known keys: ");
  EXPECT_THAT(m, HasSubstr("block_tokens, blocks, bytes"));
  EXPECT_THAT(m, ::testing::Not(HasSubstr("did you mean")));
}

TEST(RuntimeConfigTest, DuplicateKeysAndExtraDocumentsAreRefused) {
  expect_error("server:\n  io_threads: 1\n  io_threads: 2\n", "server.io_threads", "duplicate key");
  expect_error("model: {}\n---\nmodel: {}\n", "",
               "YAML syntax error at line 2, column 1: expected one YAML document, but another "
               "starts here");
}

// ---- wrong types ----

TEST(RuntimeConfigTest, StringWhereIntegerExpected) {
  const std::string m = expect_error("batching:\n  max_batch_tokens: lots\n",
                                     "batching.max_batch_tokens", "got 'lots'");
  EXPECT_EQ(m,
            "configs/x.yaml: batching.max_batch_tokens: expected a positive integer, got 'lots' "
            "(line 2)");
  expect_error("batching: {max_batch_tokens: '512'}\n", "batching.max_batch_tokens",
               "got the string '512'");
  expect_error("batching: {max_batch_tokens: 1.5}\n", "batching.max_batch_tokens", "got '1.5'");
  expect_error("admission: {max_queue: 99999999999999}\n", "admission.max_queue", "out of range");
  expect_error("routing: {seed: -1}\n", "routing.seed", "expected a non-negative integer");
}

TEST(RuntimeConfigTest, BooleansAndNullsAreNotNumbers) {
  expect_error("admission: {max_queue: true}\n", "admission.max_queue",
               "expected a positive integer, got the boolean 'true'");
  expect_error("parallel: {tensor: off}\n", "parallel.tensor", "got the boolean 'off'");
  expect_error("admission:\n  max_queue:\n", "admission.max_queue", "got nothing");
  expect_error("supervision: {within_s: yes}\n", "supervision.within_s",
               "expected a number of seconds, got the boolean 'yes'");
}

TEST(RuntimeConfigTest, ScalarVersusMapVersusList) {
  expect_error("batching: 5\n", "batching", "expected a map (keys: max_batch_sequences");
  expect_error("parallel: [1, 2]\n", "parallel", "got a list");
  expect_error("model: {path: {a: 1}}\n", "model.path", "expected a string, got a map");
  expect_error("server: {listen: [127.0.0.1, 8080]}\n", "server.listen", "got a list");
  expect_error("devices: {kind: cpu}\n", "devices", "expected a list of devices");
  expect_error("devices: [cpu]\n", "devices[0]", "expected a map");
  expect_error("- model\n", "", "expected a map (keys: model, server");
  expect_error("just text\n", "", "got 'just text'");
}

TEST(RuntimeConfigTest, NegativeAndZeroWherePositiveRequired) {
  expect_error("batching: {max_batch_sequences: 0}\n", "batching.max_batch_sequences",
               "expected a positive integer, got 0");
  expect_error("parallel: {replicas: -1}\n", "parallel.replicas",
               "expected a positive integer, got -1");
  expect_error("parallel: {pipeline: 0}\n", "parallel.pipeline", "got 0");
  expect_error("parallel: {tensor: 0}\n", "parallel.tensor", "got 0");
  expect_error("devices: [{kind: cpu, threads: 0}]\n", "devices[0].threads",
               "expected a positive integer, got 0");
  expect_error("admission: {priority_levels: 0}\n", "admission.priority_levels", "got 0");
  expect_error("server: {io_threads: 0}\n", "server.io_threads", "got 0");
  expect_error("server: {shutdown_grace_s: -1}\n", "server.shutdown_grace_s",
               "expected a number in [0, 3600], got -1");
  expect_error("server: {shutdown_grace_s: 1e9}\n", "server.shutdown_grace_s", "[0, 3600]");
  expect_error("server: {chat_template: gemma}\n", "server.chat_template",
               "expected one of plain, llama2, zephyr, chatml, llama3, mistral, auto, got 'gemma'");
  EXPECT_EQ(parse("server: {chat_template: llama3}\n").server.chat_template, ChatTemplate::Llama3);
  EXPECT_EQ(parse("server: {chat_template: llama2}\n").server.chat_template, ChatTemplate::Llama2);
  expect_error("server: {allowed_origins: [\"http://localhost:3000/app\"]}\n",
               "server.allowed_origins", "'http://localhost:3000/app' has a path");
  expect_error("server: {allowed_origins: [localhost]}\n", "server.allowed_origins",
               "'localhost' is not an origin");
  expect_error("server: {allowed_origins: \"*\"}\n", "server.allowed_origins", "a list");
  EXPECT_EQ(parse("server: {allowed_origins: [\"http://a:1\", \"*\"]}\n").server.allowed_origins,
            (std::vector<std::string>{"http://a:1", "*"}));
  EXPECT_TRUE(parse("server: {allowed_origins: []}\n").server.allowed_origins.empty());
  EXPECT_EQ(parse("server: {api_key: sk-1}\n").server.api_key, "sk-1");
  EXPECT_EQ(default_config().server.api_key, "") << "no key unless asked for";
  expect_error("supervision: {max_restarts: -2}\n", "supervision.max_restarts",
               "expected a non-negative integer, got -2");
  expect_error("supervision: {within_s: 0}\n", "supervision.within_s",
               "expected a positive number of seconds, got 0");
  expect_error("admission: {queue_timeout_s: -1}\n", "admission.queue_timeout_s",
               "expected a non-negative number of seconds");
  expect_error("server: {request_timeout_s: nan}\n", "server.request_timeout_s",
               "expected a number of seconds");
  // Zero is "no limit" for timeouts, and fractions are fine.
  EXPECT_EQ(parse("admission: {queue_timeout_s: 0}\n").admission.queue_timeout_s, 0);
  EXPECT_EQ(parse("server: {request_timeout_s: 2.5}\n").server.request_timeout_s, 2.5);
}

// ---- impossible values ----

TEST(RuntimeConfigTest, ListenMustBeHostPort) {
  expect_error("server: {listen: localhost}\n", "server.listen", "expected host:port");
  expect_error("server: {listen: '127.0.0.1:70000'}\n", "server.listen",
               "port 70000 is out of range");
  expect_error("server: {listen: ':8080'}\n", "server.listen", "expected host:port");
  expect_error("server: {listen: 'localhost:http'}\n", "server.listen", "expected host:port");
  expect_error("server: {listen: '::1:8080'}\n", "server.listen", "needs brackets");
  EXPECT_EQ(parse("server: {listen: '[::1]:0'}\n").server.listen, "[::1]:0");
}

TEST(RuntimeConfigTest, UnknownEnumValuesListTheKnownOnes) {
  expect_error("model: {dtype: f64}\n", "model.dtype", "expected one of f32, bf16, f16, got 'f64'");
  expect_error("model: {dtype: bf61}\n", "model.dtype", "did you mean 'bf16'?");
  expect_error("routing: {policy: random}\n", "routing.policy",
               "expected one of round_robin, least_outstanding, power_of_two, latency_aware");
  expect_error("routing: {policy: round-robin}\n", "routing.policy", "did you mean 'round_robin'?");
  // What the key's kind allows and the policy does not: named all the same.
  expect_error("routing: {latency_aware: {ema_alpha: 0}}\n", "routing.latency_aware.ema_alpha",
               "in (0, 1]");
  expect_error("routing: {latency_aware: {probe_every_requests: 0}}\n",
               "routing.latency_aware.probe_every_requests", ">= 1");
  expect_error("routing: {latency_aware: {ema_alpa: 0.2}}\n", "routing.latency_aware.ema_alpa",
               "did you mean 'ema_alpha'?");
  expect_error("devices: [{kind: gpu}]\n", "devices[0].kind",
               "expected one of cpu, cuda, auto, got 'gpu'");
  expect_error("logging: {level: verbose}\n", "logging.level",
               "expected one of trace, debug, info, warn, error, critical, off");
  expect_error("logging: {level: warning}\n", "logging.level", "did you mean 'warn'?");
  expect_error("admission: {on_timeout: drop}\n", "admission.on_timeout",
               "expected one of reject, keep, got 'drop'");
  // `off` is a YAML 1.1 boolean, but as a level it is a level.
  EXPECT_EQ(parse("logging: {level: off}\n").logging.level, spdlog::level::off);
  EXPECT_EQ(parse("model: {dtype: bf16}\n").model.dtype, DType::BF16);
  expect_error("kv_cache: {dtype: fp8}\n", "kv_cache.dtype",
               "expected one of f32, bf16, f16, got 'fp8'");
  EXPECT_EQ(parse("kv_cache: {dtype: f16}\n").kv_cache.dtype, DType::F16);
  EXPECT_EQ(parse("kv_cache: {blocks: 64}\n").kv_cache.dtype, DType::F32);
  EXPECT_EQ(parse("admission: {on_timeout: keep}\n").admission.on_timeout, TimeoutAction::Keep);
}

TEST(RuntimeConfigTest, KeysThatConstrainEachOther) {
  expect_error("batching: {max_batch_tokens: 256, prefill_chunk_tokens: 512}\n",
               "batching.prefill_chunk_tokens", "512 is more than batching.max_batch_tokens (256)");
  expect_error("kv_cache: {blocks: 10, bytes: 1024}\n", "kv_cache",
               "blocks and bytes are both set");
  expect_error("kv_cache: {blocks: 0}\n", "kv_cache.blocks", "expected a positive integer, got 0");
  expect_error("model: {path: ''}\n", "model.path", "must not be empty");
  expect_error("parallel: {replicas: 1000, pipeline: 1000}\n", "parallel", "at most 4096");
}

TEST(RuntimeConfigTest, NodesAndPlacementAgreeWithTheLayout) {
  const Config c = parse(
      "parallel: {replicas: 2}\n"
      "nodes: {listen: 127.0.0.1:7100, local: false, token: s3cret, heartbeat_timeout_s: 1.5}\n"
      "placement: {replicas: [gpu-a, any]}\n");
  EXPECT_EQ(c.nodes.listen, "127.0.0.1:7100");
  EXPECT_FALSE(c.nodes.local);
  EXPECT_EQ(c.nodes.token, "s3cret");
  EXPECT_DOUBLE_EQ(c.nodes.heartbeat_timeout_s, 1.5);
  EXPECT_EQ(c.placement.replicas, (std::vector<std::string>{"gpu-a", "any"}));
  expect_error("placement: {replicas: [a, b]}\n", "placement.replicas",
               "names 2 replicas, but parallel.replicas is 1");
  expect_error("placement: {replicas: ['']}\n", "placement.replicas[0]",
               "expected a node name, \"local\" or \"any\"");
  expect_error("nodes: {listen: 127.0.0.1:7100, local: false}\nplacement: {replicas: [local]}\n",
               "placement.replicas[0]", "nodes.local is false");
  // A placement no node could ever match is refused, not waited for.
  EXPECT_EQ(parse("parallel: {pipeline: 2}\nplacement: {replicas: ['a,b']}\n").placement.replicas,
            (std::vector<std::string>{"a,b"}));
  expect_error("placement: {replicas: ['a,b']}\n", "placement.replicas[0]",
               "splits a replica of 1 device(s) over 2 nodes");
  expect_error("parallel: {tensor: 2}\nplacement: {replicas: ['a,a']}\n", "placement.replicas[0]",
               "names node \"a\" twice");
  for (const char* bad : {"'a,'", "',a'", "'a,,b'"})
    expect_error(std::string("parallel: {tensor: 3}\nplacement: {replicas: [") + bad + "]}\n",
                 "placement.replicas[0]", "an empty name between its commas");
  expect_error("parallel: {tensor: 2}\nplacement: {replicas: ['a,any']}\n", "placement.replicas[0]",
               "lists \"any\"");
  expect_error("placement: {replicas: ['bad name!']}\n", "placement.replicas[0]",
               "names no node that could join");
  expect_error("nodes: {local: false}\n", "nodes.local", "no device would ever join");
  expect_error("server: {listen: 127.0.0.1:7100}\nnodes: {listen: 127.0.0.1:7100}\n",
               "nodes.listen", "server.listen's address too");
  expect_error("nodes: {listen: nowhere}\n", "nodes.listen", "");
  expect_error("nodes: {heartbeat_timeout_s: 0}\n", "nodes.heartbeat_timeout_s", "");
  expect_error("nodes: {heartbeat_timeout_s: 0.001}\n", "nodes.heartbeat_timeout_s",
               "at least 0.2 seconds");
}

TEST(RuntimeConfigTest, DeviceCountMustMatchTheLayout) {
  const std::string m = expect_error(
      "parallel: {replicas: 2, tensor: 2}\ndevices:\n  - {threads: 1}\n  - {threads: 1}\n"
      "  - {threads: 1}\n",
      "devices", "has 3 entries");
  EXPECT_THAT(m, HasSubstr("needs 4 (one per device) or 1 (applied to every device)"));
  EXPECT_THAT(m, HasSubstr("(line 2)"));
  expect_error("devices: []\n", "devices", "has 0 entries");

  const Config c = parse(
      "parallel: {replicas: 2, pipeline: 1, tensor: 2}\n"
      "devices: [{threads: 1}, {threads: 2}, {threads: 3}, {kind: auto, threads: 4}]\n");
  EXPECT_EQ(threads_for_device(c, device_index(c.parallel, 0, 0, 0)), 1);
  EXPECT_EQ(threads_for_device(c, device_index(c.parallel, 0, 0, 1)), 2);
  EXPECT_EQ(threads_for_device(c, device_index(c.parallel, 1, 0, 0)), 3);
  EXPECT_EQ(device_spec(c, 3).kind, DeviceKind::Auto);
  EXPECT_THROW(threads_for_device(c, 4), std::out_of_range);
  EXPECT_THROW(threads_for_device(c, -1), std::out_of_range);
}

// A node's devices list is what it offers (configs/node.yaml: "list more
// entries ... to offer more"); its own parallel layout, unused, does not
// bound it.
TEST(RuntimeConfigTest, ANodesDevicesAreTheDevicesItOffers) {
  const std::string two = "devices: [{threads: 1}, {threads: 3}]\n";
  EXPECT_THROW(parse_config(two, "node.yaml"), ConfigError);  // as a deployment: 1 device
  const Config c = parse_config(two, "node.yaml", ConfigRole::Node);
  const std::vector<DeviceSpec> offered = node_devices(c, 0);
  ASSERT_EQ(offered.size(), 2u);
  EXPECT_EQ(offered[0].threads, 1);
  EXPECT_EQ(offered[1].threads, 3);
  EXPECT_EQ(node_devices(c, 2).size(), 2u);
  EXPECT_THROW(node_devices(c, 3), std::invalid_argument);
  // One entry: for every device, --devices N of them (default: the layout's).
  const Config one = parse_config("devices: [{threads: 2}]\n", "node.yaml", ConfigRole::Node);
  EXPECT_EQ(node_devices(one, 0).size(), 1u);
  ASSERT_EQ(node_devices(one, 4).size(), 4u);
  EXPECT_EQ(node_devices(one, 4)[3].threads, 2);
  // Overrides keep the role.
  Config o = one;
  apply_overrides(o, {{"devices", "[{threads: 1}, {threads: 1}, {threads: 1}]"}}, "--set",
                  ConfigRole::Node);
  EXPECT_EQ(node_devices(o, 0).size(), 3u);
  EXPECT_THROW(apply_overrides(o, {{"devices", "[{threads: 1}, {threads: 1}]"}}, "--set"),
               ConfigError);
  EXPECT_THROW(parse_config("devices: []\n", "node.yaml", ConfigRole::Node), ConfigError);
}

TEST(RuntimeConfigTest, ByteCountsTakeBinaryUnits) {
  const Config c = parse("kv_cache: {bytes: 256MiB}\nserver: {max_body_bytes: 64 KiB}\n");
  EXPECT_EQ(c.kv_cache.bytes, int64_t(256) << 20);
  EXPECT_EQ(c.kv_cache.blocks, 0);  // sized by bytes now
  EXPECT_EQ(c.server.max_body_bytes, 64 * 1024);
  expect_error("kv_cache: {bytes: 256MB}\n", "kv_cache.bytes", "expected a byte count");
  expect_error("kv_cache: {bytes: 99999999999TiB}\n", "kv_cache.bytes", "too large");
  expect_error("server: {max_body_bytes: 0}\n", "server.max_body_bytes",
               "expected a positive byte count, got 0");
  const Config d = parse("devices: [{kind: cpu, threads: 1, memory: 3GiB}]\n");
  EXPECT_EQ(d.devices[0].memory_bytes, int64_t(3) << 30);
  EXPECT_EQ(default_config().devices[0].memory_bytes, 0);  // no cap
  expect_error("devices: [{memory: -1}]\n", "devices[0].memory", "expected a byte count");
}

// ---- syntax and files ----

TEST(RuntimeConfigTest, YamlSyntaxErrorsGiveLineAndColumn) {
  const std::string m =
      expect_error("model:\n  path: [unclosed\nserver: {}\n", "", "YAML syntax error at line ");
  EXPECT_THAT(m, HasSubstr(", column "));
  expect_error("a: 1\n  b: 2\n", "", "YAML syntax error at line 2, column 4");
  // yaml-cpp 0.7's LoadAll loops forever on these (jbeder/yaml-cpp#1040).
  expect_error(",\n", "", "YAML syntax error at line 1, column 1: unexpected ','");
  expect_error(",model: {}\n", "", "unexpected ','");
  expect_error("model: {}\n...\n,\n", "", "YAML syntax error at line 3, column 1");
}

TEST(RuntimeConfigTest, LoadNamesTheFile) {
  troupe::test::TempDir dir;
  const auto file = dir / "bad.yaml";
  troupe::test::write_file(file, "logging:\n  level: loud\n");
  try {
    load_config(file);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              file.string() +
                  ": logging.level: expected one of trace, debug, info, warn, error, critical, "
                  "off, got 'loud' (line 2)");
  }
  try {
    load_config(dir / "missing.yaml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing.yaml: cannot read the config file"));
  }
  EXPECT_THROW(load_config(dir.path()), ConfigError);
  // ConfigError is an invalid_argument, so generic handlers catch it too.
  EXPECT_THROW(load_config(dir / "missing.yaml"), std::invalid_argument);
}

// ---- overrides ----

TEST(RuntimeConfigTest, OverridesApplyOnTop) {
  Config c = load_config(shipped("default.yaml"));
  apply_override(c, "batching.max_batch_tokens", "4096");
  apply_override(c, "parallel.replicas", "2");
  apply_override(c, "server.listen", "0.0.0.0:0");
  apply_override(c, "logging.level", "debug");
  apply_override(c, "model.path", "models/stories260K/stories260K.bin");
  apply_override(c, "model.tokenizer", "");
  apply_override(c, "routing.seed", "42");
  apply_override(c, "routing.latency_aware.ema_alpha", "0.5");
  apply_override(c, "admission.queue_timeout_s", "0.25");
  EXPECT_EQ(c.batching.max_batch_tokens, 4096);
  EXPECT_EQ(c.parallel.replicas, 2);
  EXPECT_EQ(threads_for_device(c, 1), 2);  // the single entry applies to both
  EXPECT_EQ(parse_listen(c.server.listen).second, 0);
  EXPECT_EQ(c.logging.level, spdlog::level::debug);
  EXPECT_EQ(served_model_name(c), "stories260K");
  EXPECT_EQ(c.routing.seed, 42u);
  EXPECT_EQ(c.routing.latency_aware.ema_alpha, 0.5);
  EXPECT_EQ(c.routing.latency_aware.probe_every_requests, 20u) << "the others keep theirs";
  // An IPv6 listen address is a value, not a flow list.
  apply_override(c, "server.listen", "[::1]:8081");
  EXPECT_EQ(parse_listen(c.server.listen), (std::pair<std::string, uint16_t>{"::1", 8081}));
  EXPECT_THROW(apply_override(c, "server.allowed_origins", "[a b"), ConfigError)
      << "a list with a syntax error is still one";
  EXPECT_EQ(c.admission.queue_timeout_s, 0.25);
}

TEST(RuntimeConfigTest, OverridesReachSectionsAndDeviceEntries) {
  Config c;
  apply_override(c, "parallel", "{replicas: 2, tensor: 2}");
  EXPECT_EQ(c.parallel.device_count(), 4);
  apply_override(c, "devices[0].threads", "3");
  EXPECT_EQ(threads_for_device(c, 3), 3);
  apply_override(c, "devices", "[{threads: 1}, {threads: 1}, {threads: 1}, {kind: cuda}]");
  EXPECT_EQ(device_spec(c, 3).kind, DeviceKind::Cuda);
  EXPECT_EQ(device_spec(c, 3).threads, 2);  // a new entry starts from the defaults
  apply_override(c, "devices[3]", "{threads: 5}");
  EXPECT_EQ(device_spec(c, 3).kind, DeviceKind::Cuda);
  EXPECT_EQ(device_spec(c, 3).threads, 5);
  // The command line replaces the file's KV sizing instead of conflicting with it.
  apply_override(c, "kv_cache.bytes", "1GiB");
  EXPECT_EQ(c.kv_cache.blocks, 0);
  apply_override(c, "kv_cache.blocks", "100");
  EXPECT_EQ(c.kv_cache.bytes, 0);
  EXPECT_EQ(c.kv_cache.blocks, 100);
}

TEST(RuntimeConfigTest, BadOverridesNameTheKeyAndChangeNothing) {
  Config c;
  const Config before = c;
  EXPECT_EQ(override_error(c, "batching.max_batch_tokens", "lots"),
            "command line: batching.max_batch_tokens: expected a positive integer, got 'lots'");
  EXPECT_THAT(override_error(c, "batching.max_batch_token", "1"),
              HasSubstr("command line: batching.max_batch_token: unknown key; did you mean "
                        "'max_batch_tokens'?"));
  EXPECT_THAT(override_error(c, "batching.max_batch_tokens", "100"),
              HasSubstr("batching.prefill_chunk_tokens: 512 is more than"));
  EXPECT_THAT(override_error(c, "routing.policy", "fastest"),
              HasSubstr("routing.policy: expected one of"));
  EXPECT_THAT(override_error(c, "devices[1].threads", "2"),
              HasSubstr("devices[1]: no such entry; devices has 1"));
  EXPECT_THAT(override_error(c, "batching..x", "2"), HasSubstr("not a key"));
  EXPECT_THAT(override_error(c, "devices[0].", "2"), HasSubstr("not a key"));
  EXPECT_THAT(override_error(c, "devices[0].threds", "2"),
              HasSubstr("devices[0].threds: unknown key; did you mean 'threads'?"));
  EXPECT_THAT(override_error(c, "devices[0]", "4"), HasSubstr("devices[0]: expected a map"));
  EXPECT_THAT(override_error(c, "devices[x].threads", "4"), HasSubstr("did you mean 'devices'?"));
  EXPECT_THAT(override_error(c, "parallel", "{replicas: [}"), HasSubstr("YAML syntax error"));
  EXPECT_THAT(override_error(c, "parallel", "{replicas: 2}\n---\n{}"),
              HasSubstr("another starts here"));
  EXPECT_THAT(override_error(c, "server.listen", "nowhere"),
              HasSubstr("server.listen: expected host:port"));
  EXPECT_EQ(c, before);
}

TEST(RuntimeConfigTest, OverridesThatOnlyFitTogetherAreValidatedTogether) {
  Config c = parse("parallel: {replicas: 2}\ndevices: [{threads: 1}, {threads: 3}]\n");
  const Config before = c;
  // Alone, three replicas do not fit two device entries...
  try {
    apply_override(c, "parallel.replicas", "3", "--set");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--set: devices: has 2 entries"));
  }
  EXPECT_EQ(c, before);
  // ...but together with a three-entry list they do.
  apply_overrides(c, {{"parallel.replicas", "3"}, {"devices", "[{threads: 1}, {threads: 1}, {}]"}});
  EXPECT_EQ(c.parallel.replicas, 3);
  EXPECT_EQ(threads_for_device(c, 2), 2);
}

// ---- round trip ----

Config everything_changed() {
  Config c;
  c.model = {"models/a dir/with: colon #hash", "tok/tokenizer.model", DType::BF16,
             QuantProducts::Int8, "true"};
  c.server = {"[::1]:0",
              4096,
              0.5,
              100,
              4,
              7,
              ChatTemplate::Llama2,
              "/srv/templates/my chat.jinja",
              ReasoningParser::DeepSeekR1,
              "sk-x: y",
              {"http://localhost:3000", "https://a.example"},
              true};
  c.parallel = {2, 3, 1};
  c.devices.clear();
  for (int i = 0; i < 6; ++i)
    c.devices.push_back({i % 2 ? DeviceKind::Cuda : DeviceKind::Auto, i + 1, int64_t(i) << 30});
  c.batching = {8, 1024, 256, 7};
  c.kv_cache = {32, 0, int64_t(3) << 30};
  c.routing.policy = "power_of_two";
  c.routing.seed = 18446744073709551615ull;
  c.routing.latency_aware = {0.125, 0.02, 1500.5, 0.1, 2.5, 7, 0, 3};
  c.admission = {10, 5, 1e-3, TimeoutAction::Keep};
  c.supervision = {0, 0.1};
  c.logging.level = spdlog::level::off;
  return c;
}

TEST(RuntimeConfigTest, ToYamlRoundTrips) {
  for (const Config& c :
       {default_config(), load_config(shipped("two-replicas.yaml")), everything_changed()}) {
    const std::string yaml = to_yaml(c);
    Config back;
    ASSERT_NO_THROW(back = parse_config(yaml, "printed")) << yaml;
    EXPECT_EQ(back, c) << yaml;
    EXPECT_EQ(to_yaml(back), yaml);
  }
  EXPECT_THAT(to_yaml(default_config()), HasSubstr("max_batch_tokens: 2048"));
}

// ---- helpers ----

TEST(RuntimeConfigTest, ParseListen) {
  EXPECT_EQ(parse_listen("127.0.0.1:8080"),
            std::make_pair(std::string("127.0.0.1"), uint16_t(8080)));
  EXPECT_EQ(parse_listen("localhost:0"), std::make_pair(std::string("localhost"), uint16_t(0)));
  EXPECT_EQ(parse_listen("[::1]:65535"), std::make_pair(std::string("::1"), uint16_t(65535)));
  for (const char* bad : {"", "8080", "host:", "host:-1", "host:65536", "host:8080x", "[::1]8080",
                          "[::1]", "a b:80", ":80", "host:+80"}) {
    EXPECT_THROW(parse_listen(bad), std::invalid_argument) << bad;
  }
}

TEST(RuntimeConfigTest, DeviceIndexIsReplicaMajor) {
  const ParallelLayout p{2, 3, 2};
  EXPECT_EQ(device_index(p, 0, 0, 0), 0);
  EXPECT_EQ(device_index(p, 0, 0, 1), 1);
  EXPECT_EQ(device_index(p, 0, 1, 0), 2);
  EXPECT_EQ(device_index(p, 1, 0, 0), 6);
  EXPECT_EQ(device_index(p, 1, 2, 1), 11);
  EXPECT_THROW(device_index(p, 2, 0, 0), std::out_of_range);
  EXPECT_THROW(device_index(p, 0, 3, 0), std::out_of_range);
  EXPECT_THROW(device_index(p, 0, 0, 2), std::out_of_range);
}

TEST(RuntimeConfigTest, ServedModelName) {
  Config c;
  EXPECT_EQ(served_model_name(c), "fortune");
  c.model.path = "models/fortune/";
  EXPECT_EQ(served_model_name(c), "fortune");
  c.model.path = "/data/llama-3.2-1b";
  EXPECT_EQ(served_model_name(c), "llama-3.2-1b");
  c.model.path = "models/stories260K/stories260K.bin";
  EXPECT_EQ(served_model_name(c), "stories260K");
  c.model.name = "tiny";
  EXPECT_EQ(served_model_name(c), "tiny");
}

TEST(RuntimeConfigTest, AdmissionOptionsBuildAQueue) {
  const Config c = parse("admission: {max_queue: 3, priority_levels: 4, on_timeout: keep}\n");
  const AdmissionQueueOptions options = admission_queue_options(c);
  EXPECT_EQ(options.max_size, 3u);
  EXPECT_EQ(options.priority_levels, 4u);
  EXPECT_EQ(options.on_timeout, TimeoutAction::Keep);
  AdmissionQueue queue(options);
  EXPECT_EQ(queue.priority_levels(), 4u);
}

// ---- layout against the model ----

ModelConfig model_shape(int layers, int heads, int kv_heads, int vocab) {
  ModelConfig m;
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  m.vocab_size = vocab;
  m.hidden_dim = 768;
  return m;
}

TEST(RuntimeConfigTest, LayoutForModel) {
  // models/fortune: 5 layers, 6 heads, 2 KV heads, vocabulary 2000.
  Config c;
  auto layout_error = [&](int pipeline, int tensor) -> std::string {
    c.parallel = {1, pipeline, tensor};
    try {
      validate_layout_for_model(c, model_shape(5, 6, 2, 2000));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(layout_error(1, 1), "");
  EXPECT_EQ(layout_error(1, 2), "");
  EXPECT_EQ(layout_error(5, 6), "");  // 3 query heads per shard, each KV head on 3 shards
  EXPECT_THAT(layout_error(1, 4),
              HasSubstr("parallel.tensor = 4 does not divide the model's 6 attention heads"));
  EXPECT_THAT(layout_error(1, 4), HasSubstr("tensor degrees that fit this model: 1, 2, 6"));
  EXPECT_THAT(layout_error(1, 4), HasSubstr("models/fortune"));
  EXPECT_THAT(layout_error(1, 3),
              HasSubstr("parallel.tensor = 3 can neither split nor evenly replicate the model's "
                        "2 KV heads"));
  EXPECT_THAT(layout_error(6, 1),
              HasSubstr("parallel.pipeline = 6 is more than the model's 5 layers"));

  // stories260K: 8 heads, 4 KV heads; T=8 replicates each KV head on 2 shards.
  c.parallel = {2, 2, 8};
  EXPECT_NO_THROW(validate_layout_for_model(c, model_shape(5, 8, 4, 512)));
  c.parallel = {1, 1, 2};
  EXPECT_THROW(validate_layout_for_model(c, model_shape(5, 6, 4, 512)),
               std::invalid_argument);  // 6 % 4
  EXPECT_THROW(validate_layout_for_model(c, model_shape(0, 6, 2, 512)), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
