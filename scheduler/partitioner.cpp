#include "scheduler/partitioner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint64_t kNoCap = std::numeric_limits<uint64_t>::max();

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("partition: " + what);
}

std::string bytes_str(uint64_t b) {
  std::ostringstream os;
  os << b << " bytes (" << double(b) / double(1 << 20) << " MiB)";
  return os.str();
}

void check_shape(int layers, int stages) {
  if (stages < 1) fail("stage count must be >= 1, got " + std::to_string(stages));
  if (stages > layers) {
    fail(std::to_string(stages) + " stages for " + std::to_string(layers) +
         " layers: every stage needs at least one layer");
  }
}

void check_costs(std::span<const double> cost, std::span<const uint64_t> memory) {
  for (size_t i = 0; i < cost.size(); ++i) {
    // Written so that NaN fails too.
    if (!(cost[i] >= 0 && std::isfinite(cost[i]))) {
      fail("layer " + std::to_string(i) + " has cost " + std::to_string(cost[i]) +
           " s; costs must be finite and >= 0");
    }
  }
  if (!memory.empty() && memory.size() != cost.size()) {
    fail(std::to_string(memory.size()) + " layer memory sizes for " + std::to_string(cost.size()) +
         " layer costs");
  }
}

// Prefix sums, so that a range's cost and memory are one subtraction each.
// Rounding is monotone, so range costs still grow as ranges grow, which the
// searches below rely on to stop early.
struct Prefix {
  std::vector<double> cost;
  std::vector<uint64_t> mem;

  Prefix(std::span<const double> c, std::span<const uint64_t> m)
      : cost(c.size() + 1, 0), mem(c.size() + 1, 0) {
    for (size_t i = 0; i < c.size(); ++i) {
      cost[i + 1] = cost[i] + c[i];
      const uint64_t add = m.empty() ? 0 : m[i];
      if (mem[i] > kNoCap - add) fail("the layers' memory sizes add up to more than 2^64 bytes");
      mem[i + 1] = mem[i] + add;
    }
  }
  double range_cost(int j, int i) const { return cost[size_t(i)] - cost[size_t(j)]; }
  uint64_t range_mem(int j, int i) const { return mem[size_t(i)] - mem[size_t(j)]; }
};

StagePartition finish(std::vector<int> boundaries, const Prefix& pre) {
  StagePartition p;
  p.boundaries = std::move(boundaries);
  for (int s = 0; s < p.stages(); ++s) {
    p.stage_cost_s.push_back(pre.range_cost(p.begin(s), p.end(s)));
    p.stage_memory_bytes.push_back(pre.range_mem(p.begin(s), p.end(s)));
  }
  return p;
}

[[noreturn]] void explain_no_fit(const PartitionRequest& r, const std::vector<uint64_t>& cap) {
  const uint64_t max_cap = *std::max_element(cap.begin(), cap.end());
  for (size_t i = 0; i < r.layer_memory_bytes.size(); ++i) {
    if (r.layer_memory_bytes[i] > max_cap) {
      fail("no assignment fits the memory caps: layer " + std::to_string(i) + " needs " +
           bytes_str(r.layer_memory_bytes[i]) + ", more than the largest stage cap, " +
           bytes_str(max_cap));
    }
  }
  uint64_t need = 0, have = 0;
  for (uint64_t m : r.layer_memory_bytes) need = need > kNoCap - m ? kNoCap : need + m;
  for (uint64_t c : cap) have = have > kNoCap - c ? kNoCap : have + c;
  if (need > have) {
    fail("no assignment fits the memory caps: the layers need " + bytes_str(need) +
         " in total, the " + std::to_string(cap.size()) + " stages hold " + bytes_str(have));
  }
  std::ostringstream os;
  os << "no assignment fits the memory caps: no split of the " << r.layer_cost_s.size()
     << " layers into " << r.stages << " contiguous stages keeps every stage under its cap (caps:";
  for (size_t s = 0; s < cap.size(); ++s) os << (s ? ", " : " ") << cap[s];
  os << " bytes)";
  fail(os.str());
}

}  // namespace

int StagePartition::stage_of(int layer) const {
  if (layer < 0 || layer >= layers()) {
    throw std::out_of_range("partition: layer " + std::to_string(layer) + " is not in [0, " +
                            std::to_string(layers()) + ")");
  }
  return int(std::upper_bound(boundaries.begin(), boundaries.end(), layer) - boundaries.begin()) -
         1;
}

double StagePartition::bottleneck_s() const {
  return stage_cost_s.empty() ? 0 : *std::max_element(stage_cost_s.begin(), stage_cost_s.end());
}

StagePartition partition_layers(const PartitionRequest& r) {
  const int L = int(r.layer_cost_s.size());
  const int P = r.stages;
  check_shape(L, P);
  check_costs(r.layer_cost_s, r.layer_memory_bytes);
  const size_t n_caps = r.stage_memory_cap_bytes.size();
  if (n_caps != 0 && n_caps != 1 && n_caps != size_t(P)) {
    fail(std::to_string(n_caps) + " stage memory caps for " + std::to_string(P) +
         " stages; give none, one for every stage, or one per stage");
  }
  std::vector<uint64_t> cap(size_t(P), kNoCap);
  for (int s = 0; s < P; ++s) {
    if (n_caps == 1) cap[size_t(s)] = r.stage_memory_cap_bytes[0];
    if (n_caps == size_t(P)) cap[size_t(s)] = r.stage_memory_cap_bytes[size_t(s)];
  }
  const Prefix pre(r.layer_cost_s, r.layer_memory_bytes);

  // Suffix tables: stage s starting at layer j serves layers [j, L) with
  // stages s..P-1. Suffixes, so that the rebuild walks front to back and can
  // prefer the earliest boundary on ties.
  const size_t W = size_t(L) + 1;
  auto at = [W](std::vector<double>& t, int s, int j) -> double& {
    return t[size_t(s) * W + size_t(j)];
  };
  // Stage s can start at j in [s, L - (P - s)] and end at i in (j, L - (P - s - 1)].
  auto last_end = [L, P](int s) { return L - (P - s - 1); };

  // Pass 1: the smallest bottleneck of each suffix.
  std::vector<double> worst(size_t(P) * W, kInf);
  for (int s = P - 1; s >= 0; --s) {
    for (int j = s; j <= L - (P - s); ++j) {
      double best = kInf;
      for (int i = j + 1; i <= last_end(s); ++i) {
        if (pre.range_mem(j, i) > cap[size_t(s)]) break;  // longer ranges only need more
        const double c = pre.range_cost(j, i);
        if (c >= best) break;  // and cost more: no longer range can win
        const double rest = s == P - 1 ? (i == L ? 0 : kInf) : at(worst, s + 1, i);
        best = std::min(best, std::max(c, rest));
      }
      at(worst, s, j) = best;
    }
  }
  const double bottleneck = at(worst, 0, 0);
  if (bottleneck == kInf) explain_no_fit(r, cap);

  // Pass 2: among suffixes whose every stage is within the bottleneck, the
  // smallest sum of squared stage costs.
  std::vector<double> spread(size_t(P) * W, kInf);
  for (int s = P - 1; s >= 0; --s) {
    for (int j = s; j <= L - (P - s); ++j) {
      double best = kInf;
      for (int i = j + 1; i <= last_end(s); ++i) {
        if (pre.range_mem(j, i) > cap[size_t(s)]) break;
        const double c = pre.range_cost(j, i);
        if (c > bottleneck) break;
        const double rest = s == P - 1 ? (i == L ? 0 : kInf) : at(spread, s + 1, i);
        best = std::min(best, c * c + rest);
      }
      at(spread, s, j) = best;
    }
  }

  // Rebuild front to back, taking the first (smallest) end that achieves the
  // optimum; recomputing the same expression makes the equality exact.
  std::vector<int> boundaries{0};
  int j = 0;
  for (int s = 0; s < P; ++s) {
    const double target = at(spread, s, j);
    int chosen = -1;
    for (int i = j + 1; i <= last_end(s) && chosen < 0; ++i) {
      if (pre.range_mem(j, i) > cap[size_t(s)]) break;
      const double c = pre.range_cost(j, i);
      if (c > bottleneck) break;
      const double rest = s == P - 1 ? (i == L ? 0 : kInf) : at(spread, s + 1, i);
      if (c * c + rest == target) chosen = i;
    }
    if (chosen < 0) fail("internal error: partition rebuild found no stage end");
    boundaries.push_back(chosen);
    j = chosen;
  }
  return finish(std::move(boundaries), pre);
}

StagePartition equal_partition(int layers, int stages) {
  check_shape(layers, stages);
  std::vector<int> boundaries{0};
  const int q = layers / stages, extra = layers % stages;
  for (int s = 0; s < stages; ++s)
    boundaries.push_back(boundaries.back() + q + (s < extra ? 1 : 0));
  const std::vector<double> unit(size_t(layers), 1.0);
  return finish(std::move(boundaries), Prefix(unit, {}));
}

StagePartition evaluate_partition(std::vector<int> boundaries, std::span<const double> layer_cost_s,
                                  std::span<const uint64_t> layer_memory_bytes) {
  const int L = int(layer_cost_s.size());
  check_costs(layer_cost_s, layer_memory_bytes);
  if (boundaries.size() < 2 || boundaries.front() != 0 || boundaries.back() != L) {
    fail("boundaries must run from 0 to the layer count " + std::to_string(L));
  }
  for (size_t s = 1; s < boundaries.size(); ++s) {
    if (boundaries[s] <= boundaries[s - 1]) {
      fail("boundaries must increase strictly (stage " + std::to_string(s - 1) + " is empty)");
    }
  }
  return finish(std::move(boundaries), Prefix(layer_cost_s, layer_memory_bytes));
}

}  // namespace troupe
