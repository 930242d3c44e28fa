#include "actors/runtime.h"

#include <chrono>
#include <stdexcept>
#include <thread>

#include "actors/messages.h"

namespace troupe {

ActorRuntime::ActorRuntime(std::shared_ptr<const Model> model, ServingOptions o, Metrics* metrics)
    : options_(std::move(o)),
      router_shared_(std::make_shared<RouterShared>()),
      supervisor_shared_(std::make_shared<SupervisorShared>(options_.replicas)) {
  if (options_.replicas < 1) throw std::invalid_argument("parallel.replicas must be at least 1");
  if (options_.threads.empty()) options_.threads = {1};
  if (options_.threads.size() != 1 && int(options_.threads.size()) != options_.replicas)
    throw std::invalid_argument("give one thread count, or one per replica");
  ContinuousBatchPolicy check(options_.batching, options_.block_tokens);  // validates limits
  const int ctx_blocks = (model->config().max_seq_len + options_.block_tokens - 1) / options_.block_tokens;
  if (options_.kv_blocks < ctx_blocks)
    throw std::invalid_argument("kv_cache holds " + std::to_string(options_.kv_blocks) +
                                " blocks per replica, fewer than one full-context sequence needs (" +
                                std::to_string(ctx_blocks) + ")");
  cfg_.set("scheduler.max-threads", options_.scheduler_threads);
  system_ = std::make_unique<caf::actor_system>(cfg_);

  RouterOptions ro;
  ro.replicas = options_.replicas;
  ro.max_seq_len = model->config().max_seq_len;
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
    b.engine.threads = options_.threads.size() == 1 ? options_.threads[0] : options_.threads[size_t(r)];
    b.engine.block_tokens = options_.block_tokens;
    b.engine.blocks = options_.kv_blocks;
    b.limits = options_.batching;
    so.batchers.push_back(b);
  }
  supervisor_ = system_->spawn(supervisor_actor, router_, std::move(model), so, supervisor_shared_, metrics);
}

ActorRuntime::~ActorRuntime() {
  caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(router_, caf::exit_reason::user_shutdown);
  system_->await_all_actors_done();
}

void ActorRuntime::submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) {
  caf::anon_send(router_, submit_atom::value, std::move(request), std::move(sink));
}

void ActorRuntime::cancel(uint64_t request_id) { caf::anon_send(router_, cancel_atom::value, request_id); }

std::vector<ReplicaStatus> ActorRuntime::replica_status() const {
  std::vector<ReplicaStatus> out(size_t(options_.replicas));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].restarts = supervisor_shared_->restarts[i].load();
    out[i].failed = supervisor_shared_->failed[i].load();
  }
  return out;
}

void ActorRuntime::inject_crash(int replica) { caf::anon_send(supervisor_, crash_atom::value, replica); }

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
