#pragma once
// The one configuration every `troupe` command builds: a YAML file, then
// command-line overrides on top, all validated before anything starts, so a
// typo stops start-up with a message naming the file and the key instead of
// surfacing later as odd behaviour. Each key is declared once, in
// config.cpp's schema (deploy/yaml_schema.h does the reading, checking and
// writing). Checks that need the model (heads divisible by the tensor
// degree, ...) live in validate_layout_for_model, called once it is loaded.
#include <spdlog/common.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "deploy/yaml_schema.h"
#include "gpu/dtype.h"
#include "gpu/model_config.h"
#include "scheduler/admission_queue.h"
#include "scheduler/routing_policy.h"
#include "service/chat_template.h"

namespace troupe {

// One struct per YAML section. Named *Section rather than *Config because
// troupe::ModelConfig (gpu/model_config.h) is the model's shape, and both
// headers meet in every command.
struct ModelSection {
  std::string path = "models/fortune";  // llama2.c .bin, or a Hugging Face directory
  std::string tokenizer;                // empty: the tokenizer beside the weights
  DType dtype = DType::F32;             // weights in memory
  // How CPU devices multiply a GGUF's block-quantized weights (gpu/dtype.h).
  QuantProducts quantized_products = QuantProducts::Exact;
  std::string name;  // empty: see served_model_name()
  bool operator==(const ModelSection&) const = default;
};

struct ServerSection {
  std::string listen = "127.0.0.1:8080";  // host:port; port 0 = any free port
  int64_t max_body_bytes = 1048576;
  double request_timeout_s = 120;  // 0 = no limit
  int max_tokens_limit = 4096;     // cap on a request's max_tokens
  int io_threads = 1;
  // On SIGTERM or SIGINT: new requests get 503 at once; those in flight get
  // this long to finish, then end with 503 (a stream: an error event and
  // [DONE]). 0: end them at once.
  double shutdown_grace_s = 5;
  // How /v1/chat/completions renders messages into a prompt (plain, llama2,
  // zephyr, ...; auto: the model's own Jinja template, interpreted).
  ChatTemplate chat_template = ChatTemplate::Auto;
  // Not empty: a Jinja chat template file rendered instead (vLLM's
  // --chat-template).
  std::string chat_template_file;
  // How a chat answer's reasoning ("<think>...</think>") is told from its
  // reply, returned as message.reasoning_content (vLLM's --reasoning-parser):
  // none, deepseek_r1 or qwen3.
  ReasoningParser reasoning_parser = ReasoningParser::None;
  // Not empty: the model's endpoints (/v1/*, /tokenize, /detokenize) need
  // `Authorization: Bearer <api_key>` (vLLM's --api-key). Empty: the
  // TROUPE_API_KEY environment variable, if set, when troupe serve starts.
  std::string api_key;
  // Web pages whose scripts may call the API from a browser (CORS): "*" for
  // any, as vLLM and llama-server; [] for none.
  std::vector<std::string> allowed_origins = {"*"};
  // One info line per answered request: client, request, status, time, and
  // a completion's token counts and time to its first token.
  bool access_log = false;
  bool operator==(const ServerSection&) const = default;
};

// R replicas, each split into P pipeline stages of T tensor shards.
struct ParallelLayout {
  int replicas = 1;
  int pipeline = 1;
  int tensor = 1;
  int device_count() const { return replicas * pipeline * tensor; }
  bool operator==(const ParallelLayout&) const = default;
};

enum class DeviceKind { Cpu, Cuda, Auto };
const char* device_kind_name(DeviceKind k);  // "cpu", "cuda", "auto"

struct DeviceSpec {
  DeviceKind kind = DeviceKind::Cpu;
  int threads = 2;           // CPU threads (compute for cpu; host-side work for cuda)
  int64_t memory_bytes = 0;  // cap on weights + KV cache the device holds; 0: none
  // cuda (and auto when it picks CUDA): the CUDA device; -1: the device's
  // number in the layout (replica r of a one-device layout on GPU r).
  int index = -1;
  bool operator==(const DeviceSpec&) const = default;
};

struct BatchingSection {
  int max_batch_sequences = 32;
  int max_batch_tokens = 2048;
  int prefill_chunk_tokens = 512;
  int max_waiting = 256;  // per replica
  // Plan each step while the one before it runs (replicas without a
  // pipeline): the device never waits for the batcher, at the price of a
  // request arriving mid-step joining one step later.
  bool async_scheduling = true;
  bool operator==(const BatchingSection&) const = default;
};

// Capacity is given either as a block count or as a byte budget (the count
// then follows from the model's KV size per token); exactly one is non-zero.
struct KvCacheSection {
  int block_tokens = 16;
  int64_t blocks = 4096;
  int64_t bytes = 0;
  // Elements of a CPU device's cache: f32 (exact), or f16/bf16 (half the
  // memory and of what decode's attention reads; keys and values rounded
  // once when written).
  DType dtype = DType::F32;
  // Full blocks stay indexed by their tokens after their sequence ends, and a
  // prompt that starts with them takes them instead of computing them again.
  bool prefix_caching = true;
  bool operator==(const KvCacheSection&) const = default;
};

struct RoutingSection {
  std::string policy = "latency_aware";  // one of routing_policy_names()
  uint64_t seed = 1;                     // for the random policies
  LatencyAwareOptions latency_aware;     // its estimates' constants
  bool operator==(const RoutingSection&) const = default;
};

struct AdmissionSection {
  int max_queue = 256;
  int priority_levels = 2;
  double queue_timeout_s = 30;  // 0 = no limit
  TimeoutAction on_timeout = TimeoutAction::Reject;
  bool operator==(const AdmissionSection&) const = default;
};

// Erlang-style restart intensity: at most max_restarts within within_s.
struct SupervisionSection {
  int max_restarts = 3;
  double within_s = 10;
  bool operator==(const SupervisionSection&) const = default;
};

// Many processes: `troupe serve` is the coordinator (HTTP API, router,
// supervisor, placement) and `troupe node --join HOST:PORT` processes offer
// their devices to it.
struct NodesSection {
  std::string listen;                 // coordinator: host:port nodes join on; empty: no nodes
  bool local = true;                  // coordinator: also place replicas on its own devices
  std::string token;                  // what a node must present to join; empty: none
  double heartbeat_timeout_s = 2;     // a node (or coordinator) silent this long is dead
  std::string name;                   // troupe node: this node's name; empty: host-pid
  std::string address = "127.0.0.1";  // troupe node: where peers reach it (data plane)
  bool operator==(const NodesSection&) const = default;
};

// Where replicas run: per replica index, a node name, "local" (the
// coordinator's own devices) or "any"; replicas beyond the list: any.
struct PlacementSection {
  std::vector<std::string> replicas;
  bool operator==(const PlacementSection&) const = default;
};

// Run-time administration over HTTP. Off by default: POST/GET
// /admin/faults (fault injection) exist only with faults on, and answer only
// requests that carry `Authorization: Bearer <token>`.
struct AdminSection {
  bool faults = false;
  std::string token;
  bool operator==(const AdminSection&) const = default;
};

// CUDA devices (kind cuda, or auto where a GPU answers).
struct CudaSection {
  // A sequence's logits do not depend on what else is in its step, so a
  // request resumed on another replica gives the same tokens (the runtime's
  // promise); off is faster and keeps that only approximately.
  bool deterministic = true;
  bool graphs = true;                 // decode steps replay captured CUDA graphs
  int64_t reserve_bytes = 1LL << 30;  // device memory left outside the pool
  bool operator==(const CudaSection&) const = default;
};

struct LoggingSection {
  spdlog::level::level_enum level = spdlog::level::info;
  bool operator==(const LoggingSection&) const = default;
};

struct Config {
  ModelSection model;
  ServerSection server;
  ParallelLayout parallel;
  // One entry per device (parallel.device_count() of them, ordered as
  // device_index() numbers them), or one entry applied to every device.
  std::vector<DeviceSpec> devices{DeviceSpec{}};
  BatchingSection batching;
  KvCacheSection kv_cache;
  RoutingSection routing;
  AdmissionSection admission;
  SupervisionSection supervision;
  NodesSection nodes;
  PlacementSection placement;
  AdminSection admin;
  CudaSection cuda;
  LoggingSection logging;
  bool operator==(const Config&) const = default;
};

Config default_config();

// Why `name` is not a routing policy (the registered ones listed, the
// nearest suggested); empty when it is one.
std::string routing_policy_problem(const std::string& name);

// What a configuration describes, for the devices list. A deployment's
// (`serve`, `generate`, `bench`) devices are its layout's:
// parallel.device_count() entries, or one entry for every device. A node's
// (`troupe node`) are the devices it offers, one entry each (or one entry
// for all, with --devices N); the coordinator's layout decides what runs on
// them, so its own `parallel` does not bound the list.
enum class ConfigRole { Deployment, Node };

// Reads and validates a YAML file; every key is optional.
Config load_config(const std::filesystem::path& file, ConfigRole role = ConfigRole::Deployment);
// The same from text; `source_name` prefixes error messages (a file name).
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    ConfigRole role = ConfigRole::Deployment);

// Sets one key, e.g. ("batching.max_batch_tokens", "4096"), with the same
// checks as the file, then re-validates the whole config. A value that starts
// with '{' or '[' is YAML flow ("parallel" = "{replicas: 2}", "devices" =
// "[{kind: cpu, threads: 1}]"); `devices[N].threads` reaches one entry.
// Setting kv_cache.blocks clears kv_cache.bytes and vice versa: the command
// line replaces the file's sizing rather than conflicting with it.
void apply_override(Config& config, const std::string& dotted_key, const std::string& value,
                    const std::string& source_name = "command line");
// Applies several, validating once at the end, so that overrides which only
// make sense together (--replicas 2 with a two-entry device list) are allowed.
void apply_overrides(Config& config,
                     const std::vector<std::pair<std::string, std::string>>& key_values,
                     const std::string& source_name = "command line",
                     ConfigRole role = ConfigRole::Deployment);

// The checks that span keys and every range check; the loaders call it, and
// code that builds a Config by hand should too. Throws ConfigError.
void validate_config(const Config& config, const std::string& source_name = "config",
                     ConfigRole role = ConfigRole::Deployment);

// The devices a node (ConfigRole::Node) offers: `count` of them (0: one per
// devices entry when it lists several, else parallel.device_count()), each
// as its entry says, or all as the single entry says. Throws
// std::invalid_argument when `count` and a list of several disagree.
std::vector<DeviceSpec> node_devices(const Config& config, int count);

// YAML that parse_config reads back as an equal config (--print-config).
std::string to_yaml(const Config& config);

// "host:port" or "[v6addr]:port" -> (host, port). Throws std::invalid_argument.
std::pair<std::string, uint16_t> parse_listen(const std::string& listen);

// Device numbering: replica-major, then stage, then shard, so one replica's
// devices are contiguous and so are one stage's shards.
int device_index(const ParallelLayout& parallel, int replica, int stage, int shard);
// The entry that applies to device `device_index` (the single entry when
// there is one). Throws std::out_of_range for an index outside the layout.
const DeviceSpec& device_spec(const Config& config, int device_index);
int threads_for_device(const Config& config, int device_index);

// model.name, or the weights' name: "models/fortune" -> "fortune",
// "models/stories260K/stories260K.bin" -> "stories260K".
std::string served_model_name(const Config& config);

// The tokenizer to use: model.tokenizer when set, else the one found beside
// the weights (`beside_weights`, empty when there is none).
std::filesystem::path tokenizer_path(const Config& config,
                                     const std::filesystem::path& beside_weights);

// Options for the admission queue in front of the replicas.
AdmissionQueueOptions admission_queue_options(const Config& config);

// Throws ConfigError (key parallel.tensor or parallel.pipeline) when the
// parallel layout does not fit the model (gpu/model.h's check_layout_fits,
// the one rule), and std::invalid_argument for impossible model dimensions.
void validate_layout_for_model(const Config& config, const ModelConfig& model);

}  // namespace troupe
