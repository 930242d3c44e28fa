#pragma once
// The process's own figures, as Prometheus clients export them by default
// (process_cpu_seconds_total, process_resident_memory_bytes, ...), so that
// dashboards and alerts written for any service read this one: a
// long-running server's memory, descriptors and CPU, from /proc.
#include <optional>
#include <string>
#include <string_view>

namespace troupe {

struct ProcessFigures {
  double cpu_seconds = 0;  // user + system
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double start_time_s = 0;  // since the Unix epoch
  double open_fds = 0;
  double max_fds = 0;
  double threads = 0;
};

// Parses /proc/<pid>/stat (`stat`) with the machine's clock tick, page size
// and boot time; nothing when the line is not one.
std::optional<ProcessFigures> parse_proc_stat(std::string_view stat, double clock_ticks,
                                              double page_bytes, double boot_time_s);

// This process's figures now (fields that cannot be read stay 0).
ProcessFigures read_process_figures();

// The figures in the text exposition format, HELP and TYPE included.
std::string render_process_figures(const ProcessFigures& f);

}  // namespace troupe
