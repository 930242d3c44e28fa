#pragma once
// The discrete-event simulator behind `troupe simulate`: the runtime's own
// scheduling objects on a virtual clock. One RequestTable (admission queue,
// routing policy, exactly-once delivery, deadlines, cancellation, resumption)
// and one ReplicaScheduler per replica (continuous batching over its KV-block
// book, preemption, the stop rule) are driven exactly as the router and
// batcher actors drive them; only the engine is replaced, by step times
// interpolated from measurements (step_profile.h), with pipeline stages as
// resources that micro-batches flow through and the micro-batch tuner
// choosing their number, as the worker does. Replica deaths come from a
// script or an MTBF and follow the supervisor's rules (restart intensity).
//
// Single-threaded and allocation-light per event; arrivals are pulled from
// the workload one at a time and finished requests go to the observer, so
// memory follows what is in flight, not the length of the run.
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/microbatch_tuner.h"
#include "scheduler/replica_scheduler.h"
#include "scheduler/request_table.h"
#include "scheduler/restart_intensity.h"
#include "scheduler/router_log.h"
#include "scheduler/sim/step_profile.h"
#include "scheduler/sim/summary.h"
#include "scheduler/sim/workload.h"

namespace troupe::sim {

// A scripted death: one replica, or every replica of one node.
struct Failure {
  double time_s = 0;
  int replica = -1;  // >= 0: this replica
  int node = -1;     // >= 0: replicas [node * replicas_per_node, +replicas_per_node)
};

// What is wrong with a scripted failure among `replicas` replicas, nodes
// of `replicas_per_node` (the last node may hold fewer); empty when nothing.
std::string failure_problem(const Failure& f, int replicas, int replicas_per_node);

struct SimOptions {
  int replicas = 1;
  RequestTableOptions table;  // table.replicas is set from `replicas`
  std::string policy = "latency_aware";
  uint64_t policy_seed = 1;
  LatencyAwareOptions latency_aware;  // the latency-aware policy's constants
  // Each replica's scheduler; `replica` is filled in per replica and
  // `groups` from the cost model's pipeline stages.
  ReplicaSchedulerOptions scheduler;
  double request_timeout_s = 0;  // per request, as server.request_timeout_s (0: none)
  int max_tokens_limit = 0;      // > 0: longer requests are refused like the HTTP layer does
  // Supervision (supervision.max_restarts within within_s).
  int max_restarts = 3;
  double restart_window_s = 10;
  // Seconds from a death until the new replica is up (its engine built;
  // its probe step is added from the cost model).
  double restart_s = 2;
  double mtbf_s = 0;  // > 0: each replica dies after exponential times of this mean
  int replicas_per_node = 1;
  double node_mtbf_s = 0;  // > 0: whole nodes die likewise
  std::vector<Failure> failures;
  // Per-replica multiplier of step times (empty: all 1): heterogeneous or
  // degraded hardware.
  std::vector<double> slowdown;
  double tick_s = 0.05;   // the router's deadline tick
  double sample_s = 1.0;  // time-series interval (0: none); the last sample is at the run's end
  uint64_t seed = 1;      // failures
};

// One replica at one sample time.
struct ReplicaSample {
  int replica = 0;
  bool live = false;
  double utilisation = 0;   // busy share of the interval, over its stages
  double kv_occupancy = 0;  // blocks used / blocks
  int running = 0, waiting = 0;
};

struct ClusterSample {
  double time_s = 0;
  size_t in_flight = 0;                // accepted, not ended
  size_t queue_depth = 0;              // waiting for a replica
  size_t arrivals = 0, completed = 0;  // in the interval
  uint64_t output_tokens = 0;          // in the interval
  int live_replicas = 0;
};

class SimObserver {
 public:
  virtual ~SimObserver() = default;
  virtual void on_request_end(const RequestRecord& /*r*/) {}
  virtual void on_sample(const ClusterSample& /*c*/, const std::vector<ReplicaSample>& /*r*/) {}
};

struct SimTotals {
  uint64_t events = 0;
  uint64_t steps = 0;
  uint64_t requests = 0;
  uint64_t preemptions = 0;
  uint64_t resumed = 0;                               // requests resumed after their replica died
  uint64_t failures = 0, restarts = 0, given_up = 0;  // replica deaths, restarts, permanent
  // Prefix caching: prompt tokens of the sequences admitted, and of those
  // found cached.
  uint64_t prefix_queried = 0, prefix_hits = 0;
  double end_time_s = 0;
};

class Simulator {
 public:
  // `models` has one cost model per replica, or one for all. Throws
  // std::invalid_argument for inconsistent options.
  // With `log`, every call the table gets and every decision it makes is
  // recorded as the router does (scheduler/router_log.h).
  Simulator(SimOptions options, std::vector<StepCostModel> models, Workload& workload,
            SimObserver* observer = nullptr, std::unique_ptr<RouterLog> log = nullptr);
  ~Simulator();

  // Runs until the workload is exhausted and every request has ended.
  void run();
  const SimTotals& totals() const { return totals_; }
  std::vector<ReplicaFigures> replica_figures() const;

 private:
  enum class Kind : uint8_t { Arrival, Submit, StepDone, Cancel, Tick, Sample, Failure, Up };
  struct Event {
    double t;
    uint64_t seq;  // ties: first scheduled, first handled
    Kind kind;
    int replica;
    uint64_t a, b;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  struct InFlightStep {
    uint64_t id = 0;
    std::vector<int> ids;  // the sampled ids it will report
    double engine_s = 0;   // the engine's part of it, which the batcher times
    double launched_s = 0;
    struct Sample {
      int stage;
      size_t tokens;
      double seconds;
    };
    std::vector<Sample> samples;  // each stage's micro-batch times, for the tuner
  };
  struct Replica;
  class Flight;
  class Channel;

  void push(double t, Kind kind, int replica = -1, uint64_t a = 0, uint64_t b = 0);
  void bring_up(int replica);
  void pull_arrival();
  void schedule_arrival(const Arrival& a);
  void on_arrival(const Arrival& a);
  void submit(uint64_t id);
  double time_step(Replica& r, const PlannedStep& step, InFlightStep& f);
  void note_busy(Replica& r, double start, double end);
  void stop_busy(Replica& r);
  void launch(int replica);
  // The table reads the replicas' reports gathered in out_.
  void deliver();
  StepEvents& next_out();
  static std::vector<int> prompt_of(uint64_t id, const Flight& f);
  void settle();
  void on_step_done(int replica, uint64_t epoch, uint64_t step);
  void schedule_failures();
  void on_failure_event(const Event& e);
  void on_failure(int replica, bool node_death = false);
  void on_up(int replica, uint64_t epoch);
  void on_sample();
  void note_released(Replica& r);
  void note_started(uint64_t id);
  void finish(Flight& f, Outcome outcome);
  bool done() const;
  // The error for work in flight that made no progress for stall_s.
  std::runtime_error stalled(double stall_s) const;
  std::unique_ptr<ReplicaScheduler> make_scheduler(int replica) const;

  SimOptions o_;
  std::vector<StepCostModel> models_;
  Workload& workload_;
  SimObserver* observer_;
  std::unique_ptr<Channel> channel_;
  std::unique_ptr<LoggedRequestTable> table_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::unordered_map<uint64_t, Flight*> flights_;
  // Requests on their way through the front end, by id.
  std::unordered_map<uint64_t, std::shared_ptr<Flight>> entering_;
  std::unordered_map<uint64_t, Arrival> pending_;  // scheduled arrivals, by key
  uint64_t next_key_ = 0;
  std::vector<int> dirty_;  // replicas with work to plan
  Xoshiro256 rng_;
  double now_ = 0;
  uint64_t seq_ = 0;
  uint64_t next_id_ = 1;
  bool workload_done_ = false;
  int sample_token_ = 3;
  double last_progress_ = 0;  // a step finished or a request ended
  // The router's tick runs only while requests are in flight: an idle
  // cluster has no deadline to check, and a sparse workload (a trace
  // spanning weeks) would otherwise cost 20 events per simulated second.
  bool ticking_ = false;
  SimTotals totals_;
  ClusterSample window_;
  double window_end_ = 0;  // when the sample window being filled closes
  std::vector<ReplicaSample> samples_;
  std::vector<InFlightStep> spare_;  // finished steps' buffers
  // Reports on their way to the table: out_[0, out_n_) (none between
  // calls); the vector only grows, so that their buffers are reused.
  std::vector<StepEvents> out_;
  size_t out_n_ = 0;
  PlannedStep step_;  // the step being launched, reused likewise
};

}  // namespace troupe::sim
