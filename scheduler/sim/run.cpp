#include "scheduler/sim/run.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace troupe::sim {

namespace {

// The whole of `text` as a finite number, or nullopt.
std::optional<double> finite_number(const std::string& text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

// The whole of `text` as a count from 0 (digits only), or nullopt.
std::optional<int> index_number(const std::string& text) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || text[0] == '-' || text[0] == '+' || ec != std::errc() ||
      end != text.data() + text.size())
    return std::nullopt;
  return v;
}

std::vector<std::string> split_colons(const std::string& text) {
  std::vector<std::string> out(1);
  for (char c : text)
    if (c == ':')
      out.emplace_back();
    else
      out.back() += c;
  return out;
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

void WorkloadSpec::check() const {
  const auto fail = [](const std::string& text) { throw std::invalid_argument(text); };
  if (!(rate >= 0) || !std::isfinite(rate))
    fail("--rate: " + number_text(rate) + " is not a rate; give requests per second, > 0");
  if (clients < 0)
    fail("--clients: " + std::to_string(clients) +
         " is not a number of clients; give 1 or more for a closed loop (none: open loop)");
  if (trace.empty() && requests == 0)
    fail("--requests: 0 requests; give 1 or more (0, all of a trace's rows, only with --trace)");
  if (!(think_s >= 0) || !std::isfinite(think_s))
    fail("--think-s: " + number_text(think_s) + " is not a pause; give seconds >= 0");
  if (!(cancel_fraction >= 0 && cancel_fraction <= 1))
    fail("--cancel-fraction: " + number_text(cancel_fraction) +
         " is not a share; give a fraction in [0, 1]");
  if (!(cancel_after_s >= 0) || !std::isfinite(cancel_after_s))
    fail("--cancel-after-s: " + number_text(cancel_after_s) +
         " is not a mean time; give seconds >= 0");
  if (!(priority_fraction >= 0 && priority_fraction <= 1))
    fail("--priority-fraction: " + number_text(priority_fraction) +
         " is not a share; give a fraction in [0, 1]");
  if (!(length_scale > 0) || !std::isfinite(length_scale))
    fail("--length-scale: " + number_text(length_scale) + " is not a factor; give a number > 0");
  const auto parsed = [&](const char* flag, const auto& parse) {
    try {
      parse();
    } catch (const std::invalid_argument& e) {
      fail(std::string(flag) + ": " + e.what());
    }
  };
  parsed("--prompt", [&] { LengthDist::parse(prompt); });
  parsed("--output", [&] { LengthDist::parse(output); });
  parsed("--arrivals", [&] { ArrivalProcess::parse(arrivals, 1.0); });
  // A flag the chosen workload would ignore: the run would not be the one
  // asked for. (A value left at its default counts as not given.)
  const WorkloadSpec dflt;
  const auto ignored = [&](bool given, const std::string& flag, const std::string& why) {
    if (given) fail(flag + ": " + why + "; drop " + flag);
  };
  if (!trace.empty()) {
    const std::string why = "a trace gives the arrivals and lengths";
    ignored(clients > 0, "--clients", why);
    ignored(arrivals != dflt.arrivals, "--arrivals", why);
    ignored(prompt != dflt.prompt, "--prompt", why);
    ignored(output != dflt.output, "--output", why);
    ignored(cancel_fraction > 0, "--cancel-fraction", "a trace's requests are not cancelled");
    ignored(priority_fraction > 0, "--priority-fraction", "a trace's requests have one priority");
  } else if (clients > 0) {
    const std::string why = "closed-loop clients send when they are answered";
    ignored(rate > 0, "--rate", why + ", not at a rate");
    ignored(arrivals != dflt.arrivals, "--arrivals", why + ", not by an arrival process");
    ignored(cancel_fraction > 0, "--cancel-fraction",
            "closed-loop clients do not cancel (open loop: --rate)");
    ignored(priority_fraction > 0, "--priority-fraction",
            "closed-loop clients send one priority (open loop: --rate)");
  }
  ignored(think_s != dflt.think_s && clients == 0, "--think-s",
          "only closed-loop clients (--clients) pause between requests");
  ignored(length_scale != dflt.length_scale && trace.empty(), "--length-scale",
          "it scales a trace's lengths (--trace); synthetic lengths are --prompt and --output");
  ignored(cancel_after_s != dflt.cancel_after_s && cancel_fraction == 0, "--cancel-after-s",
          "no request is cancelled without --cancel-fraction");
  if (prefix_len < 0)
    fail("--prefix-len: " + std::to_string(prefix_len) +
         " is not a length; give the tokens every prompt starts with, >= 1 (0: none)");
  if (prefix_groups < 1)
    fail("--prefix-groups: " + std::to_string(prefix_groups) +
         " is not a number of prefixes; give 1 or more");
  ignored(prefix_groups != dflt.prefix_groups && prefix_len == 0, "--prefix-groups",
          "there is no shared prefix without --prefix-len");
}

Failure parse_failure(const std::string& spec) {
  const std::string form =
      "--fail: '" + spec +
      "' is not TIME:REPLICA or TIME:node:N (TIME in seconds, replicas and nodes counted from 0)";
  const auto parts = split_colons(spec);
  if (parts.size() != 2 && !(parts.size() == 3 && parts[1] == "node"))
    throw std::invalid_argument(form);
  const auto time = finite_number(parts[0]);
  const auto index = index_number(parts.back());
  if (!time || !index) throw std::invalid_argument(form);
  if (*time < 0)
    throw std::invalid_argument("--fail: '" + spec + "': the time " + parts[0] +
                                " is before the start; give seconds >= 0");
  Failure f;
  f.time_s = *time;
  (parts.size() == 3 ? f.node : f.replica) = *index;
  return f;
}

std::pair<int, double> parse_slowdown(const std::string& spec) {
  const auto parts = split_colons(spec);
  const auto replica = parts.size() == 2 ? index_number(parts[0]) : std::nullopt;
  const auto factor = parts.size() == 2 ? finite_number(parts[1]) : std::nullopt;
  if (!replica || !factor || *factor <= 0)
    throw std::invalid_argument("--slow: '" + spec +
                                "' is not REPLICA:FACTOR (a replica counted from 0, a factor > 0: "
                                "2 makes its steps take twice as long)");
  return {*replica, *factor};
}

std::unique_ptr<Workload> WorkloadSpec::make(int max_context) const {
  check();
  if (prefix_len > 0) {
    if (max_context > 0 && prefix_len + 2 > max_context)
      throw std::invalid_argument("--prefix-len: " + std::to_string(prefix_len) +
                                  " leaves no room in the model's context of " +
                                  std::to_string(max_context) +
                                  " tokens for a prompt's own token and an output token");
    // A trace's rows are cut to leave the prefix room.
    WorkloadSpec own = *this;
    own.prefix_len = 0;
    own.prefix_groups = 1;
    return std::make_unique<SharedPrefixWorkload>(
        own.make(max_context > 0 ? std::max(1, max_context - prefix_len) : 0), prefix_len,
        prefix_groups, seed);
  }
  if (!trace.empty()) {
    TraceOptions o;
    o.length_scale = length_scale;
    o.max_context = max_context;
    o.limit = requests;
    if (rate > 0) {
      // The rate of the rows replayed: the first `requests` of them.
      const TraceStats s = trace_stats(trace, requests);
      if (s.rate_per_s() <= 0)
        throw std::invalid_argument(
            trace + ": too few rows or no time span to rescale to a rate" +
            (requests > 0 ? " in the first " + std::to_string(requests) + " rows (--requests)"
                          : std::string()));
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
  if (prefix_len > 0)
    s << ", after a shared prefix of " << prefix_len << " tokens ("
      << (prefix_groups == 1 ? std::string("one for all")
                             : std::to_string(prefix_groups) + " different ones")
      << ")";
  return s.str();
}

RunResult simulate(const SimOptions& options, const std::vector<StepCostModel>& models,
                   const WorkloadSpec& spec, const Slo& slo, SimObserver* extra,
                   std::unique_ptr<RouterLog> log) {
  const auto workload = spec.make(options.scheduler.stop.context_length);
  RunResult res;
  res.summary = RunSummary(slo);
  res.summary.set_limits(options.scheduler.stop.context_length, options.max_tokens_limit);
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
  const Workload* w = workload.get();
  if (const auto* shared = dynamic_cast<const SharedPrefixWorkload*>(w)) w = &shared->inner();
  if (const auto* t = dynamic_cast<const TraceWorkload*>(w)) res.trace_cuts = t->cuts();
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
