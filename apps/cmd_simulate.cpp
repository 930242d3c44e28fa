// `troupe simulate`: the runtime's scheduling objects on a virtual clock
// (scheduler/sim/), built from the same config as `troupe serve`, with step
// times from a profile measured by `troupe bench --profile`. Modes: one run,
// --sweep (policies x rates x layouts, a table, a CSV and a plot), and
// --validate (the same workload against a real `troupe serve`, side by side).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "apps/bench_serving.h"
#include "apps/commands.h"
#include "net/admin_client.h"
#include "scheduler/sim/run.h"
#include "scheduler/sim/sweep.h"

extern char** environ;

namespace troupe::app {

namespace {

using sim::StepProfile;
using sim::WorkloadSpec;

struct SimulateOptions {
  ConfigFlags config;
  std::string profile;
  WorkloadSpec workload;
  std::vector<std::string> slow;   // REPLICA:FACTOR
  std::vector<std::string> fails;  // TIME:REPLICA or TIME:node:N
  double mtbf_s = 0, node_mtbf_s = 0, restart_s = 2, sample_s = 1;
  int replicas_per_node = 1;
  sim::Slo slo;
  bool find_max_rate = false;
  bool out_given = false, refine_given = false;
  bool json = false;
  std::string csv_dir;
  std::string router_log;
  std::string emit_trace;
  // --sweep
  bool sweep = false;
  std::string policies, rates, layouts;
  std::string out_dir = "simulate-sweep";
  int refine = 3;
  // --calibrate
  bool calibrate = false;
  // --validate
  bool validate = false;
  std::string loads = "0.3,0.7";
  int prompt_len = 32, output_len = 32;
  int repeats = 2;
  bool rate_given = false;  // --rate appeared (0 is then not "no rate")
  // --requests as given: signed, so that a negative count is refused rather
  // than wrapped into an endless run (workload.requests once checked).
  long long requests = 1000;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Every policy of --policies, before the first point runs.
void check_policy_names(const std::vector<std::string>& policies) {
  for (const std::string& p : policies)
    if (const std::string problem = routing_policy_problem(p); !problem.empty())
      throw UsageError("--policies: '" + p + "' is not a routing policy: " + problem);
}

double parse_number(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(v))
    throw UsageError(what + ": '" + text + "' is not a number");
  return v;
}

std::vector<double> parse_numbers(const std::string& text, const std::string& what) {
  std::vector<double> out;
  for (const auto& s : split_list(text)) {
    out.push_back(parse_number(s, what));
    if (out.back() <= 0) throw UsageError(what + ": '" + s + "' must be positive");
  }
  if (out.empty()) throw UsageError(what + ": no values given");
  return out;
}

// "RxPxT" -> the config keys it sets.
std::vector<std::pair<std::string, std::string>> layout_overrides(const std::string& layout) {
  int r = 0, p = 0, t = 0;
  char tail = 0;
  if (std::sscanf(layout.c_str(), "%dx%dx%d%c", &r, &p, &t, &tail) != 3 || r < 1 || p < 1 || t < 1)
    throw UsageError("--layouts: '" + layout + "' is not REPLICASxPIPELINExTENSOR, e.g. 4x1x2");
  return {{"parallel.replicas", std::to_string(r)},
          {"parallel.pipeline", std::to_string(p)},
          {"parallel.tensor", std::to_string(t)}};
}

std::string layout_name(const Config& c) {
  return std::to_string(c.parallel.replicas) + "x" + std::to_string(c.parallel.pipeline) + "x" +
         std::to_string(c.parallel.tensor);
}

// --profile, else the bundle's benchmarks/profiles/<model>.json.
std::filesystem::path profile_path(const SimulateOptions& o, const Config& cfg) {
  if (!o.profile.empty()) return o.profile;
  const auto file = bundle_root() / "benchmarks" / "profiles" / (served_model_name(cfg) + ".json");
  if (!std::filesystem::exists(file))
    throw UsageError("no step profile for model " + served_model_name(cfg) + " (looked for " +
                     file.string() +
                     "); make one with troupe bench --profile FILE, then pass --profile FILE");
  return file;
}

StepProfile load_profile(const SimulateOptions& o, const Config& cfg) {
  const std::filesystem::path file = profile_path(o, cfg);
  StepProfile profile;
  try {
    profile = StepProfile::load(file);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // The profile names the model it measured as bench was given it (a path,
  // or "preset:NAME"). The simulation is of that model (its steps, context
  // and stop tokens), whatever the config's model.path says: said, when
  // the two differ, so that a run is not taken for the config's model.
  const auto stem = [](std::string name) {
    if (name.rfind("preset:", 0) == 0) return name;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    return std::filesystem::path(name).stem().string();
  };
  if (stem(profile.model.name) != stem(cfg.model.path))
    std::cerr << "troupe simulate: simulating " << profile.model.name << " (context "
              << profile.model.max_seq_len << " tokens), the model " << file.string()
              << " measured, not the config's " << cfg.model.path
              << " (set model.path to the profile's model to say so)\n";
  const auto measured = parse_dtype(profile.kv_dtype);
  if (!measured)
    throw UsageError(file.string() + ": kv_dtype '" + profile.kv_dtype +
                     "' is not f32, f16 or bf16");
  if (*measured != cfg.kv_cache.dtype)
    std::cerr << "troupe simulate: the profile's steps were measured with a " << profile.kv_dtype
              << " KV cache; the config's is " << dtype_name(cfg.kv_cache.dtype)
              << " (its capacity is sized for it, its step times are the profile's)\n";
  return profile;
}

// A parser of the sim library's, its std::invalid_argument (which names the
// flag) as a usage error.
template <class Parse, class Arg>
auto usage(Parse parse, const Arg& arg) {
  try {
    return parse(arg);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// Every flag's value on its own, before anything runs: a message naming the
// flag and the values it takes (the workload's are WorkloadSpec::check's).
void check_flags(const SimulateOptions& o) {
  const auto fail = [](const std::string& flag, double v, const std::string& range) {
    std::ostringstream s;
    s << flag << ": " << v << " is out of range; give " << range;
    throw UsageError(s.str());
  };
  const auto seconds = [&](const char* flag, double v, const char* range) {
    if (!(v >= 0) || !std::isfinite(v)) fail(flag, v, range);
  };
  const auto positive = [&](const char* flag, double v, const char* range) {
    if (!(v > 0) || !std::isfinite(v)) fail(flag, v, range);
  };
  if (o.rate_given) positive("--rate", o.workload.rate, "requests per second, > 0");
  usage([](const WorkloadSpec& w) { w.check(); }, o.workload);
  seconds("--mtbf-s", o.mtbf_s, "seconds >= 0 (0: no random replica deaths)");
  seconds("--node-mtbf-s", o.node_mtbf_s, "seconds >= 0 (0: no random node deaths)");
  if (o.replicas_per_node < 1) fail("--replicas-per-node", o.replicas_per_node, "1 or more");
  seconds("--restart-s", o.restart_s, "seconds >= 0");
  seconds("--sample-s", o.sample_s, "seconds >= 0 (0: no time series)");
  positive("--slo-ttft-s", o.slo.ttft_s, "seconds > 0");
  positive("--slo-tpot-s", o.slo.tpot_s, "seconds > 0");
  if (o.refine < 0 || o.refine > 30) fail("--refine", o.refine, "0 to 30 bisection steps");
  if (o.prompt_len < 1) fail("--prompt-len", o.prompt_len, "1 or more tokens");
  if (o.output_len < 1) fail("--output-len", o.output_len, "1 or more tokens");
  if (o.repeats < 1) fail("--repeats", o.repeats, "1 or more real runs per point");
  for (const std::string& spec : o.slow) usage(sim::parse_slowdown, spec);
  for (const std::string& spec : o.fails) usage(sim::parse_failure, spec);
}

// The config's KV bytes per token: the profile's, for the config's cache
// elements (load_profile checked the profile's type; the step times stay
// those measured with it).
long long config_kv_bytes_per_token(const StepProfile& profile, const Config& cfg) {
  const DType measured = parse_dtype(profile.kv_dtype).value_or(DType::F32);
  return profile.model.kv_bytes_per_token / (long long)dtype_size(measured) *
         (long long)dtype_size(cfg.kv_cache.dtype);
}

// The same objects the runtime builds from the same config (actors/runtime.cpp).
sim::SimOptions sim_options(const Config& cfg, const StepProfile& profile,
                            const SimulateOptions& o) {
  // Refused here, before any run, rather than by each run's workload.
  const int context = profile.model.max_seq_len;
  if (o.workload.prefix_len > 0 && o.workload.prefix_len + 2 > context)
    throw UsageError("--prefix-len: " + std::to_string(o.workload.prefix_len) +
                     " leaves no room in the model's context of " + std::to_string(context) +
                     " tokens for a prompt's own token and an output token");
  sim::SimOptions s;
  s.replicas = cfg.parallel.replicas;
  s.table.max_seq_len = profile.model.max_seq_len;
  s.table.max_batch_sequences = cfg.batching.max_batch_sequences;
  s.table.max_waiting_per_replica = cfg.batching.max_waiting;
  s.table.admission = admission_queue_options(cfg);
  s.policy = cfg.routing.policy;
  s.policy_seed = cfg.routing.seed;
  s.latency_aware = cfg.routing.latency_aware;
  s.scheduler.block_tokens = cfg.kv_cache.block_tokens;
  s.scheduler.kv_blocks = cfg.kv_cache.bytes > 0
                              ? int(cfg.kv_cache.bytes / (config_kv_bytes_per_token(profile, cfg) *
                                                          cfg.kv_cache.block_tokens))
                              : int(cfg.kv_cache.blocks);
  s.scheduler.limits = {cfg.batching.max_batch_sequences, cfg.batching.max_batch_tokens,
                        cfg.batching.prefill_chunk_tokens};
  s.scheduler.stop = StopRule{profile.model.eos, profile.model.max_seq_len};
  s.scheduler.bos = profile.model.bos;
  s.scheduler.lookahead = cfg.batching.async_scheduling;  // one group only (make_scheduler)
  s.scheduler.prefix_caching = cfg.kv_cache.prefix_caching;
  s.request_timeout_s = cfg.server.request_timeout_s;
  s.max_tokens_limit = cfg.server.max_tokens_limit;
  s.max_restarts = cfg.supervision.max_restarts;
  s.restart_window_s = cfg.supervision.within_s;
  s.restart_s = o.restart_s;
  s.mtbf_s = o.mtbf_s;
  s.node_mtbf_s = o.node_mtbf_s;
  s.replicas_per_node = o.replicas_per_node;
  s.sample_s = o.sample_s;
  s.seed = o.workload.seed;
  // The shapes were checked with the other flags (check_flags); whether the
  // replicas and nodes exist depends on the config.
  if (!o.slow.empty()) s.slowdown.assign(size_t(s.replicas), 1.0);
  for (const std::string& spec : o.slow) {
    const auto [r, factor] = usage(sim::parse_slowdown, spec);
    if (r >= s.replicas)
      throw UsageError("--slow: '" + spec + "': replica " + std::to_string(r) +
                       " does not exist: there " +
                       (s.replicas == 1 ? std::string("is one replica, 0")
                                        : "are replicas 0.." + std::to_string(s.replicas - 1)));
    s.slowdown[size_t(r)] = factor;
  }
  for (const std::string& spec : o.fails) {
    const sim::Failure f = usage(sim::parse_failure, spec);
    if (const std::string problem = sim::failure_problem(f, s.replicas, s.replicas_per_node);
        !problem.empty())
      throw UsageError("--fail: '" + spec + "': " + problem);
    s.failures.push_back(f);
  }
  return s;
}

std::vector<sim::StepCostModel> cost_models(const Config& cfg, const StepProfile& profile) {
  const int threads = cfg.devices.front().threads;
  try {
    const sim::ProfileGrid& grid =
        profile.find(cfg.parallel.pipeline, cfg.parallel.tensor, threads);
    if (grid.threads != threads) {
      // Steps of another thread count stand in: say so, once per grid (a
      // sweep asks again for every point).
      static std::set<std::string> said;
      if (said.insert(grid.describe() + "/" + std::to_string(threads)).second)
        std::cerr << "troupe simulate: the profile has no grid of " << threads
                  << " thread(s) per device for layout " << cfg.parallel.pipeline << "x"
                  << cfg.parallel.tensor << "; using the nearest (" << grid.describe()
                  << "): measure one with troupe bench --threads " << threads
                  << " --profile FILE\n";
    }
    return {sim::StepCostModel(grid)};
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// A replay that kept a small part of its trace's work should say so: its
// figures describe another workload.
void warn_trace_cuts(const sim::TraceCuts& c) {
  if (c.cut == 0) return;
  std::fprintf(stderr,
               "troupe simulate: %zu of %zu trace rows were cut to fit the model's %d-token "
               "context: prompts %.0f -> %.0f tokens, outputs %.0f -> %.0f in all (--length-scale "
               "%.2g fits the mean row)\n",
               c.cut, c.rows, c.context, c.asked_prompt, c.kept_prompt, c.asked_output,
               c.kept_output, c.scale_to_fit());
}

// The run as JSON: the summary, what was run (workload, layout, policy,
// seed, profile) and the simulation's own figures.
nlohmann::json run_json(const SimulateOptions& o, const Config& cfg, const sim::RunResult& r) {
  nlohmann::json j = r.summary.to_json();
  j["workload"] = o.workload.describe();
  if (o.workload.prefix_len > 0) {
    j["prefix_len"] = o.workload.prefix_len;
    j["prefix_groups"] = o.workload.prefix_groups;
  }
  j["seed"] = o.workload.seed;
  j["profile"] = profile_path(o, cfg).string();
  j["layout"] = layout_name(cfg);
  j["policy"] = cfg.routing.policy;
  j["simulation"] = {{"events", r.totals.events},
                     {"wall_s", r.wall_s},
                     {"events_per_s", r.wall_s > 0 ? double(r.totals.events) / r.wall_s : 0},
                     {"simulated_s", r.totals.end_time_s},
                     {"replica_failures", r.totals.failures},
                     {"restarts", r.totals.restarts},
                     {"given_up", r.totals.given_up},
                     {"resumed", r.totals.resumed},
                     {"prefix_cache",
                      {{"enabled", cfg.kv_cache.prefix_caching},
                       {"queried_tokens", r.totals.prefix_queried},
                       {"hit_tokens", r.totals.prefix_hits}}}};
  return j;
}

void print_run(const SimulateOptions& o, const Config& cfg, const sim::RunResult& r,
               const nlohmann::json& max_rate) {
  warn_trace_cuts(r.trace_cuts);
  if (o.json) {
    nlohmann::json j = run_json(o, cfg, r);
    if (!max_rate.is_null()) j["max_rate"] = max_rate;
    std::cout << j.dump(1) << "\n";
    return;
  }
  std::cout << "simulated " << layout_name(cfg) << " (replicas x pipeline x tensor), routing "
            << cfg.routing.policy << "; " << o.workload.describe() << "\n"
            << r.summary.table();
  std::printf(
      "simulation: %llu events in %.2f s (%.0f events/s), %.1f simulated s; %llu replica deaths, "
      "%llu restarts, %llu given up, %llu requests resumed\n",
      (unsigned long long)r.totals.events, r.wall_s,
      r.wall_s > 0 ? double(r.totals.events) / r.wall_s : 0.0, r.totals.end_time_s,
      (unsigned long long)r.totals.failures, (unsigned long long)r.totals.restarts,
      (unsigned long long)r.totals.given_up, (unsigned long long)r.totals.resumed);
  if (!cfg.kv_cache.prefix_caching) {
    if (o.workload.prefix_len > 0) std::printf("prefix cache: off (kv_cache.prefix_caching)\n");
  } else if (r.totals.prefix_hits > 0 || o.workload.prefix_len > 0) {
    std::printf("prefix cache: %llu of %llu prompt tokens found cached (%.0f%%)\n",
                (unsigned long long)r.totals.prefix_hits,
                (unsigned long long)r.totals.prefix_queried,
                r.totals.prefix_queried > 0
                    ? 100.0 * double(r.totals.prefix_hits) / double(r.totals.prefix_queried)
                    : 0.0);
  }
}

// Goodput at a rate depends on how long the load lasts: a few hundred
// requests at a rate past the capacity end before the queue has grown enough
// to miss the SLO. Each rate tried runs this long at least (synthetic
// arrivals; a trace replays its rows).
constexpr double kMaxRateMinSeconds = 60;
constexpr size_t kMaxRateMaxRequests = 100000;

std::optional<sim::MaxRate> find_max_rate(const SimulateOptions& o, const sim::SimOptions& so,
                                          const std::vector<sim::StepCostModel>& models) {
  if (!o.find_max_rate) return std::nullopt;
  const double start = o.workload.rate > 0 ? o.workload.rate : 1.0;
  // The search needs goodput only: no time series, whose windows would
  // be most of the work at the lowest rates it tries.
  sim::SimOptions search = so;
  search.sample_s = 0;
  return sim::search_max_rate(
      [&](double rate) {
        WorkloadSpec w = o.workload;
        w.rate = rate;
        if (w.trace.empty())
          w.requests = std::max(w.requests, std::min(kMaxRateMaxRequests,
                                                     size_t(std::ceil(rate * kMaxRateMinSeconds))));
        return sim::simulate(search, models, w, o.slo).summary.goodput_share();
      },
      start, 0.9);
}

nlohmann::json max_rate_json(const sim::MaxRate& m, const SimulateOptions& o) {
  const char* bound = m.bound == sim::MaxRate::Bound::Found          ? "found"
                      : m.bound == sim::MaxRate::Bound::MetAtHighest ? "met_at_highest"
                                                                     : "missed_at_lowest";
  return {{"rate", m.rate},
          {"bound", bound},
          {"share", 0.9},
          {"slo", {{"ttft_s", o.slo.ttft_s}, {"tpot_s", o.slo.tpot_s}}},
          {"lowest_tried", m.lowest},
          {"highest_tried", m.highest},
          {"min_seconds_per_rate", o.workload.trace.empty() ? kMaxRateMinSeconds : 0}};
}

void print_max_rate(const sim::MaxRate& m, const SimulateOptions& o) {
  switch (m.bound) {
    case sim::MaxRate::Bound::Found:
      std::printf("highest rate with 90%% within the SLO: %.3f requests/s", m.rate);
      if (o.workload.trace.empty())
        std::printf(" (each rate tried ran at least %.0f simulated seconds)", kMaxRateMinSeconds);
      std::printf("\n");
      break;
    case sim::MaxRate::Bound::MetAtHighest:
      std::printf(
          "90%% within the SLO even at %.3f requests/s, the highest rate tried (1024 x the "
          "start): a lower bound, not the maximum (a workload this short may never load the "
          "cluster enough to miss it: each rate ran --requests, or %.0f simulated seconds of "
          "arrivals up to %zu requests)\n",
          m.rate, kMaxRateMinSeconds, kMaxRateMaxRequests);
      break;
    case sim::MaxRate::Bound::MissedAtLowest:
      std::printf(
          "no rate tried keeps 90%% within the SLO: missed even at %.4g requests/s, the lowest "
          "tried (a request alone may miss TTFT <= %.3g s or TPOT <= %.3g s)\n",
          m.lowest, o.slo.ttft_s, o.slo.tpot_s);
      break;
  }
}

// A scripted death after the run ended changed nothing: say so.
void warn_late_failures(const SimulateOptions& o, const sim::RunResult& r) {
  for (const std::string& spec : o.fails) {
    const sim::Failure f = usage(sim::parse_failure, spec);
    if (f.time_s > r.totals.end_time_s)
      std::fprintf(stderr,
                   "troupe simulate: --fail %s: at %.3g s, after the run ended (%.3g simulated "
                   "s): nothing failed\n",
                   spec.c_str(), f.time_s, r.totals.end_time_s);
  }
}

void run_single(const SimulateOptions& o) {
  const Config cfg = command_config(o.config);
  const StepProfile profile = load_profile(o, cfg);
  const auto models = cost_models(cfg, profile);
  const sim::SimOptions so = sim_options(cfg, profile, o);
  std::unique_ptr<sim::TimeSeriesCsv> csv;
  if (!o.csv_dir.empty()) csv = std::make_unique<sim::TimeSeriesCsv>(o.csv_dir);
  std::unique_ptr<RouterLog> log;
  if (!o.router_log.empty()) log = std::make_unique<RouterLog>(o.router_log);
  const sim::RunResult r = sim::simulate(so, models, o.workload, o.slo, csv.get(), std::move(log));
  warn_late_failures(o, r);
  const std::optional<sim::MaxRate> max_rate = find_max_rate(o, so, models);
  print_run(o, cfg, r, max_rate ? max_rate_json(*max_rate, o) : nlohmann::json());
  if (!o.csv_dir.empty()) {
    std::ofstream(std::filesystem::path(o.csv_dir) / "summary.json")
        << run_json(o, cfg, r).dump(1) << "\n";
    std::cerr << "troupe simulate: time series in " << o.csv_dir
              << "/cluster.csv and replicas.csv\n";
  }
  if (max_rate && !o.json) print_max_rate(*max_rate, o);
}

void run_sweep(const SimulateOptions& o) {
  const Config base = command_config(o.config);
  const StepProfile profile = load_profile(o, base);
  std::vector<std::string> policies = split_list(o.policies);
  if (policies.empty()) policies = routing_policy_names();
  check_policy_names(policies);
  const std::vector<double> rates = parse_numbers(o.rates, "--rates");
  std::vector<std::string> layouts = split_list(o.layouts);
  if (layouts.empty()) layouts.push_back(layout_name(base));
  std::filesystem::create_directories(o.out_dir);
  std::vector<sim::SweepPoint> points;
  std::vector<std::tuple<std::string, std::string, sim::MaxRate>> max_rates;
  for (const std::string& layout : layouts)
    for (const std::string& policy : policies) {
      auto overrides = layout_overrides(layout);
      overrides.emplace_back("routing.policy", policy);
      const Config cfg = command_config(o.config, overrides);
      const auto models = cost_models(cfg, profile);
      const sim::SimOptions so = sim_options(cfg, profile, o);
      const auto run_at = [&](double rate) {
        WorkloadSpec w = o.workload;
        w.rate = rate;
        return sim::simulate(so, models, w, o.slo);
      };
      std::vector<std::pair<double, double>> shares;
      for (double rate : rates) {
        const sim::RunResult r = run_at(rate);
        points.push_back({policy, layout, rate, r.summary, r.wall_s});
        shares.emplace_back(rate, r.summary.goodput_share());
        std::cerr << "  " << policy << " " << layout << " at " << rate << "/s: done in " << r.wall_s
                  << " s\n";
      }
      max_rates.emplace_back(policy, layout,
                             sim::max_rate_within_slo(shares, 0.9, o.refine, [&](double rate) {
                               return run_at(rate).summary.goodput_share();
                             }));
    }
  std::cout << "sweep: " << o.workload.describe() << "\n" << sim::sweep_table(points, max_rates);
  const std::filesystem::path dir = o.out_dir;
  sim::write_sweep_csv(points, dir / "sweep.csv");
  const auto image = sim::plot_sweep(points, dir);
  std::cout << "wrote " << (dir / "sweep.csv").string() << " and " << (dir / "sweep.gp").string();
  if (image)
    std::cout << "; plot " << image->string() << "\n";
  else
    std::cout << "; no plot: gnuplot is not installed (apt-get install gnuplot-nox, then run "
                 "gnuplot sweep.gp in "
              << dir.string() << ")\n";
}

// ---- --validate: a real server ----

// `troupe serve` started from this binary on a free loopback port; stopped
// (SIGTERM, then SIGKILL) and reaped on destruction. Its stderr is drained
// by a thread so that its logging never blocks it.
class ServerProcess {
 public:
  // With an admin token, the server takes faults (POST /admin/faults) from
  // its holder.
  ServerProcess(const SimulateOptions& o, const std::string& policy, int replicas,
                const std::string& admin_token = "") {
    std::vector<std::string> args{"/proc/self/exe", "serve", "--listen", "127.0.0.1:0"};
    if (!o.config.file.empty()) args.insert(args.end(), {"--config", o.config.file});
    for (const auto& s : o.config.overrides) args.insert(args.end(), {"--set", s});
    args.insert(args.end(), {"--set", "logging.level=info"});
    if (!policy.empty()) args.insert(args.end(), {"--set", "routing.policy=" + policy});
    if (!admin_token.empty())
      args.insert(args.end(),
                  {"--set", "admin.faults=true", "--set", "admin.token=" + admin_token});
    // Its own API key, whatever the config or the environment would give it.
    args.insert(args.end(), {"--set", "server.api_key=" + api_key_});
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      throw std::runtime_error("cannot start troupe serve");
    }
    fd_ = fds[0];
    const std::string listening = wait_for("listening on http://", 1, 120);
    url_ = listening.substr(listening.find("http://"));
    while (!url_.empty() && std::isspace(static_cast<unsigned char>(url_.back()))) url_.pop_back();
    wait_for(" ready", replicas, 120);  // "replica N ready": every probe passed
    drain_ = std::thread([this] {
      char buf[4096];
      while (read(fd_, buf, sizeof buf) > 0) {
      }
    });
  }
  ~ServerProcess() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (drain_.joinable()) drain_.join();
    close(fd_);
  }
  const std::string& url() const { return url_; }
  const std::string& api_key() const { return api_key_; }

 private:
  // Reads stderr until `count` lines contain `needle`; returns the last.
  std::string wait_for(const std::string& needle, int count, double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::string line, found;
    int seen = 0;
    char c = 0;
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      if (read(fd_, &c, 1) != 1) break;
      log_ += c;
      if (c != '\n') {
        line += c;
        continue;
      }
      if (line.find(needle) != std::string::npos) {
        found = line;
        if (++seen == count) return found;
      }
      line.clear();
    }
    throw std::runtime_error("troupe serve did not report '" + needle + "' in time; it said:\n" +
                             log_);
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string url_, log_;
  std::string api_key_ = fresh_admin_token();
  std::thread drain_;
};

// Heterogeneous replicas for --validate (--slow): each slowed replica of the
// real server gets a slow fault of the same factor for as long as the
// server lives, through its fault injection (every step takes the factor
// times as long), as the simulated replica's steps do.
void slow_real_replicas(const ServerProcess& server, const std::string& token,
                        const std::vector<double>& slowdown) {
  const serving_bench::HttpUrl url = serving_bench::parse_http_url(server.url());
  const ServerEndpoint admin{url.host, url.port, token, server.api_key()};
  for (size_t r = 0; r < slowdown.size(); ++r) {
    if (slowdown[r] == 1) continue;
    const nlohmann::json body{
        {"kind", "slow"}, {"replica", r}, {"factor", slowdown[r]}, {"duration_s", 86400}};
    const HttpResponse resp = admin.call("POST", "/admin/faults", body.dump());
    if (resp.status < 200 || resp.status >= 300)
      throw std::runtime_error("--validate --slow: the server refused the slow fault on replica " +
                               std::to_string(r) + " (" + std::to_string(resp.status) +
                               "): " + resp.body);
  }
}

// The serving bench's Poisson open loop of this command's fixed-length
// requests (the rate is the caller's).
serving_bench::ServingBenchOptions open_loop(const SimulateOptions& o, const std::string& url) {
  serving_bench::ServingBenchOptions bo;
  bo.url = url;
  bo.requests = int(o.workload.requests);
  bo.prompt_len = o.prompt_len;
  bo.output_len = o.output_len;
  bo.seed = o.workload.seed;
  bo.timeout_s = 120;
  bo.max_inflight = 1024;
  return bo;
}

// The figures compared, from the real client's view and the simulator's.
struct Figures {
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0, latency_p50 = 0, tokens_per_s = 0;
  int completed = 0;
};

const std::vector<std::pair<const char*, double Figures::*>> kMetrics{
    {"TTFT p50", &Figures::ttft_p50},       {"TTFT p99", &Figures::ttft_p99},
    {"TPOT p50", &Figures::tpot_p50},       {"TPOT p99", &Figures::tpot_p99},
    {"latency p50", &Figures::latency_p50}, {"output tok/s", &Figures::tokens_per_s}};

Figures figures_of(const serving_bench::ServingBenchResult& r) {
  return {r.ttft_s.p50, r.ttft_s.p99,    r.tpot_s.p50,
          r.tpot_s.p99, r.latency_s.p50, r.output_tokens_per_s(),
          r.completed};
}

// The serving bench's open loop, request for request: the same Poisson
// gaps from the same seed, fixed lengths.
class BenchArrivals : public sim::Workload {
 public:
  BenchArrivals(const serving_bench::ServingBenchOptions& o) : o_(o), gaps_(o.rate, o.seed) {}
  std::optional<sim::Arrival> next() override {
    if (sent_ >= o_.requests) return std::nullopt;
    if (sent_++ > 0) t_ += gaps_.next_gap_s();
    sim::Arrival a;
    a.time_s = t_;
    a.prompt_tokens = o_.prompt_len;
    a.output_tokens = o_.output_len;
    return a;
  }

 private:
  serving_bench::ServingBenchOptions o_;
  serving_bench::PoissonArrivals gaps_;
  int sent_ = 0;
  double t_ = 0;
};

Figures simulate_bench(const sim::SimOptions& so, const std::vector<sim::StepCostModel>& models,
                       const serving_bench::ServingBenchOptions& bo) {
  struct Collect : sim::SimObserver {
    std::vector<double> ttft, tpot, latency;
    double first = 1e300, last = 0;
    long long tokens = 0;
    int completed = 0;
    void on_request_end(const sim::RequestRecord& r) override {
      first = std::min(first, r.arrival);
      last = std::max(last, r.end);
      tokens += r.output_tokens;
      if (r.outcome != sim::Outcome::Completed) return;
      ++completed;
      if (r.first_token >= 0) ttft.push_back(r.ttft());
      if (r.output_tokens > 1) tpot.push_back(r.tpot());
      latency.push_back(r.latency());
    }
  } c;
  BenchArrivals w(bo);
  sim::Simulator sim(so, models, w, &c);
  sim.run();
  const auto t = serving_bench::summarize(c.ttft), p = serving_bench::summarize(c.tpot),
             l = serving_bench::summarize(c.latency);
  return {t.p50,      t.p99, p.p50,
          p.p99,      l.p50, c.last > c.first ? double(c.tokens) / (c.last - c.first) : 0,
          c.completed};
}

// `clients` clients sending fixed-length requests back to back.
WorkloadSpec closed_loop(int clients, size_t requests, int prompt_len, int output_len) {
  WorkloadSpec w;
  w.clients = clients;
  w.requests = requests;
  w.prompt = std::to_string(prompt_len);
  w.output = std::to_string(output_len);
  return w;
}

// The rate one replica set sustains: a closed loop that keeps every batch
// slot full, simulated.
double simulated_capacity(const sim::SimOptions& so, const std::vector<sim::StepCostModel>& models,
                          int prompt_len, int output_len) {
  const int clients = so.replicas * so.table.max_batch_sequences;
  const WorkloadSpec w = closed_loop(clients, size_t(clients) * 8, prompt_len, output_len);
  return sim::simulate(so, models, w, {}).summary.requests_per_s();
}

void run_validate(const SimulateOptions& o) {
  const Config cfg = command_config(o.config);
  const StepProfile profile = load_profile(o, cfg);
  std::vector<std::string> policies = split_list(o.policies);
  if (policies.empty()) policies = routing_policy_names();
  check_policy_names(policies);
  serving_bench::ServingBenchOptions bo = open_loop(o, "");
  std::vector<double> rates;
  {
    const auto models = cost_models(cfg, profile);
    const double capacity =
        simulated_capacity(sim_options(cfg, profile, o), models, o.prompt_len, o.output_len);
    if (!o.rates.empty()) {
      rates = parse_numbers(o.rates, "--rates");
    } else {
      for (double load : parse_numbers(o.loads, "--loads")) rates.push_back(load * capacity);
    }
    std::printf(
        "validate: %s, %d requests of %d prompt + %d output tokens, Poisson; simulated capacity "
        "%.2f requests/s; rates:",
        layout_name(cfg).c_str(), bo.requests, bo.prompt_len, bo.output_len, capacity);
    for (double r : rates) std::printf(" %.2f", r);
    std::printf("/s; %d real run%s per point", o.repeats,
                o.repeats == 1 ? " (so no run-to-run spread)" : "s");
    for (const std::string& spec : o.slow) std::printf("; --slow %s", spec.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }
  for (const std::string& spec : o.slow)
    if (parse_number(spec.substr(spec.find(':') + 1), "--slow") < 1)
      throw UsageError("--validate --slow: '" + spec +
                       "': a real replica can be slowed, not sped up; give factors of 1 or more");
  // [rate][policy] -> figures
  std::map<double, std::map<std::string, Figures>> simulated, measured;
  std::map<double, std::map<std::string, Figures>> spread;  // (max - min) / mean per metric
  for (const std::string& policy : policies) {
    Config pc = command_config(o.config, {{"routing.policy", policy}});
    const sim::SimOptions so = sim_options(pc, profile, o);
    const auto models = cost_models(pc, profile);
    const std::string token = so.slowdown.empty() ? "" : fresh_admin_token();
    ServerProcess server(o, policy, pc.parallel.replicas, token);
    if (!so.slowdown.empty()) slow_real_replicas(server, token, so.slowdown);
    bo.url = server.url();
    bo.api_key = server.api_key();
    for (double rate : rates) {
      bo.rate = rate;
      simulated[rate][policy] = simulate_bench(so, models, bo);
      std::vector<Figures> runs;
      for (int i = 0; i < o.repeats; ++i)
        runs.push_back(figures_of(serving_bench::run_serving_bench(bo)));
      Figures mean, lo = runs[0], hi = runs[0], rel;
      for (const auto& [name, m] : kMetrics) {
        double sum = 0;
        for (const Figures& f : runs) {
          sum += f.*m;
          lo.*m = std::min(lo.*m, f.*m);
          hi.*m = std::max(hi.*m, f.*m);
        }
        mean.*m = sum / double(runs.size());
        rel.*m = mean.*m > 0 ? (hi.*m - lo.*m) / mean.*m : 0;
      }
      mean.completed = runs[0].completed;
      measured[rate][policy] = mean;
      spread[rate][policy] = rel;
      std::fprintf(stderr, "  %s at %.2f/s: measured\n", policy.c_str(), rate);
    }
  }
  nlohmann::json out = nlohmann::json::array();
  // One run per point measures no run-to-run spread: 0 would make every
  // difference look real.
  const bool has_spread = o.repeats > 1;
  for (double rate : rates) {
    std::printf("\nrate %.2f requests/s (times in ms)\n%-18s %-13s %10s %10s %8s %8s\n", rate,
                "policy", "metric", "simulated", "measured", "error", "spread");
    for (const std::string& policy : policies) {
      const Figures& s = simulated[rate][policy];
      const Figures& m = measured[rate][policy];
      const Figures& sp = spread[rate][policy];
      for (const auto& [name, f] : kMetrics) {
        const bool ms = std::string(name) != "output tok/s";
        const double err = m.*f > 0 ? (s.*f - m.*f) / m.*f : 0;
        char spread_text[16] = "       -";  // one run: no spread
        if (has_spread) std::snprintf(spread_text, sizeof spread_text, "%7.1f%%", 100 * (sp.*f));
        std::printf("%-18s %-13s %10.2f %10.2f %+7.1f%% %s%s\n", policy.c_str(), name,
                    ms ? 1e3 * (s.*f) : s.*f, ms ? 1e3 * (m.*f) : m.*f, 100 * err, spread_text,
                    has_spread && std::abs(err) <= sp.*f ? "  (within spread)" : "");
        out.push_back({{"rate", rate},
                       {"policy", policy},
                       {"metric", name},
                       {"simulated", s.*f},
                       {"measured", m.*f},
                       {"error", err},
                       {"spread", has_spread ? nlohmann::json(sp.*f) : nlohmann::json()}});
      }
    }
    // Rankings by median end-to-end latency.
    auto ranking = [&](std::map<std::string, Figures>& by) {
      std::vector<std::string> order = policies;
      std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
        return by[a].latency_p50 < by[b].latency_p50;
      });
      std::string s;
      for (const auto& p : order) s += (s.empty() ? "" : " < ") + p;
      return s;
    };
    const std::string rs = ranking(simulated[rate]), rm = ranking(measured[rate]);
    if (!has_spread) {
      std::printf(
          "ranking by latency p50: simulated %s; measured %s: %s; one real run per point has no "
          "spread to tell the policies apart by (--repeats 2 or more), so no pair is counted\n",
          rs.c_str(), rm.c_str(), rs == rm ? "same" : "different");
      continue;
    }
    // Only a measured difference beyond the run-to-run spread is a ranking
    // worth reproducing; the rest are ties.
    int pairs = 0, agree = 0;
    for (size_t a = 0; a < policies.size(); ++a)
      for (size_t b = a + 1; b < policies.size(); ++b) {
        const Figures &ma = measured[rate][policies[a]], &mb = measured[rate][policies[b]];
        const double noise = std::max(spread[rate][policies[a]].latency_p50 * ma.latency_p50,
                                      spread[rate][policies[b]].latency_p50 * mb.latency_p50);
        if (std::abs(ma.latency_p50 - mb.latency_p50) <= noise) continue;
        ++pairs;
        const double ds =
            simulated[rate][policies[a]].latency_p50 - simulated[rate][policies[b]].latency_p50;
        if ((ds < 0) == (ma.latency_p50 < mb.latency_p50) && ds != 0) ++agree;
      }
    if (pairs == 0) {
      std::printf(
          "ranking by latency p50: simulated %s; measured %s; no two policies measured apart "
          "beyond the run-to-run spread: ties, nothing to order\n",
          rs.c_str(), rm.c_str());
      continue;
    }
    std::printf(
        "ranking by latency p50: simulated %s; measured %s: %s; %d of %d pairs measured apart "
        "beyond the spread ordered the same\n",
        rs.c_str(), rm.c_str(), rs == rm ? "same" : "different", agree, pairs);
  }
  if (o.json) std::cout << out.dump(1) << "\n";
}

// A server's figures move by tens of percent from one short run to the
// next on a shared machine: calibration takes the median of a few.
constexpr int kCalibrationRuns = 5;

template <class F>
double median_of(int runs, F measure) {
  std::vector<double> v;
  for (int i = 0; i < runs; ++i) v.push_back(measure());
  return serving_bench::summarize(std::move(v)).p50;
}

// What serving adds to each step beyond the engine on this machine: the
// HTTP layer, the actors' messages, the client and everything else sharing
// the cores. A real server of this config is loaded by closed loops of 1 and
// of several clients; the TPOT it shows above the simulator's (without
// overhead) is fitted as overhead_s + overhead_per_seq_s * sequences per
// step. Then an open loop at half the capacity gives what TTFT still lacks
// per request. All three are stored in the profile's layout.
// The per-step serving time that makes the simulated TPOT the measured
// one. Not measured minus simulated: with scheduling ahead, a step's
// serving overlaps the next step's compute, so the simulated TPOT grows
// with it more slowly than one for one. Bisection: TPOT does not fall as
// the overhead grows.
double step_overhead_matching(const std::function<double(double)>& tpot_with, double measured) {
  if (tpot_with(0) >= measured) return 0;
  double lo = 0, hi = measured;
  while (tpot_with(hi) < measured && hi < 1e3 * measured) hi *= 2;
  for (int i = 0; i < 30; ++i) {
    const double mid = 0.5 * (lo + hi);
    (tpot_with(mid) < measured ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// overhead(n) = a + b n, a and b >= 0, through the two points when both
// come out so. Else a = 0 and b the slope whose errors in TPOT (the
// measured `tpot`), relative, are least at the two points: clamping a
// negative intercept to 0 and keeping the slope overshot the first point
// (TPOT +56% at one client), and relative errors of the overhead itself let
// the first, small one decide alone (-68% at the second).
std::pair<double, double> fit_overhead(const double n[2], const double e[2], const double tpot[2]) {
  if (e[0] <= 0 && e[1] <= 0) return {0, 0};
  const double b = n[1] > n[0] ? (e[1] - e[0]) / (n[1] - n[0]) : 0;
  const double a = e[0] - b * n[0];
  if (b >= 0 && a >= 0) return {a, b};
  if (b < 0) return {std::max(0.0, std::min(e[0], e[1])), 0};
  double num = 0, den = 0;
  for (int i = 0; i < 2; ++i) {
    if (!(tpot[i] > 0)) continue;
    num += n[i] * e[i] / (tpot[i] * tpot[i]);
    den += n[i] * n[i] / (tpot[i] * tpot[i]);
  }
  return {0, den > 0 ? std::max(0.0, num / den) : 0};
}

void run_calibrate(const SimulateOptions& o) {
  const Config cfg = command_config(o.config);
  const std::filesystem::path file = profile_path(o, cfg);
  StepProfile profile = load_profile(o, cfg);
  const int threads = cfg.devices.front().threads;
  sim::ProfileGrid grid = profile.find(cfg.parallel.pipeline, cfg.parallel.tensor, threads);
  // The server runs the config's threads; its overhead belongs to a grid of
  // that many, not to the nearest one the profile happens to have.
  if (grid.threads != threads)
    throw UsageError(
        "--calibrate: " + file.string() + " has no grid of " + std::to_string(threads) +
        " thread(s) per device for this layout (nearest: " + grid.describe() +
        "), and the server would run " + std::to_string(threads) +
        ": measure one (troupe bench --threads " + std::to_string(threads) + " --profile " +
        file.string() + ", with the same layout) or serve with " + std::to_string(grid.threads) +
        " (--set 'devices=[{kind: cpu, threads: " + std::to_string(grid.threads) + "}]')");
  grid.overhead_s = grid.overhead_per_seq_s = grid.request_overhead_s = 0;
  const std::vector<sim::StepCostModel> models{sim::StepCostModel(grid)};
  const sim::SimOptions so = sim_options(cfg, profile, o);
  const int replicas = cfg.parallel.replicas;
  const int many = std::min(cfg.batching.max_batch_sequences * replicas, std::max(8, 2 * replicas));
  ServerProcess server(o, "", replicas);
  double n[2], extra[2], tpot[2];
  const int clients[2] = {1, many};
  const auto loop_of = [&](int c) {
    return closed_loop(c, size_t(std::max(24, 6 * c)), o.prompt_len, o.output_len);
  };
  for (int i = 0; i < 2; ++i) {
    serving_bench::ServingBenchOptions bo;
    bo.url = server.url();
    bo.api_key = server.api_key();
    bo.concurrency = clients[i];
    bo.requests = int(loop_of(clients[i]).requests);
    bo.prompt_len = o.prompt_len;
    bo.output_len = o.output_len;
    bo.seed = o.workload.seed;
    serving_bench::run_serving_bench(bo);  // warm-up
    const double measured = median_of(
        kCalibrationRuns, [&] { return serving_bench::run_serving_bench(bo).tpot_s.p50; });
    const auto simulated = [&](double overhead_s) {
      sim::ProfileGrid g = grid;
      g.overhead_s = overhead_s;
      return sim::simulate(so, {sim::StepCostModel(g)}, loop_of(clients[i]), {})
          .summary.tpot()
          .percentile(50);
    };
    n[i] = std::max(1.0, double(clients[i]) / replicas);
    tpot[i] = measured;
    extra[i] = step_overhead_matching(simulated, measured);
    std::printf(
        "%d client(s): TPOT p50 measured %.3f ms (median of %d runs), engine alone (simulated) "
        "%.3f ms: %.3f ms of serving per step\n",
        clients[i], 1e3 * measured, kCalibrationRuns, 1e3 * simulated(0), 1e3 * extra[i]);
  }
  std::tie(grid.overhead_s, grid.overhead_per_seq_s) = fit_overhead(n, extra, tpot);
  // With the steps' overhead in, what the first token still lacks is the
  // front end's: measured as clients arrive in the validation's open loop
  // (Poisson, at half the capacity: between --validate's default loads),
  // where each request also waits for a client thread and a connection,
  // which a closed loop's waiting client never does.
  const std::vector<sim::StepCostModel> with_steps{sim::StepCostModel(grid)};
  serving_bench::ServingBenchOptions bo = open_loop(o, server.url());
  bo.api_key = server.api_key();
  bo.requests = std::clamp(bo.requests, 60, 200);
  bo.seed = o.workload.seed + 1;  // not the validation's arrivals
  bo.rate = 0.5 * simulated_capacity(so, with_steps, o.prompt_len, o.output_len);
  const double ttft_open =
      median_of(kCalibrationRuns, [&] { return serving_bench::run_serving_bench(bo).ttft_s.p50; });
  const double ttft_sim = simulate_bench(so, with_steps, bo).ttft_p50;
  grid.request_overhead_s = std::max(0.0, ttft_open - ttft_sim);
  std::printf("open loop at %.1f requests/s: TTFT p50 measured %.3f ms, simulated %.3f ms\n",
              bo.rate, 1e3 * ttft_open, 1e3 * ttft_sim);
  std::printf(
      "serving overhead: %.3f ms per step + %.3f ms per sequence in it, %.3f ms per request; "
      "written to %s (%s)\n",
      1e3 * grid.overhead_s, 1e3 * grid.overhead_per_seq_s, 1e3 * grid.request_overhead_s,
      file.string().c_str(), grid.describe().c_str());
  profile.put(std::move(grid));
  profile.save(file);
}

void run_simulate(const SimulateOptions& o) {
  check_flags(o);
  if (int(o.sweep) + int(o.validate) + int(o.calibrate) + int(!o.emit_trace.empty()) > 1)
    throw UsageError("give one of --sweep, --validate, --calibrate and --emit-trace");
  if (!o.emit_trace.empty()) {
    if (!o.workload.trace.empty() || o.workload.clients > 0)
      throw UsageError(
          "--emit-trace writes the synthetic open-loop workload; drop --trace and "
          "--clients");
    if (o.workload.prefix_len > 0)
      throw UsageError(
          "--emit-trace writes lengths, not which tokens prompts share, so a shared prefix would "
          "be lost; drop --prefix-len (a Mooncake trace's hash_ids say what prompts share)");
    auto w = o.workload.make(0);
    sim::write_trace(*w, o.workload.requests, o.emit_trace);
    std::cerr << "troupe simulate: " << o.workload.describe() << " written to " << o.emit_trace
              << "\n";
    return;
  }
  if (o.workload.trace.empty() && o.workload.clients == 0 && o.workload.rate <= 0 && !o.sweep &&
      !o.validate && !o.calibrate)
    throw UsageError(
        "give a workload: --rate R (open loop), --clients N (closed loop) or "
        "--trace FILE");
  if ((o.validate || o.calibrate) && (!o.workload.trace.empty() || o.workload.clients > 0))
    throw UsageError(
        "--validate and --calibrate load the real server with the serving bench's "
        "own workloads (--prompt-len, --output-len); drop --trace and --clients");
  if (o.sweep && o.rates.empty()) throw UsageError("--sweep needs --rates R1,R2,...");
  if (o.sweep && o.workload.trace.empty() && o.workload.clients > 0)
    throw UsageError(
        "--sweep runs each policy at each of --rates, and closed-loop --clients send at the "
        "rate they are answered, not at a rate; drop --clients (open loop) or give --trace");
  // What the simulated side would do that the real server is not made to.
  if (o.validate || o.calibrate) {
    const char* mode = o.validate ? "--validate" : "--calibrate";
    const auto refuse = [&](bool given, const std::string& flag) {
      if (given)
        throw UsageError(std::string(mode) + ": " + flag +
                         " would act on the simulated side only; the real server is not made to "
                         "fail, so the two would not be compared like for like; drop " +
                         flag);
    };
    refuse(!o.fails.empty(), "--fail");
    if (o.workload.prefix_len > 0)
      throw UsageError(std::string(mode) +
                       ": --prefix-len would shape the simulated side's prompts only; the "
                       "serving bench sends prompts of its own (--prompt-len); drop --prefix-len");
    refuse(o.mtbf_s > 0, "--mtbf-s");
    refuse(o.node_mtbf_s > 0, "--node-mtbf-s");
    if (o.calibrate && !o.slow.empty())
      throw UsageError(
          "--calibrate: --slow would slow the simulated replicas only; calibration measures the "
          "serving overhead of the real server as it is configured, so drop --slow (--validate "
          "--slow slows both sides)");
  }
  // A flag of another mode would be ignored here: refused, so that a run is
  // never silently not the one asked for.
  const auto only_in = [](bool given, const char* flag, const char* modes) {
    if (given)
      throw UsageError(std::string(flag) + " applies to " + modes + " only; add it, or drop " +
                       flag);
  };
  if (!o.sweep && !o.validate) {
    only_in(!o.policies.empty(), "--policies", "--sweep and --validate");
    only_in(!o.rates.empty(), "--rates", "--sweep and --validate");
  }
  if (!o.sweep) {
    only_in(!o.layouts.empty(), "--layouts", "--sweep");
    only_in(o.out_given, "--out", "--sweep");
    only_in(o.refine_given, "--refine", "--sweep");
  }
  if (o.sweep && o.json)
    throw UsageError(
        "--json prints one run; --sweep writes sweep.csv (and its table): drop --json");
  if (o.sweep && o.rate_given) throw UsageError("--sweep runs the rates of --rates; drop --rate");
  if (o.find_max_rate && (o.sweep || o.validate || o.calibrate))
    throw UsageError("--find-max-rate searches from one run; the sweep has its own search");
  if (o.find_max_rate && o.workload.trace.empty() && o.workload.clients > 0)
    throw UsageError(
        "--find-max-rate needs open-loop arrivals (--rate R or --trace FILE), "
        "not --clients");
  if (o.calibrate) return run_calibrate(o);
  if (o.validate) return run_validate(o);
  if (o.sweep) return run_sweep(o);
  run_single(o);
}

}  // namespace

void register_simulate(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  auto* cmd = app.add_subcommand(
      "simulate",
      "Simulate serving on a virtual clock: the runtime's own routing, admission and batching "
      "objects, step times from a measured profile (troupe bench --profile)");
  add_config_flags(cmd, o->config);
  cmd->add_option("--profile", o->profile,
                  "Step profile JSON (default: benchmarks/profiles/<model>.json of the bundle)");
  auto& w = o->workload;
  cmd->add_option("--trace", w.trace,
                  "Replay a trace: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or "
                  "Mooncake JSONL (timestamp ms, input_length, output_length)");
  auto* rate = cmd->add_option(
      "--rate", w.rate,
      "Open loop: requests per second (with --trace: the rows replayed, --requests of them, "
      "rescaled to this mean rate)");
  cmd->add_option("--requests,-n", o->requests,
                  "Requests to send (with --trace: at most this many rows; 0: all)")
      ->capture_default_str();
  cmd->add_option("--arrivals", w.arrivals, "Open loop: constant | poisson | gamma:CV (bursty)")
      ->capture_default_str();
  cmd->add_option("--prompt", w.prompt,
                  "Prompt lengths: N | uniform:A:B | exp:MEAN | lognormal:MEDIAN:SIGMA")
      ->capture_default_str();
  cmd->add_option("--output", w.output, "Output lengths, as --prompt")->capture_default_str();
  cmd->add_option("--clients", w.clients, "Closed loop: clients, each waiting for its answer");
  cmd->add_option("--think-s", w.think_s, "Closed loop: pause between a client's requests");
  cmd->add_option("--cancel-fraction", w.cancel_fraction,
                  "Share of clients that go away before their answer");
  cmd->add_option("--cancel-after-s", w.cancel_after_s, "Mean seconds until they do (exponential)");
  cmd->add_option("--priority-fraction", w.priority_fraction, "Share sent with priority 1");
  cmd->add_option("--length-scale", w.length_scale,
                  "Traces: multiply lengths by this (they are also cut to the model's context)");
  cmd->add_option("--prefix-len", w.prefix_len,
                  "Tokens of a shared prefix put before every prompt (what kv_cache.prefix_caching "
                  "reuses; troupe bench --prefix-len sends the same)");
  cmd->add_option("--prefix-groups", w.prefix_groups,
                  "Different shared prefixes, one per request at random (default 1)");
  cmd->add_option("--seed", w.seed, "Seed of the workload and of random failures")
      ->capture_default_str();
  cmd->add_option("--slow", o->slow,
                  "REPLICA:FACTOR: that replica's steps take FACTOR times as long (repeatable)");
  cmd->add_option("--fail", o->fails,
                  "TIME:REPLICA or TIME:node:N: a death at TIME seconds (repeatable)");
  cmd->add_option("--mtbf-s", o->mtbf_s, "Mean seconds between a replica's deaths (0: none)");
  cmd->add_option("--node-mtbf-s", o->node_mtbf_s, "Mean seconds between a node's deaths");
  cmd->add_option("--replicas-per-node", o->replicas_per_node, "Replicas a node death takes down")
      ->capture_default_str();
  cmd->add_option("--restart-s", o->restart_s, "Seconds a restarted replica takes to come up")
      ->capture_default_str();
  cmd->add_option("--sample-s", o->sample_s, "Time-series interval (simulated seconds)")
      ->capture_default_str();
  cmd->add_option("--slo-ttft-s", o->slo.ttft_s, "Goodput SLO: time to first token")
      ->capture_default_str();
  cmd->add_option("--slo-tpot-s", o->slo.tpot_s, "Goodput SLO: time per output token")
      ->capture_default_str();
  cmd->add_flag("--find-max-rate", o->find_max_rate,
                "Also search the highest rate keeping 90% within the SLO (more runs)");
  cmd->add_flag("--json", o->json, "Print JSON instead of tables");
  cmd->add_option("--csv", o->csv_dir,
                  "Write DIR/cluster.csv, DIR/replicas.csv (time series) and DIR/summary.json");
  cmd->add_option("--router-log", o->router_log,
                  "Record every router call and decision (the format TROUPE_ROUTER_LOG gives "
                  "the real router)");
  cmd->add_option("--emit-trace", o->emit_trace,
                  "Write the synthetic workload as a trace (.csv Azure, .jsonl Mooncake) and exit");
  cmd->add_flag("--sweep", o->sweep, "Run policies x rates x layouts; table, CSV and plot");
  cmd->add_option("--policies", o->policies,
                  "Sweep/validate: routing policies, comma-separated (default: all)");
  cmd->add_option("--rates", o->rates, "Sweep/validate: offered rates, comma-separated");
  cmd->add_option("--layouts", o->layouts,
                  "Sweep: RxPxT layouts, comma-separated (default: the config's)");
  auto* out =
      cmd->add_option("--out", o->out_dir, "Sweep: directory for sweep.csv, sweep.gp, sweep.png")
          ->capture_default_str();
  auto* refine =
      cmd->add_option("--refine", o->refine, "Sweep: bisection steps for the highest rate in SLO")
          ->capture_default_str();
  cmd->add_flag("--calibrate", o->calibrate,
                "Measure what serving adds per step and per request (a real troupe serve of this "
                "config: closed loops of 1 and several clients, an open loop at half the "
                "capacity) and store it in the profile");
  cmd->add_flag("--validate", o->validate,
                "Run the workload against a real troupe serve too and compare, per policy");
  cmd->add_option("--loads", o->loads,
                  "Validate: rates as fractions of the simulated capacity (unless --rates)")
      ->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Validate, calibrate: prompt tokens per request")
      ->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "Validate, calibrate: output tokens per request")
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Validate: real runs per point (their spread is shown)")
      ->capture_default_str();
  cmd->callback([o, rate, out, refine] {
    o->rate_given = rate->count() > 0;
    o->out_given = out->count() > 0;
    o->refine_given = refine->count() > 0;
    if (o->requests < 0)
      throw UsageError("--requests: " + std::to_string(o->requests) +
                       " is out of range; give 1 or more (0, all of a trace's rows, only with "
                       "--trace)");
    o->workload.requests = size_t(o->requests);
    run_simulate(*o);
  });
}

}  // namespace troupe::app
