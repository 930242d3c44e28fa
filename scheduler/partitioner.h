#pragma once
// Pipeline partitioning: which contiguous range of layers each of P stages
// owns. From measured per-layer costs it minimizes the slowest stage (the
// pipeline's throughput bound), under a memory cap per stage. Plain and
// deterministic: same inputs, same boundaries.
#include <cstdint>
#include <span>
#include <vector>

namespace troupe {

struct StagePartition {
  // Stage s owns layers [boundaries[s], boundaries[s + 1]); boundaries has
  // stages() + 1 entries, from 0 to the number of layers, strictly increasing
  // (every stage has at least one layer).
  std::vector<int> boundaries;
  std::vector<double> stage_cost_s;          // sum of the stage's layer costs
  std::vector<uint64_t> stage_memory_bytes;  // sum of its layers' memory (0 when not given)

  int stages() const { return int(boundaries.size()) - 1; }
  int layers() const { return boundaries.empty() ? 0 : boundaries.back(); }
  int begin(int stage) const { return boundaries[size_t(stage)]; }
  int end(int stage) const { return boundaries[size_t(stage) + 1]; }
  int layer_count(int stage) const { return end(stage) - begin(stage); }
  int stage_of(int layer) const;  // throws std::out_of_range outside [0, layers())
  double bottleneck_s() const;    // the largest stage cost
};

struct PartitionRequest {
  std::vector<double> layer_cost_s;  // measured seconds per layer, finite and >= 0
  // Bytes per layer (weights + its KV cache share); empty: memory not
  // considered. Fixed costs of a stage (embedding on the first, classifier on
  // the last) go into the first or last layer, or come off that stage's cap.
  std::vector<uint64_t> layer_memory_bytes;
  // Per stage cap: empty (no cap), one value (every stage) or one per stage
  // (devices of different sizes; stage s gets cap s).
  std::vector<uint64_t> stage_memory_cap_bytes;
  int stages = 1;
};

// The partition with the smallest bottleneck (largest stage cost) that fits
// the caps. Exact: dynamic programming over (stage, prefix of layers),
// O(P * L^2) at worst, pruned to far less in practice (L <= 1024, P <= 64
// take milliseconds).
//
// Tie-breaking, deterministic: among the partitions with the smallest
// bottleneck it returns the one with the smallest sum of squared stage costs
// (the most even spread of the remaining stages, which leaves the most slack
// when measured costs drift); remaining ties go to the partition whose stage
// boundaries are lexicographically smallest (earlier stages end sooner).
//
// Throws std::invalid_argument naming the problem: stages < 1, stages > layers
// (each stage needs a layer), a negative or non-finite cost, memory sizes that
// do not match the costs, a cap list that is neither empty, one value nor one
// per stage, or no assignment fitting the caps (naming a layer larger than
// every cap, total memory over the total of the caps, or else the caps).
StagePartition partition_layers(const PartitionRequest& request);

// Layer counts that differ by at most one, the larger counts on the earlier
// stages (the last stage usually also runs the classifier). Stage costs are
// the layer counts (unit cost per layer); evaluate_partition() prices it with
// measured costs. Throws std::invalid_argument when stages < 1 or stages >
// layers.
StagePartition equal_partition(int layers, int stages);

// The costs and memory of given boundaries (validated as described above).
StagePartition evaluate_partition(std::vector<int> boundaries, std::span<const double> layer_cost_s,
                                  std::span<const uint64_t> layer_memory_bytes = {});

}  // namespace troupe
