// `troupe serve`: the OpenAI-compatible HTTP API over the actor runtime.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>

#include "actors/runtime.h"
#include "schema/config.h"
#include "apps/commands.h"
#include "net/http_server.h"

namespace troupe::app {

namespace {

struct ServeOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string listen;
  bool print_config = false;
};

ServingOptions serving_options(const RuntimeConfig& c, const troupe::ModelConfig& model) {
  ServingOptions o;
  o.replicas = c.parallel.replicas;
  o.pipeline = c.parallel.pipeline;
  o.tensor = c.parallel.tensor;
  o.threads.clear();
  for (int d = 0; d < c.parallel.device_count(); ++d) {
    o.threads.push_back(threads_for_device(c, d));
    o.device_memory_bytes.push_back(device_spec(c, d).memory_bytes);
  }
  o.block_tokens = c.kv_cache.block_tokens;
  o.kv_blocks = c.kv_cache.bytes > 0 ? KvCache::blocks_for_bytes(model, c.kv_cache.block_tokens,
                                                                 size_t(c.kv_cache.bytes))
                                     : int(c.kv_cache.blocks);
  o.batching = {c.batching.max_batch_sequences, c.batching.max_batch_tokens,
                c.batching.prefill_chunk_tokens};
  o.max_waiting_per_replica = c.batching.max_waiting;
  o.routing_policy = c.routing.policy;
  o.routing_seed = c.routing.seed;
  o.admission.max_size = size_t(c.admission.max_queue);
  o.admission.priority_levels = size_t(c.admission.priority_levels);
  o.admission.max_wait_s = c.admission.queue_timeout_s;
  o.admission.on_timeout = c.admission.on_timeout;
  o.max_restarts = c.supervision.max_restarts;
  o.restart_window_s = c.supervision.within_s;
  return o;
}

void run_serve(const ServeOptions& so) {
  RuntimeConfig cfg;
  if (!so.config.empty()) {
    cfg = load_runtime_config(so.config);
  } else {
    const auto def = default_model_path().parent_path().parent_path() / "configs" / "default.yaml";
    cfg = std::filesystem::exists(def) ? load_runtime_config(def) : default_runtime_config();
  }
  for (const auto& kv : so.overrides) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw UsageError("--set expects KEY=VALUE, got '" + kv + "'");
    apply_override(cfg, kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (!so.listen.empty()) apply_override(cfg, "server.listen", so.listen);
  if (so.print_config) {
    std::cout << to_yaml(cfg);
    return;
  }
  spdlog::set_level(cfg.logging.level);
  for (const auto& d : cfg.devices)
    if (d.kind == DeviceKind::Cuda)
      throw UsageError("devices: kind cuda is not available in this build yet; use cpu or auto");
  // One whole model shared by the replicas, or each replica's devices
  // packing their own shards from the memory-mapped checkpoint.
  auto ckpt = std::make_shared<const Checkpoint>(load_checkpoint(cfg.model.path));
  const ModelConfig mc = ckpt->config;
  validate_layout_for_model(cfg, mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.vocab_size);
  const bool whole = cfg.parallel.pipeline == 1 && cfg.parallel.tensor == 1;
  std::shared_ptr<const Model> model;
  if (whole) model = std::make_shared<const Model>(*ckpt, cfg.model.dtype);
  std::optional<Tokenizer> tokenizer;
  const std::filesystem::path tok_path = cfg.model.tokenizer.empty()
                                             ? ckpt->tokenizer_path
                                             : std::filesystem::path(cfg.model.tokenizer);
  if (!tok_path.empty())
    tokenizer = Tokenizer::load(tok_path);
  else
    spdlog::warn("no tokenizer for {}: only token-id prompts are accepted", cfg.model.path);

  Metrics metrics;
  auto runtime_ptr = whole
                         ? std::make_unique<ActorRuntime>(model, serving_options(cfg, mc), &metrics)
                         : std::make_unique<ActorRuntime>(ckpt, cfg.model.dtype,
                                                          serving_options(cfg, mc), &metrics);
  ActorRuntime& runtime = *runtime_ptr;
  const auto [host, port] = parse_listen(cfg.server.listen);
  HttpServer::Options ho;
  ho.host = host;
  ho.port = port;
  ho.max_body_bytes = size_t(cfg.server.max_body_bytes);
  ho.request_timeout_s = cfg.server.request_timeout_s;
  ho.io_threads = cfg.server.io_threads;
  openai::ModelLimits limits{served_model_name(cfg), mc.max_seq_len, mc.vocab_size,
                             cfg.server.max_tokens_limit};
  // Block the shutdown signals before any thread starts, so sigwait below
  // is the only one to receive them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  sigaddset(&signals, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  HttpServer server(ho, runtime, tokenizer, limits, metrics);
  server.start();
  std::fprintf(
      stderr,
      "troupe serve: model %s (%s), %d replica(s) x %d stage(s) x %d shard(s), listening on "
      "http://%s:%u\n",
      limits.name.c_str(), dtype_name(cfg.model.dtype), cfg.parallel.replicas,
      cfg.parallel.pipeline, cfg.parallel.tensor, host.c_str(), unsigned(server.port()));
  std::fflush(stderr);
  // Fault-injection hooks for tests and chaos runs: SIGUSR1 crashes replica
  // 0, SIGUSR2 the last replica: its worker, or with a multi-device layout
  // its last shard, mid-step.
  const int devices = cfg.parallel.pipeline * cfg.parallel.tensor;
  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig == SIGUSR1 || sig == SIGUSR2) {
      const int replica = sig == SIGUSR1 ? 0 : cfg.parallel.replicas - 1;
      if (devices > 1) {
        spdlog::warn("signal {}: killing shard {} of replica {}", sig, devices - 1, replica);
        runtime.inject_shard_crash(replica, devices - 1);
      } else {
        spdlog::warn("signal {}: injecting a crash into replica {}", sig, replica);
        runtime.inject_crash(replica);
      }
      continue;
    }
    break;
  }
  spdlog::info("signal {}: shutting down", sig);
  server.stop();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve the OpenAI-compatible HTTP API (POST /v1/completions, ...)");
  cmd->add_option("--config,-c", o->config, "Deployment YAML (default: configs/default.yaml)");
  cmd->add_option("--set", o->overrides,
                  "Override a config key, e.g. --set parallel.replicas=2 (repeatable)");
  cmd->add_option("--listen", o->listen,
                  "Override server.listen (host:port; port 0 = any free port)");
  cmd->add_flag("--print-config", o->print_config, "Print the effective configuration and exit");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace troupe::app
