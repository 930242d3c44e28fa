#include "scheduler/sim/run.h"

#include <chrono>
#include <sstream>
#include <stdexcept>

namespace troupe::sim {

std::unique_ptr<Workload> WorkloadSpec::make(int max_context) const {
  if (!trace.empty()) {
    TraceOptions o;
    o.length_scale = length_scale;
    o.max_context = max_context;
    o.limit = requests;
    if (rate > 0) {
      const TraceStats s = trace_stats(trace);
      if (s.rate_per_s() <= 0)
        throw std::invalid_argument(trace + ": too few rows or no time span to rescale to a rate");
      o.time_scale = rate / s.rate_per_s();
    }
    return std::make_unique<TraceWorkload>(trace, o);
  }
  if (clients > 0) {
    ClosedLoopOptions o;
    o.clients = clients;
    o.requests = requests;
    o.think_s = think_s;
    o.prompt = prompt;
    o.output = output;
    o.seed = seed;
    return std::make_unique<ClosedLoopWorkload>(o);
  }
  SyntheticOptions o;
  o.requests = requests;
  o.rate_per_s = rate;
  o.process = arrivals;
  o.prompt = prompt;
  o.output = output;
  o.cancel_fraction = cancel_fraction;
  o.cancel_after_s = cancel_after_s;
  o.high_priority_fraction = priority_fraction;
  o.seed = seed;
  return std::make_unique<SyntheticWorkload>(o);
}

std::string WorkloadSpec::describe() const {
  std::ostringstream s;
  if (!trace.empty()) {
    s << "trace " << trace;
    if (rate > 0) s << " at " << rate << " requests/s";
    if (requests > 0) s << ", first " << requests << " rows";
    if (length_scale != 1) s << ", lengths x" << length_scale;
  } else if (clients > 0) {
    s << clients << " closed-loop clients (think " << think_s << " s), " << requests
      << " requests, prompt " << prompt << ", output " << output;
  } else {
    s << requests << " requests, " << arrivals;
    if (rate > 0) s << " at " << rate << "/s";
    s << ", prompt " << prompt << ", output " << output;
  }
  return s.str();
}

RunResult simulate(const SimOptions& options, const std::vector<StepCostModel>& models,
                   const WorkloadSpec& spec, const Slo& slo, SimObserver* extra,
                   std::unique_ptr<RouterLog> log) {
  const auto workload = spec.make(options.scheduler.stop.context_length);
  RunResult res;
  res.summary = RunSummary(slo);
  struct Summarize : SimObserver {
    RunSummary* s;
    void on_request_end(const RequestRecord& r) override { s->add(r); }
  } summarize;
  summarize.s = &res.summary;
  Observers all;
  all.add(&summarize);
  all.add(extra);
  const auto t0 = std::chrono::steady_clock::now();
  Simulator sim(options, models, *workload, &all, std::move(log));
  sim.run();
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.totals = sim.totals();
  res.summary.set_replicas(sim.replica_figures());
  return res;
}

TimeSeriesCsv::TimeSeriesCsv(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  cluster_.open(dir / "cluster.csv");
  replicas_.open(dir / "replicas.csv");
  if (!cluster_ || !replicas_)
    throw std::invalid_argument("cannot write the time series in " + dir.string());
  cluster_ << "time_s,arrivals,completed,output_tokens_per_s,in_flight,queue_depth,live_replicas\n";
  replicas_ << "time_s,replica,live,utilisation,kv_occupancy,running,waiting\n";
}

void TimeSeriesCsv::on_sample(const ClusterSample& c, const std::vector<ReplicaSample>& r) {
  const double span = c.time_s - last_t_;
  last_t_ = c.time_s;
  char line[200];
  std::snprintf(line, sizeof line, "%.6g,%zu,%zu,%.6g,%zu,%zu,%d\n", c.time_s, c.arrivals,
                c.completed, span > 0 ? double(c.output_tokens) / span : 0.0, c.in_flight,
                c.queue_depth, c.live_replicas);
  cluster_ << line;
  for (const ReplicaSample& s : r) {
    std::snprintf(line, sizeof line, "%.6g,%d,%d,%.4f,%.4f,%d,%d\n", c.time_s, s.replica,
                  s.live ? 1 : 0, s.utilisation, s.kv_occupancy, s.running, s.waiting);
    replicas_ << line;
  }
}

}  // namespace troupe::sim
