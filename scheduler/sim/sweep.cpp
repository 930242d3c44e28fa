#include "scheduler/sim/sweep.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

extern char** environ;

namespace troupe::sim {

MaxRate max_rate_within_slo(const std::vector<std::pair<double, double>>& rate_share, double share,
                            int refine, const std::function<double(double)>& measure) {
  std::vector<std::pair<double, double>> pts = rate_share;
  std::sort(pts.begin(), pts.end());
  MaxRate m;
  if (pts.empty()) {
    m.bound = MaxRate::Bound::MissedAtLowest;
    return m;
  }
  m.lowest = pts.front().first;
  m.highest = pts.back().first;
  // The last rate of the leading run that meets it: past the first miss the
  // system is overloaded, whatever a noisy higher rate says.
  double lo = 0, hi = 0;
  for (const auto& [rate, s] : pts) {
    if (s < share) {
      hi = rate;
      break;
    }
    lo = rate;
  }
  m.rate = lo;
  if (lo == 0) {
    m.bound = MaxRate::Bound::MissedAtLowest;
    return m;
  }
  if (hi == 0) {
    m.bound = MaxRate::Bound::MetAtHighest;
    return m;
  }
  for (int i = 0; i < refine; ++i) {
    const double mid = (lo + hi) / 2;
    (measure(mid) >= share ? lo : hi) = mid;
  }
  m.rate = lo;
  return m;
}

MaxRate search_max_rate(const std::function<double(double)>& share_at, double start, double share,
                        int refine) {
  // How far from `start` the bracket may go: up, a finite workload may
  // never miss; down, the rates only get cheaper to simulate.
  constexpr double kUp = 1024, kDown = 1 << 20;
  MaxRate m;
  m.lowest = m.highest = start;
  double lo = 0, hi = 0;  // met at lo, missed at hi; 0: not yet found
  if (share_at(start) >= share) {
    lo = start;
    while (hi == 0) {
      if (lo * 2 > start * kUp) {
        m.rate = lo;
        m.bound = MaxRate::Bound::MetAtHighest;
        return m;
      }
      m.highest = lo * 2;
      (share_at(lo * 2) >= share ? lo : hi) = lo * 2;
    }
  } else {
    hi = start;
    while (lo == 0) {
      if (hi / 2 < start / kDown) {
        m.bound = MaxRate::Bound::MissedAtLowest;
        return m;
      }
      m.lowest = hi / 2;
      (share_at(hi / 2) >= share ? lo : hi) = hi / 2;
    }
  }
  for (int i = 0; i < refine; ++i) {
    const double mid = (lo + hi) / 2;
    (share_at(mid) >= share ? lo : hi) = mid;
  }
  m.rate = lo;
  return m;
}

std::string sweep_table(
    const std::vector<SweepPoint>& points,
    const std::vector<std::tuple<std::string, std::string, MaxRate>>& max_rates) {
  std::ostringstream s;
  char line[320];
  // done%: the share of requests that completed; the latencies are theirs
  // alone, so a point that refused or timed out many reads better than it was.
  std::snprintf(line, sizeof line, "%-18s %-8s %8s %9s %6s %9s %9s %9s %9s %9s %8s %6s\n", "policy",
                "layout", "rate/s", "done/s", "done%", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                "e2e p99", "goodput", "util");
  s << line;
  for (const SweepPoint& p : points) {
    const RunSummary& r = p.summary;
    std::snprintf(
        line, sizeof line,
        "%-18s %-8s %8.2f %9.2f %5.1f%% %9.1f %8.0fms %8.0fms %8.1fms %8.0fms %7.1f%% %5.0f%%\n",
        p.policy.c_str(), p.layout.c_str(), p.rate, r.requests_per_s(),
        r.requests() ? 100.0 * double(r.completed()) / double(r.requests()) : 0.0,
        r.output_tokens_per_s(), 1e3 * r.ttft().percentile(50), 1e3 * r.ttft().percentile(99),
        1e3 * r.tpot().percentile(50), 1e3 * r.latency().percentile(99), 100 * r.goodput_share(),
        100 * r.mean_utilisation());
    s << line;
  }
  if (!max_rates.empty() && !points.empty()) {
    const Slo& slo = points.front().summary.slo();
    std::snprintf(line, sizeof line,
                  "\nhighest rate with 90%% of requests within TTFT %.3g s and TPOT %.3g s:\n",
                  slo.ttft_s, slo.tpot_s);
    s << line;
    for (const auto& [policy, layout, m] : max_rates) {
      const char* note = m.bound == MaxRate::Bound::MissedAtLowest
                             ? " (missed even at the lowest rate)"
                         : m.bound == MaxRate::Bound::MetAtHighest
                             ? " (met even at the highest rate: a lower bound)"
                             : "";
      std::snprintf(line, sizeof line, "  %-18s %-8s %8.2f requests/s%s\n", policy.c_str(),
                    layout.c_str(), m.rate, note);
      s << line;
    }
  }
  return s.str();
}

void write_sweep_csv(const std::vector<SweepPoint>& points, const std::filesystem::path& file) {
  std::ofstream out(file);
  if (!out) throw std::invalid_argument("cannot write " + file.string());
  out << "policy,layout,rate,requests_per_s,output_tokens_per_s,ttft_p50,ttft_p90,ttft_p99,"
         "tpot_p50,tpot_p90,tpot_p99,latency_p50,latency_p90,latency_p99,queue_p50,queue_p99,"
         "goodput_share,completed_share,preemptions,utilisation,wall_s\n";
  for (const SweepPoint& p : points) {
    const RunSummary& r = p.summary;
    uint64_t preemptions = 0;
    for (const auto& f : r.replicas()) preemptions += f.preemptions;
    char line[512];
    std::snprintf(
        line, sizeof line,
        "%s,%s,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,"
        "%.6g,%llu,%.6g,%.6g\n",
        p.policy.c_str(), p.layout.c_str(), p.rate, r.requests_per_s(), r.output_tokens_per_s(),
        r.ttft().percentile(50), r.ttft().percentile(90), r.ttft().percentile(99),
        r.tpot().percentile(50), r.tpot().percentile(90), r.tpot().percentile(99),
        r.latency().percentile(50), r.latency().percentile(90), r.latency().percentile(99),
        r.queue_delay().percentile(50), r.queue_delay().percentile(99), r.goodput_share(),
        r.requests() ? double(r.completed()) / double(r.requests()) : 0.0,
        (unsigned long long)preemptions, r.mean_utilisation(), p.wall_s);
    out << line;
  }
}

std::optional<std::filesystem::path> find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::istringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::filesystem::path p = std::filesystem::path(dir.empty() ? "." : dir) / name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return std::nullopt;
}

std::optional<std::filesystem::path> plot_sweep(const std::vector<SweepPoint>& points,
                                                const std::filesystem::path& dir) {
  std::set<std::string> layouts, policies;
  for (const auto& p : points) {
    layouts.insert(p.layout);
    policies.insert(p.policy);
  }
  // One data file per layout and policy: gnuplot reads them directly.
  std::map<std::pair<std::string, std::string>, std::string> data;
  for (const auto& p : points) {
    char line[160];
    std::snprintf(line, sizeof line, "%.6g %.6g %.6g\n", p.rate, p.summary.latency().percentile(50),
                  p.summary.latency().percentile(99));
    data[{p.layout, p.policy}] += line;
  }
  const std::filesystem::path gp = dir / "sweep.gp";
  std::ofstream s(gp);
  if (!s) throw std::invalid_argument("cannot write " + gp.string());
  s << "# troupe simulate --sweep: end-to-end latency against offered load.\n"
    << "# Run: gnuplot " << gp.filename().string() << " (from this directory)\n"
    << "set terminal pngcairo size " << 640 * layouts.size() << ",480 noenhanced\n"
    << "set output 'sweep.png'\n"
    << "set multiplot layout 1," << layouts.size() << "\n"
    << "set xlabel 'offered load (requests/s)'\nset ylabel 'end-to-end latency (s)'\n"
    << "set logscale y\nset grid\nset key top left\n";
  for (const std::string& layout : layouts) {
    s << "set title 'layout " << layout << " (solid: p99, dashed: p50)'\nplot ";
    bool first = true;
    int color = 1;
    for (const std::string& policy : policies) {
      const auto it = data.find({layout, policy});
      if (it == data.end()) continue;
      s << (first ? "" : ", ") << "'-' using 1:3 with linespoints lc " << color << " dt 1 title '"
        << policy << "', '-' using 1:2 with linespoints lc " << color << " dt 2 notitle";
      first = false;
      ++color;
    }
    s << "\n";
    for (const std::string& policy : policies) {
      const auto it = data.find({layout, policy});
      if (it == data.end()) continue;
      s << it->second << "e\n" << it->second << "e\n";
    }
  }
  s << "unset multiplot\n";
  s.close();
  const auto gnuplot = find_program("gnuplot");
  if (!gnuplot) return std::nullopt;
  // Run in DIR so that the script's relative output lands beside it.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  const std::string program = gnuplot->string(), script = gp.filename().string();
  char* argv[] = {const_cast<char*>(program.c_str()), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return std::nullopt;
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return dir / "sweep.png";
}

}  // namespace troupe::sim
