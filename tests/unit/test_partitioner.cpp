// Layer partitioning: optimal against brute force on small cases (with and
// without memory caps, including the documented tie-breaking), better than
// equal counts on skewed costs, and clear errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "scheduler/partitioner.h"
#include "support/error_messages.h"
#include "util/rng.h"

namespace troupe {
namespace {

template <class Fn>
std::string error_of(Fn fn) {
  return test::message_of<std::invalid_argument>(fn);
}

struct Brute {
  double bottleneck = std::numeric_limits<double>::infinity();
  double sum_sq = 0;
  std::vector<int> boundaries;  // the optimum under the documented tie-breaking
};

// Every split of L layers into P non-empty contiguous stages, in
// lexicographic order of the boundaries, so the first optimum found is the
// lexicographically smallest.
void enumerate(const std::vector<double>& cost, const std::vector<uint64_t>& mem,
               const std::vector<uint64_t>& cap, int stages, std::vector<int>& b, Brute& best) {
  const int L = int(cost.size());
  const int s = int(b.size()) - 1;  // the stage that starts at b.back()
  const int left = stages - s;
  for (int end = b.back() + 1; end <= L - (left - 1); ++end) {
    if (left == 1 && end != L) continue;
    double c = 0;
    uint64_t m = 0;
    for (int i = b.back(); i < end; ++i) {
      c += cost[size_t(i)];
      m += mem.empty() ? 0 : mem[size_t(i)];
    }
    const uint64_t limit = cap.empty() ? UINT64_MAX : cap[cap.size() == 1 ? 0 : size_t(s)];
    if (m > limit) continue;
    b.push_back(end);
    if (left == 1) {
      double worst = 0, sq = 0;
      for (size_t k = 0; k + 1 < b.size(); ++k) {
        double sc = 0;
        for (int i = b[k]; i < b[k + 1]; ++i) sc += cost[size_t(i)];
        worst = std::max(worst, sc);
        sq += sc * sc;
      }
      if (worst < best.bottleneck || (worst == best.bottleneck && sq < best.sum_sq)) {
        best = {worst, sq, b};
      }
    } else {
      enumerate(cost, mem, cap, stages, b, best);
    }
    b.pop_back();
  }
}

Brute brute_force(const std::vector<double>& cost, const std::vector<uint64_t>& mem,
                  const std::vector<uint64_t>& cap, int stages) {
  Brute best;
  std::vector<int> b{0};
  enumerate(cost, mem, cap, stages, b, best);
  return best;
}

TEST(Partitioner, SkewedCostsAreBalancedBetterThanEqualCounts) {
  // The last layers are ten times as expensive (say, a MoE block or the
  // classifier folded into the last layer).
  const std::vector<double> cost{1, 1, 1, 1, 1, 1, 10, 10};
  PartitionRequest req;
  req.layer_cost_s = cost;
  req.stages = 2;
  const StagePartition best = partition_layers(req);
  const StagePartition equal = evaluate_partition(equal_partition(8, 2).boundaries, cost);
  EXPECT_EQ(equal.bottleneck_s(), 22);
  EXPECT_EQ(best.bottleneck_s(), 16);
  EXPECT_EQ(best.boundaries, (std::vector<int>{0, 7, 8}));
  EXPECT_EQ(best.stage_cost_s, (std::vector<double>{16, 10}));
  EXPECT_EQ(best.stage_of(6), 0);
  EXPECT_EQ(best.stage_of(7), 1);
}

TEST(Partitioner, OptimalAgainstBruteForceOnSmallCases) {
  Xoshiro256 rng(2024);
  int with_caps = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int L = 1 + int(rng.below(10));
    const int P = 1 + int(rng.below(uint64_t(std::min(L, 5))));
    std::vector<double> cost(static_cast<size_t>(L));
    // Integer costs: sums are exact, so equal bottlenecks really tie. Small
    // ranges make ties frequent, which exercises the tie-breaking.
    const uint64_t range = trial % 2 ? 4 : 50;
    for (auto& c : cost) c = double(rng.below(range));
    std::vector<uint64_t> mem;
    std::vector<uint64_t> cap;
    if (trial % 3 != 0) {
      for (int i = 0; i < L; ++i) mem.push_back(1 + rng.below(10));
      const uint64_t total = std::accumulate(mem.begin(), mem.end(), uint64_t(0));
      if (trial % 3 == 1) {
        cap.push_back(total / uint64_t(P) + rng.below(8));
      } else {
        for (int s = 0; s < P; ++s) cap.push_back(2 + rng.below(total));
      }
    }
    PartitionRequest req{cost, mem, cap, P};
    const Brute expected = brute_force(cost, mem, cap, P);
    const std::string where =
        "trial " + std::to_string(trial) + " L=" + std::to_string(L) + " P=" + std::to_string(P);
    if (expected.boundaries.empty()) {
      EXPECT_NE(error_of([&] { partition_layers(req); }).find("no assignment fits"),
                std::string::npos)
          << where;
      continue;
    }
    with_caps += cap.empty() ? 0 : 1;
    const StagePartition got = partition_layers(req);
    EXPECT_EQ(got.bottleneck_s(), expected.bottleneck) << where;
    EXPECT_EQ(got.boundaries, expected.boundaries) << where;
    for (int s = 0; s < got.stages(); ++s) {
      ASSERT_GE(got.layer_count(s), 1) << where;
      if (!cap.empty()) {
        EXPECT_LE(got.stage_memory_bytes[size_t(s)], cap[cap.size() == 1 ? 0 : size_t(s)]) << where;
      }
    }
  }
  EXPECT_GT(with_caps, 100);  // the caps were really exercised
}

TEST(Partitioner, MemoryCapMovesALayerEvenAtACost) {
  PartitionRequest req;
  req.layer_cost_s = {1, 1, 1, 1};
  req.layer_memory_bytes = {10, 10, 10, 40};
  req.stages = 2;
  EXPECT_EQ(partition_layers(req).boundaries, (std::vector<int>{0, 2, 4}));
  req.stage_memory_cap_bytes = {40};
  const StagePartition p = partition_layers(req);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 3, 4}));
  EXPECT_EQ(p.stage_memory_bytes, (std::vector<uint64_t>{30, 40}));
  EXPECT_EQ(p.bottleneck_s(), 3);
  // Per-stage caps: a small first device.
  req.stage_memory_cap_bytes = {10, 1000};
  EXPECT_EQ(partition_layers(req).boundaries, (std::vector<int>{0, 1, 4}));
}

TEST(Partitioner, LargestSizesAreFastAndOptimal) {
  // L = 1024, P = 64 with integer costs; optimality checked with a greedy
  // feasibility test (without caps, "fits within B" is monotone in B).
  Xoshiro256 rng(7);
  std::vector<double> cost(1024);
  for (auto& c : cost) c = double(1 + rng.below(1000));
  PartitionRequest req;
  req.layer_cost_s = cost;
  req.stages = 64;
  const auto t0 = std::chrono::steady_clock::now();
  const StagePartition p = partition_layers(req);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  auto stages_needed = [&](double limit) {
    int stages = 1;
    double run = 0;
    for (double c : cost) {
      if (c > limit) return std::numeric_limits<int>::max();
      if (run + c > limit) {
        ++stages;
        run = 0;
      }
      run += c;
    }
    return stages;
  };
  const double b = p.bottleneck_s();
  EXPECT_LE(stages_needed(b), 64);
  EXPECT_GT(stages_needed(b - 1), 64);  // integer sums: b - 1 is the next smaller candidate
  EXPECT_EQ(p.stages(), 64);
  EXPECT_EQ(p.layers(), 1024);
}

TEST(Partitioner, EqualPartitionPutsExtraLayersFirst) {
  const StagePartition p = equal_partition(10, 3);
  EXPECT_EQ(p.boundaries, (std::vector<int>{0, 4, 7, 10}));
  EXPECT_EQ(p.stage_cost_s, (std::vector<double>{4, 3, 3}));
  EXPECT_EQ(equal_partition(5, 5).boundaries, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(equal_partition(7, 1).boundaries, (std::vector<int>{0, 7}));
}

TEST(Partitioner, ErrorsSayWhatIsWrong) {
  PartitionRequest req;
  req.layer_cost_s = {1, 2, 3};
  req.stages = 4;
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("4 stages for 3 layers"),
            std::string::npos);
  req.stages = 0;
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("stage count must be >= 1"),
            std::string::npos);
  req.stages = 2;
  req.layer_memory_bytes = {1, 2};
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("2 layer memory sizes for 3 layer costs"),
            std::string::npos);
  req.layer_memory_bytes = {50, 5, 5};
  req.stage_memory_cap_bytes = {1, 2, 3};
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("3 stage memory caps for 2 stages"),
            std::string::npos);
  req.stage_memory_cap_bytes = {40};
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("layer 0 needs 50 bytes"),
            std::string::npos);
  req.layer_memory_bytes = {25, 25, 25};
  req.stage_memory_cap_bytes = {30, 29};
  EXPECT_NE(
      error_of([&] { partition_layers(req); }).find("need 75 bytes (7.15256e-05 MiB) in total"),
      std::string::npos);
  req.layer_memory_bytes = {50, 5, 5};
  req.stage_memory_cap_bytes = {10, 100};  // enough in total, but layer 0 must go to stage 0
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("no split of the 3 layers"),
            std::string::npos);
  req.stage_memory_cap_bytes.clear();
  req.layer_cost_s = {1, -1, 3};
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("layer 1 has cost"), std::string::npos);
  req.layer_cost_s = {1, std::nan(""), 3};
  EXPECT_NE(error_of([&] { partition_layers(req); }).find("layer 1 has cost"), std::string::npos);
  EXPECT_THROW(equal_partition(2, 3), std::invalid_argument);
  EXPECT_THROW(equal_partition(2, 0), std::invalid_argument);
  const std::vector<double> three{1, 1, 1};
  EXPECT_THROW(evaluate_partition({0, 2, 2, 3}, three), std::invalid_argument);
  EXPECT_THROW(evaluate_partition({0, 2}, three), std::invalid_argument);
  EXPECT_THROW(equal_partition(3, 1).stage_of(3), std::out_of_range);
}

}  // namespace
}  // namespace troupe
