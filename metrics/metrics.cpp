#include "metrics/metrics.h"

#include <string>
#include <vector>

#include "metrics/process_metrics.h"

namespace troupe {

namespace {
// Latency buckets follow vLLM's, so dashboards built for it read the same.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
                                          0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
const std::vector<double> kTpotBuckets = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                          0.2,   0.3,  0.4,   0.5,  0.75,  1.0, 2.5};
const std::vector<double> kLatencyBuckets = {0.1, 0.3,  0.5,  0.8,  1.0,  1.5,  2.0,  2.5,
                                             5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0};
}  // namespace

Metrics::Metrics() {
  stage_busy_ = &registry_.gauge("troupe_stage_busy_seconds",
                                 "Seconds a pipeline stage computed since its replica started.",
                                 {"replica", "stage"});
  stage_bubble_ =
      &registry_.gauge("troupe_stage_bubble_fraction",
                       "Share of step time a pipeline stage sat idle.", {"replica", "stage"});
  stage_comm_share_ =
      &registry_.gauge("troupe_stage_comm_share",
                       "Share of a stage's busy time spent in collectives.", {"replica", "stage"});
  stage_comm_bytes_ = &registry_.gauge(
      "troupe_stage_comm_bytes", "Bytes moved by a stage's collectives since its replica started.",
      {"replica", "stage"});
  pipeline_steps_ = &registry_.counter(
      "troupe_pipeline_steps_total",
      "Steps launched on a multi-device replica; overlapped=\"true\" when another step of the "
      "replica was still in flight (pipeline stages busy with different groups).",
      {"replica", "overlapped"});
  requests_ = &registry_.counter("troupe_requests_total",
                                 "Completion requests by the HTTP status they ended with "
                                 "(499: the client disconnected).",
                                 {"status"});
  queue_depth_ = &registry_.gauge("troupe_queue_depth", "Requests waiting in the admission queue.")
                      .labels(std::vector<std::string>{});
  running_sequences_ =
      &registry_.gauge("troupe_running_sequences", "Sequences in running batches, all replicas.")
           .labels(std::vector<std::string>{});
  batch_size_ = &registry_
                     .histogram("troupe_batch_size", "Sequences per engine step.",
                                exponential_buckets(1, 2, 10))
                     .labels(std::vector<std::string>{});
  tokens_per_step_ =
      &registry_
           .histogram("troupe_tokens_per_step", "Tokens fed per engine step (prefill and decode).",
                      exponential_buckets(1, 2, 14))
           .labels(std::vector<std::string>{});
  kv_blocks_ = &registry_.gauge(
      "troupe_kv_blocks",
      "KV-cache blocks per replica, used or free (both 0 while the replica is down).",
      {"replica", "state"});
  ttft_ = &registry_
               .histogram("troupe_time_to_first_token_seconds",
                          "From submission to the first generated token.", kTtftBuckets)
               .labels(std::vector<std::string>{});
  tpot_ = &registry_
               .histogram("troupe_time_per_output_token_seconds",
                          "Mean time between generated tokens after the first, per request.",
                          kTpotBuckets)
               .labels(std::vector<std::string>{});
  latency_ =
      &registry_
           .histogram("troupe_request_latency_seconds",
                      "From submission to the last token, per successful request.", kLatencyBuckets)
           .labels(std::vector<std::string>{});
  replica_state_ = &registry_.gauge(
      "troupe_replica_state",
      "0 down, 1 starting, 2 ready, 3 failed permanently (restart limit hit).", {"replica"});
  replica_restarts_ = &registry_.counter("troupe_replica_restarts_total",
                                         "Replica restarts by the supervisor.", {"replica"});
  prompt_tokens_ = &registry_.counter("troupe_prompt_tokens_total", "Prompt tokens processed.")
                        .labels(std::vector<std::string>{});
  generation_tokens_ = &registry_.counter("troupe_generation_tokens_total", "Tokens generated.")
                            .labels(std::vector<std::string>{});
  prefix_queries_ = &registry_.counter(
      "troupe_prefix_cache_queries_total",
      "Prompt tokens of the sequences a replica admitted, looked up in its prefix cache.",
      {"replica"});
  prefix_hits_ = &registry_.counter(
      "troupe_prefix_cache_hits_total",
      "Of the prompt tokens looked up, those found in the replica's prefix cache.", {"replica"});
  cached_blocks_ = &registry_.gauge(
      "troupe_kv_cached_blocks",
      "KV-cache blocks a replica keeps indexed for reuse by prefix (held or free).", {"replica"});
  nodes_ = &registry_.gauge("troupe_nodes", "Nodes known to the coordinator, by state", {"state"});
  node_devices_ = &registry_.gauge("troupe_node_devices", "Devices a node offers", {"node"});
  node_live_ = &registry_.gauge("troupe_node_live",
                                "1 while a node is a live member, 0 once declared dead", {"node"});
  node_replicas_ = &registry_.gauge("troupe_node_replicas", "Replicas placed on a node", {"node"});
  node_heartbeat_age_ = &registry_.gauge(
      "troupe_node_heartbeat_age_seconds",
      "Seconds since a node was last heard from (a dead node's keeps growing)", {"node"});
  node_deaths_ = &registry_.counter("troupe_node_detections_total",
                                    "Nodes declared dead, by how it was detected", {"cause"});
}

void Metrics::request_finished(int http_status) {
  requests_->labels({std::to_string(http_status)}).inc();
}

void Metrics::observe_step(int batch_sequences, int batch_tokens) {
  batch_size_->observe(batch_sequences);
  tokens_per_step_->observe(batch_tokens);
}

void Metrics::set_kv_blocks(int replica, size_t used, size_t free) {
  std::string r = std::to_string(replica);
  kv_blocks_->labels({r, "used"}).set(double(used));
  kv_blocks_->labels({r, "free"}).set(double(free));
  if (!vllm_.kv_usage || replica < 0) return;
  std::lock_guard l(kv_mu_);
  if (size_t(replica) >= kv_.size()) kv_.resize(size_t(replica) + 1);
  kv_[size_t(replica)] = {used, free};
  double all_used = 0, all = 0;
  for (const auto& [u, f] : kv_) {
    all_used += double(u);
    all += double(u + f);
  }
  vllm_.kv_usage->set(all > 0 ? all_used / all : 0);
}

void Metrics::export_vllm_names(const std::string& model) {
  const std::vector<std::string> label{"model_name"};
  const std::vector<std::string> value{model};
  vllm_.running = &registry_
                       .gauge("vllm:num_requests_running",
                              "Number of requests in model execution batches.", label)
                       .labels(value);
  vllm_.waiting =
      &registry_
           .gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", label)
           .labels(value);
  vllm_.kv_usage =
      &registry_
           .gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", label)
           .labels(value);
  vllm_.prompt_tokens =
      &registry_.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", label)
           .labels(value);
  vllm_.generation_tokens =
      &registry_
           .counter("vllm:generation_tokens_total", "Number of generation tokens processed.", label)
           .labels(value);
  vllm_.prefix_queries =
      &registry_
           .counter("vllm:prefix_cache_queries_total",
                    "Prefix cache queries, in terms of number of queried tokens.", label)
           .labels(value);
  vllm_.prefix_hits =
      &registry_
           .counter("vllm:prefix_cache_hits_total",
                    "Prefix cache hits, in terms of number of cached tokens.", label)
           .labels(value);
  vllm_.ttft = &registry_
                    .histogram("vllm:time_to_first_token_seconds",
                               "Histogram of time to first token in seconds.", kTtftBuckets, label)
                    .labels(value);
  vllm_.tpot =
      &registry_
           .histogram("vllm:time_per_output_token_seconds",
                      "Histogram of time per output token in seconds.", kTpotBuckets, label)
           .labels(value);
  vllm_.e2e =
      &registry_
           .histogram("vllm:e2e_request_latency_seconds",
                      "Histogram of end to end request latency in seconds.", kLatencyBuckets, label)
           .labels(value);
}

void Metrics::set_queue_depth(size_t n) {
  queue_depth_->set(double(n));
  if (vllm_.waiting) vllm_.waiting->set(double(n));
}

void Metrics::set_running_sequences(size_t n) {
  running_sequences_->set(double(n));
  if (vllm_.running) vllm_.running->set(double(n));
}

void Metrics::observe_time_to_first_token(double seconds) {
  ttft_->observe(seconds);
  if (vllm_.ttft) vllm_.ttft->observe(seconds);
}

void Metrics::observe_time_per_output_token(double seconds) {
  tpot_->observe(seconds);
  if (vllm_.tpot) vllm_.tpot->observe(seconds);
}

void Metrics::observe_request_latency(double seconds) {
  latency_->observe(seconds);
  if (vllm_.e2e) vllm_.e2e->observe(seconds);
}

Metrics::ReplicaView& Metrics::replica_view(int replica) {
  if (size_t(replica) >= replica_views_.size()) replica_views_.resize(size_t(replica) + 1);
  return replica_views_[size_t(replica)];
}

void Metrics::show_replica_state(int replica, const ReplicaView& view) {
  const ReplicaState state =
      view.router == ReplicaState::Starting && !view.placed ? ReplicaState::Down : view.router;
  replica_state_->labels({std::to_string(replica)}).set(double(int(state)));
}

void Metrics::set_replica_state(int replica, ReplicaState state) {
  if (replica < 0) return;
  std::lock_guard l(replica_mu_);
  ReplicaView& v = replica_view(replica);
  v.router = state;
  show_replica_state(replica, v);
}

void Metrics::set_replica_placed(int replica, bool placed) {
  if (replica < 0) return;
  std::lock_guard l(replica_mu_);
  ReplicaView& v = replica_view(replica);
  v.placed = placed;
  show_replica_state(replica, v);
}

void Metrics::set_stage(int replica, int stage, double busy_s, double bubble_fraction,
                        double comm_share, double comm_bytes) {
  const std::string r = std::to_string(replica), st = std::to_string(stage);
  stage_busy_->labels({r, st}).set(busy_s);
  stage_bubble_->labels({r, st}).set(bubble_fraction);
  stage_comm_share_->labels({r, st}).set(comm_share);
  stage_comm_bytes_->labels({r, st}).set(comm_bytes);
}

void Metrics::pipeline_step_launched(int replica, bool overlapped) {
  pipeline_steps_->labels({std::to_string(replica), overlapped ? "true" : "false"}).inc();
}

void Metrics::replica_restarted(int replica) {
  replica_restarts_->labels({std::to_string(replica)}).inc();
}

void Metrics::set_nodes(int live, int dead) {
  nodes_->labels({"live"}).set(live);
  nodes_->labels({"dead"}).set(dead);
}

void Metrics::set_node(const std::string& name, bool live, int devices, int replicas,
                       double heartbeat_age_s) {
  node_devices_->labels({name}).set(live ? devices : 0);
  node_live_->labels({name}).set(live ? 1 : 0);
  node_replicas_->labels({name}).set(replicas);
  node_heartbeat_age_->labels({name}).set(heartbeat_age_s);
}

void Metrics::forget_node(const std::string& name) {
  for (auto* family : {node_devices_, node_live_, node_replicas_, node_heartbeat_age_})
    family->remove({name});
}

void Metrics::node_dead(const std::string& cause) {
  node_deaths_->labels({cause}).inc();
}

void Metrics::add_prompt_tokens(int64_t n) {
  if (n <= 0) return;
  prompt_tokens_->inc(double(n));
  if (vllm_.prompt_tokens) vllm_.prompt_tokens->inc(double(n));
}

void Metrics::add_generation_tokens(int64_t n) {
  if (n <= 0) return;
  generation_tokens_->inc(double(n));
  if (vllm_.generation_tokens) vllm_.generation_tokens->inc(double(n));
}

void Metrics::add_prefix_cache(int replica, int64_t queried, int64_t hits) {
  const std::string r = std::to_string(replica);
  if (queried > 0) {
    prefix_queries_->labels({r}).inc(double(queried));
    if (vllm_.prefix_queries) vllm_.prefix_queries->inc(double(queried));
  }
  if (hits > 0) {
    prefix_hits_->labels({r}).inc(double(hits));
    if (vllm_.prefix_hits) vllm_.prefix_hits->inc(double(hits));
  }
}

void Metrics::set_cached_blocks(int replica, size_t cached) {
  cached_blocks_->labels({std::to_string(replica)}).set(double(cached));
}

std::string Metrics::render() const {
  return registry_.render() + render_process_figures(read_process_figures());
}

}  // namespace troupe
