// `troupe chaos`: start a deployment on 127.0.0.1 (or attach to one), run a
// workload while faults play, and prove, by comparing every answer with a
// fault-free run, that nothing was lost, hung, duplicated or wrong.
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <iostream>

#include "apps/bench_serving.h"
#include "apps/commands.h"
#include "chaos/checker.h"
#include "chaos/child_process.h"
#include "chaos/plan.h"
#include "chaos/report.h"
#include "chaos/runner.h"
#include "deploy/config.h"
#include "deploy/yaml_schema.h"

namespace troupe::app {

namespace {

// A run whose plan was not exercised (faults never played) ends with this.
constexpr int kIncompleteStatus = 3;

struct ChaosFlags {
  std::string plan = "configs/chaos/quick.yaml";
  std::vector<std::string> sets;
  int requests = 0;  // the flags' values count only when given (see given_*)
  double duration_s = 0;
  bool soak = false;
  std::string json;
  std::string attach;
  std::string admin_token;
  std::string api_key;
  std::string run_dir;
  double sample_every_s = 0;
  bool quiet = false;
  bool given_requests = false, given_duration = false, given_sample_every = false;
};

// Every flag given is used or refused by name; none is ignored.
void check_flags(const ChaosFlags& f) {
  if (f.given_requests && f.requests < 1)
    throw UsageError("--requests must be a positive number of requests, got " +
                     std::to_string(f.requests));
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (f.given_duration && !positive(f.duration_s))
    throw UsageError("--duration must be a positive number of seconds, got " +
                     schema::format_number(f.duration_s));
  if (f.given_sample_every && !positive(f.sample_every_s))
    throw UsageError("--sample-every must be a positive number of seconds, got " +
                     schema::format_number(f.sample_every_s));
  if (f.attach.empty() && !f.admin_token.empty())
    throw UsageError(
        "--admin-token is for --attach (a deployment troupe chaos starts gets a "
        "fresh token)");
  if (f.attach.empty() && !f.api_key.empty())
    throw UsageError("--api-key is for --attach (a deployment troupe chaos starts needs none)");
}

std::filesystem::path own_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this program's path: " + ec.message());
  return p;
}

// A soak's drift: each process's memory and threads at the start, the
// largest and the end.
std::string drift_text(const chaos::ChaosRun& run) {
  struct Span {
    double first = -1, max = 0, last = 0;
    int threads_first = -1, threads_last = 0;
  };
  std::map<std::string, Span> by;
  for (const auto& [t, samples] : run.resource_series)
    for (const auto& s : samples) {
      Span& x = by[s.process];
      if (x.first < 0) x.first = s.rss_mib, x.threads_first = s.threads;
      x.max = std::max(x.max, s.rss_mib);
      x.last = s.rss_mib;
      x.threads_last = s.threads;
    }
  std::string out = "memory over the run (" + std::to_string(run.resource_series.size()) +
                    " samples): RSS MiB first / max / last, threads first -> last\n";
  char line[200];
  for (const auto& [name, x] : by) {
    std::snprintf(line, sizeof line, "  %-12s %8.1f / %8.1f / %8.1f   threads %d -> %d\n",
                  name.c_str(), x.first, x.max, x.last, x.threads_first, x.threads_last);
    out += line;
  }
  return out;
}

// A soak's latency drift: each window's end-to-end p50/p99, the first and
// last windows side by side, and the worst.
std::string latency_drift_text(const std::vector<chaos::LatencyWindow>& series, double window_s) {
  std::vector<const chaos::LatencyWindow*> full;
  for (const auto& w : series)
    if (w.e2e.count > 0) full.push_back(&w);
  if (full.size() < 2) return "";
  const chaos::LatencyWindow* worst = full[0];
  for (const auto* w : full)
    if (w->e2e.p99 > worst->e2e.p99) worst = w;
  char line[300];
  std::snprintf(line, sizeof line,
                "latency over the run (%zu windows of %.0f s), e2e p50/p99 s: first %.3f/%.3f, "
                "last %.3f/%.3f, worst p99 %.3f at t=%.0f s\n",
                full.size(), window_s, full.front()->e2e.p50, full.front()->e2e.p99,
                full.back()->e2e.p50, full.back()->e2e.p99, worst->e2e.p99, worst->start_s);
  return line;
}

nlohmann::json latency_series_json(const std::vector<chaos::LatencyWindow>& series) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& w : series)
    j.push_back({{"start_s", w.start_s},
                 {"requests", w.e2e.count},
                 {"e2e_p50_s", w.e2e.p50},
                 {"e2e_p99_s", w.e2e.p99},
                 {"ttft_p50_s", w.ttft.p50},
                 {"ttft_p99_s", w.ttft.p99}});
  return j;
}

nlohmann::json series_json(const chaos::ChaosRun& run) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [t, samples] : run.resource_series) {
    nlohmann::json row = {{"t_s", t}, {"processes", nlohmann::json::array()}};
    for (const auto& s : samples)
      row["processes"].push_back({{"process", s.process},
                                  {"pid", s.pid},
                                  {"rss_mib", s.rss_mib},
                                  {"threads", s.threads},
                                  {"open_fds", s.open_fds}});
    j.push_back(row);
  }
  return j;
}

// Interrupted (Ctrl-C, kill): the deployment's processes go too, instead
// of living on as orphans; then the signal's default action.
extern "C" void stop_children_and_die(int sig) {
  ChildProcess::kill_all();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run_chaos_command(const ChaosFlags& f) {
  check_flags(f);
  std::signal(SIGINT, stop_children_and_die);
  std::signal(SIGTERM, stop_children_and_die);
  std::signal(SIGHUP, stop_children_and_die);
  chaos::ChaosOptions o;
  o.plan = chaos::load_chaos_plan(f.plan);
  for (const std::string& kv : f.sets) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--set expects KEY=VALUE, got '" + kv + "'");
    chaos::apply_plan_override(o.plan, kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (f.given_requests) {
    o.plan.workload.requests = f.requests;
    o.plan.workload.distinct = std::min(o.plan.workload.distinct, f.requests);
  }
  chaos::validate_plan(o.plan);
  o.duration_s = f.given_duration ? f.duration_s : (f.soak ? 1800 : 0);
  o.sample_every_s = f.given_sample_every ? f.sample_every_s : (f.soak ? 60 : 10);
  o.attach = f.attach;
  o.admin_token = f.admin_token;
  o.api_key = f.api_key;
  // A deployment started here inherits it too, so its clients need it then.
  o.api_key = api_key_or_env(o.api_key);
  if (!o.attach.empty() && o.admin_token.empty())
    throw UsageError("--attach needs --admin-token (the deployment's admin.token)");
  if (!o.attach.empty()) {
    try {
      serving_bench::parse_http_url(o.attach, "--attach");
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  // Everything the plan asks that can be checked is checked before
  // anything starts.
  if (o.attach.empty()) {
    const std::filesystem::path config = chaos::deployment_config_path(o.plan);
    chaos::check_plan_deployment(o.plan, load_config(config), config.string());
  } else {
    chaos::check_plan_for_attach(o.plan);
  }
  for (const std::string& w : chaos::plan_warnings(o.plan, o.duration_s))
    std::cerr << "troupe chaos: warning: " << w << "\n";
  o.exe = own_executable();
  o.run_dir = f.run_dir.empty() ? std::filesystem::temp_directory_path() /
                                      ("troupe-chaos-" + std::to_string(getpid()))
                                : std::filesystem::path(f.run_dir);
  if (!f.quiet) o.log = [](const std::string& s) { std::cerr << "troupe chaos: " << s << "\n"; };
  // Attached, the harness starts no process: there are no logs of its own.
  const std::string logs = o.attach.empty() ? "logs in " + o.run_dir.string() : "";
  const auto with_logs = [&](const std::string& before) {
    return logs.empty() ? before : before + "; " + logs;
  };
  if (!f.quiet && !logs.empty()) std::cerr << "troupe chaos: " << logs << "\n";
  const chaos::ChaosRun run = chaos::run_chaos(o);
  const chaos::ChaosReport report = chaos::check(run.records);
  std::cout << chaos::render_text(report);
  std::cout << "cancellations: " << run.client_cancels
            << " by the client on purpose; the coordinator counted " << run.server_cancels
            << " (status 499)"
            << (run.server_cancels < run.client_cancels
                    ? " (a client that left as its answer was already complete is no 499)"
                    : "")
            << "\n";
  const auto latency = chaos::latency_series(run.records.requests, o.sample_every_s);
  if (f.soak || run.resource_series.size() > 2)
    std::cout << drift_text(run) << latency_drift_text(latency, o.sample_every_s);
  if (!f.json.empty()) {
    nlohmann::json j = chaos::render_json(report);
    j["cancellations"] = {{"client", run.client_cancels}, {"server_499", run.server_cancels}};
    j["resource_series"] = series_json(run);
    j["latency_series"] = latency_series_json(latency);
    j["latency_window_s"] = o.sample_every_s;
    j["seed"] = o.plan.seed;
    std::ofstream out(f.json);
    if (!out) throw std::runtime_error("cannot write " + f.json);
    out << j.dump(2) << "\n";
  }
  switch (report.verdict()) {
    case chaos::Verdict::Pass:
      return;
    case chaos::Verdict::Fail: {
      std::string why;
      for (const std::string& s : report.failures()) why += (why.empty() ? "" : "; ") + s;
      throw std::runtime_error(logs.empty() ? "chaos run failed: " + why
                                            : "chaos run failed: " + why + " (" + logs + ")");
    }
    case chaos::Verdict::Incomplete:
      throw ExitStatus(
          kIncompleteStatus,
          "chaos run incomplete: " + std::to_string(report.faults.size() - report.played_faults()) +
              " of " + std::to_string(report.faults.size()) +
              " planned faults were not played, so the plan was not exercised "
              "(" +
              with_logs("exit status " + std::to_string(kIncompleteStatus)) + ")");
  }
}

// Whatever goes wrong, the deployment's processes go too (their owners'
// destructors stop them; this is for anything that got past those).
void run_chaos_guarded(const ChaosFlags& f) {
  try {
    run_chaos_command(f);
  } catch (...) {
    ChildProcess::kill_all();
    throw;
  }
}

}  // namespace

void register_chaos(CLI::App& app) {
  auto f = std::make_shared<ChaosFlags>();
  auto* cmd = app.add_subcommand(
      "chaos",
      "Run a workload while injecting faults, and check every answer against a fault-free run");
  cmd->add_option("plan", f->plan, "The run: deployment, workload and faults (YAML)")
      ->capture_default_str();
  cmd->add_option("--set", f->sets, "Override a key of the plan, e.g. workload.requests=1000");
  cmd->add_option("--requests", f->requests,
                  "Requests to send, at least 1 (overrides workload.requests)");
  cmd->add_option("--duration", f->duration_s,
                  "Run the load this many seconds, > 0 (requests repeat) instead of a request "
                  "count");
  cmd->add_flag("--soak", f->soak,
                "A long run (default 30 minutes) reporting memory and thread drift");
  cmd->add_option("--json", f->json, "Also write the report as JSON to this file");
  cmd->add_option("--attach", f->attach,
                  "Use a running deployment (http://HOST:PORT, admin.faults on) instead of "
                  "starting one: only runtime and HTTP faults");
  cmd->add_option("--admin-token", f->admin_token, "--attach: the deployment's admin.token");
  cmd->add_option("--api-key", f->api_key,
                  "--attach: the deployment's server.api_key, if it has one (default: the "
                  "TROUPE_API_KEY environment variable)");
  cmd->add_option("--run-dir", f->run_dir, "Where the processes' logs go (default: a temp dir)");
  cmd->add_option("--sample-every", f->sample_every_s,
                  "Seconds between resource samples (default 10; 60 with --soak)");
  cmd->add_flag("--quiet", f->quiet, "No progress lines");
  cmd->callback([f, cmd] {
    f->given_requests = cmd->count("--requests") > 0;
    f->given_duration = cmd->count("--duration") > 0;
    f->given_sample_every = cmd->count("--sample-every") > 0;
    run_chaos_guarded(*f);
  });
}

}  // namespace troupe::app
