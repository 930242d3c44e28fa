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

// The highest rate found to keep a share of the requests within the SLO,
// and whether it is the maximum or only a bound of it.
struct MaxRate {
  enum class Bound {
    Found,           // met at `rate`, missed at a rate tried above it
    MetAtHighest,    // met at every rate tried: `rate`, the highest, is a lower bound
    MissedAtLowest,  // missed at every rate tried: `rate` is 0
  };
  double rate = 0;
  Bound bound = Bound::Found;
  double lowest = 0, highest = 0;  // the range of rates tried
};

// The highest rate at which at least `share` of the requests meet the SLO:
// the best swept rate that does, refined by bisection toward the next swept
// rate (`measure` runs one more simulation at a rate and returns its
// goodput share). MetAtHighest when every swept rate meets it,
// MissedAtLowest when even the lowest misses.
MaxRate max_rate_within_slo(const std::vector<std::pair<double, double>>& rate_share, double share,
                            int refine, const std::function<double(double)>& measure);

// The same without a sweep (--find-max-rate): a bracket from `start`,
// doubling while the SLO is met (up to 1024 times `start`: past that a
// finite workload may never load the cluster enough to miss, and the answer
// is MetAtHighest), or halving while it is missed (down to `start` / 2^20:
// MissedAtLowest when even that misses), then `refine` bisection steps
// between the highest rate met and the lowest missed. So the answer does not
// depend on whether `start` was above or below it.
MaxRate search_max_rate(const std::function<double(double)>& share_at, double start, double share,
                        int refine = 8);

std::string sweep_table(
    const std::vector<SweepPoint>& points,
    const std::vector<std::tuple<std::string, std::string, MaxRate>>& max_rates);
void write_sweep_csv(const std::vector<SweepPoint>& points, const std::filesystem::path& file);

// Writes DIR/sweep.gp (p50 and p99 end-to-end latency against offered rate,
// one line per policy, one panel per layout) and, when gnuplot is on the
// PATH, runs it to make DIR/sweep.png. Returns the image, if made.
std::optional<std::filesystem::path> plot_sweep(const std::vector<SweepPoint>& points,
                                                const std::filesystem::path& dir);

// The program's full path when it is on the PATH.
std::optional<std::filesystem::path> find_program(const std::string& name);

}  // namespace troupe::sim
