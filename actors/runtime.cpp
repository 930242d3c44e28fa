#include "actors/runtime.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace troupe {

namespace {
// CAF's cooperative threads: routing and batching are light work.
constexpr int kSchedulerThreads = 2;
}  // namespace

ActorRuntime::ActorRuntime(const Config& config, std::shared_ptr<EngineBuilder> engines,
                           Metrics* metrics)
    : ActorRuntime(
          config, engines->model(),
          [engines](int, const EngineSpec& spec) {
            const EngineSpec resolved = engines->resolve(spec);
            return ReplicaEngine{engines->factory(resolved), resolved};
          },
          metrics) {}

ActorRuntime::ActorRuntime(const Config& config, const ModelConfig& model, EngineSource engine_for,
                           Metrics* metrics)
    : replicas_(config.parallel.replicas),
      router_shared_(std::make_shared<RouterShared>()),
      supervisor_shared_(std::make_shared<SupervisorShared>(config.parallel.replicas)) {
  validate_config(config);
  validate_layout_for_model(config, model);
  const BatchLimits limits{config.batching.max_batch_sequences, config.batching.max_batch_tokens,
                           config.batching.prefill_chunk_tokens};
  SupervisorOptions so;
  so.max_restarts = config.supervision.max_restarts;
  so.window_s = config.supervision.within_s;
  for (int r = 0; r < replicas_; ++r) {
    ReplicaEngine engine = engine_for(r, engine_spec(config, model, r));
    const EngineSpec& spec = engine.spec;
    const int ctx_blocks = (model.max_seq_len + spec.block_tokens - 1) / spec.block_tokens;
    if (spec.blocks < ctx_blocks)
      throw std::invalid_argument("kv_cache holds " + std::to_string(spec.blocks) +
                                  " blocks per device, fewer than one full-context sequence "
                                  "needs (" +
                                  std::to_string(ctx_blocks) + ")");
    BatcherOptions b;
    b.scheduler.replica = r;
    b.scheduler.kv_blocks = spec.blocks;
    b.scheduler.block_tokens = spec.block_tokens;
    b.scheduler.limits = limits;
    b.scheduler.groups = spec.pipeline;  // one step in flight per stage
    b.scheduler.stop = StopRule{model.eos_ids, model.max_seq_len};
    b.scheduler.bos = model.bos_id;
    ReplicaScheduler check(b.scheduler);  // bad limits fail here, not in an actor
    stage_layers_.push_back(spec.stage_layers);
    b.engine = std::move(engine.factory);
    b.metrics = metrics;
    so.batchers.push_back(std::move(b));
  }

  cfg_.set("scheduler.max-threads", kSchedulerThreads);
  // CAF's idle threads poll for 100 rounds and then wake every 50 us for
  // 500 more before sleeping on a condition variable. Between engine steps
  // (milliseconds apart) that polling takes CPU from the device threads,
  // which on a small machine share the cores with it: go to sleep at once;
  // an enqueue wakes a sleeping thread.
  cfg_.set("work-stealing.aggressive-poll-attempts", 10);
  cfg_.set("work-stealing.moderate-poll-attempts", 0);
  system_ = std::make_unique<caf::actor_system>(cfg_);

  RouterOptions ro;
  ro.table.replicas = replicas_;
  ro.table.max_seq_len = model.max_seq_len;
  ro.table.max_batch_sequences = config.batching.max_batch_sequences;
  ro.table.max_waiting_per_replica = config.batching.max_waiting;
  ro.table.admission = admission_queue_options(config);
  ro.routing_policy = config.routing.policy;
  ro.routing_seed = config.routing.seed;
  router_ = system_->spawn(router, ro, router_shared_, metrics);
  supervisor_ = system_->spawn(supervisor, router_, std::move(so), supervisor_shared_, metrics);
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
  std::vector<ReplicaStatus> out(static_cast<size_t>(replicas_));
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
