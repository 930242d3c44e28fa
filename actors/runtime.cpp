#include "actors/runtime.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <thread>

#include "actors/messages.h"
#include "gpu/parallel_engine.h"
#include "scheduler/partitioner.h"

namespace troupe {

std::vector<std::pair<int, int>> balanced_stages(const LayerProfile& profile, int stages,
                                                 const StageMemory& memory) {
  if (stages <= 1) return {};
  PartitionRequest req;
  req.stages = stages;
  req.layer_cost_s = profile.seconds;
  if (!memory.stage_cap_bytes.empty()) {
    for (uint64_t w : profile.weight_bytes)
      req.layer_memory_bytes.push_back(w + memory.kv_bytes_per_layer);
    req.stage_memory_cap_bytes = memory.stage_cap_bytes;
  }
  const StagePartition p = partition_layers(req);
  std::vector<std::pair<int, int>> out;
  std::string text;
  for (int s = 0; s < p.stages(); ++s) {
    out.emplace_back(p.begin(s), p.end(s));
    text += fmt::format("{}[{}, {}) {:.3f} ms", s ? ", " : "", p.begin(s), p.end(s),
                        p.stage_cost_s[size_t(s)] * 1e3);
  }
  spdlog::info("pipeline stages from measured layer times: {}", text);
  return out;
}

ActorRuntime::ActorRuntime(std::shared_ptr<const Model> model, ServingOptions o, Metrics* metrics)
    : options_(std::move(o)),
      router_shared_(std::make_shared<RouterShared>()),
      supervisor_shared_(std::make_shared<SupervisorShared>(options_.replicas)) {
  if (options_.pipeline != 1 || options_.tensor != 1)
    throw std::invalid_argument(
        "a layout with pipeline or tensor > 1 needs the checkpoint, not a model");
  std::vector<EngineFactory> factories;
  for (int r = 0; r < options_.replicas; ++r) {
    EngineOptions eo{threads_of(r), options_.block_tokens, options_.kv_blocks};
    factories.push_back(
        [model, eo](const DeviceLauncher&) { return std::make_unique<Engine>(model, eo); });
  }
  start(model->config(), std::move(factories), metrics);
}

ActorRuntime::ActorRuntime(std::shared_ptr<const Checkpoint> ckpt, DType dtype, ServingOptions o,
                           Metrics* metrics)
    : options_(std::move(o)),
      router_shared_(std::make_shared<RouterShared>()),
      supervisor_shared_(std::make_shared<SupervisorShared>(options_.replicas)) {
  const int per_replica = options_.pipeline * options_.tensor;
  // Stages are balanced on layer times measured once, on a device like the
  // first one; replicas differ only in their memory caps.
  LayerProfile profile;
  if (options_.pipeline > 1 && options_.stage_layers.empty()) {
    LayerProfileOptions po;
    po.threads = threads_of(0);
    profile = profile_layers(*ckpt, dtype, po);
  }
  std::vector<EngineFactory> factories;
  for (int r = 0; r < options_.replicas; ++r) {
    ParallelLayout l;
    l.pipeline = options_.pipeline;
    l.tensor = options_.tensor;
    l.threads.clear();
    for (int d = 0; d < per_replica; ++d) l.threads.push_back(threads_of(r * per_replica + d));
    l.stage_layers = options_.stage_layers.empty()
                         ? balanced_stages(profile, options_.pipeline, stage_memory(*ckpt, r))
                         : options_.stage_layers;
    stage_layers_.push_back(l.stage_layers);
    l.credits = options_.pipeline_credits;
    l.block_tokens = options_.block_tokens;
    l.blocks = options_.kv_blocks;
    // Fail at start-up, not in a worker, when the layout does not fit.
    if (r == 0) shard_dims(ckpt->config, ShardSpec{0, l.tensor, 0, -1});
    factories.push_back([ckpt, dtype, l](const DeviceLauncher& launcher) {
      return std::make_unique<ParallelEngine>(*ckpt, dtype, l, launcher);
    });
  }
  start(ckpt->config, std::move(factories), metrics);
}

StageMemory ActorRuntime::stage_memory(const Checkpoint& ckpt, int replica) const {
  StageMemory m;
  const auto& caps = options_.device_memory_bytes;
  if (caps.empty() || std::all_of(caps.begin(), caps.end(), [](int64_t b) { return b == 0; }))
    return m;
  const ModelConfig& c = ckpt.config;
  // A layer's KV share on one device: the replica's blocks for that layer.
  m.kv_bytes_per_layer = uint64_t(options_.kv_blocks) * uint64_t(options_.block_tokens) * 2 *
                         uint64_t(c.kv_dim()) * sizeof(float);
  const int P = options_.pipeline, T = options_.tensor;
  for (int s = 0; s < P; ++s) {
    // A stage's T shards split its layers: it holds T times its smallest
    // shard's memory (0 is no cap).
    uint64_t cap = std::numeric_limits<uint64_t>::max();
    for (int t = 0; t < T; ++t) {
      const int d = (replica * P + s) * T + t;
      const int64_t b = caps.size() == 1 ? caps[0] : caps.at(size_t(d));
      if (b > 0) cap = std::min(cap, uint64_t(b) * uint64_t(T));
    }
    m.stage_cap_bytes.push_back(cap);
  }
  return m;
}

int ActorRuntime::threads_of(int device) const {
  if (options_.threads.empty()) return 1;
  if (options_.threads.size() == 1) return options_.threads[0];
  return options_.threads.at(size_t(device));
}

void ActorRuntime::start(const ModelConfig& config, std::vector<EngineFactory> factories,
                         Metrics* metrics) {
  if (options_.replicas < 1) throw std::invalid_argument("parallel.replicas must be at least 1");
  const size_t devices = size_t(options_.replicas * options_.pipeline * options_.tensor);
  if (options_.threads.size() > 1 && options_.threads.size() != devices)
    throw std::invalid_argument("give one thread count, or one per device");
  ContinuousBatchPolicy check(options_.batching, options_.block_tokens);  // validates limits
  const int ctx_blocks = (config.max_seq_len + options_.block_tokens - 1) / options_.block_tokens;
  if (options_.kv_blocks < ctx_blocks)
    throw std::invalid_argument("kv_cache holds " + std::to_string(options_.kv_blocks) +
                                " blocks per device, fewer than one full-context sequence needs (" +
                                std::to_string(ctx_blocks) + ")");
  cfg_.set("scheduler.max-threads", options_.scheduler_threads);
  // CAF's idle threads poll for 100 rounds and then wake every 50 us for
  // 500 more before sleeping on a condition variable. Between engine steps
  // (milliseconds apart) that polling takes CPU from the device threads,
  // which on a small machine share the cores with it: go to sleep at once;
  // an enqueue wakes a sleeping thread.
  cfg_.set("work-stealing.aggressive-poll-attempts", 10);
  cfg_.set("work-stealing.moderate-poll-attempts", 0);
  system_ = std::make_unique<caf::actor_system>(cfg_);

  RouterOptions ro;
  ro.replicas = options_.replicas;
  ro.max_seq_len = config.max_seq_len;
  ro.max_batch_sequences = options_.batching.max_batch_sequences;
  ro.max_waiting_per_replica = options_.max_waiting_per_replica;
  ro.routing_policy = options_.routing_policy;
  ro.routing_seed = options_.routing_seed;
  ro.admission = options_.admission;
  router_ = system_->spawn(router_actor, ro, router_shared_, metrics);

  SupervisorOptions so;
  so.replicas = options_.replicas;
  so.max_restarts = options_.max_restarts;
  so.window_s = options_.restart_window_s;
  for (int r = 0; r < options_.replicas; ++r) {
    BatcherOptions b;
    b.replica = r;
    b.engine = std::move(factories[size_t(r)]);
    b.block_tokens = options_.block_tokens;
    b.kv_blocks = options_.kv_blocks;
    b.limits = options_.batching;
    b.metrics = metrics;
    b.groups = options_.pipeline;  // one step in flight per stage
    so.batchers.push_back(std::move(b));
  }
  supervisor_ = system_->spawn(supervisor_actor, router_, config, so, supervisor_shared_, metrics);
}

ActorRuntime::~ActorRuntime() {
  caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(router_, caf::exit_reason::user_shutdown);
  system_->await_all_actors_done();
}

void ActorRuntime::submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) {
  caf::anon_send(router_, submit_atom::value, std::move(request), std::move(sink));
}

void ActorRuntime::cancel(uint64_t request_id) {
  caf::anon_send(router_, cancel_atom::value, request_id);
}

std::vector<ReplicaStatus> ActorRuntime::replica_status() const {
  std::vector<ReplicaStatus> out(size_t(options_.replicas));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].restarts = supervisor_shared_->restarts[i].load();
    out[i].failed = supervisor_shared_->failed[i].load();
    std::lock_guard<std::mutex> l(supervisor_shared_->mu);
    out[i].last_death = supervisor_shared_->last_death[i];
  }
  return out;
}

void ActorRuntime::inject_crash(int replica) {
  caf::anon_send(supervisor_, crash_atom::value, replica);
}

void ActorRuntime::inject_shard_crash(int replica, int device) {
  caf::anon_send(supervisor_, crash_atom::value, replica, device);
}

void ActorRuntime::inject_slowness(int replica, double seconds) {
  caf::anon_send(supervisor_, slow_atom::value, replica, seconds);
}

bool ActorRuntime::wait_live(int n, double timeout_s) const {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (live_replicas() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return live_replicas() >= n;
}

}  // namespace troupe
