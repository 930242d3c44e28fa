// `troupe chaos`: start a deployment on 127.0.0.1 (or attach to one), run a
// workload while faults play, and prove, by comparing every answer with a
// fault-free run, that nothing was lost, hung, duplicated or wrong.
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "apps/commands.h"
#include "chaos/checker.h"
#include "chaos/plan.h"
#include "chaos/report.h"
#include "chaos/runner.h"

namespace troupe::app {

namespace {

struct ChaosFlags {
  std::string plan = "configs/chaos/quick.yaml";
  std::vector<std::string> sets;
  int requests = 0;
  double duration_s = 0;
  bool soak = false;
  std::string json;
  std::string attach;
  std::string admin_token;
  std::string run_dir;
  double sample_every_s = 0;
  bool quiet = false;
};

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

void run_chaos_command(const ChaosFlags& f) {
  chaos::ChaosOptions o;
  o.plan = chaos::load_chaos_plan(f.plan);
  for (const std::string& kv : f.sets) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--set expects KEY=VALUE, got '" + kv + "'");
    chaos::apply_plan_override(o.plan, kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (f.requests > 0) {
    o.plan.workload.requests = f.requests;
    o.plan.workload.distinct = std::min(o.plan.workload.distinct, f.requests);
  }
  chaos::validate_plan(o.plan);
  o.duration_s = f.soak && f.duration_s <= 0 ? 1800 : f.duration_s;
  o.sample_every_s = f.sample_every_s > 0 ? f.sample_every_s : (f.soak ? 60 : 10);
  o.attach = f.attach;
  o.admin_token = f.admin_token;
  if (!o.attach.empty() && o.admin_token.empty())
    throw UsageError("--attach needs --admin-token (the deployment's admin.token)");
  o.exe = own_executable();
  o.run_dir = f.run_dir.empty() ? std::filesystem::temp_directory_path() /
                                      ("troupe-chaos-" + std::to_string(getpid()))
                                : std::filesystem::path(f.run_dir);
  if (!f.quiet) o.log = [](const std::string& s) { std::cerr << "troupe chaos: " << s << "\n"; };
  if (!f.quiet) std::cerr << "troupe chaos: logs in " << o.run_dir.string() << "\n";
  const chaos::ChaosRun run = chaos::run_chaos(o);
  const chaos::ChaosReport report = chaos::check(run.records);
  std::cout << chaos::render_text(report);
  std::cout << "cancellations: " << run.client_cancels
            << " by the client on purpose; the coordinator counted " << run.server_cancels
            << " (status 499)\n";
  if (f.soak || run.resource_series.size() > 2) std::cout << drift_text(run);
  if (!f.json.empty()) {
    nlohmann::json j = chaos::render_json(report);
    j["cancellations"] = {{"client", run.client_cancels}, {"server_499", run.server_cancels}};
    j["resource_series"] = series_json(run);
    j["seed"] = o.plan.seed;
    std::ofstream out(f.json);
    if (!out) throw std::runtime_error("cannot write " + f.json);
    out << j.dump(2) << "\n";
  }
  if (!report.ok()) {
    std::string why;
    for (const std::string& s : report.failures()) why += (why.empty() ? "" : "; ") + s;
    throw std::runtime_error("chaos run failed: " + why + " (logs in " + o.run_dir.string() + ")");
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
  cmd->add_option("--requests", f->requests, "Requests to send (overrides workload.requests)");
  cmd->add_option("--duration", f->duration_s,
                  "Run the load this many seconds (requests repeat) instead of a request count");
  cmd->add_flag("--soak", f->soak,
                "A long run (default 30 minutes) reporting memory and thread drift");
  cmd->add_option("--json", f->json, "Also write the report as JSON to this file");
  cmd->add_option("--attach", f->attach,
                  "Use a running deployment (http://HOST:PORT, admin.faults on) instead of "
                  "starting one: only runtime and HTTP faults");
  cmd->add_option("--admin-token", f->admin_token, "--attach: the deployment's admin.token");
  cmd->add_option("--run-dir", f->run_dir, "Where the processes' logs go (default: a temp dir)");
  cmd->add_option("--sample-every", f->sample_every_s,
                  "Seconds between resource samples (default 10; 60 with --soak)");
  cmd->add_flag("--quiet", f->quiet, "No progress lines");
  cmd->callback([f] { run_chaos_command(*f); });
}

}  // namespace troupe::app
