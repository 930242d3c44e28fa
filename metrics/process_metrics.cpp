#include "metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace troupe {

std::optional<ProcessFigures> parse_proc_stat(std::string_view stat, double clock_ticks,
                                              double page_bytes, double boot_time_s) {
  // The command name (field 2) may hold spaces and parentheses: the fields
  // that follow start after its last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || clock_ticks <= 0) return std::nullopt;
  std::istringstream in{std::string(stat.substr(close + 1))};
  std::vector<std::string> f;  // f[0] is field 3 (state)
  for (std::string w; in >> w;) f.push_back(w);
  if (f.size() < 22) return std::nullopt;
  const auto num = [&](int field) { return std::strtod(f[size_t(field - 3)].c_str(), nullptr); };
  ProcessFigures p;
  p.cpu_seconds = (num(14) + num(15)) / clock_ticks;
  p.threads = num(20);
  p.start_time_s = boot_time_s + num(22) / clock_ticks;
  p.virtual_bytes = num(23);
  p.resident_bytes = num(24) * page_bytes;
  return p;
}

namespace {

double boot_time_s() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("btime ", 0) == 0) return std::strtod(line.c_str() + 6, nullptr);
  return 0;
}

double open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  double n = 0;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

}  // namespace

ProcessFigures read_process_figures() {
  std::string stat;
  {
    std::ifstream in("/proc/self/stat");  // closed before the descriptors are counted
    std::getline(in, stat);
  }
  static const double boot = boot_time_s();
  ProcessFigures f =
      parse_proc_stat(stat, double(sysconf(_SC_CLK_TCK)), double(sysconf(_SC_PAGESIZE)), boot)
          .value_or(ProcessFigures{});
  f.open_fds = open_fds();
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    f.max_fds = double(lim.rlim_cur);
  return f;
}

std::string render_process_figures(const ProcessFigures& f) {
  struct Row {
    const char* name;
    const char* type;
    const char* help;
    double value;
  };
  const Row rows[] = {
      {"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
       f.cpu_seconds},
      {"process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
       f.resident_bytes},
      {"process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", f.virtual_bytes},
      {"process_start_time_seconds", "gauge",
       "Start time of the process since unix epoch in seconds.", f.start_time_s},
      {"process_open_fds", "gauge", "Number of open file descriptors.", f.open_fds},
      {"process_max_fds", "gauge", "Maximum number of open file descriptors.", f.max_fds},
      {"process_threads", "gauge", "Number of OS threads in the process.", f.threads},
  };
  std::string out;
  char value[64];
  for (const Row& r : rows) {
    std::snprintf(value, sizeof value, "%.17g", r.value);
    out.append("# HELP ").append(r.name).append(" ").append(r.help).append("\n");
    out.append("# TYPE ").append(r.name).append(" ").append(r.type).append("\n");
    out.append(r.name).append(" ").append(value).append("\n");
  }
  return out;
}

}  // namespace troupe
