#include "actors/runtime.h"

#include <chrono>
#include <stdexcept>
#include <thread>

#include "actors/messages.h"
#include "gpu/parallel_engine.h"
#include "scheduler/partitioner.h"

namespace troupe {

std::vector<std::pair<int, int>> balanced_stages(const ModelConfig& c, int stages, DType dtype) {
  if (stages <= 1) return {};
  // Decode streams every weight once per step, so a layer's cost is its
  // weight bytes; the classifier's bytes weigh on the last layer.
  const double esz = double(dtype_size(dtype));
  const double layer = esz * (2.0 * double(c.q_dim()) * c.dim + 2.0 * double(c.kv_dim()) * c.dim +
                              3.0 * double(c.dim) * c.hidden_dim);
  PartitionRequest req;
  req.stages = stages;
  req.layer_cost_s.assign(size_t(c.n_layers), layer / 1e10);
  req.layer_cost_s.back() += esz * double(c.vocab_size) * c.dim / 1e10;
  const StagePartition p = partition_layers(req);
  std::vector<std::pair<int, int>> out;
  for (int s = 0; s < p.stages(); ++s)
    out.emplace_back(p.boundaries[size_t(s)], p.boundaries[size_t(s) + 1]);
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
  std::vector<EngineFactory> factories;
  for (int r = 0; r < options_.replicas; ++r) {
    ParallelLayout l;
    l.pipeline = options_.pipeline;
    l.tensor = options_.tensor;
    l.threads.clear();
    for (int d = 0; d < per_replica; ++d) l.threads.push_back(threads_of(r * per_replica + d));
    l.stage_layers = options_.stage_layers.empty()
                         ? balanced_stages(ckpt->config, options_.pipeline, dtype)
                         : options_.stage_layers;
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
