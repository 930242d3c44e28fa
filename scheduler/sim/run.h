#pragma once
// One simulated run end to end: the workload from its description, the
// simulator, the summary, and the CSV time series when asked for.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/sim/simulator.h"

namespace troupe::sim {

// What to serve, as the command line gives it.
struct WorkloadSpec {
  std::string trace;       // Azure .csv or Mooncake .jsonl; empty: synthetic
  double rate = 0;         // synthetic: requests/s; a trace: its rows replayed at this mean rate
  size_t requests = 1000;  // synthetic: how many; a trace: at most this many (0: all)
  std::string arrivals = "poisson";
  std::string prompt = "128", output = "128";
  int clients = 0;  // > 0: closed loop
  double think_s = 0;
  double cancel_fraction = 0, cancel_after_s = 1;
  double priority_fraction = 0;
  double length_scale = 1;  // traces
  // > 0: every prompt starts with prefix_len tokens shared by its group,
  // one of prefix_groups, before the prompt's own length.
  int prefix_len = 0;
  int prefix_groups = 1;
  uint64_t seed = 1;

  // Throws std::invalid_argument naming the flag (--rate, --requests,
  // --clients, ...) and the values it takes, for a value no workload can
  // have: negative, not finite, a share outside [0, 1], an unknown length
  // distribution or arrival process. Missing parts (no rate, no clients, no
  // trace) are the caller's to judge.
  void check() const;
  // Lengths are cut to fit `max_context` (the model's). Throws
  // std::invalid_argument for a bad description or an unreadable trace.
  std::unique_ptr<Workload> make(int max_context) const;
  std::string describe() const;
};

// The command line's --fail TIME:REPLICA or TIME:node:N, and --slow
// REPLICA:FACTOR. Throw std::invalid_argument naming the flag and the form;
// whether the replica or node exists is failure_problem's (simulator.h) and
// the caller's.
Failure parse_failure(const std::string& spec);
std::pair<int, double> parse_slowdown(const std::string& spec);

struct RunResult {
  RunSummary summary;
  SimTotals totals;
  TraceCuts trace_cuts;  // a trace's rows cut to fit the context
  double wall_s = 0;     // host seconds the simulation took
};

// Runs one simulation; `extra` sees every request and sample too.
RunResult simulate(const SimOptions& options, const std::vector<StepCostModel>& models,
                   const WorkloadSpec& workload, const Slo& slo, SimObserver* extra = nullptr,
                   std::unique_ptr<RouterLog> log = nullptr);

// Writes DIR/cluster.csv (per interval: arrivals, completions, output
// tokens/s, requests in flight and queued, live replicas) and
// DIR/replicas.csv (per interval and replica: utilisation, KV occupancy,
// running and waiting sequences).
class TimeSeriesCsv : public SimObserver {
 public:
  explicit TimeSeriesCsv(const std::filesystem::path& dir);
  void on_sample(const ClusterSample& c, const std::vector<ReplicaSample>& r) override;

 private:
  std::ofstream cluster_, replicas_;
  double last_t_ = 0;
};

// Several observers as one.
class Observers : public SimObserver {
 public:
  void add(SimObserver* o) {
    if (o) list_.push_back(o);
  }
  void on_request_end(const RequestRecord& r) override {
    for (auto* o : list_) o->on_request_end(r);
  }
  void on_sample(const ClusterSample& c, const std::vector<ReplicaSample>& r) override {
    for (auto* o : list_) o->on_sample(c, r);
  }

 private:
  std::vector<SimObserver*> list_;
};

}  // namespace troupe::sim
