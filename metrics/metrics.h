#pragma once
// The troupe metrics every layer updates, pre-declared on a registry
// (metrics/registry.h) and rendered by GET /metrics.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/registry.h"

namespace troupe {

// What troupe_replica_state reports.
enum class ReplicaState { Down = 0, Starting = 1, Ready = 2, FailedPermanently = 3 };

// The troupe metrics, pre-declared, with one helper per thing a component
// reports. Safe to call from any thread.
class Metrics {
 public:
  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // A completion request ended; `http_status` is what the client got (499:
  // the client went away first, as nginx counts it).
  void request_finished(int http_status);
  // Also exports vLLM's names of the figures vLLM has (vllm:num_requests_running,
  // vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:prompt_tokens_total,
  // vllm:generation_tokens_total and the TTFT, TPOT and end-to-end latency
  // histograms), labelled model_name=`model`, so that dashboards and
  // autoscalers written for vLLM read this server. Once, before any other call.
  void export_vllm_names(const std::string& model);
  void set_queue_depth(size_t n);
  void set_running_sequences(size_t n);
  // One engine step: how many sequences ran and how many tokens they fed.
  void observe_step(int batch_sequences, int batch_tokens);
  void set_kv_blocks(int replica, size_t used, size_t free);
  // The router's view (Ready, FailedPermanently, or Starting for neither)
  // and the supervisor's (whether a placement of it exists: placed and
  // starting, or waiting for a node) make the state shown: a replica not
  // ready and not placed is Down.
  void set_replica_state(int replica, ReplicaState state);
  void set_replica_placed(int replica, bool placed);
  void replica_restarted(int replica);
  void observe_time_to_first_token(double seconds);
  void observe_time_per_output_token(double seconds);
  void observe_request_latency(double seconds);
  // Pipeline and tensor parallelism, per replica and stage, since the
  // replica's worker started: idle share of the step time (bubble), share of
  // busy time spent in collectives, and bytes the collectives moved.
  void set_stage(int replica, int stage, double busy_s, double bubble_fraction, double comm_share,
                 double comm_bytes);
  // A pipeline step launched while another step of the replica was still
  // in flight: how often the stages are kept busy with different groups.
  void pipeline_step_launched(int replica, bool overlapped);
  // Nodes (many processes): how many are live and dead, each one's devices,
  // replicas and the age of its last heartbeat, and deaths by cause.
  void set_nodes(int live, int dead);
  // A node the coordinator forgot (dead for long): its series go.
  void forget_node(const std::string& name);
  void set_node(const std::string& name, bool live, int devices, int replicas,
                double heartbeat_age_s);
  void node_dead(const std::string& cause);
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  // Prefix caching: prompt tokens of sequences admitted, and of those found
  // cached; and the blocks a replica keeps indexed.
  void add_prefix_cache(int replica, int64_t queried, int64_t hits);
  void set_cached_blocks(int replica, size_t cached);

  // For metrics a component wants beyond the pre-declared ones.
  MetricsRegistry& registry() { return registry_; }
  // The registry, then the process's own figures (metrics/process_metrics.h).
  std::string render() const;

 private:
  // What the router and the supervisor said of a replica.
  struct ReplicaView {
    ReplicaState router = ReplicaState::Starting;
    bool placed = true;
  };
  // With replica_mu_ held: the replica's view (grown to hold it), and
  // setting its gauge from it.
  ReplicaView& replica_view(int replica);
  void show_replica_state(int replica, const ReplicaView& view);

  MetricsRegistry registry_;
  std::mutex replica_mu_;
  std::vector<ReplicaView> replica_views_;
  Family<Counter>* requests_;
  Gauge* queue_depth_;
  Gauge* running_sequences_;
  Histogram* batch_size_;
  Histogram* tokens_per_step_;
  Family<Gauge>* kv_blocks_;
  Histogram* ttft_;
  Histogram* tpot_;
  Histogram* latency_;
  Family<Gauge>* replica_state_;
  Family<Counter>* replica_restarts_;
  Family<Gauge>* stage_busy_;
  Family<Gauge>* stage_bubble_;
  Family<Gauge>* stage_comm_share_;
  Family<Gauge>* stage_comm_bytes_;
  Family<Counter>* pipeline_steps_;
  Family<Gauge>* nodes_;
  Family<Gauge>* node_devices_;
  Family<Gauge>* node_live_;
  Family<Gauge>* node_replicas_;
  Family<Gauge>* node_heartbeat_age_;
  Family<Counter>* node_deaths_;
  Counter* prompt_tokens_;
  Counter* generation_tokens_;
  Family<Counter>* prefix_queries_;
  Family<Counter>* prefix_hits_;
  Family<Gauge>* cached_blocks_;
  // vLLM's names (export_vllm_names), or all null.
  struct Vllm {
    Gauge* running = nullptr;
    Gauge* waiting = nullptr;
    Gauge* kv_usage = nullptr;
    Counter* prompt_tokens = nullptr;
    Counter* generation_tokens = nullptr;
    Counter* prefix_queries = nullptr;
    Counter* prefix_hits = nullptr;
    Histogram* ttft = nullptr;
    Histogram* tpot = nullptr;
    Histogram* e2e = nullptr;
  } vllm_;
  std::mutex kv_mu_;
  std::vector<std::pair<size_t, size_t>> kv_;  // used, free per replica (for kv_usage)
};

}  // namespace troupe
