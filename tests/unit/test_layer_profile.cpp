// Per-layer profiling for the partitioner: one measured time per layer and
// the bytes each layer's stage would hold; balanced_stages turns them into
// contiguous stages within memory caps. Times are only checked for sanity
// here (timing belongs in benchmarks); the partitioner's balancing itself is
// tested on fixed cost lists in test_partitioner.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "actors/runtime.h"
#include "gpu/layer_profile.h"
#include "gpu/model.h"
#include "support/test_support.h"

namespace troupe {
namespace {

TEST(LayerProfile, OneTimePerLayerAndTheBytesEachLayerBrings) {
  const auto ck = load_checkpoint(test::model_path("fortune"));  // 5 layers, tied embedding
  LayerProfileOptions o;
  o.repeats = 3;
  const LayerProfile p = profile_layers(ck, DType::F32, o);
  ASSERT_EQ(p.seconds.size(), 5u);
  ASSERT_EQ(p.weight_bytes.size(), 5u);
  for (double t : p.seconds) {
    EXPECT_TRUE(std::isfinite(t));
    EXPECT_GT(t, 0);
  }
  // The first layer brings the embedding and the last the classifier; the
  // middle ones are alike.
  EXPECT_EQ(p.weight_bytes[1], p.weight_bytes[2]);
  EXPECT_GT(p.weight_bytes[0], p.weight_bytes[1]);
  EXPECT_GT(p.weight_bytes[4], p.weight_bytes[1]);
  const Model whole(ck, DType::F32);
  uint64_t sum = 0;
  for (uint64_t b : p.weight_bytes) sum += b;
  EXPECT_GE(sum, whole.weight_bytes());
  LayerProfileOptions bad;
  bad.batch = 0;
  EXPECT_THROW(profile_layers(ck, DType::F32, bad), std::invalid_argument);
}

TEST(LayerProfile, BalancedStagesFollowTheCostsAndTheMemoryCaps) {
  LayerProfile p;
  p.seconds = {1, 1, 1, 1, 1, 5};  // a heavy last layer (the classifier)
  p.weight_bytes = {100, 100, 100, 100, 100, 100};
  auto stages = balanced_stages(p, 2);
  EXPECT_EQ(stages, (std::vector<std::pair<int, int>>{{0, 5}, {5, 6}}));
  // Stage 0 can hold two layers with their KV share: the rest goes to stage 1.
  StageMemory m;
  m.kv_bytes_per_layer = 20;
  m.stage_cap_bytes = {240, std::numeric_limits<uint64_t>::max()};
  stages = balanced_stages(p, 2, m);
  EXPECT_EQ(stages, (std::vector<std::pair<int, int>>{{0, 2}, {2, 6}}));
  m.stage_cap_bytes = {100, 100};
  EXPECT_THROW(balanced_stages(p, 2, m), std::invalid_argument);
  EXPECT_TRUE(balanced_stages(p, 1).empty());
}

}  // namespace
}  // namespace troupe
