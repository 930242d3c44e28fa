#include "actors/runtime.h"

#include <spdlog/spdlog.h>

#include <caf/io/all.hpp>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "actors/fault_injector.h"
#include "net/link_proxy.h"
#include "scheduler/replica_scheduler.h"

namespace troupe {

namespace {
// CAF's cooperative threads: routing and batching are light work.
constexpr int kSchedulerThreads = 2;
}  // namespace

void configure_distribution(caf::actor_system_config& cfg, double heartbeat_timeout_s) {
  register_wire_types(cfg);
  const auto timeout =
      std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(heartbeat_timeout_s));
  cfg.set("middleman.heartbeat-interval", caf::timespan{timeout / 4});
  cfg.set("middleman.connection-timeout", caf::timespan{timeout});
}

ActorRuntime::ActorRuntime(const Config& config, std::shared_ptr<EngineBuilder> engines,
                           Metrics* metrics)
    : ActorRuntime(
          config, engines->model(),
          [engines](int, const EngineSpec& spec) {
            const EngineSpec resolved = engines->resolve(spec);
            return ReplicaEngine{engines->factory(resolved), resolved};
          },
          metrics, engines->fingerprint()) {}

ActorRuntime::ActorRuntime(const Config& config, const ModelConfig& model, EngineSource engine_for,
                           Metrics* metrics, std::string model_fingerprint)
    : replicas_(config.parallel.replicas),
      replica_devices_(config.parallel.pipeline * config.parallel.tensor),
      router_shared_(std::make_shared<RouterShared>()),
      supervisor_shared_(std::make_shared<SupervisorShared>(config.parallel.replicas)) {
  validate_config(config);
  validate_layout_for_model(config, model);
  SupervisorOptions so;
  so.replicas = replicas_;
  so.max_restarts = config.supervision.max_restarts;
  so.window_s = config.supervision.within_s;
  so.placement = config.placement.replicas;
  so.layers = model.n_layers;
  so.faults = faults_;
  so.cluster = {kWireProtocol, model_fingerprint, config.nodes.token,
                config.nodes.heartbeat_timeout_s};
  ReplicaPlan& plan = so.plan;
  plan.pipeline = config.parallel.pipeline;
  plan.tensor = config.parallel.tensor;
  const EngineSpec first = engine_spec(config, model, 0);
  plan.block_tokens = first.block_tokens;
  plan.blocks = first.blocks;
  plan.kv_dtype = dtype_name(first.kv_dtype);
  plan.max_batch_sequences = config.batching.max_batch_sequences;
  plan.max_batch_tokens = config.batching.max_batch_tokens;
  plan.prefill_chunk_tokens = config.batching.prefill_chunk_tokens;
  plan.async_scheduling = config.batching.async_scheduling;
  plan.prefix_caching = config.kv_cache.prefix_caching;
  const int ctx_blocks = (model.max_seq_len + plan.block_tokens - 1) / plan.block_tokens;
  if (plan.blocks < ctx_blocks)
    throw std::invalid_argument("kv_cache holds " + std::to_string(plan.blocks) +
                                " blocks per device, fewer than one full-context sequence needs (" +
                                std::to_string(ctx_blocks) + ")");
  // This process's replicas are resolved now, so that what does not fit
  // (a memory cap, a layout) stops start-up here, not later in an actor.
  auto local = std::make_shared<std::vector<ReplicaEngine>>();
  if (config.nodes.local)
    for (int r = 0; r < replicas_; ++r) {
      local->push_back(engine_for(r, engine_spec(config, model, r)));
      stage_layers_.push_back(local->back().spec.stage_layers);
    }
  // Bad limits fail here, not in an actor.
  ReplicaScheduler check(
      {0,
       0,
       plan.blocks,
       plan.block_tokens,
       {plan.max_batch_sequences, plan.max_batch_tokens, plan.prefill_chunk_tokens},
       plan.pipeline,
       plan.schedules_ahead(),
       plan.prefix_caching,
       StopRule{model.eos_ids, model.max_seq_len},
       model.bos_id});

  cfg_.set("scheduler.max-threads", kSchedulerThreads);
  // CAF's idle threads poll for 100 rounds and then wake every 50 us for
  // 500 more before sleeping on a condition variable. Between engine steps
  // (milliseconds apart) that polling takes CPU from the device threads,
  // which on a small machine share the cores with it: go to sleep at once;
  // an enqueue wakes a sleeping thread.
  cfg_.set("work-stealing.aggressive-poll-attempts", 10);
  cfg_.set("work-stealing.moderate-poll-attempts", 0);
  if (!config.nodes.listen.empty()) configure_distribution(cfg_, config.nodes.heartbeat_timeout_s);
  system_ = std::make_unique<caf::actor_system>(cfg_);

  RouterOptions ro;
  ro.table.replicas = replicas_;
  ro.table.max_seq_len = model.max_seq_len;
  ro.table.max_batch_sequences = config.batching.max_batch_sequences;
  ro.table.max_waiting_per_replica = config.batching.max_waiting;
  ro.table.admission = admission_queue_options(config);
  ro.routing_policy = config.routing.policy;
  ro.routing_seed = config.routing.seed;
  ro.latency_aware = config.routing.latency_aware;
  ro.faults = faults_;
  // A replica's channel is given as long as a node's heartbeats to answer.
  ro.link.timeout_s = std::max(2.0, 2 * config.nodes.heartbeat_timeout_s);
  router_ = system_->spawn(router, ro, router_shared_, metrics);
  supervisor_ = system_->spawn(supervisor, router_, std::move(so), supervisor_shared_, metrics);
  caf::anon_send(router_, watch_atom::value, caf::actor_cast<caf::actor>(supervisor_));
  injector_ = system_->spawn(fault_injector, faults_, supervisor_);

  if (!config.nodes.listen.empty()) {
    const auto [host, port] = parse_listen(config.nodes.listen);
    // The middleman listens on loopback only, behind a guard on the
    // configured address that resets a connection whose stream is not a
    // node's BASP: the middleman allocates whatever length a header claims.
    auto bound = system_->middleman().publish(caf::actor_cast<CoordinatorActor>(supervisor_), 0,
                                              "127.0.0.1", true);
    const auto stop_actors = [&] {
      // Every actor spawned so far, or the actor system's destructor waits
      // for it forever (and the process hangs, the error unsaid).
      caf::anon_send_exit(injector_, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(router_, caf::exit_reason::user_shutdown);
    };
    if (!bound) {
      stop_actors();
      throw std::runtime_error(
          "nodes.listen: the node port's middleman cannot listen on "
          "127.0.0.1: " +
          system_->render(bound.error()));
    }
    try {
      node_port_guard_ = std::make_unique<LinkProxy>("127.0.0.1", *bound, host, port, true);
    } catch (const std::exception& e) {
      stop_actors();
      // "link proxy: cannot listen on HOST:PORT: why", said as the key's.
      std::string why = e.what();
      if (why.starts_with("link proxy: ")) why.erase(0, 12);
      throw std::runtime_error("nodes.listen: " + why);
    }
    nodes_port_ = node_port_guard_->port();
    spdlog::info("nodes join on {}:{}", host, nodes_port_);
  }
  if (config.nodes.local) {
    NodeAgentOptions no;
    no.join = {"local",        config.nodes.token, kWireProtocol,
               kTroupeVersion, model_fingerprint,  config.parallel.device_count(),
               "127.0.0.1"};
    for (int d = 0; d < config.parallel.device_count(); ++d)
      no.devices.push_back(device_spec(config, d));
    no.engines = [local](const ReplicaPlan& p, const std::vector<DeviceSpec>&, const PartLinks&) {
      if (p.spans())
        throw std::invalid_argument("the coordinator's own devices hold whole replicas only");
      return local->at(size_t(p.replica));
    };
    no.stop = StopRule{model.eos_ids, model.max_seq_len};
    no.bos = model.bos_id;
    no.vocab_size = model.vocab_size;
    no.heartbeat_timeout_s = config.nodes.heartbeat_timeout_s;
    no.metrics = metrics;
    local_node_ = system_->spawn<caf::detached>(node_agent, std::move(no),
                                                caf::actor_cast<CoordinatorActor>(supervisor_));
  }
}

ActorRuntime::~ActorRuntime() {
  // The supervisor first (it takes the replicas down with it), so that it
  // does not see this process's node go and try to place its replicas again.
  caf::anon_send_exit(injector_, caf::exit_reason::user_shutdown);
  {
    caf::scoped_actor self{*system_};
    self->send_exit(supervisor_, caf::exit_reason::user_shutdown);
    self->wait_for(supervisor_);
  }
  if (local_node_) caf::anon_send_exit(local_node_, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(router_, caf::exit_reason::user_shutdown);
  system_->await_all_actors_done();
}

void ActorRuntime::shutdown() {
  if (shut_down_.exchange(true)) return;
  // The router's exit ends what it holds with 503 (RequestTable::shutdown),
  // each through its sink, before it quits.
  caf::scoped_actor self{*system_};
  self->send_exit(router_, caf::exit_reason::user_shutdown);
  self->wait_for(router_);
}

void ActorRuntime::submit(CompletionRequest request, std::shared_ptr<CompletionSink> sink) {
  if (shut_down_) {
    // Nothing accepted ends in silence: the router is gone.
    sink->on_error({ServiceErrorKind::Unavailable, "the server is shutting down", 5});
    return;
  }
  caf::anon_send(router_, submit_atom::value, std::move(request), std::move(sink));
}

void ActorRuntime::cancel(uint64_t request_id) {
  caf::anon_send(router_, cancel_atom::value, request_id);
}

std::vector<NodeRecord> ActorRuntime::nodes() const {
  std::lock_guard<std::mutex> l(supervisor_shared_->mu);
  return supervisor_shared_->nodes;
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

FaultEntry ActorRuntime::inject(const FaultRequest& request) {
  const FaultOrder order =
      faults_->add(request.order, request.at_s, request.duration_s, faults_->now());
  caf::anon_send(injector_, fault_atom::value, order.id);
  return *faults_->get(order.id);
}

std::variant<FaultEntry, std::string> ActorRuntime::inject_json(std::string_view body) {
  auto parsed = parse_fault_request(body, replicas_, replica_devices_);
  if (auto* why = std::get_if<std::string>(&parsed)) return *why;
  return inject(std::get<FaultRequest>(parsed));
}

void ActorRuntime::inject_crash(int replica) {
  FaultRequest r;
  r.order.kind = FaultKind::Kill;
  r.order.role = FaultRole::Worker;
  r.order.replica = replica;
  inject(r);
}

void ActorRuntime::inject_shard_crash(int replica, int device) {
  FaultRequest r;
  r.order.kind = FaultKind::Kill;
  r.order.role = FaultRole::Shard;
  r.order.replica = replica;
  r.order.device = device;
  inject(r);
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
