#pragma once
// `troupe simulate --sweep`: runs over policies x rates x layouts, compared
// in one table, one CSV, and a plot of latency against load per policy
// (gnuplot, when installed; the CSV and the script are written regardless).
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/sim/summary.h"

namespace troupe::sim {

struct SweepPoint {
  std::string policy;
  std::string layout;  // "RxPxT"
  double rate = 0;     // offered requests/s
  RunSummary summary;
  double wall_s = 0;
};

// The highest rate at which at least `share` of the requests meet the SLO:
// the best swept rate that does, refined by bisection toward the next swept
// rate (`measure` runs one more simulation at a rate and returns its
// goodput share). 0 when even the lowest rate misses.
double max_rate_within_slo(const std::vector<std::pair<double, double>>& rate_share, double share,
                           int refine, const std::function<double(double)>& measure);

std::string sweep_table(const std::vector<SweepPoint>& points,
                        const std::vector<std::tuple<std::string, std::string, double>>& max_rates);
void write_sweep_csv(const std::vector<SweepPoint>& points, const std::filesystem::path& file);

// Writes DIR/sweep.gp (p50 and p99 end-to-end latency against offered rate,
// one line per policy, one panel per layout) and, when gnuplot is on the
// PATH, runs it to make DIR/sweep.png. Returns the image, if made.
std::optional<std::filesystem::path> plot_sweep(const std::vector<SweepPoint>& points,
                                                const std::filesystem::path& dir);

// The program's full path when it is on the PATH.
std::optional<std::filesystem::path> find_program(const std::string& name);

}  // namespace troupe::sim
